"""The RNN-T / HAT lattice of :mod:`cbasr.losses.transducer` as one compiled CPU loop
(package-internal).

The same forward-backward over masked edge weights as ``_TransducerForwardBackward`` (HAT
paper eq. 4's edges; the RNN-T recursion), in float64 whatever the input precision. Along a
frame the recursion is a scan over ``u`` (``alpha(t, u)`` needs ``alpha(t, u - 1)``), so the
utterances are the vector lanes: the tables are laid out ``(t, u, b)`` and every state update,
a :func:`cbasr._compiled.log_add_exp64`, runs for all ``B`` utterances at once.

Also the two joint-sized passes of ``gather_logsumexp``: each row's log-sum-exp, and the
gradient ``exp(x - lse) * weight``, one compiled loop per row in the input's precision
(:func:`cbasr._compiled.exp32` for float32: 8 lanes), with the PyTorch path's exponent floor;
the rows are split over as many threads as PyTorch uses (the loops release the GIL).
"""

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import torch
from numba.extending import overload

from cbasr._compiled import exp32, exp64, jit, log_add_exp64

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
    return _run_lattice(_lattice, blank, emit, target_lengths, posteriors)


@jit
def _monotonic(blank, emit, target_lengths, want_posteriors, log_p, post_blank, post_emit):
    """:func:`_lattice` for the one-label-per-frame topology: a label edge leaves ``(t, u)``
    for ``(t + 1, u + 1)``. Same layouts and masking; every path ends at ``(T, U_b)``.
    """  # pragma: no cover - compiled
    T, U1, B = blank.shape
    alpha = np.full((T + 1, U1, B), _NEG_INF)
    alpha[0, 0, :] = 0.0
    for t in range(T):
        for b in range(B):
            alpha[t + 1, 0, b] = alpha[t, 0, b] + blank[t, 0, b]
        for u in range(1, U1):
            for b in range(B):
                alpha[t + 1, u, b] = log_add_exp64(
                    alpha[t, u, b] + blank[t, u, b], alpha[t, u - 1, b] + emit[t, u - 1, b]
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
    U = U1 - 1
    for t in range(T - 1, -1, -1):
        for b in range(B):  # u = U: only the blank
            via_blank = blank[t, U, b] + beta[t + 1, U, b]
            beta[t, U, b] = via_blank
            post_blank[t, U, b] = exp64(alpha[t, U, b] + via_blank - z[b])
        for u in range(U):
            for b in range(B):
                via_blank = blank[t, u, b] + beta[t + 1, u, b]
                via_emit = emit[t, u, b] + beta[t + 1, u + 1, b]
                beta[t, u, b] = log_add_exp64(via_blank, via_emit)
                post_blank[t, u, b] = exp64(alpha[t, u, b] + via_blank - z[b])
                post_emit[t, u, b] = exp64(alpha[t, u, b] + via_emit - z[b])


def _run_lattice(kernel, blank, emit, target_lengths, posteriors):
    """Lay the weights out ``(t, u, b)``, run ``kernel``, and return ``log P`` and the
    posteriors in ``(B, ...)`` layouts."""
    blank_n = blank.detach().permute(1, 2, 0).contiguous()  # (T, U + 1, B)
    emit_n = emit.detach().permute(1, 2, 0).contiguous()  # (T, U, B)
    log_p = torch.empty(blank.shape[0], dtype=torch.float64)
    post_blank = torch.empty_like(blank_n) if posteriors else blank_n.new_empty(0, 0, 0)
    post_emit = torch.empty_like(emit_n) if posteriors else emit_n.new_empty(0, 0, 0)
    kernel(
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


def monotonic_lattice(
    blank: torch.Tensor, emit: torch.Tensor, target_lengths: torch.Tensor, posteriors: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`transducer_lattice` over the one-label-per-frame lattice."""
    return _run_lattice(_monotonic, blank, emit, target_lengths, posteriors)


# ---- the joint's log-sum-exp and its gradient (gather_logsumexp) ---------------------------


def _exp(x):
    """``exp(x)``; compiled code gets the typed version below, in the argument's precision."""
    return math.exp(x)


@overload(_exp, inline="always")
def _exp_typed(x):
    """``exp`` in the argument's precision: :func:`exp32` for float32, else :func:`exp64`."""
    if x == numba.types.float32:
        return lambda x: exp32(x)
    return lambda x: exp64(x)


@jit(fastmath=frozenset({"contract", "reassoc"}))  # reassoc: the row sums vectorise
def _row_logsumexp(rows, start, floor, first, stop, lse):  # pragma: no cover - compiled
    """``lse[i] = top + log sum_{v >= start} exp(max(rows[i, v] - top, floor))`` for rows
    ``first:stop``, in the rows' precision: ``top`` is the row's maximum (0 when it is not
    finite), ``floor`` the PyTorch path's (``_exp_floor``): both paths give an all ``-inf``
    row the same finite, very negative normaliser."""
    V = rows.shape[1]
    for i in range(first, stop):
        x = rows[i, start:]
        top = x[0]
        for v in range(1, V - start):
            top = x[v] if x[v] > top else top
        zero = top - top  # 0 in the rows' precision when top is finite
        if not zero == 0:
            top = floor - floor
        total = floor - floor
        for v in range(V - start):
            d = x[v] - top
            total += _exp(floor if d < floor else d)
        lse[i] = top + np.log(total)


@jit
def _row_softmax(rows, start, shift, weight, floor, first, stop, grad):  # pragma: no cover
    """``grad[i, v] = exp(max(rows[i, v] - shift[i], floor)) * weight[i]`` for ``v >= start``
    (0 before ``start`` and on rows of weight 0), rows ``first:stop``."""
    V = rows.shape[1]
    for i in range(first, stop):
        out = grad[i]
        g = weight[i]
        for v in range(start):
            out[v] = 0
        if g == 0:
            for v in range(start, V):
                out[v] = 0
            continue
        x, s = rows[i], shift[i]
        for v in range(start, V):
            d = x[v] - s
            out[v] = _exp(floor if d < floor else d) * g


_POOL: dict[int, ThreadPoolExecutor] = {}  # by worker count; emptied in a forked child


def _forget_pools() -> None:
    _POOL.clear()  # a forked child has the executors but not their threads


os.register_at_fork(after_in_child=_forget_pools)


def _split_rows(function, rows: int, *args) -> None:
    """``function(*args[:-1], first, stop, args[-1])`` over row ranges, on as many threads as
    PyTorch uses (the compiled loops release the GIL), one range each."""
    workers = max(1, min(torch.get_num_threads(), rows // 256))
    if workers == 1:
        function(*args[:-1], 0, rows, args[-1])
        return
    bounds = [rows * k // workers for k in range(workers + 1)]
    pool = _POOL.get(workers) or _POOL.setdefault(workers, ThreadPoolExecutor(workers))
    futures = [
        pool.submit(function, *args[:-1], bounds[k], bounds[k + 1], args[-1])
        for k in range(workers)
    ]
    for future in futures:
        future.result()


def row_logsumexp(rows: torch.Tensor, start: int, floor: float) -> torch.Tensor:
    """``logsumexp(rows[:, start:], -1)``, each exponent at least ``floor``, for a contiguous
    CPU float32/float64 ``(N, V)`` tensor (``start < V``), in its dtype."""
    lse = rows.new_empty(rows.shape[0])
    x = rows.numpy()
    _split_rows(_row_logsumexp, rows.shape[0], x, start, x.dtype.type(floor), lse.numpy())
    return lse


def row_softmax(
    rows: torch.Tensor, start: int, shift: torch.Tensor, weight: torch.Tensor, floor: float
) -> torch.Tensor:
    """``exp(max(rows[:, start:] - shift[:, None], floor)) * weight[:, None]`` (zeros before
    ``start`` and on rows of weight 0) in the dtype of ``rows``: the log-sum-exp's gradient,
    in one pass."""
    grad = torch.empty_like(rows)
    x = rows.numpy()
    _split_rows(
        _row_softmax,
        rows.shape[0],
        x,
        start,
        shift.to(rows.dtype).contiguous().numpy(),
        weight.to(rows.dtype).contiguous().numpy(),
        x.dtype.type(floor),
        grad.numpy(),
    )
    return grad
