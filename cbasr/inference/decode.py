"""Decode a split with a trained experiment and write sclite ``trn`` files.

A decoding directory (``<exp>/decode/<split>[_<tag>]``) holds ``hyp.trn`` and ``ref.trn``,
``utt2spk`` (for per-speaker scores), ``skipped.tsv`` and ``decode.json``: the checkpoint,
the search settings (greedy, or beam search with its beam, LM and weights), the data it read
(:func:`data_stamp`), the parameter count, and the decoding time with its real-time factor.
A decoding is up to date (:func:`is_decoded`) only for the same checkpoint, settings and data.

Decodings of audio also write ``timing.tsv`` (:mod:`cbasr.evaluation.delay`): each reference
token's gold end where the corpus has one, and when each hypothesis token reached the user. The
greedy search of a streaming transducer (:func:`~cbasr.inference.streaming.streamable`) emits
a token once its encoder block has been computed
(:func:`~cbasr.inference.streaming.emission_seconds`, ``decode.json``'s ``emission``:
``streaming``); every other decoding at the utterance's end (``utterance end``).
"""

import dataclasses
import logging
import time
from pathlib import Path

import torch

from cbasr.data.batching import BucketBatchSampler
from cbasr.data.manifest import read_manifest
from cbasr.data.source_tokens import TokenStore, open_store
from cbasr.data.vocab import tokens_of
from cbasr.evaluation.decode_info import DecodeInfo
from cbasr.evaluation.delay import TIMING_FILE, gold_ends, write_timing
from cbasr.evaluation.scoring import decode_dir_name, file_digest, write_trn
from cbasr.inference.experiment import MAX_FRAMES, Experiment, frame_seconds
from cbasr.inference.streaming import emission_seconds, streamable
from cbasr.progress import progress_bar
from cbasr.search import (
    BeamSearchOptions,
    LabelScorer,
    WordArpaScorer,
    beam_search,
    check_options,
    search_family,
)
from cbasr.storage.files import write_json, write_text

__all__ = [
    "decode_split",
    "decode_batch",
    "decode_dir_name",
    "is_decoded",
    "decode_settings",
    "data_stamp",
]

log = logging.getLogger(__name__)


def decode_settings(
    exp: Experiment,
    options: BeamSearchOptions | None = None,
    lm_path: str | Path | None = None,
    lm_words: bool = False,
) -> dict:
    """What ``decode.json`` records of a search: ``{"search": "greedy"}`` (with a transducer's
    ``greedy`` rule unless it is ``label``) or the beam search's options (a transducer's
    ``max_symbols`` resolved to the model's when unset), the LM path and, for a word ARPA
    scored at word ends, ``lm_words``."""
    if options is None:
        if lm_path is not None:
            raise ValueError("LM fusion needs a beam search (--beam N with N >= 1)")
        rule = getattr(exp.model, "greedy", "label")
        return {"search": "greedy", **({"greedy": rule} if rule != "label" else {})}
    if search_family(exp.model) == "transducer" and options.max_symbols is None:
        options = dataclasses.replace(options, max_symbols=exp.model.max_symbols)
    return {
        "search": "beam",
        **options.to_dict(),
        "lm": str(lm_path) if lm_path is not None else None,
        **({"lm_words": True} if lm_words else {}),
    }


def data_stamp(manifest: str | Path, feature_dir: str | Path) -> dict:
    """What a decoding reads, as ``decode.json`` records it: the manifest's resolved path and
    the SHA-256 of its content, and the feature directory's resolved path with the SHA-256 and
    modification time (ns) of its ``.done`` record, which extraction writes last (``None``
    where there is none). Editing one transcript, or extracting the features again, changes
    the stamp.

    Raises:
        FileNotFoundError: naming the manifest, when it does not exist.
    """
    manifest, feature_dir = Path(manifest), Path(feature_dir)
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest}: no such manifest")
    done = feature_dir / ".done"
    return {
        "manifest": str(manifest.resolve()),
        "manifest_sha256": file_digest(manifest),
        "features": str(feature_dir.resolve()),
        "features_done": (
            f"{file_digest(done)}@{done.stat().st_mtime_ns}" if done.is_file() else None
        ),
    }


