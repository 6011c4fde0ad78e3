"""Manifests from Kaldi data directories (one per split).

A Kaldi data directory holds ``wav.scp`` (``<recording> <path>``, or ``<recording> <command> |``
whose standard output is the audio), ``text`` (``<utterance> <transcript>``), ``utt2spk``
(``<utterance> <speaker>``) and, when utterances are parts of recordings, ``segments``
(``<utterance> <recording> <start> <end>``, seconds; end -1: to the end of the recording).
Without ``segments`` each recording is one utterance of the same id.

Commands (``... |`` entries, e.g. ``sph2pipe -f wav file.sph |``) are refused unless
``run_pipes`` is set; then each is run once through ``bash -c`` and its output stored as
``<out>/audio/<split>/<recording>.wav`` (read by content: WAV, SPHERE or FLAC), since every
later stage reads audio by path. Archive entries (``path.ark:offset``) are refused.

Utterances with no transcript, an empty one, no audio, unreadable audio or a segment beyond
its recording are counted skips with the reason, never silent. The transcript becomes the
manifest's ``words``: train on it with ``data.units=words``, ``chars`` or ``sp:<model>``.
"""

import logging
import subprocess
from pathlib import Path

import soundfile

from cbasr.corpora.prepare import CorpusError, DurationFilter, PreparedCorpus
from cbasr.data.audio import AudioError, read_audio

__all__ = ["read_table", "recording_path", "prepare_kaldi"]

log = logging.getLogger(__name__)


def read_table(path: Path, columns: int | None = None) -> dict[str, list[str]]:
    """``{key: [fields...]}`` of a Kaldi table file; ``columns``: exact field count after the key
    (None: the rest of the line as one field, e.g. a transcript or a command)."""
    table: dict[str, list[str]] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        key, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        fields = rest.split() if columns is not None else [rest]
        if columns is not None and len(fields) != columns:
            raise CorpusError(
                f"{path}:{lineno}: expected a key and {columns} fields, found {line.strip()!r}"
            )
        if key in table:
            raise CorpusError(f"{path}:{lineno}: duplicate key {key!r}")
        table[key] = fields
    return table


def _duration(path: Path) -> float:
    """Seconds of audio in ``path`` (libsndfile's header, else a full read)."""
    try:
        info = soundfile.info(str(path))
        if info.frames > 0:
            return info.frames / info.samplerate
    except Exception:  # SPHERE with Shorten, or damaged: read it through read_audio
        pass
    samples, rate = read_audio(path)
    return len(samples) / rate


def recording_path(rec: str, entry: str, data_dir: Path, audio_dir: Path, run_pipes: bool) -> Path:
    """The audio file of a ``wav.scp`` entry (running its command when allowed)."""
    if entry.endswith("|"):
        command = entry[:-1].strip()
        if not run_pipes:
            raise CorpusError(
                f"{data_dir / 'wav.scp'}: recording {rec} is a command ({command!r}): pass "
                "--run-pipes to run each command once and store its audio, or convert the "
                "audio to files first"
            )
        audio_dir.mkdir(parents=True, exist_ok=True)
        out = audio_dir / f"{rec}.wav"
        if not out.is_file():
            run = subprocess.run(["bash", "-c", command], capture_output=True)
            if run.returncode != 0 or not run.stdout:
                raise AudioError(
                    f"wav.scp command for {rec} failed (exit {run.returncode}): "
                    f"{run.stderr.decode(errors='replace').strip()[-200:]}"
                )
            tmp = out.with_suffix(".tmp")
            tmp.write_bytes(run.stdout)
            tmp.replace(out)
        return out
    if ".ark:" in entry or entry.count(" ") > 0:
        raise CorpusError(
            f"{data_dir / 'wav.scp'}: recording {rec}: {entry!r} is neither a file path nor a "
            "command ending in |"
        )
    path = Path(entry)
    return path if path.is_absolute() else (data_dir / path)


