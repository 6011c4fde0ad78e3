"""Log-mel filterbank features, computed once per split and stored for fast reading.

Layout of a feature directory (one per split)::

    <out>/<split>/feats.bin     float16 frames of every utterance, concatenated (N, F)
    <out>/<split>/index.tsv     id <TAB> first frame <TAB> number of frames
    <out>/<split>/skipped.tsv   id <TAB> reason, for utterances that could not be used
    <out>/<split>/.done         JSON of the extraction parameters, written last
    <out>/cmvn.json             global mean and standard deviation from the train split

An experiment directory keeps what recognising new audio needs (:func:`write_feature_settings`):
``cmvn.json`` and ``features.json``, the extraction options, the SHA-256 of ``cmvn.json`` and
whether the model saw the features rounded to float16 (the cache) or in float32 (on the fly).

Float16 keeps 3 significant digits of log energies, far below the features' own noise,
and halves disk and page-cache use. Features are returned as float32.
"""

import hashlib
import json
import logging
import multiprocessing
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torchaudio

from cbasr.data.audio import AudioError, read_segment
from cbasr.data.manifest import audio_path, read_manifest
from cbasr.progress import progress_bar
from cbasr.storage.files import write_json, write_text

__all__ = [
    "FbankOptions",
    "compute_fbank",
    "extract_split",
    "FeaturePool",
    "write_cmvn",
    "load_cmvn",
    "normalise",
    "utterance_mean_of",
    "FeatureStore",
    "frames_of",
    "extraction_options",
    "FEATURE_SETTINGS",
    "FeatureSettings",
    "write_feature_settings",
    "load_feature_settings",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FbankOptions:
    num_mel_bins: int = 80
    deltas: int = 0  # 0: none; 1: + deltas; 2: + deltas and delta-deltas (window 5, as Kaldi)
    sample_rate: int = 16000
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0


def compute_fbank(waveform: torch.Tensor, sample_rate: int, opts: FbankOptions) -> torch.Tensor:
    """Kaldi-compatible log-mel filterbank of a mono waveform.

    Args:
        waveform: ``(N,)`` samples in [-1, 1].
        sample_rate: rate of ``waveform``; resampled to ``opts.sample_rate`` when different.

    Returns:
        ``(T, F)`` float32 features, ``T = 1 + (N - window) // shift`` (0 for short audio).
    """
    if sample_rate != opts.sample_rate:
        waveform = torchaudio.functional.resample(waveform, sample_rate, opts.sample_rate)
    window = int(opts.sample_rate * opts.frame_length_ms / 1000)
    if waveform.numel() < window:
        return torch.zeros(0, opts.num_mel_bins * (1 + opts.deltas))
    feats = torchaudio.compliance.kaldi.fbank(
        waveform.unsqueeze(0) * 32768.0,  # (N,) -> (1, N), Kaldi's int16 scale
        num_mel_bins=opts.num_mel_bins,
        frame_length=opts.frame_length_ms,
        frame_shift=opts.frame_shift_ms,
        dither=0.0,
        energy_floor=0.0,
        sample_frequency=opts.sample_rate,
    )
    orders = [feats]
    for _ in range(opts.deltas):
        # over time
        orders.append(torchaudio.functional.compute_deltas(orders[-1].t(), win_length=5).t())
    return torch.cat(orders, dim=-1)  # (T, F * (1 + deltas))


def _features_of(job: tuple) -> tuple[str, np.ndarray | None, str]:
    """Worker: ``(id, path, opts, start, duration, channel) -> (id, (T, F) float16 array or
    None, reason)``; ``start`` None reads the whole file."""
    utt_id, path, opts, start, duration, channel = job
    try:
        samples, sample_rate = read_segment(path, start, duration, channel)
    except AudioError as e:
        return utt_id, None, str(e)
    if samples.shape[0] == 0:
        return utt_id, None, f"empty audio {path}"
    feats = compute_fbank(torch.from_numpy(samples), sample_rate, opts)
    if feats.shape[0] == 0:
        return utt_id, None, f"audio shorter than one frame: {path}"
    if not torch.isfinite(feats).all():
        return utt_id, None, f"non-finite features (NaN or Inf) from {path}"
    stored = feats.numpy().astype(np.float16)
    if not np.isfinite(stored).all():
        return utt_id, None, f"features beyond float16's range from {path}"
    return utt_id, stored, ""


def _init_worker() -> None:
    torch.set_num_threads(1)


def extract_split(
    manifest: str | Path,
    out_dir: str | Path,
    opts: FbankOptions,
    workers: int = 2,
    accumulate_stats: bool = False,
    pool: "FeaturePool | None" = None,
) -> dict:
    """Compute features for every utterance of ``manifest`` into ``out_dir``.

    Skips itself when ``out_dir/.done`` records the same manifest and options. Utterances
    whose audio is missing or unreadable are logged by id and listed in ``skipped.tsv``.
    ``pool`` (a :class:`FeaturePool`) shares its worker processes among the splits of one
    run; without it ``workers`` processes start for this split alone.

    Returns:
        A summary: utterances kept and skipped, frames, and (with ``accumulate_stats``)
        float64 ``sum``/``sum_sq`` per dimension for CMVN.
    """
    out_dir = Path(out_dir)
    params = {"manifest": str(Path(manifest).resolve()), **asdict(opts)}
    done = out_dir / ".done"
    if done.is_file() and json.loads(done.read_text()).get("params") == params:
        summary = json.loads(done.read_text())
        log.info("%s: features complete (%d utterances), skipping", out_dir, summary["kept"])
        return summary
    done.unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = read_manifest(manifest)
    jobs = [
        (
            r["id"],
            str(audio_path(r, manifest)),
            opts,
            r.get("start"),
            r.get("duration"),
            r.get("channel", 0),
        )
        for r in records
    ]

    index, skipped, offset = [], [], 0
    dim = opts.num_mel_bins * (1 + opts.deltas)
    total = np.zeros(dim)
    total_sq = np.zeros(dim)
    tmp_bin = out_dir / "feats.bin.tmp"
    with open(tmp_bin, "wb") as fbin:
        for utt_id, feats, reason in progress_bar(
            _map(jobs, workers, pool), out_dir.name, len(jobs)
        ):
            if feats is None:
                log.warning("skipping utterance %s: %s", utt_id, reason)
                skipped.append(f"{utt_id}\t{reason}")
                continue
            fbin.write(feats.tobytes())
            index.append(f"{utt_id}\t{offset}\t{feats.shape[0]}")
            offset += feats.shape[0]
            if accumulate_stats:
                f64 = feats.astype(np.float64)
                total += f64.sum(0)
                total_sq += (f64 * f64).sum(0)
    tmp_bin.replace(out_dir / "feats.bin")
    write_text(out_dir / "index.tsv", "".join(line + "\n" for line in index))
    write_text(out_dir / "skipped.tsv", "".join(line + "\n" for line in skipped))
    if skipped:
        log.warning(
            "%s: skipped %d of %d utterances (see %s)",
            manifest,
            len(skipped),
            len(records),
            out_dir / "skipped.tsv",
        )
    summary = {
        "params": params,
        "kept": len(index),
        "skipped": len(skipped),
        "frames": offset,
        "dim": dim,
    }
    if accumulate_stats:
        summary["sum"], summary["sum_sq"] = total.tolist(), total_sq.tolist()
    write_json(done, summary)
    return summary


class FeaturePool:
    """Worker processes for :func:`extract_split`, started when the first split needs them and
    shared by the splits after it (each start of a spawned worker imports torch: seconds).
    A context manager; ``workers=0`` computes inline."""

    def __init__(self, workers: int):
        self.workers = workers
        self._pool = None

    def imap(self, jobs: list):
        """Ordered map of :func:`_features_of` over ``jobs``."""
        if self.workers <= 0:
            return map(_features_of, jobs)
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ctx.Pool(self.workers, initializer=_init_worker)
        return self._pool.imap(_features_of, jobs, chunksize=16)

    def __enter__(self) -> "FeaturePool":
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None


def _map(jobs: list, workers: int, pool: FeaturePool | None = None):
    """Ordered map of :func:`_features_of` over ``jobs``: in ``pool``, or in ``workers``
    processes of its own (0: inline)."""
    if pool is not None:
        yield from pool.imap(jobs)
        return
    with FeaturePool(workers) as own:
        yield from own.imap(jobs)


def write_cmvn(summary: dict, path: str | Path) -> None:
    """Global mean and standard deviation from an :func:`extract_split` summary."""
    n = summary["frames"]
    if n == 0:
        raise ValueError(f"cannot compute CMVN for {path}: the train split has no frames")
    mean = np.asarray(summary["sum"]) / n
    var = np.asarray(summary["sum_sq"]) / n - mean**2
    std = np.sqrt(np.maximum(var, 1e-10))
    write_json(path, {"frames": n, "mean": mean.tolist(), "std": std.tolist()})


def normalise(
    feats: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, utterance_mean: bool = False
) -> torch.Tensor:
    """CMVN of one utterance's ``(T, F)`` features: ``(feats - mean) / std`` with the train
    split's statistics; with ``utterance_mean`` (``data.mean_norm=utterance``), then the
    utterance's own mean over its frames subtracted (per-utterance cepstral mean
    normalisation; the variance stays the train split's)."""
    feats = (feats - mean) / std
    if utterance_mean:  # (an utterance of no frames stays empty)
        feats = feats - feats.mean(0, keepdim=True)
    return feats


def utterance_mean_of(config: dict | None) -> bool:
    """Whether an experiment's ``config`` subtracts each utterance's mean (``data.mean_norm``)."""
    return ((config or {}).get("data") or {}).get("mean_norm", "train") == "utterance"


def load_cmvn(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean (F,), std (F,))`` written by :func:`write_cmvn`."""
    stats = json.loads(Path(path).read_text())
    return torch.tensor(stats["mean"], dtype=torch.float32), torch.tensor(
        stats["std"], dtype=torch.float32
    )


_SCAN_ROWS = 1 << 16  # rows per block when FeatureStore.finite scans the file


class FeatureStore:
    """Random access to the features of one split directory written by :func:`extract_split`."""

    def __init__(self, split_dir: str | Path):
        split_dir = Path(split_dir)
        done = split_dir / ".done"
        if not done.is_file():
            raise FileNotFoundError(
                f"{split_dir}: features incomplete (no .done); rerun extraction (cbasr-features)"
            )
        summary = json.loads(done.read_text())
        self.dim = summary["dim"]
        self.index: dict[str, tuple[int, int]] = {}
        for line in (split_dir / "index.tsv").read_text().splitlines():
            utt_id, offset, frames = line.split("\t")
            self.index[utt_id] = (int(offset), int(frames))
        self._data = self._open(split_dir, summary["frames"]) if summary["frames"] else None
        self._nonfinite_rows: np.ndarray | None = None  # see finite()

    def _open(self, split_dir: Path, total: int) -> np.ndarray:
        """The concatenated frames of every utterance, memory-mapped: ``(N, F)`` float16."""
        return np.memmap(
            split_dir / "feats.bin", dtype=np.float16, mode="r", shape=(total, self.dim)
        )

    def __contains__(self, utt_id: str) -> bool:
        return utt_id in self.index

    def __len__(self) -> int:
        return len(self.index)

    def num_frames(self, utt_id: str) -> int:
        return self.index[utt_id][1]

    def finite(self, utt_id: str) -> bool:
        """Whether every stored value of ``utt_id`` is finite (no NaN or Inf).

        The first call scans the whole file once, a block of rows at a time (0.4 s for the synth
        recipe's 1.5 M training frames, against 1.1 s reading utterance by utterance), and keeps
        the indices of the rows holding a non-finite value: normally none.
        """
        if self._nonfinite_rows is None:
            self._nonfinite_rows = self._find_nonfinite_rows()
        offset, frames = self.index[utt_id]
        bad = self._nonfinite_rows
        return bool(np.searchsorted(bad, offset) == np.searchsorted(bad, offset + frames))

    def _find_nonfinite_rows(self) -> np.ndarray:
        """Sorted indices of the stored rows (frames, or tokens) holding a non-finite value."""
        found = [np.zeros(0, dtype=np.int64)]
        if self._data is None or not np.issubdtype(self._data.dtype, np.floating):
            return found[0]  # integers (a token store's ids) are always finite
        total = self._data.shape[0]
        for start in range(0, total, _SCAN_ROWS):
            rows = np.asarray(self._data[start : start + _SCAN_ROWS])
            finite = np.isfinite(rows).reshape(len(rows), -1).all(axis=1)
            found.append(start + np.flatnonzero(~finite))
        return np.concatenate(found)

    def __getitem__(self, utt_id: str) -> torch.Tensor:
        """``(T, F)`` float32 features of ``utt_id``."""
        offset, frames = self.index[utt_id]
        return torch.from_numpy(np.asarray(self._data[offset : offset + frames], dtype=np.float32))


def frames_of(duration: float, opts: FbankOptions) -> int:
    """Number of frames :func:`compute_fbank` gives for ``duration`` seconds of audio."""
    samples = int(round(duration * opts.sample_rate))
    window = int(opts.sample_rate * opts.frame_length_ms / 1000)
    shift = int(opts.sample_rate * opts.frame_shift_ms / 1000)
    return 0 if samples < window else 1 + (samples - window) // shift


FEATURE_SETTINGS = "features.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def extraction_options(split_dir: str | Path) -> FbankOptions:
    """The options a feature split directory was extracted with (its ``.done`` record)."""
    done = Path(split_dir) / ".done"
    if not done.is_file():
        raise FileNotFoundError(
            f"{done} not found: {split_dir} holds no complete features (cbasr-features)"
        )
    params = json.loads(done.read_text()).get("params")
    if not isinstance(params, dict):
        raise ValueError(
            f"{done} records no extraction options (no 'params'): not written by cbasr-features; "
            f"extract {split_dir} again with cbasr-features"
        )
    return FbankOptions(
        **{f.name: params[f.name] for f in fields(FbankOptions) if f.name in params}
    )


@dataclass(frozen=True)
class FeatureSettings:
    """How an experiment's model saw its input: filterbank options, normalisation and storage."""

    fbank: FbankOptions
    mean: torch.Tensor  # (F,)
    std: torch.Tensor  # (F,)
    float16: bool  # features rounded to float16, as the cache stores them
    utterance_mean: bool = False  # each utterance's own mean subtracted too (data.mean_norm)

    def __call__(self, waveform: torch.Tensor, sample_rate: int) -> torch.Tensor:
        """``(T, F)`` normalised features of a mono waveform, exactly as in training."""
        feats = compute_fbank(waveform, sample_rate, self.fbank)
        if self.float16:
            feats = feats.half().float()
        return normalise(feats, self.mean, self.std, self.utterance_mean)


def write_feature_settings(exp_dir: str | Path, opts: FbankOptions, cached: bool) -> dict:
    """Write ``<exp_dir>/features.json`` for an experiment whose ``cmvn.json`` is in place:
    ``opts`` are the training features' options, ``cached`` whether they were read from the
    float16 cache."""
    exp_dir = Path(exp_dir)
    settings = {
        "type": "fbank",
        "fbank": asdict(opts),
        "stored_as": "float16" if cached else "float32",
        "cmvn": "cmvn.json",
        "cmvn_sha256": _sha256(exp_dir / "cmvn.json"),
    }
    write_json(exp_dir / FEATURE_SETTINGS, settings)
    return settings


def load_feature_settings(exp_dir: str | Path, config: dict | None = None) -> FeatureSettings:
    """The :class:`FeatureSettings` of an experiment directory.

    Experiments trained before ``features.json`` existed fall back, with a warning, to the
    ``.done`` record of the train split named in ``config`` (``data.feature_dir``), when it
    is still there.

    Raises:
        FileNotFoundError: neither ``features.json`` nor the train split's record is found.
        ValueError: ``cmvn.json`` is not the one the experiment was trained with.
    """
    exp_dir = Path(exp_dir)
    path = exp_dir / FEATURE_SETTINGS
    cmvn = exp_dir / "cmvn.json"
    if not cmvn.is_file():
        raise FileNotFoundError(
            f"{cmvn} not found: {exp_dir} is not an experiment trained on filterbank features"
        )
    mean, std = load_cmvn(cmvn)
    if path.is_file():
        settings = json.loads(path.read_text())
        if settings.get("type") != "fbank":
            raise ValueError(f"{path}: unknown feature type {settings.get('type')!r}")
        if settings.get("cmvn_sha256") not in (None, _sha256(cmvn)):
            raise ValueError(
                f"{cmvn} differs from the statistics the model was trained with "
                f"(SHA-256 recorded in {path}): restore the original file"
            )
        return FeatureSettings(
            FbankOptions(**settings["fbank"]),
            mean,
            std,
            settings["stored_as"] == "float16",
            utterance_mean_of(config),
        )
    data = (config or {}).get("data", {})
    split_dir = Path(data.get("feature_dir", "")) / data.get("train_split", "train")
    if not data.get("feature_dir") or not (split_dir / ".done").is_file():
        raise FileNotFoundError(
            f"{path} not found and the training features ({split_dir}) are gone: the feature "
            f"settings of {exp_dir} are unknown (experiments record them since cbasr 0.1's "
            "features.json)"
        )
    log.warning("%s not found: reading the feature settings from %s/.done", path, split_dir)
    return FeatureSettings(
        extraction_options(split_dir), mean, std, data.get("features", "cached") == "cached"
    )