def is_decoded(
    exp: Experiment, out_dir: str | Path, settings: dict | None = None, data: dict | None = None
) -> bool:
    """Whether ``out_dir`` already holds this checkpoint's complete decoding with ``settings``
    (default: greedy) of the data stamped ``data`` (:func:`data_stamp`; ``None``: any data,
    for callers that decoded it themselves). A decoding written before the data were recorded
    is not up to date for any ``data``."""
    info = DecodeInfo.read(out_dir)
    if info is None or (data is not None and info.data != data):
        return False
    return info.checkpoint_stamp == exp.checkpoint_stamp and info.settings == (
        settings or {"search": "greedy"}
    )


@torch.no_grad()
def decode_batch(
    exp: Experiment,
    feats: list[torch.Tensor],
    options: BeamSearchOptions | None = None,
    lm: LabelScorer | None = None,
    frames: bool = False,
):
    """The best label ids of each utterance of a batch of normalised ``(T, F)`` features:
    the model's greedy search, or the beam search of ``options`` (with ``lm`` fused). With
    ``frames`` (a transducer's greedy search) the labels' encoder frames too
    (:class:`~cbasr.models.transducer_greedy.Emissions`)."""
    lens = torch.tensor([f.shape[0] for f in feats], device=exp.device)
    padded = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True).to(exp.device)
    if options is None:
        if frames:
            return exp.model.greedy_emissions(padded, lens)
        return exp.model.greedy_decode(padded, lens)
    return [
        nbest[0].tokens if nbest else []
        for nbest in beam_search(exp.model, padded, lens, options, lm)
    ]


