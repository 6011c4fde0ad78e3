"""Pieces the time-synchronous prefix searches share (CB, CTC, transducers).

Each frame, every kept hypothesis (a label prefix, ``K`` rows per utterance) proposes ``V``
candidates: column 0 keeps its prefix, column ``v`` extends it by label ``v``. The candidates of
an utterance are one row of a ``(B, K V)`` score matrix; :func:`select` keeps the best ``K``
(CB paper footnote 5: ``V + 1`` extensions per stored prefix and frame, counting the blank).
Before that, candidates that reach the same prefix along different alignments are merged by
summing their probabilities (:func:`extension_pairs` finds them).
"""

import math
from collections import defaultdict

import torch

from cbasr.search.hypotheses import BeamSearchOptions, Hypothesis

__all__ = [
    "extension_pairs",
    "prefix_groups",
    "select",
    "PrefixScores",
    "fused_extensions",
    "next_scores",
    "next_prefixes",
    "finalize",
]

_NEG_INF = float("-inf")


def extension_pairs(
    prefixes: list, batch: int, width: int
) -> tuple[list[int], list[int], list[int]]:
    """Rows whose prefix is another row's prefix extended by one label.

    Args:
        prefixes: ``B K`` tuples (``None`` for dead rows), row ``b K + k``.

    Returns:
        ``(rows, parents, labels)``: row ``rows[i]`` holds ``prefixes[parents[i]] + (labels[i],)``,
        both rows of the same utterance.
    """
    rows, parents, labels = [], [], []
    for b in range(batch):
        table = {}
        for r in range(b * width, (b + 1) * width):
            if prefixes[r] is not None:
                table.setdefault(prefixes[r], r)
        for prefix, r in table.items():
            if prefix and prefix[:-1] in table:
                rows.append(r)
                parents.append(table[prefix[:-1]])
                labels.append(prefix[-1])
    return rows, parents, labels


def prefix_groups(prefixes: list, batch: int, width: int) -> list[list[int]]:
    """Groups of two or more live rows of one utterance with equal prefixes."""
    groups = []
    for b in range(batch):
        table = defaultdict(list)
        for r in range(b * width, (b + 1) * width):
            if prefixes[r] is not None:
                table[prefixes[r]].append(r)
        groups += [rows for rows in table.values() if len(rows) > 1]
    return groups


