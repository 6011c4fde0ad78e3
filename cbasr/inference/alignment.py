"""Forced alignments of reference transcripts: when each label happens, per model family.

- CB models: the Viterbi emission times ``b* = argmax_b P(b, y)`` of eq. (38)
  (:func:`~cbasr.losses.cb_viterbi`, memoryless decoders) and the posteriors ``P(t_l = t | y)``
  (:func:`~cbasr.losses.cb_posteriors`); a label's time is its emission frame.
- CTC: :func:`torchaudio.functional.forced_align` (best path over the alignments that
  collapse to ``y``); a label's time is the first frame of its span, its duration the span.
- RNN-T and HAT: the best path through the transducer lattice (max-product over the lattice of
  :mod:`cbasr.losses.transducer`); a label's time is the frame on which it is emitted.

Times are in seconds: frame ``t`` after subsampling starts at ``t * stride * shift``, with the
feature frame shift (10 ms) and the encoder's subsampling stride. :func:`align_split` writes a
CTM file (``utt channel start duration token``) and, where the manifest has gold phone start
times (``phone_starts``, the synthetic corpus and TIMIT), the onset errors: mean absolute
difference and the share within 20 ms.
"""

import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import torchaudio.functional as AF

from cbasr.data.batching import BucketBatchSampler
from cbasr.data.features import FeatureStore
from cbasr.data.manifest import read_manifest
from cbasr.data.vocab import tokens_of
from cbasr.inference.experiment import (
    MAX_FRAMES,
    Experiment,
    frame_shift_seconds,
    subsampling_stride,
)
from cbasr.losses import cb_posteriors, cb_posteriors_windowed, cb_viterbi, cb_viterbi_windowed
from cbasr.models import CBModel, CTCModel, TransducerModel
from cbasr.modules.decoders import LabelOrder
from cbasr.progress import progress_bar
from cbasr.storage.files import write_json, write_text

__all__ = [
    "cb_alignment",
    "ctc_alignment",
    "transducer_alignment",
    "Alignment",
    "onset_errors",
    "ctm_entries",
    "write_ctm",
    "plot_posteriors",
    "align_split",
    "align_batch",
]

log = logging.getLogger(__name__)


class Alignment:
    """One utterance's label times, in encoder frames: ``start[l]`` and ``frames[l]`` (duration)."""

    def __init__(self, start: list[int], frames: list[int]):
        self.start, self.frames = start, frames


