"""The RNN-T / HAT lattice of :mod:`cbasr.losses.transducer` as one compiled CPU loop
(package-internal).

The same forward-backward over masked edge weights as ``_TransducerForwardBackward`` (HAT
paper eq. 4's edges; the RNN-T recursion), in float64 whatever the input precision. Along a
frame the recursion is a scan over ``u`` (``alpha(t, u)`` needs ``alpha(t, u - 1)``), so the
utterances are the vector lanes: the tables are laid out ``(t, u, b)`` and every state update,
a :func:`cbasr._compiled.log_add_exp64`, runs for all ``B`` utterances at once.
"""

import numpy as np
import torch

from cbasr._compiled import exp64, jit, log_add_exp64

__all__: list[str] = []  # package-internal

_NEG_INF = -np.inf


@jit
def _lattice(blank, emit, target_lengths, want_posteriors, log_p, post_blank, post_emit):
    """``log_p[b] = log P(y)`` and, if ``want_posteriors``, the edge posteriors.

    ``blank``: ``(T, U + 1, B)``, masked (0 on padded frames, ``-inf`` beyond ``U_b``);
    ``emit``: ``(T, U, B)``, ``-inf`` where masked; outputs in the same layouts. Every path
    ends at node ``(T, U_b)``: padded frames pass down for free and emit nothing.
    """  # pragma: no cover - compiled
    T, U1, B = blank.shape
    U = U1 - 1
    # Indexed in place: no row views inside the loops (a view per (t, u) costs more than the
    # B lanes of arithmetic it serves).
    alpha = np.full((T + 1, U1, B), _NEG_INF)
    alpha[0, 0, :] = 0.0
    for t in range(T + 1):
        if t > 0:  # from the frame above, by its blank
            for u in range(U1):
                for b in range(B):
                    alpha[t, u, b] = alpha[t - 1, u, b] + blank[t - 1, u, b]
        if t == T:
            break
        for u in range(1, U1):  # from the left, by emitting label u - 1 at frame t
            for b in range(B):
                alpha[t, u, b] = log_add_exp64(
                    alpha[t, u, b], alpha[t, u - 1, b] + emit[t, u - 1, b]
                )
    for b in range(B):
        log_p[b] = alpha[T, target_lengths[b], b]
    if not want_posteriors:
        return
    beta = np.full((T + 1, U1, B), _NEG_INF)
    for b in range(B):
        beta[T, target_lengths[b], b] = 0.0
    z = np.empty(B)  # no path: log P := 0, and every posterior is exp(-inf) = 0
    for b in range(B):
        z[b] = 0.0 if log_p[b] == _NEG_INF else log_p[b]
    for t in range(T - 1, -1, -1):
        for b in range(B):  # u = U: only the blank
            via_blank = blank[t, U, b] + beta[t + 1, U, b]
            beta[t, U, b] = via_blank
            post_blank[t, U, b] = exp64(alpha[t, U, b] + via_blank - z[b])
        for u in range(U - 1, -1, -1):
            for b in range(B):
                via_blank = blank[t, u, b] + beta[t + 1, u, b]
                via_emit = emit[t, u, b] + beta[t, u + 1, b]
                beta[t, u, b] = log_add_exp64(via_blank, via_emit)
                post_blank[t, u, b] = exp64(alpha[t, u, b] + via_blank - z[b])
                post_emit[t, u, b] = exp64(alpha[t, u, b] + via_emit - z[b])


def transducer_lattice(
    blank: torch.Tensor, emit: torch.Tensor, target_lengths: torch.Tensor, posteriors: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``log P(y)`` ``(B,)`` in float64 and, if ``posteriors``, the blank and emission edge
    posteriors ``(B, T, U + 1)`` and ``(B, T, U)`` (``= d log P / d weight``) in the inputs'
    dtype. ``blank`` and ``emit`` are the masked CPU float32/float64 weights of
    ``_TransducerForwardBackward``; they are read, not differentiated."""
    B, T, U1 = blank.shape
    blank_n = blank.detach().permute(1, 2, 0).contiguous()  # (T, U + 1, B)
    emit_n = emit.detach().permute(1, 2, 0).contiguous()  # (T, U, B)
    log_p = torch.empty(B, dtype=torch.float64)
    post_blank = torch.empty_like(blank_n) if posteriors else blank_n.new_empty(0, 0, 0)
    post_emit = torch.empty_like(emit_n) if posteriors else emit_n.new_empty(0, 0, 0)
    _lattice(
        blank_n.numpy(),
        emit_n.numpy(),
        target_lengths.to(torch.int64).contiguous().numpy(),
        posteriors,
        log_p.numpy(),
        post_blank.numpy(),
        post_emit.numpy(),
    )
    if not posteriors:
        return log_p, None, None
    return log_p, post_blank.permute(2, 0, 1), post_emit.permute(2, 0, 1)