def select(
    total: torch.Tensor, beam: int | None, stable: bool = False
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The best candidates of each utterance.

    Args:
        total: ``(B, C)`` fused candidate scores, ``-inf`` for impossible ones.
        beam: how many to keep; ``None``: every finite one.
        stable: of equal scores keep the first (a stable sort; ``topk`` keeps either), so
            that two layouts of the same candidates in the same order choose alike.

    Returns:
        ``(values (B, W), index (B, W), W)``; ``W = beam`` (``None``: the largest number of
        finite candidates of an utterance), at most ``C``; utterances with fewer finite
        candidates fill up with ``-inf``.
    """
    width = beam
    if beam is None:  # the one read of the device here
        width = int(torch.isfinite(total).sum(dim=1).max()) if total.numel() else 0
    width = max(1, min(width, total.shape[1]))
    values, index = total.topk(width, dim=1)
    if stable:
        index = _first_of_equals(total, values[:, -1:], width)
        values, order = total.gather(1, index).sort(dim=1, descending=True, stable=True)
        index = index.gather(1, order)
    return values, index, width


def _first_of_equals(total: torch.Tensor, kth: torch.Tensor, width: int) -> torch.Tensor:
    """``(B, width)`` positions of each row's ``width`` best candidates, in increasing order,
    those equal to the ``width``-th best ``kth (B, 1)`` the first ones: what a stable sort
    keeps, without sorting the ``B (M + K (V - 1))`` candidates (the sort's cost against
    ``topk``'s: recipes/synth/RESULTS.md, "Measurements behind defaults")."""
    above = total > kth
    equal = total == kth
    need = width - above.sum(dim=1, keepdim=True)
    take = above | (equal & (equal.cumsum(dim=1) <= need))
    slot = torch.where(take, take.cumsum(dim=1) - 1, width)  # width: a column thrown away
    positions = torch.arange(total.shape[1], device=total.device).expand_as(total)
    index = total.new_zeros(total.shape[0], width + 1, dtype=torch.long)
    return index.scatter_(1, slot, positions)[:, :width]


class PrefixScores:
    """Per-row running scores of a beam: model, LM and fused prefix terms.

    Attributes:
        am: ``(N,)`` log probability mass of the row's alignments (``-inf``: a dead row).
        fused: ``(N,)`` the prefix-only part of the ranking score: ``lm_weight * lm +
            label_bonus * |y| - ilm_weight * ilm``.
        lm, ilm: ``(N,)`` unweighted LM and internal-LM log probabilities of the prefix.
    """

    def __init__(self, rows: int, dtype: torch.dtype, device):
        self.am = torch.full((rows,), _NEG_INF, dtype=dtype, device=device)
        self.fused = torch.zeros(rows, dtype=dtype, device=device)
        self.lm = torch.zeros(rows, dtype=dtype, device=device)
        self.ilm = torch.zeros(rows, dtype=dtype, device=device)


def fused_extensions(
    fused: torch.Tensor,
    options: BeamSearchOptions,
    labels: int,
    lm_lp: torch.Tensor | None = None,
    ilm_lp: torch.Tensor | None = None,
) -> torch.Tensor:
    """The prefix-only score of every one-label extension of every row, ``(N, V - 1)``:
    ``fused + label_bonus + lm_weight * log P_LM(v | y) - ilm_weight * log P_ILM(v | y)``.

    Args:
        fused: ``(N,)`` the rows' prefix scores; labels: ``V - 1``.
        lm_lp, ilm_lp: ``(N, V - 1)`` or None.
    """
    extend = (fused + options.label_bonus)[:, None].expand(-1, labels)
    if lm_lp is not None:
        extend = extend + options.lm_weight * lm_lp
    if ilm_lp is not None:
        extend = extend - options.ilm_weight * ilm_lp
    return extend


def _picked(values: torch.Tensor, parent: torch.Tensor, label_col: torch.Tensor) -> torch.Tensor:
    """``values[parent[i], label_col[i]]``: ``(N, V - 1)`` -> ``(N',)``."""
    return values[parent].gather(1, label_col).squeeze(1)


def next_scores(
    scores: PrefixScores,
    parent: torch.Tensor,
    emitted: torch.Tensor,
    label: torch.Tensor,
    am: torch.Tensor,
    extend: torch.Tensor,
    lm_lp: torch.Tensor | None = None,
    ilm_lp: torch.Tensor | None = None,
) -> PrefixScores:
    """The scores of the kept candidates: each row continues row ``parent`` of ``scores``,
    extended by ``label`` where ``emitted``.

    Args:
        scores: the ``N`` current rows.
        parent, emitted, label: ``(N',)`` for the kept candidates (``label`` a valid id everywhere).
        am: ``(N',)`` their model scores, already computed (``-inf`` for dead rows).
        extend: ``(N, V - 1)`` the fused prefix score of each extension.
        lm_lp, ilm_lp: ``(N, V - 1)`` unweighted LM and internal-LM log probabilities, or None.
    """
    label_col = (label - 1)[:, None]
    new = PrefixScores(0, scores.am.dtype, scores.am.device)
    new.am = am
    new.fused = torch.where(emitted, _picked(extend, parent, label_col), scores.fused[parent])
    new.lm, new.ilm = scores.lm[parent], scores.ilm[parent]
    if lm_lp is not None:
        new.lm = new.lm + torch.where(emitted, _picked(lm_lp, parent, label_col), 0.0)
    if ilm_lp is not None:
        new.ilm = new.ilm + torch.where(emitted, _picked(ilm_lp, parent, label_col), 0.0)
    return new


def next_prefixes(
    prefixes: list, parent: torch.Tensor, label: torch.Tensor, alive: torch.Tensor
) -> list:
    """The kept candidates' label prefixes (host side, a few hundred tuples per frame): the
    parent's, extended by ``label`` where it is positive (0: no label); ``None`` where dead.
    The three may be tensors or lists already read on the host."""
    host = [x.tolist() if isinstance(x, torch.Tensor) else x for x in (parent, label, alive)]
    return [
        None if not ok else (prefixes[p] + (v,) if v > 0 else prefixes[p])
        for p, v, ok in zip(*host)
    ]


def finalize(
    prefixes: list,
    am: torch.Tensor,
    fused: torch.Tensor,
    lm: torch.Tensor,
    ilm: torch.Tensor,
    eos: torch.Tensor | None,
    batch: int,
    width: int,
    options: BeamSearchOptions,
) -> list[list[Hypothesis]]:
    """Final n-best lists: rows with equal prefixes summed (second-order CB keeps several rows
    per prefix), the LM's end of sentence added, length normalisation applied, best first.

    Args:
        prefixes: ``B K`` tuples or ``None``.
        am, fused, lm, ilm: ``(B K,)`` row scores (see :class:`PrefixScores`).
        eos: ``(B K,)`` ``log P_LM(</s> | prefix)``, or None without an LM.
    """
    am, fused, lm, ilm = am.tolist(), fused.tolist(), lm.tolist(), ilm.tolist()
    eos = eos.tolist() if eos is not None else None
    out = []
    for b in range(batch):
        merged: dict[tuple, list[int]] = defaultdict(list)
        for r in range(b * width, (b + 1) * width):
            if prefixes[r] is not None and am[r] > _NEG_INF:
                merged[prefixes[r]].append(r)
        hyps = []
        for prefix, rows in merged.items():
            total_am = _log_sum([am[r] for r in rows])
            r = rows[0]
            end = eos[r] if eos is not None else 0.0
            score = options.am_weight * total_am + fused[r] + options.lm_weight * end
            if options.length_norm:
                score /= max(len(prefix), 1)
            hyps.append(Hypothesis(list(prefix), score, total_am, lm[r] + end, ilm[r]))
        hyps.sort(key=lambda h: h.score, reverse=True)
        out.append(hyps if options.nbest is None else hyps[: options.nbest])
    return out


def _log_sum(values: list[float]) -> float:
    top = max(values)
    if top == _NEG_INF:
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))