def _pad_targets(targets: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    lens = torch.tensor([len(t) for t in targets], device=device)
    out = torch.ones(
        len(targets),
        max(1, int(lens.max()) if len(targets) else 1),
        dtype=torch.long,
        device=device,
    )
    for i, t in enumerate(targets):
        if t:
            out[i, : len(t)] = torch.tensor(t, device=device)
    return out, lens


@torch.no_grad()
def cb_alignment(
    model: CBModel, feats: torch.Tensor, feat_lens: torch.Tensor, targets: list[list[int]]
) -> tuple[list[Alignment], torch.Tensor, torch.Tensor]:
    """Viterbi emission times of a CB model with a memoryless or a second-order decoder.

    Returns:
        ``(alignments, posteriors (B, T', L), encoder lengths (B,))``.
    """
    if model.decoder.order is LabelOrder.HISTORY:
        raise ValueError(
            f"CB Viterbi alignment needs label terms that read the current (and previous) emission "
            f"time only; {type(model.decoder).__name__} depends on every earlier one"
        )
    y, y_lens = _pad_targets(targets, feats.device)
    emit_logits, terms, lens = model.terms(feats, feat_lens, y, y_lens)
    if model.decoder.order is LabelOrder.SECOND_ORDER:
        times, _ = cb_viterbi_windowed(emit_logits, terms, lens, y_lens)
        post = cb_posteriors_windowed(emit_logits, terms, lens, y_lens)
    else:
        times, _ = cb_viterbi(emit_logits, terms, lens, y_lens)
        post = cb_posteriors(emit_logits, terms, lens, y_lens)
    out = [
        Alignment(times[b, : int(y_lens[b])].tolist(), [1] * int(y_lens[b]))
        for b in range(len(targets))
    ]
    return out, post, lens


@torch.no_grad()
def ctc_alignment(
    model: CTCModel, feats: torch.Tensor, feat_lens: torch.Tensor, targets: list[list[int]]
) -> list[Alignment]:
    """CTC forced alignment (torchaudio), one utterance at a time (its kernel takes one)."""
    log_probs, lens = model.log_probs(feats, feat_lens)
    out = []
    for b, target in enumerate(targets):
        T = int(lens[b])
        labels, scores = AF.forced_align(
            log_probs[b : b + 1, :T].float().cpu(),
            torch.tensor([target]),
            torch.tensor([T]),
            torch.tensor([len(target)]),
            blank=0,
        )
        spans = AF.merge_tokens(labels[0], scores[0].exp(), blank=0)
        out.append(Alignment([s.start for s in spans], [s.end - s.start for s in spans]))
    return out


def _lattice_weights(
    model: TransducerModel, h, lens, y, y_lens
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(blank (B, T, U + 1), label (B, T, U))`` log weights of the transducer lattice edges
    (padding's label edges: label 1's, never read)."""
    U = y.shape[1]
    labels = F.pad(y, (0, 1)).clamp(min=1)  # (B, U + 1): none after the last
    blank, picked = model.lattice_log_probs(h, model.decoder.history(y), labels)
    return blank, picked[:, :, :U]


@torch.no_grad()
def transducer_alignment(
    model: TransducerModel, feats: torch.Tensor, feat_lens: torch.Tensor, targets: list[list[int]]
) -> list[Alignment]:
    """Best lattice path of each reference: the frame on which each label is emitted."""
    if model.criterion == "tdt":
        raise ValueError("forced alignment of a TDT model (token and duration paths) is not built")
    h, lens = model.encoder(feats, feat_lens)
    y, y_lens = _pad_targets(targets, feats.device)
    blank, label = _lattice_weights(model, h, lens, y, y_lens)
    out = []
    for b, target in enumerate(targets):
        T, U = int(lens[b]), len(target)
        bl, lab = (
            blank[b, :T, : U + 1].double().cpu().numpy(),
            label[b, :T, :U].double().cpu().numpy(),
        )
        if model.monotonic:
            out.append(_monotonic_best_path(bl, lab))
            continue
        # Max-product forward over nodes (t, u); from_label[t, u]: node reached by a label edge.
        best = np.full((T, U + 1), -np.inf)
        from_label = np.zeros((T, U + 1), dtype=bool)
        for t in range(T):
            for u in range(U + 1):
                if t == 0 and u == 0:
                    best[t, u] = 0.0
                    continue
                left = best[t - 1, u] + bl[t - 1, u] if t > 0 else -np.inf
                below = best[t, u - 1] + lab[t, u - 1] if u > 0 else -np.inf
                best[t, u], from_label[t, u] = (below, True) if below > left else (left, False)
        t, u, start = T - 1, U, [0] * U
        while u > 0 or t > 0:
            if from_label[t, u]:
                start[u - 1], u = t, u - 1
            else:
                t -= 1
        out.append(Alignment(start, [1] * U))
    return out


def _monotonic_best_path(blank: np.ndarray, label: np.ndarray) -> Alignment:
    """The best path of the one-label-per-frame lattice (:mod:`cbasr.losses.transducer`) from
    ``blank (T, U + 1)`` and ``label (T, U)`` log weights: a label edge leaves ``(t, u)`` for
    ``(t + 1, u + 1)``, so each label's frame is the frame of its edge."""
    T, U = label.shape
    if U > T:
        raise ValueError(
            f"{U} labels in {T} frames: the one-label-per-frame transducer emits at most one "
            "label per frame"
        )
    # best[t, u]: the best path to node (t, u); from_label[t, u]: reached by a label edge.
    best = np.full((T + 1, U + 1), -np.inf)
    from_label = np.zeros((T + 1, U + 1), dtype=bool)
    best[0, 0] = 0.0
    for t in range(T):
        stay = best[t] + blank[t]
        climb = np.concatenate([[-np.inf], best[t, :-1] + label[t]])
        from_label[t + 1] = climb > stay
        best[t + 1] = np.maximum(stay, climb)
    start, u = [0] * U, U
    for t in range(T, 0, -1):
        if from_label[t, u]:
            start[u - 1], u = t - 1, u - 1
    return Alignment(start, [1] * U)


def onset_errors(start_seconds: list[float], gold_seconds: list[float]) -> list[float]:
    """``|start - gold|`` per label (seconds)."""
    if len(start_seconds) != len(gold_seconds):
        raise ValueError(
            f"{len(start_seconds)} aligned labels but {len(gold_seconds)} gold start times"
        )
    return [abs(a - b) for a, b in zip(start_seconds, gold_seconds)]


def ctm_entries(
    utt_id: str, alignment: Alignment, tokens: list[str], period: float
) -> list[tuple[str, float, float, str]]:
    """``(utt, start, duration, token)`` per label: frame ``t`` starts at ``t * period`` seconds."""
    return [
        (utt_id, t * period, n * period, tok)
        for t, n, tok in zip(alignment.start, alignment.frames, tokens)
    ]


def write_ctm(path, entries: list[tuple[str, float, float, str]]) -> None:
    """CTM lines ``utt 1 start duration token`` (seconds, 3 decimals)."""
    write_text(path, "".join(f"{u} 1 {s:.3f} {d:.3f} {tok}\n" for u, s, d, tok in entries))


def plot_posteriors(
    posteriors: np.ndarray,
    tokens: list[str],
    period: float,
    path,
    viterbi: list[int] | None = None,
    gold: list[float] | None = None,
    title: str = "",
) -> None:
    """Heat map of ``P(t_l = t | y)`` (labels up, time across) with the Viterbi emission frames
    (white circles) and the gold phone starts (red crosses), saved as PNG.

    Args:
        posteriors: ``(T, L)``; period: seconds per frame; gold: seconds per label.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T, L = posteriors.shape
    fig, ax = plt.subplots(figsize=(max(6.0, T * 0.06), max(3.0, L * 0.22)))
    image = ax.imshow(
        posteriors.T,
        origin="lower",
        aspect="auto",
        cmap="viridis",
        vmin=0.0,
        vmax=1.0,
        extent=(0.0, T * period, -0.5, L - 0.5),
        interpolation="nearest",
    )
    labels = range(L)
    if viterbi is not None:
        ax.scatter(
            [(t + 0.5) * period for t in viterbi],
            labels,
            s=18,
            facecolors="none",
            edgecolors="white",
            linewidths=1.2,
            label="Viterbi emission frame",
        )
    if gold is not None:
        ax.scatter(
            gold, labels, s=22, marker="x", color="red", linewidths=1.2, label="gold phone start"
        )
    ax.set_yticks(list(labels))
    ax.set_yticklabels(tokens, fontsize=7)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("label")
    ax.set_title(title or "CB alignment posteriors P(t_l = t | y)", fontsize=9)
    ax.legend(loc="upper left", fontsize=7, framealpha=0.6)
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gold(record: dict, tokens: list[str], units: str) -> list[float] | None:
    """The manifest's gold start time of each reference token, if it has them for these units."""
    gold = record.get("phone_starts")
    if gold is None or units not in ("phones", "phones_full") or len(gold) != len(tokens):
        return None
    return gold


def _alignable(exp: Experiment, records: list[dict], store: FeatureStore) -> tuple[list, list]:
    """``(usable [(record, tokens)], skipped [(id, reason)])``: features, known tokens, and
    enough frames for the model's lattice."""
    usable, skipped = [], []
    for r in records:
        if r["id"] not in store:
            skipped.append((r["id"], "no features"))
            continue
        tokens = tokens_of(r, exp.units)
        unknown = [t for t in tokens if t not in exp.vocab]
        reason = (
            f"token {unknown[0]!r} not in the vocabulary"
            if unknown
            else exp.model.check_utterance(store.num_frames(r["id"]), exp.vocab.encode(tokens))
        )
        if reason:
            skipped.append((r["id"], reason))
        else:
            usable.append((r, tokens))
    return usable, skipped


def align_batch(model, feats: torch.Tensor, lens: torch.Tensor, targets: list[list[int]]):
    """``(alignments, CB posteriors (B, T', L) or None, encoder lengths or None)``."""
    if isinstance(model, CBModel):
        return cb_alignment(model, feats, lens, targets)
    if isinstance(model, CTCModel):
        return ctc_alignment(model, feats, lens, targets), None, None
    return transducer_alignment(model, feats, lens, targets), None, None


@torch.no_grad()
def align_split(
    exp: Experiment,
    manifest: str | Path,
    feature_dir: str | Path,
    out_dir: str | Path,
    max_frames: int = MAX_FRAMES,
    plot_utt: str | None = None,
) -> dict:
    """Align every utterance of ``manifest`` to its reference; write ``align.ctm``,
    ``alignment.json`` (onset errors against gold starts where the manifest has them),
    ``skipped.tsv`` and, for CB models, ``posteriors_<utt>.png`` of ``plot_utt`` (default: the
    manifest's first alignable utterance with gold times).

    Returns:
        The summary written to ``alignment.json``.
    """
    model, out_dir = exp.model, Path(out_dir)
    if not isinstance(model, (CBModel, CTCModel, TransducerModel)):
        raise TypeError(f"no forced alignment for {type(model).__name__}")
    store, records = FeatureStore(feature_dir), read_manifest(manifest)
    period = subsampling_stride(model) * frame_shift_seconds(feature_dir)
    usable, skipped = _alignable(exp, records, store)
    if plot_utt is not None and plot_utt not in {r["id"] for r, _ in usable}:
        raise ValueError(f"--plot-utt {plot_utt!r} is not an alignable utterance of {manifest}")
    if plot_utt is None:  # the first utterance of the manifest with gold times (or the first)
        with_gold = [r["id"] for r, tokens in usable if _gold(r, tokens, exp.units) is not None]
        plot_utt = (with_gold or [r["id"] for r, _ in usable] or [None])[0]
    ctm, errors, plotted = [], [], None
    lengths = [store.num_frames(r["id"]) for r, _ in usable]
    batches = list(BucketBatchSampler(lengths, max_frames, shuffle=False)) if usable else []
    for indices in progress_bar(batches, f"aligning {Path(out_dir).name}", unit="batch"):
        feats = [exp.normalise(store[usable[i][0]["id"]]) for i in indices]
        lens = torch.tensor([f.shape[0] for f in feats], device=exp.device)
        padded = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True).to(exp.device)
        targets = [exp.vocab.encode(usable[i][1]) for i in indices]
        aligned, post, enc_lens = align_batch(model, padded, lens, targets)
        for j, (i, a) in enumerate(zip(indices, aligned)):
            record, tokens = usable[i]
            entries = ctm_entries(record["id"], a, tokens, period)
            ctm += entries
            gold = _gold(record, tokens, exp.units)
            if gold is not None:
                errors += onset_errors([e[1] for e in entries], gold)
            if post is not None and record["id"] == plot_utt:
                T = int(enc_lens[j])
                path = out_dir / f"posteriors_{record['id']}.png"
                out_dir.mkdir(parents=True, exist_ok=True)
                plot_posteriors(
                    post[j, :T, : len(tokens)].float().cpu().numpy(),
                    tokens,
                    period,
                    path,
                    a.start,
                    gold,
                    f"{record['id']}: P(t_l = t | y), {exp.exp_dir.name}",
                )
                plotted = str(path)
    ctm.sort(key=lambda e: (e[0], e[1]))
    write_ctm(out_dir / "align.ctm", ctm)
    write_text(out_dir / "skipped.tsv", "".join(f"{u}\t{why}\n" for u, why in skipped))
    summary = {
        "manifest": str(manifest),
        "checkpoint": exp.checkpoint,
        "epoch": exp.epoch,
        "method": {CBModel: "cb_viterbi", CTCModel: "ctc_forced_align"}.get(
            type(model), "transducer_best_path"
        ),
        "frame_period": period,
        "utts": len(usable),
        "skipped": len(skipped),
        "labels_with_gold": len(errors),
        "mean_abs_onset_error_ms": 1000.0 * float(np.mean(errors)) if errors else None,
        "within_20ms": float(np.mean(np.asarray(errors) <= 0.020 + 1e-9)) if errors else None,
        "plot": plotted,
    }
    write_json(out_dir / "alignment.json", summary)
    return summary