@torch.no_grad()
def decode_split(
    exp: Experiment,
    manifest: str | Path,
    feature_dir: str | Path,
    out_dir: str | Path,
    max_frames: int = MAX_FRAMES,
    options: BeamSearchOptions | None = None,
    lm: LabelScorer | None = None,
    lm_path: str | Path | None = None,
) -> dict:
    """Decode every utterance of ``manifest`` into ``out_dir`` (see the module docstring).

    Args:
        options: beam search options; None decodes greedily (the model's ``greedy_decode``).
        lm: an external LM for shallow fusion (beam search only), loaded from ``lm_path``.

    Utterances without features (unreadable audio) cannot be decoded: they are failures, not
    missing rows. Each gets an empty hypothesis in ``hyp.trn`` beside its reference (so its
    tokens count as deletions), is listed in ``out_dir/skipped.tsv`` and counted as
    ``failed`` in the returned summary, ``decode.json`` and the score.
    """
    settings = decode_settings(
        exp, options, lm_path if lm is not None else None, isinstance(lm, WordArpaScorer)
    )
    if options is not None:
        check_options(exp.model, options, lm)
    out_dir = Path(out_dir)
    data = data_stamp(manifest, feature_dir)
    for stale in ("score.json", "per_utt.tsv", "errors.pra", TIMING_FILE):  # an earlier decoding's
        (out_dir / stale).unlink(missing_ok=True)
    store = open_store(feature_dir)
    records = read_manifest(manifest)
    usable = [r for r in records if r["id"] in store]
    skipped = [r["id"] for r in records if r["id"] not in store]
    for utt_id in skipped:
        log.warning("cannot decode %s: no features", utt_id)
    lengths = [store.num_frames(r["id"]) for r in usable]
    hyps: dict[str, list[str]] = {}
    streaming = options is None and streamable(exp.model) is None
    at: dict[str, list[int]] = {}  # a streaming search's emission frames
    start = time.perf_counter()
    batches = list(BucketBatchSampler(lengths, max_frames, shuffle=False))
    for indices in progress_bar(batches, f"decoding {Path(out_dir).name}", unit="batch"):
        feats = [exp.normalise(store[usable[i]["id"]]) for i in indices]
        found = decode_batch(exp, feats, options, lm, frames=streaming)
        for j, (i, hyp) in enumerate(zip(indices, found.labels if streaming else found)):
            hyps[usable[i]["id"]] = exp.vocab.decode(hyp)
            if streaming:
                at[usable[i]["id"]] = found.frames[j]
    seconds = time.perf_counter() - start
    is_audio = not isinstance(store, TokenStore)
    shift, window = frame_seconds(feature_dir)
    audio = sum(lengths) * shift if is_audio else 0.0
    hyps.update({u: [] for u in skipped})  # failures score as empty hypotheses
    refs = {r["id"]: tokens_of(r, exp.units) for r in records}
    empty_refs = sorted(u for u, tokens in refs.items() if not tokens)
    oov = {u: sorted({t for t in tokens if t not in exp.vocab}) for u, tokens in refs.items()}
    oov = {u: tokens for u, tokens in oov.items() if tokens}
    if empty_refs:
        log.warning(
            "%d utterances have an empty reference (scored: every hypothesis token is an "
            "insertion), e.g. %s",
            len(empty_refs),
            empty_refs[:3],
        )
    if oov:
        log.warning(
            "%d utterances have reference tokens outside the model's vocabulary (scored as they "
            "are: the model cannot produce them), e.g. %s",
            len(oov),
            list(oov.items())[:3],
        )
    write_trn(out_dir / "hyp.trn", [(r["id"], hyps[r["id"]]) for r in records])
    if is_audio:
        frames = dict(zip((r["id"] for r in usable), lengths))
        write_timing(
            out_dir / TIMING_FILE,
            [
                (
                    r["id"],
                    gold_ends(r, exp.units, len(refs[r["id"]])),
                    _emitted(exp, r, hyps[r["id"]], at, frames, shift, window),
                )
                for r in records
            ],
        )
    write_trn(out_dir / "ref.trn", [(r["id"], refs[r["id"]]) for r in records])
    write_text(
        out_dir / "utt2spk",
        "".join(f"{r['id']} {r.get('speaker', 'unknown')}\n" for r in records),
    )
    write_text(
        out_dir / "skipped.tsv",
        "".join(f"{u}\tno features: scored as an empty hypothesis\n" for u in skipped),
    )
    summary = {
        "manifest": str(manifest),
        "data": data,
        "checkpoint": exp.checkpoint,
        "epoch": exp.epoch,
        "checkpoint_stamp": exp.checkpoint_stamp,
        "search": settings["search"],
        "settings": settings,
        "units": exp.units,
        "utts": len(records),
        "failed": len(skipped),
        "skipped": 0,  # nothing is left out of the score any more (older decodings: left out)
        "empty_refs": len(empty_refs),
        "oov_ref_utts": len(oov),
        "oov_ref_tokens": sorted({t for tokens in oov.values() for t in tokens}),
        "parameters": exp.num_parameters,
        "decode_seconds": round(seconds, 3),
        "audio_seconds": round(audio, 3),
        "rtf": round(seconds / audio, 5) if audio else None,
        "device": str(exp.device),
        "emission": None if not is_audio else "streaming" if streaming else "utterance end",
    }
    write_json(out_dir / "decode.json", summary)
    return summary


def _emitted(exp, record, hyp, at, frames, shift, window) -> list[float]:
    """When each token of ``hyp`` reached the user (module docstring), in seconds."""
    utt_id = record["id"]
    n = frames.get(utt_id, 0)
    duration = record.get("duration") or (max(n - 1, 0) * shift + window if n else 0.0)
    if utt_id not in at:  # offline, or not decoded: the utterance's end
        return [duration] * len(hyp)
    length = exp.model.output_frames(n)
    return emission_seconds(exp.model, at[utt_id], length, shift, window, duration)
