"""The transducer lattice of :func:`cbasr.losses.transducer_lattice_nll` as Triton kernels
(package-internal): the ``triton`` backend of :mod:`cbasr._backends`, for RNN-T and HAT alike
(both reduce to per-node blank and label log-weights) and for both topologies.

One program per utterance runs the whole recursion over the nodes ``(t, u)``, ``t <= T``,
``u <= U``, level by level, each level a vector over ``u``:

- standard topology (Graves 2012; HAT paper eq. 4): a label edge goes ``(t, u) -> (t, u + 1)``,
  so the level is the anti-diagonal ``n = t + u`` (``T + U + 1`` levels):
  ``alpha(t, u) = logaddexp(alpha(t - 1, u) + blank(t - 1, u), alpha(t, u - 1) + emit(t, u - 1))``;
- one label per frame (``MONOTONIC``): a label edge goes ``(t, u) -> (t + 1, u + 1)``, so the
  level is the frame (``T + 1`` levels):
  ``alpha(t, u) = logaddexp(alpha(t - 1, u) + blank(t - 1, u), alpha(t - 1, u - 1) + emit(t - 1, u - 1))``.

Row ``T`` is reached by blanks only, and ``log P(y) = alpha(T, U_b)``: padded frames (blank
weight 0, label weight ``-inf``) pass every path down unchanged. The weights are the
reference's, masked and shifted (:mod:`cbasr.losses.transducer`). A level lives in registers:
both topologies read the previous level at ``u`` and at ``u - 1`` (forward) or ``u + 1``
(backward), the shifted read a ``tl.gather`` (through shared memory on a GPU), so no step waits
on global memory, and the next level's weights are loaded while this level computes. The
forward kernel stores the ``(T + 1, U + 1)`` table of forward variables for the backward pass;
the backward kernel walks the levels the other way and writes each node's edge posteriors (the
gradient of ``log P(y)``) as it goes, storing no table of its own.

The joint's rows enter through :func:`row_logsumexp` and :func:`row_softmax`, the fused
log-softmax of :func:`cbasr.losses.gather_logsumexp`: one pass over the joint forward
(each row's normaliser, an online log-sum-exp over blocks of columns) and one backward (the
softmax times each row's weight, written straight into the gradient), with no joint-sized
temporary in either. A program takes a tile of rows; half-precision rows are read into float32.

Importing this module needs Triton; set ``TRITON_INTERPRET=1`` first to run the kernels on
CPU tensors in Triton's interpreter (the tests do).
"""

import math

import torch
import triton
import triton.language as tl

from cbasr._triton import block as _block
from cbasr._triton import log_add_exp as _log_add_exp
from cbasr._triton import softplus as _softplus

__all__: list[str] = []  # package-internal


@triton.jit
def _level(n, u, MONOTONIC: tl.constexpr):  # pragma: no cover - compiled (or interpreted)
    """The frames ``t`` of level ``n``'s nodes ``(t, u)`` (one per ``u``)."""
    if MONOTONIC:
        return tl.zeros_like(u) + n
    else:
        return n - u


@triton.jit
def _forward_edges(n, u, inside, T, MONOTONIC: tl.constexpr):  # pragma: no cover - compiled
    """Level ``n`` of the forward pass: its nodes' frames ``t`` and ``te`` (the frame of the
    label edge in), the nodes (``live``), those with a blank edge in from ``(t - 1, u)``
    (``down``) and those with a label edge in from the previous level's ``u - 1``
    (``across``)."""
    t = _level(n, u, MONOTONIC)
    if MONOTONIC:
        te = t - 1  # the label edge into (t, u) leaves (t - 1, u - 1)
    else:
        te = t  # it leaves (t, u - 1)
    live = inside & (t >= 0) & (t <= T)
    down = live & (t >= 1)
    across = live & (u >= 1) & (te >= 0) & (te < T)
    return t, te, live, down, across


@triton.jit
def _shifted(weight_ptr, at, mask, shift_ptr, shift_at):  # pragma: no cover - compiled
    """``weight[at] - shift[shift_at]`` where ``mask``, ``-inf`` elsewhere."""
    weight = tl.load(weight_ptr + at, mask=mask, other=-math.inf)
    return weight - tl.load(shift_ptr + shift_at, mask=mask, other=0.0)


