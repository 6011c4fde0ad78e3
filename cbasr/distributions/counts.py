"""Count functions ``C(v, S; w)`` of the CB paper, eq. (8), in log space.

``C(v, S; w)`` sums the products of ``v`` distinct odds ``w_t = exp(logit_t)`` from a set of
frames ``S``: the elementary symmetric polynomial of degree ``v``, a generalised binomial
coefficient (all ``w_t = 1`` gives ``C(|S|, v)``). Every Conditional Bernoulli quantity is a
ratio of counts over a prefix or a suffix of the frames (eqs. 9-16).

These functions return the counts themselves, computed by the recursion of
:mod:`cbasr.distributions._tables` (T serial steps, vectorised over the batch and counts).
Frames are 0-based: frame ``t`` here is frame ``t + 1`` of the paper.
"""

import torch

from cbasr.distributions._arguments import broadcast_arguments, frame_mask
from cbasr.distributions._dispatch import count_table

__all__ = ["log_count", "log_count_prefix", "log_count_suffix"]

_NEG_INF = float("-inf")


def _count_weights(logits: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_off, log_on) = (0, logit)`` on valid frames: the recursion then counts eq. (8)."""
    log_off = torch.zeros_like(logits)
    log_on = torch.where(valid, logits, _NEG_INF)
    return log_off, log_on


def log_count(logits: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """``log C(v, I; w)`` of eq. (8) for ``v = 0..T``, with ``w_t = exp(logits_t)``.

    ``C(v, I; w)`` sums ``prod_{a in A} w_a`` over the subsets ``A`` of ``v`` existing frames.
    O(T^2) work and memory per row, T serial steps.

    Args:
        logits: ``(*, T)`` log odds; finite or ``-inf`` (a frame that never fires).
        lengths: ``(*,)`` number of existing frames; frames ``t >= lengths`` are ignored.

    Returns:
        ``(*, T + 1)``; ``-inf`` for ``v > lengths``. Differentiable.
    """
    args = broadcast_arguments(logits, None, lengths)
    T = args.logits.shape[-1]
    log_off, log_on = _count_weights(args.logits, frame_mask(args.lengths, T))
    table = count_table(log_off, log_on, T + 1)
    return table[T].reshape(args.batch_shape + (T + 1,))  # (B, T + 1) -> (*, T + 1)


def log_count_prefix(
    logits: torch.Tensor, lengths: torch.Tensor | None = None, max_count: int | None = None
) -> torch.Tensor:
    """Prefix counts ``log C(v, A_t; w)``, ``A_t`` = the first ``t`` frames (eq. 8, 15).

    Args:
        logits: ``(*, T)`` log odds.
        lengths: ``(*,)`` number of existing frames.
        max_count: ``K``, the largest count kept (default ``T``).

    Returns:
        ``(*, T + 1, K + 1)``; entry ``[t, v] = log C(v, {frames 0..t-1})``.
    """
    return _log_count_table(logits, lengths, max_count, suffix=False)


def log_count_suffix(
    logits: torch.Tensor, lengths: torch.Tensor | None = None, max_count: int | None = None
) -> torch.Tensor:
    """Suffix counts ``log C(v, A_t^c; w)``, ``A_t^c`` = frames ``t..T-1`` (eqs. 9-15).

    These are the "future" counts of the draft (eq. 9), ID-checking (eq. 11) and bounded
    (eq. 13) steps: e.g. the ID-checking step at frame ``t`` with ``r`` highs still to place
    is ``w_t * C(r - 1, A_{t+1}^c) / C(r, A_t^c)`` in this indexing.

    Args:
        logits: ``(*, T)`` log odds.
        lengths: ``(*,)`` number of existing frames (padding counts as absent).
        max_count: ``K``, the largest count kept (default ``T``).

    Returns:
        ``(*, T + 1, K + 1)``; entry ``[t, v] = log C(v, {frames t..T-1})``; row ``T`` is the
        empty set (``0`` at ``v = 0``, ``-inf`` elsewhere).
    """
    return _log_count_table(logits, lengths, max_count, suffix=True)


def _log_count_table(logits, lengths, max_count, suffix):
    args = broadcast_arguments(logits, None, lengths)
    T = args.logits.shape[-1]
    num_states = T + 1 if max_count is None else min(max_count, T) + 1
    log_off, log_on = _count_weights(args.logits, frame_mask(args.lengths, T))
    table = count_table(log_off, log_on, num_states, suffix=suffix)
    table = table.transpose(0, 1)  # (T + 1, B, V) -> (B, T + 1, V)
    return table.reshape(args.batch_shape + table.shape[1:])
