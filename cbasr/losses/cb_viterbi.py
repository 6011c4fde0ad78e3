"""The CB Viterbi alignment: the most likely emission times ``argmax_b P(b, y)`` over the
eq. (38) lattice of :mod:`cbasr.losses.conditional_bernoulli` (CB paper, Robertson 2020, "The
Conditional Bernoulli and its Application to Speech Recognition", the Viterbi extension named
after eq. 40), a max-product pass and a backtrace."""

import numpy as np
import torch
import torch.nn.functional as F

from cbasr.losses._cb_kernel import _lattice_backend
from cbasr.losses.conditional_bernoulli import _cb_weights, _check_cb_inputs, _shift_labels

__all__ = ["cb_viterbi"]

_NEG_INF = float("-inf")


@torch.no_grad()
def _viterbi_pass(
    emit_t: torch.Tensor, target_lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The max-product pass over the shifted weights ``emit_t`` ``(T, B, L)``: ``emitted``
    ``(T, B, L + 1)``, whether the best way into state ``s`` (``s`` labels emitted) after
    frame ``t`` emitted there (ties stay), and the best path's score ``(B,)``."""
    T, B, L = emit_t.shape
    arrive = F.pad(emit_t, (1, 0), value=_NEG_INF)  # (T, B, L + 1)
    score = emit_t.new_full((B, L + 2), _NEG_INF)  # column l + 1: best score with l emitted
    score[:, 1] = 0.0
    emitted = torch.empty(T, B, L + 1, dtype=torch.bool, device=emit_t.device)
    came_from, stay_at = score[:, :-1], score[:, 1:]
    arrive, emitted_at = arrive.unbind(0), emitted.unbind(0)
    step = emit_t.new_empty(B, L + 1)
    for t in range(T):
        torch.add(came_from, arrive[t], out=step)
        torch.gt(step, stay_at, out=emitted_at[t])
        torch.maximum(stay_at, step, out=stay_at)
    lengths = target_lengths.to(emit_t.device)
    return emitted, score[torch.arange(B, device=emit_t.device), lengths + 1]


def cb_viterbi(
    emit_logits: torch.Tensor,
    label_log_probs: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Most likely emission times ``b* = argmax_b P(b, y)`` (the Viterbi extension the CB paper
    names after eq. 40), by a max-product pass over the eq. (38) lattice and a backtrace.

    Ties are broken towards earlier emission times.

    Args:
        emit_logits, label_log_probs, input_lengths, target_lengths: as
            :func:`cb_marginal_nll`.

    Returns:
        ``times``: ``(B, L)`` int64, 0-based frame at which label ``l`` is emitted, strictly
        increasing over ``l < L_b``; ``-1`` at padded labels and for utterances with no
        alignment.
        ``log_prob``: ``(B,)`` ``log P(b*, y)``; ``-inf`` where no alignment exists.
    """
    _check_cb_inputs(emit_logits, label_log_probs, input_lengths, target_lengths)
    input_lengths, target_lengths = input_lengths.long(), target_lengths.long()
    stay, emit = _cb_weights(emit_logits, label_log_probs, input_lengths, target_lengths)
    emit_t, shift = _shift_labels(emit)  # (T, B, L), (B,)
    T, B, L = emit_t.shape
    if _lattice_backend(emit_logits, label_log_probs) == "triton":
        from cbasr.losses import _cb_triton

        emitted, best = _cb_triton.viterbi(emit_t, target_lengths)
    else:
        emitted, best = _viterbi_pass(emit_t, target_lengths)
    lengths = target_lengths.to(emit.device)
    log_prob = best + shift + stay  # (B,)

    # Backtrace on the host: T steps of small index updates.
    emitted_np = emitted.cpu().numpy()  # (T, B, L + 1)
    state = lengths.cpu().numpy().astype(np.int64).copy()  # (B,) labels emitted so far
    times = np.full((B, L), -1, dtype=np.int64)
    rows = np.arange(B)
    for t in range(T - 1, -1, -1):
        hit = rows[emitted_np[t, rows, state]]
        times[hit, state[hit] - 1] = t
        state[hit] -= 1
    times = torch.from_numpy(times).to(emit.device)
    times[torch.isneginf(log_prob)] = -1
    return times, log_prob