@triton.jit
def _forward_weights(
    blank_ptr, emit_ptr, bshift_ptr, eshift_ptr, b, n, u, inside, T, U1, MONOTONIC: tl.constexpr
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """The shifted weights of the edges into level ``n``'s nodes, a blank's and a label's;
    ``-inf`` where there is no such edge."""
    t, te, live, down, across = _forward_edges(n, u, inside, T, MONOTONIC)
    blank = _shifted(blank_ptr, (b * T + t - 1) * U1 + u, down, bshift_ptr, b * T + t - 1)
    at = (b * T + te) * (U1 - 1) + u - 1
    if MONOTONIC:  # both edges of a frame share its shift
        emit = _shifted(emit_ptr, at, across, bshift_ptr, b * T + te)
    else:  # each label's emission its own
        emit = _shifted(emit_ptr, at, across, eshift_ptr, b * U1 + u - 1)
    return blank, emit


@triton.jit
def _shifts(
    blank_ptr, emit_ptr, bshift_ptr, eshift_ptr, b, u, T, U1, MONOTONIC: tl.constexpr
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """The shifts that keep utterance ``b``'s forward variables near 0 in float32, stored,
    and their total, which every path carries (so ``log P(y)`` is the shifted lattice's plus
    it; the posteriors do not change). Standard lattice: every path takes one blank per frame
    and emits every label once, so each frame's blank weights and each label's emission
    weights are shifted by their maximum. One label per frame: every path takes exactly one
    edge per frame, so both edges of a frame are shifted by one constant. (A maximum that is
    not finite shifts by 0.)"""
    inside = u < U1
    emits = u < U1 - 1
    top = tl.full(u.shape, float("-inf"), bshift_ptr.dtype.element_ty)  # each label's, over t
    total = tl.sum(tl.zeros(u.shape, bshift_ptr.dtype.element_ty), axis=0)
    t = 0
    while t < T:
        row = (b * T + t) * U1
        blank = tl.load(blank_ptr + row + u, mask=inside, other=-math.inf)
        emit = tl.load(emit_ptr + row - b * T - t + u, mask=emits, other=-math.inf)
        shift = tl.max(blank, axis=0)
        if MONOTONIC:
            shift = tl.maximum(shift, tl.max(emit, axis=0))
        else:
            top = tl.maximum(top, emit)
        shift = _finite_or_zero(shift)
        tl.store(bshift_ptr + b * T + t, shift)
        total += shift
        t += 1
    if not MONOTONIC:
        top = tl.where(emits, _finite_or_zero(top), 0.0)
        tl.store(eshift_ptr + b * U1 + u, top, mask=inside)
        total += tl.sum(top, axis=0)
    return total


@triton.jit(do_not_specialize=["T", "U1", "LEVELS"])
def _lattice_forward_kernel(
    blank_ptr,
    emit_ptr,
    bshift_ptr,
    eshift_ptr,
    alpha_ptr,
    log_p_ptr,
    shifted_ptr,
    lengths_ptr,
    T,
    U1,
    LEVELS,
    BLOCK: tl.constexpr,
    MONOTONIC: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Utterance ``b = program_id``: the shifts (:func:`_shifts`, into ``bshift`` ``(B, T)``
    and ``eshift`` ``(B, U + 1)``), ``alpha`` ``(B, T + 1, U + 1)`` of the shifted lattice,
    ``log_p[b]`` (shifted back) and ``shifted[b]`` (not), from ``blank`` ``(B, T, U + 1)`` and
    ``emit`` ``(B, T, U)``."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    u = tl.arange(0, BLOCK)
    inside = u < U1
    left = tl.where(u >= 1, u - 1, 0)
    total = _shifts(blank_ptr, emit_ptr, bshift_ptr, eshift_ptr, b, u, T, U1, MONOTONIC)
    tl.debug_barrier()  # the shifts are read back by every lane
    nodes = alpha_ptr + b * (T + 1) * U1
    level = tl.where(u == 0, 0.0, float("-inf")).to(alpha_ptr.dtype.element_ty)
    tl.store(nodes + u, level, mask=inside)  # row 0; the standard lattice overwrites u > 0
    shifts = (bshift_ptr, eshift_ptr)
    blank, emit = _forward_weights(blank_ptr, emit_ptr, *shifts, b, 1, u, inside, T, U1, MONOTONIC)
    n = 1
    while n < LEVELS:  # (a while loop: Triton's interpreter cannot take range() of an argument)
        # the next level's weights, on their way while this level computes
        blank_next, emit_next = _forward_weights(
            blank_ptr, emit_ptr, *shifts, b, n + 1, u, inside, T, U1, MONOTONIC
        )
        t, te, live, down, across = _forward_edges(n, u, inside, T, MONOTONIC)
        # the previous level at u and at u - 1; only along edges that exist (a NaN in a node
        # no complete path uses stays there, as on the CPU)
        via_blank = tl.where(down, level + blank, float("-inf"))
        via_emit = tl.where(across, tl.gather(level, left, 0) + emit, float("-inf"))
        level = tl.where(live, _log_add_exp(via_blank, via_emit), float("-inf"))
        tl.store(nodes + t * U1 + u, level, mask=live)
        blank, emit = blank_next, emit_next
        n += 1
    tl.debug_barrier()  # log P(y) is read back from the table
    labels = tl.load(lengths_ptr + b)
    shifted = tl.load(nodes + T * U1 + labels)
    tl.store(shifted_ptr + b, shifted)
    tl.store(log_p_ptr + b, shifted + total)


@triton.jit
def _backward_edges(n, u, inside, T, U1, MONOTONIC: tl.constexpr):  # pragma: no cover
    """Level ``n`` of the backward pass: its nodes' frames ``t``, the nodes with edges out
    (``live``), those of them with a label edge (``emits``) and the nodes of row ``T``
    (``end``)."""
    t = _level(n, u, MONOTONIC)
    live = inside & (t >= 0) & (t < T)
    emits = live & (u < U1 - 1)
    end = inside & (t == T)
    return t, live, emits, end


@triton.jit
def _backward_weights(
    blank_ptr,
    emit_ptr,
    bshift_ptr,
    eshift_ptr,
    alpha_ptr,
    b,
    n,
    u,
    inside,
    T,
    U1,
    MONOTONIC: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Level ``n`` of the backward pass: the shifted weights of the edges out of its nodes
    (``-inf`` where none) and the nodes' forward variables."""
    t, live, emits, end = _backward_edges(n, u, inside, T, U1, MONOTONIC)
    blank = _shifted(blank_ptr, (b * T + t) * U1 + u, live, bshift_ptr, b * T + t)
    at = (b * T + t) * (U1 - 1) + u
    if MONOTONIC:
        emit = _shifted(emit_ptr, at, emits, bshift_ptr, b * T + t)
    else:
        emit = _shifted(emit_ptr, at, emits, eshift_ptr, b * U1 + u)
    alpha = tl.load(alpha_ptr + (b * (T + 1) + t) * U1 + u, mask=live, other=-math.inf)
    return blank, emit, alpha


@triton.jit(do_not_specialize=["T", "U1", "LEVELS"])
def _lattice_backward_kernel(
    blank_ptr,
    emit_ptr,
    bshift_ptr,
    eshift_ptr,
    alpha_ptr,
    log_p_ptr,
    lengths_ptr,
    post_blank_ptr,
    post_emit_ptr,
    T,
    U1,
    LEVELS,
    BLOCK: tl.constexpr,
    MONOTONIC: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Utterance ``b = program_id``: the backward variables from ``beta(T, U_b) = 0``, level by
    level in registers, and the edge posteriors of the blank ``(B, T, U + 1)`` and label
    ``(B, T, U)`` edges (``log_p``: the shifted lattice's, with the forward kernel's shifts)."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    u = tl.arange(0, BLOCK)
    inside = u < U1
    right = tl.where(u + 1 < U1, u + 1, 0)
    labels = tl.load(lengths_ptr + b)
    log_p = tl.load(log_p_ptr + b)
    log_p = tl.where(log_p == float("-inf"), 0.0, log_p)  # no path: every posterior is 0
    last = tl.where(u == labels, 0.0, float("-inf")).to(alpha_ptr.dtype.element_ty)
    level = tl.zeros_like(last) + float("-inf")  # the level after the last: no nodes
    shifts = (bshift_ptr, eshift_ptr)
    blank, emit, alpha = _backward_weights(
        blank_ptr, emit_ptr, *shifts, alpha_ptr, b, LEVELS - 1, u, inside, T, U1, MONOTONIC
    )
    n = LEVELS - 1
    while n >= 0:
        # the previous level's weights and forward variables, loaded while this level computes
        blank_next, emit_next, alpha_next = _backward_weights(
            blank_ptr, emit_ptr, *shifts, alpha_ptr, b, n - 1, u, inside, T, U1, MONOTONIC
        )
        t, live, emits, end = _backward_edges(n, u, inside, T, U1, MONOTONIC)
        # beta of the next level at u, (t + 1, u), and at u + 1; only along edges that exist
        via_blank = tl.where(live, blank + level, float("-inf"))
        via_emit = tl.where(emits, emit + tl.gather(level, right, 0), float("-inf"))
        # row T: no edge leaves, beta is 0 at the last label and -inf elsewhere
        level = tl.where(live, _log_add_exp(via_blank, via_emit), tl.where(end, last, -math.inf))
        tl.store(
            post_blank_ptr + (b * T + t) * U1 + u, tl.exp(alpha + via_blank - log_p), mask=live
        )
        tl.store(
            post_emit_ptr + (b * T + t) * (U1 - 1) + u,
            tl.exp(alpha + via_emit - log_p),
            mask=emits,
        )
        blank, emit, alpha = blank_next, emit_next, alpha_next
        n -= 1


def _levels(T: int, U1: int, monotonic: bool) -> int:
    return T + 1 if monotonic else T + U1


class Lattice:
    """What :func:`forward` leaves for :func:`posteriors`: the forward variables ``alpha``
    ``(B, T + 1, U + 1)``, the shifts (``bshift`` ``(B, T)``, ``eshift`` ``(B, U + 1)``) and
    the shifted lattice's ``log P(y)`` ``(B,)``."""

    def __init__(self, alpha, bshift, eshift, shifted):
        self.alpha, self.bshift, self.eshift, self.shifted = alpha, bshift, eshift, shifted

    def tensors(self) -> tuple:
        return self.alpha, self.bshift, self.eshift, self.shifted


def forward(
    blank: torch.Tensor, emit: torch.Tensor, target_lengths: torch.Tensor, monotonic: bool
) -> tuple[torch.Tensor, Lattice]:
    """``log P(y)`` ``(B,)`` of the masked weights ``blank`` ``(B, T, U + 1)`` and ``emit``
    ``(B, T, U)`` (float32 or float64; ``target_lengths`` on their device, any integer
    dtype), and what :func:`posteriors` needs. The weights are shifted inside the kernel
    (:func:`_shifts`)."""
    blank, emit = blank.contiguous(), emit.contiguous()
    B, T, U1 = blank.shape
    alpha = blank.new_empty(B, T + 1, U1)
    bshift, eshift = blank.new_empty(B, T), blank.new_empty(B, U1)
    log_p, shifted = blank.new_empty(B), blank.new_empty(B)
    lattice = Lattice(alpha, bshift, eshift, shifted)
    if B == 0:
        return log_p, lattice
    block, warps = _block(U1)
    _lattice_forward_kernel[(B,)](
        blank,
        emit,
        bshift,
        eshift,
        alpha,
        log_p,
        shifted,
        target_lengths.contiguous(),
        T,
        U1,
        _levels(T, U1, monotonic),
        BLOCK=block,
        MONOTONIC=monotonic,
        num_warps=warps,
    )
    return log_p, lattice


def posteriors(
    blank: torch.Tensor,
    emit: torch.Tensor,
    lattice: Lattice,
    target_lengths: torch.Tensor,
    monotonic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Edge posteriors of the blank ``(B, T, U + 1)`` and label ``(B, T, U)`` edges from
    :func:`forward`'s results; all 0 where ``log P(y)`` is ``-inf``. The backward kernel
    writes every node's."""
    blank, emit = blank.contiguous(), emit.contiguous()
    B, T, U1 = blank.shape
    post_blank = torch.empty_like(blank)
    post_emit = torch.empty_like(emit)
    if B == 0:
        return post_blank, post_emit
    block, warps = _block(U1)
    _lattice_backward_kernel[(B,)](
        blank,
        emit,
        lattice.bshift,
        lattice.eshift,
        lattice.alpha,
        lattice.shifted,
        target_lengths.contiguous(),
        post_blank,
        post_emit,
        T,
        U1,
        _levels(T, U1, monotonic),
        BLOCK=block,
        MONOTONIC=monotonic,
        num_warps=warps,
    )
    return post_blank, post_emit


# ---- the fused log-softmax of the joint's rows ------------------------------------------------


@triton.jit
def _finite_or_zero(x):  # pragma: no cover - compiled (or interpreted: the tests run it)
    return tl.where((x > float("-inf")) & (x < float("inf")), x, 0.0)


@triton.jit
def _online_logsumexp(
    x_ptr, rows, live, V, start, stride, work_ptr, FLOOR: tl.constexpr, COLS: tl.constexpr
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """For rows ``rows`` of ``x`` (row stride ``stride``): ``top + log sum_{v >= start}
    exp(max(x[v] - top, FLOOR))`` with ``top`` the row's maximum (0 where it is not finite),
    as the other backends, in the precision of ``work_ptr``; ``COLS`` columns at a time, the
    sum rescaled whenever the running maximum grows."""
    work = work_ptr.dtype.element_ty
    cols = tl.arange(0, COLS)
    top = tl.full(rows.shape, float("-inf"), work)
    total = tl.zeros(rows.shape, work)
    c = start
    while c < V:
        at = c + cols
        mask = live[:, None] & (at < V)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride + at[None, :], mask=mask, other=-math.inf)
        x = x.to(work)
        grown = tl.maximum(top, tl.max(x, axis=1))
        shift = _finite_or_zero(grown)
        d = x - shift[:, None]
        low = tl.zeros_like(d) + FLOOR  # (exact: see cbasr._triton)
        d = tl.where(d < low, low, d)  # (written so that NaN passes through)
        terms = tl.where(mask, tl.exp(d), 0.0)
        # the sum so far was taken against the old maximum; none yet (all -inf so far: only
        # floored terms, negligible) is not rescaled, which could overflow
        rescale = tl.where(top > float("-inf"), tl.exp(_finite_or_zero(top) - shift), 1.0)
        total = total * rescale + tl.sum(terms, axis=1)
        top = grown
        c += COLS
    return _finite_or_zero(top) + tl.log(total)


@triton.jit(do_not_specialize=["N", "V"])
def _row_logsumexp_kernel(
    x_ptr,
    lse_ptr,
    N,
    V,
    start,
    stride,
    FLOOR: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Rows ``program_id * ROWS + (0 .. ROWS - 1)`` of ``x`` ``(N, V)``: their
    :func:`_online_logsumexp` over columns ``start:``."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = rows < N
    lse = _online_logsumexp(x_ptr, rows, live, V, start, stride, lse_ptr, FLOOR, COLS)
    tl.store(lse_ptr + rows, lse, mask=live)


@triton.jit(do_not_specialize=["N", "V"])
def _row_softmax_kernel(
    x_ptr,
    lse_ptr,
    weight_ptr,
    grad_ptr,
    N,
    V,
    start,
    stride,
    FLOOR: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """``grad[n, v] = exp(max(x[n, v] - lse[n], FLOOR)) * weight[n]`` for ``v >= start``, 0
    before ``start`` and on rows of weight 0, for rows ``program_id * ROWS + (0 .. ROWS - 1)``
    (``grad`` contiguous, ``x`` of row stride ``stride``)."""
    work = lse_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = rows < N
    cols = tl.arange(0, COLS)
    lse = tl.load(lse_ptr + rows, mask=live, other=0.0)
    weight = tl.load(weight_ptr + rows, mask=live, other=0.0).to(work)
    c = 0
    while c < V:
        at = c + cols
        mask = live[:, None] & (at < V)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride + at[None, :], mask=mask, other=0.0)
        d = x.to(work) - lse[:, None]
        low = tl.zeros_like(d) + FLOOR
        d = tl.where(d < low, low, d)
        grad = tl.exp(d) * weight[:, None]
        grad = tl.where((at >= start)[None, :] & (weight != 0.0)[:, None], grad, 0.0)
        tl.store(
            grad_ptr + rows[:, None] * V + at[None, :],
            grad.to(grad_ptr.dtype.element_ty),
            mask=mask,
        )
        c += COLS


# Entries of a tile of rows: a few per thread of 4 warps.
_TILE = 2048


def _tile(columns: int) -> tuple[int, int]:
    """``(ROWS, COLS)`` of a tile: at most 1024 columns at a time, rows filling the rest."""
    cols = min(1024, max(16, triton.next_power_of_2(columns)))
    return max(1, _TILE // cols), cols


def row_logsumexp(rows: torch.Tensor, start: int, floor: float, work: torch.dtype) -> torch.Tensor:
    """``logsumexp(rows[:, start:], -1)`` in ``work`` precision (float32 or float64), each
    exponent at least ``floor``, for an ``(N, V)`` tensor with unit column stride and
    ``start < V``."""
    N, V = rows.shape
    lse = torch.empty(N, dtype=work, device=rows.device)
    if N == 0:
        return lse
    ROWS, COLS = _tile(V - start)
    _row_logsumexp_kernel[(triton.cdiv(N, ROWS),)](
        rows, lse, N, V, start, rows.stride(0), floor, ROWS=ROWS, COLS=COLS, num_warps=4
    )
    return lse


def row_softmax(
    rows: torch.Tensor, start: int, lse: torch.Tensor, weight: torch.Tensor, floor: float
) -> torch.Tensor:
    """``exp(max(rows[:, start:] - lse[:, None], floor)) * weight[:, None]`` (zeros before
    ``start`` and on rows of weight 0), contiguous and in the dtype of ``rows``: the gradient
    of :func:`row_logsumexp`, in one pass."""
    N, V = rows.shape
    grad = torch.empty(N, V, dtype=rows.dtype, device=rows.device)
    if N == 0:
        return grad
    ROWS, COLS = _tile(V)
    _row_softmax_kernel[(triton.cdiv(N, ROWS),)](
        rows,
        lse.contiguous(),
        weight.to(lse.dtype).contiguous(),
        grad,
        N,
        V,
        start,
        rows.stride(0),
        floor,
        ROWS=ROWS,
        COLS=COLS,
        num_warps=4,
    )
    return grad


# ---- RNN-T and HAT from the joint's rows, fused ----------------------------------------------


@triton.jit
def _joint_rows(
    rows, live, T, U1, S, starts_ptr, input_lengths_ptr, target_lengths_ptr, targets_ptr
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """What a joint row is in the lattice: its frame index ``b T + t``, its node ``u`` (rows
    ``(b, t, u)`` of a whole joint, ``row = (b T + t)(U + 1) + u``; with ``S > 0``, rows ``(b,
    t, s)`` of a pruned one, ``u = starts[b, t] + s``), whether its blank edge is a weight
    (``blanks``: ``t < T_b``, ``u <= U_b``), whether it is a frame of the utterance
    (``frames``), whether it emits (``t < T_b``, ``u < U_b``) and the label ``y_{u+1}`` it
    emits (0 where none)."""
    per = tl.where(S > 0, S, U1)  # rows per frame
    frame = rows // per  # b T + t
    first = tl.load(starts_ptr + frame, mask=live & (S > 0), other=0)
    u = first + rows % per
    b = frame // T
    length = tl.load(input_lengths_ptr + b, mask=live, other=0)
    labels = tl.load(target_lengths_ptr + b, mask=live, other=0)
    frames = live & (frame % T < length)
    emits = frames & (u < labels)
    blanks = frames & (u <= labels)
    y = tl.load(targets_ptr + b * (U1 - 1) + u, mask=live & (u < labels), other=0)
    return b, frame, u, frames, blanks, emits, y


@triton.jit(do_not_specialize=["N", "T", "U1", "S", "V"])
def _joint_edges_kernel(
    x_ptr,
    blank_ptr,
    targets_ptr,
    starts_ptr,
    input_lengths_ptr,
    target_lengths_ptr,
    blank_lp_ptr,
    emit_lp_ptr,
    lse_ptr,
    N,
    T,
    U1,
    S,
    V,
    start,
    offset,
    stride,
    FLOOR: tl.constexpr,
    HAT: tl.constexpr,
    SEPARATE: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """The lattice's edge weights, masked, from the joint rows ``program_id * ROWS + (0 ..
    ROWS - 1)`` of ``x`` ``(N, V)`` (:func:`_joint_rows`), written at their nodes: the
    softmax's normaliser over columns ``start:`` (kept in ``lse`` for the backward), the blank
    unit (column 0 of ``x``, or ``blank`` ``(N,)`` with ``SEPARATE``) and the emitted label's
    column ``offset + y``. RNN-T: ``blank_lp = x[0] - lse``, ``emit_lp = x[offset + y] - lse``;
    HAT (eq. 4) from the blank logit ``b``: ``blank_lp = log sigmoid(b)``, ``emit_lp = log
    sigmoid(-b) + x[offset + y] - lse``. ``blank_lp`` is 0 on padded frames and ``-inf`` past
    the labels, ``emit_lp`` ``-inf`` where no label is emitted."""
    work = lse_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = rows < N
    lse = _online_logsumexp(x_ptr, rows, live, V, start, stride, lse_ptr, FLOOR, COLS)
    b, frame, u, frames, blanks, emits, y = _joint_rows(
        rows, live, T, U1, S, starts_ptr, input_lengths_ptr, target_lengths_ptr, targets_ptr
    )
    if SEPARATE:
        unit = tl.load(blank_ptr + rows, mask=blanks, other=0.0).to(work)
    else:
        unit = tl.load(x_ptr + rows * stride, mask=blanks, other=0.0).to(work)
    picked = tl.load(x_ptr + rows * stride + offset + y, mask=emits, other=0.0).to(work)
    if HAT:
        blank_lp = -_softplus(-unit)
        emit_lp = -_softplus(unit) + picked - lse
    else:
        blank_lp = unit - lse
        emit_lp = picked - lse
    blank_lp = tl.where(blanks, blank_lp, tl.where(frames, -math.inf, 0.0))
    emit_lp = tl.where(emits, emit_lp, -math.inf)
    tl.store(lse_ptr + rows, lse, mask=live)
    tl.store(blank_lp_ptr + frame * U1 + u, blank_lp, mask=live & (u < U1))
    tl.store(emit_lp_ptr + frame * (U1 - 1) + u, emit_lp, mask=live & (u < U1 - 1))


@triton.jit(do_not_specialize=["N", "T", "U1", "S", "V"])
def _joint_grad_kernel(
    x_ptr,
    blank_ptr,
    targets_ptr,
    starts_ptr,
    input_lengths_ptr,
    target_lengths_ptr,
    lse_ptr,
    post_blank_ptr,
    post_emit_ptr,
    grad_nll_ptr,
    grad_ptr,
    grad_blank_ptr,
    N,
    T,
    U1,
    S,
    V,
    start,
    offset,
    stride,
    FLOOR: tl.constexpr,
    HAT: tl.constexpr,
    SEPARATE: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """The gradient of the NLLs, weighted by ``grad_nll`` ``(B,)``, with respect to the joint
    rows of :func:`_joint_edges_kernel`, from the lattice's edge posteriors at their nodes:
    with ``g_b = -g post_blank`` and ``g_e = -g post_emit`` where the edge is a weight, 0
    elsewhere. RNN-T: ``d/dx[v] = -(g_b + g_e) softmax(x)[v]``, plus ``g_b`` at column 0 and
    ``g_e`` at the label's. HAT: ``d/db = g_b sigmoid(-b) - g_e sigmoid(b)`` (column 0 of
    ``grad``, or ``grad_blank`` with ``SEPARATE``), ``d/dx[v] = -g_e softmax(x[start:])[v]``
    plus ``g_e`` at the label's column. Exactly 0 on every row and column no weight reads
    (padding may hold anything)."""
    work = lse_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = rows < N
    b, frame, u, frames, blanks, emits, y = _joint_rows(
        rows, live, T, U1, S, starts_ptr, input_lengths_ptr, target_lengths_ptr, targets_ptr
    )
    weight = tl.load(grad_nll_ptr + b, mask=live, other=0.0).to(work)
    post_blank = tl.load(post_blank_ptr + frame * U1 + u, mask=blanks, other=0.0)
    post_emit = tl.load(post_emit_ptr + frame * (U1 - 1) + u, mask=emits, other=0.0)
    g_blank = tl.where(blanks, -weight * post_blank, 0.0)
    g_emit = tl.where(emits, -weight * post_emit, 0.0)
    if HAT:
        if SEPARATE:
            unit = tl.load(blank_ptr + rows, mask=blanks, other=0.0).to(work)
        else:
            unit = tl.load(x_ptr + rows * stride, mask=blanks, other=0.0).to(work)
        sig = 1.0 / (1.0 + tl.exp(-unit))  # sigmoid(b)
        g_unit = g_blank * (1.0 - sig) - g_emit * sig
        spread = g_emit  # what the softmax's normaliser carries
    else:
        g_unit = g_blank
        spread = g_blank + g_emit
    lse = tl.load(lse_ptr + rows, mask=live, other=0.0)
    label = offset + y
    reads = blanks & (spread != 0.0)
    cols = tl.arange(0, COLS)
    c = 0
    while c < V:
        at = c + cols
        mask = live[:, None] & (at < V)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride + at[None, :], mask=mask, other=0.0)
        d = x.to(work) - lse[:, None]
        low = tl.zeros_like(d) + FLOOR
        d = tl.where(d < low, low, d)
        grad = -spread[:, None] * tl.exp(d)
        grad = tl.where((at >= start)[None, :] & reads[:, None], grad, 0.0)
        grad += tl.where((at[None, :] == label[:, None]) & emits[:, None], g_emit[:, None], 0.0)
        if HAT:
            if not SEPARATE:
                grad = tl.where((at == 0)[None, :], g_unit[:, None], grad)
        else:
            grad += tl.where((at == 0)[None, :], g_unit[:, None], 0.0)
        tl.store(
            grad_ptr + rows[:, None] * V + at[None, :],
            grad.to(grad_ptr.dtype.element_ty),
            mask=mask,
        )
        c += COLS
    if SEPARATE:
        tl.store(grad_blank_ptr + rows, g_unit.to(grad_blank_ptr.dtype.element_ty), mask=live)


class JointSaved:
    """What :func:`joint_forward` keeps for :func:`joint_backward`."""

    def __init__(self, blank_lp, emit_lp, lse, lattice, monotonic):
        self.blank_lp, self.emit_lp, self.lse = blank_lp, emit_lp, lse
        self.lattice, self.monotonic = lattice, monotonic

    def tensors(self) -> tuple:
        return self.blank_lp, self.emit_lp, self.lse, *self.lattice.tensors()

    @classmethod
    def of(cls, tensors, monotonic: bool) -> "JointSaved":
        blank_lp, emit_lp, lse, *lattice = tensors
        return cls(blank_lp, emit_lp, lse, Lattice(*lattice), monotonic)


class JointLayout:
    """How a joint's rows map onto the lattice (:func:`_joint_rows`): ``x`` ``(B, T, R, V)``
    with ``R = U + 1`` node rows per frame, or ``R = S`` window rows at ``starts`` ``(B, T)``;
    the blank unit is column 0 of ``x`` unless ``blank`` ``(B, T, R)`` holds it; the softmax
    normalises columns ``start:``; label ``y`` is column ``offset + y``; ``hat``: HAT's edges,
    else RNN-T's. Lengths, targets and starts on ``x``'s device."""

    def __init__(self, x, blank, targets, starts, input_lengths, target_lengths, hat, start,
                 offset):  # fmt: skip
        B, T, R, V = x.shape
        U1 = targets.shape[1] + 1
        self.shape = (B, T, U1)
        self.rows = x.reshape(-1, V)
        self.blank = blank
        self.hat, self.separate = hat, blank is not None
        self.pruned = starts is not None
        self.pointers = (
            self.rows,
            self.rows if blank is None else blank.reshape(-1),
            targets.contiguous(),
            (starts if self.pruned else target_lengths).contiguous(),  # (unread unpruned)
            input_lengths.contiguous(),
            target_lengths.contiguous(),
        )
        self.sizes = (self.rows.shape[0], T, U1, R if self.pruned else 0, V, start, offset,
                      self.rows.stride(0))  # fmt: skip

    def launch(self, kernel, *arguments, floor: float) -> None:
        N, V = self.sizes[0], self.sizes[4]
        if not N:
            return
        ROWS, COLS = _tile(V)
        kernel[(triton.cdiv(N, ROWS),)](
            *self.pointers[:6], *arguments, *self.sizes, floor,
            HAT=self.hat, SEPARATE=self.separate, ROWS=ROWS, COLS=COLS, num_warps=4,
        )  # fmt: skip


def joint_forward(layout: JointLayout, monotonic: bool, work, floor: float):
    """The NLLs ``-log P(y | X)`` ``(B,)`` of a joint laid out as ``layout`` says, computing
    in ``work`` (float32 or float64): the edges in one pass over the joint
    (:func:`_joint_edges_kernel`), then the lattice; and what the backward needs."""
    B, T, U1 = layout.shape
    device = layout.rows.device
    if layout.pruned:  # nodes outside the windows: no edge, a free pass on padded frames
        padded = torch.arange(T, device=device)[None, :] >= layout.pointers[4][:, None]
        blank_lp = torch.where(padded, 0.0, float("-inf")).to(work)[..., None].expand(B, T, U1)
        blank_lp = blank_lp.contiguous()
        emit_lp = torch.full((B, T, U1 - 1), float("-inf"), dtype=work, device=device)
    else:  # every node is a row's
        blank_lp = torch.empty(B, T, U1, dtype=work, device=device)
        emit_lp = torch.empty(B, T, U1 - 1, dtype=work, device=device)
    lse = torch.empty(layout.sizes[0], dtype=work, device=device)
    layout.launch(_joint_edges_kernel, blank_lp, emit_lp, lse, floor=floor)
    log_p, lattice = forward(blank_lp, emit_lp, layout.pointers[5], monotonic)
    nll = torch.where(log_p == float("-inf"), float("inf"), -log_p)
    return nll, JointSaved(blank_lp, emit_lp, lse, lattice, monotonic)


def joint_backward(layout: JointLayout, saved: JointSaved, grad_nll, scale: float, floor: float):
    """The gradients of :func:`joint_forward`'s NLLs weighted by ``grad_nll`` ``(B,)`` with
    respect to the joint (in its dtype) and the separate blank logits (None where there are
    none), the label edges' scaled by ``scale`` (FastEmit's ``1 + lambda``): the lattice's
    posteriors, then one pass over the joint (:func:`_joint_grad_kernel`)."""
    post_blank, post_emit = posteriors(
        saved.blank_lp, saved.emit_lp, saved.lattice, layout.pointers[5], saved.monotonic
    )
    if scale != 1.0:  # FastEmit: the label edges' gradient, exactly as the other backends
        post_emit.mul_(scale)
    rows = layout.rows
    grad = torch.empty(rows.shape, dtype=rows.dtype, device=rows.device)
    blank = layout.blank
    grad_blank = None if blank is None else torch.empty_like(blank)
    layout.launch(
        _joint_grad_kernel, saved.lse, post_blank, post_emit, grad_nll.contiguous(), grad,
        grad if blank is None else grad_blank, floor=floor,
    )  # fmt: skip
    return grad, grad_blank