def _split_utterances(
    data_dir: Path, split: str, audio_dir: Path, run_pipes: bool
) -> tuple[list[dict], list[tuple[str, str, str]]]:
    for name in ("wav.scp", "text"):
        if not (data_dir / name).is_file():
            raise CorpusError(f"{data_dir} is not a Kaldi data directory: no {name}")
    wav_scp = read_table(data_dir / "wav.scp")
    text = read_table(data_dir / "text")
    utt2spk = read_table(data_dir / "utt2spk", 1) if (data_dir / "utt2spk").is_file() else None
    if utt2spk is None:
        log.warning("%s: no utt2spk: each utterance is its own speaker", data_dir)
    if (data_dir / "segments").is_file():
        segments = {
            utt: (rec, float(start), float(end))
            for utt, (rec, start, end) in read_table(data_dir / "segments", 3).items()
        }
    else:
        segments = {rec: (rec, None, None) for rec in wav_scp}
    records, skipped = [], []
    recordings: dict[str, tuple[Path, float] | str] = {}  # path and duration, or why not
    for utt in sorted(set(segments) | set(text)):
        if utt not in segments:
            skipped.append((split, utt, "in text but in neither segments nor wav.scp"))
            continue
        words = " ".join(text.get(utt, [""])[0].split())
        if utt not in text or not words:
            skipped.append((split, utt, "no transcript" if utt not in text else "empty transcript"))
            continue
        rec, start, end = segments[utt]
        if rec not in wav_scp:
            skipped.append((split, utt, f"recording {rec} not in wav.scp"))
            continue
        if rec not in recordings:
            try:
                path = recording_path(rec, wav_scp[rec][0], data_dir, audio_dir, run_pipes)
                recordings[rec] = (path, _duration(path))
            except AudioError as e:
                recordings[rec] = str(e)
            except OSError as e:
                recordings[rec] = f"{e.strerror}: {e.filename}"
        found = recordings[rec]
        if isinstance(found, str):
            skipped.append((split, utt, found))
            continue
        path, length = found
        record = {"id": utt, "audio": str(path.resolve())}
        if start is not None:
            stop = length if end < 0 else end
            if start < 0 or stop <= start or stop > length + 0.01:
                skipped.append(
                    (
                        split,
                        utt,
                        f"segment {start}-{end} s outside recording {rec} ({length:.2f} s)",
                    )
                )
                continue
            record.update(start=start, duration=stop - start)
        else:
            record["duration"] = round(length, 4)
        record["speaker"] = utt2spk[utt][0] if utt2spk and utt in utt2spk else utt
        record["words"] = words
        records.append(record)
    return records, skipped


def prepare_kaldi(
    data_dirs: list[str | Path],
    out_dir: str | Path,
    splits: list[str] | None = None,
    run_pipes: bool = False,
    durations: DurationFilter | None = None,
) -> dict:
    """Write ``<split>.jsonl`` into ``out_dir`` for each Kaldi data directory.

    Args:
        splits: the split names (default: each data directory's name).
        run_pipes: run ``wav.scp`` commands (see the module docstring).

    Returns:
        The summary also written to ``out_dir/.done``.
    """
    data_dirs = [Path(d) for d in data_dirs]
    names = list(splits) if splits else [d.name for d in data_dirs]
    if len(names) != len(data_dirs) or len(set(names)) != len(names):
        raise CorpusError(
            f"one distinct split name per data directory is needed; got {names} for "
            f"{[str(d) for d in data_dirs]} (name them with --splits)"
        )
    for d in data_dirs:
        if not d.is_dir():
            raise CorpusError(f"{d}: no such Kaldi data directory")
    out = PreparedCorpus(out_dir, tuple(names), durations)
    params = {
        "corpus": "kaldi",
        "data_dirs": [str(d.resolve()) for d in data_dirs],
        "splits": names,
        "run_pipes": run_pipes,
    }
    if out.is_complete(params):
        log.info("%s: manifests complete, nothing to do", out_dir)
        return out.summary()
    records, skipped = {}, []
    for d, split in zip(data_dirs, names):
        records[split], split_skipped = _split_utterances(
            d, split, Path(out_dir) / "audio" / split, run_pipes
        )
        skipped += split_skipped
    return out.write(params, records, skipped)
