"""The second-order CB lattice of :mod:`cbasr.losses.conditional_bernoulli_second_order` as
Triton kernels (package-internal): its ``T``-step recursions, the ``triton`` backend of
:func:`~cbasr.losses.cb_marginal_nll_windowed`, :func:`~cbasr.losses.cb_posteriors_windowed`
and :func:`~cbasr.losses.cb_viterbi_windowed`.

One program per utterance runs a recursion over all frames, its row of label states (``L``
entries, one block) in registers, and writes exactly what the reference loop writes, in the
same layout, so that the rest (``log Z``, the edge posteriors) stays the reference's:

- :func:`alpha`: ``alpha[W + t, l + 1] = logsumexp_{d < W - 1} alpha[t - d - 1, l] + emit[t,
  d, l]``, plus ``far[t, l] + emit[t, W - 1, l]`` with ``far[t, l] = logsumexp_{s <= t - W}
  alpha[s, l]`` carried as a running sum (:func:`~cbasr.losses.
  conditional_bernoulli_second_order._windowed_alpha`).
- :func:`beta`: ``beta[t, l] = logsumexp_{d < W - 1} emit[t + d + 1, d, l] + beta[t + d + 1,
  l + 1]``, plus the running suffix sum of ``emit[s, W - 1, l] + beta[s, l + 1]`` over ``s >=
  t + W``, and ``beta[t, L_b] = 0`` (:func:`~cbasr.losses.conditional_bernoulli_second_order.
  _windowed_beta`).

- :func:`viterbi`: the max-product form of :func:`alpha`, with each state's best gap and the
  frame of the best way in from ``W`` or more frames back, for the host's backtrace
  (:func:`~cbasr.losses.conditional_bernoulli_second_order._windowed_viterbi`).

The rows read back (up to ``W`` frames before, or after) were stored by earlier steps of the
same program, with a barrier between. :func:`alpha` and :func:`beta` read a frame's window as
one ``(WINDOW, BLOCK)`` tile (``WINDOW``: ``W`` rounded up to a power of two), one round of
loads per frame instead of ``W - 1`` in turn, and sum it as a log-sum-exp, as the reference
does; :func:`viterbi` takes the window's maximum and its first entry (the reference's tie
rule). Float32 and float64. Importing this module needs Triton;
``TRITON_INTERPRET=1`` runs it on CPU tensors.
"""

import math

import torch
import triton
import triton.language as tl

from cbasr._triton import block, log_add_exp

__all__: list[str] = []  # package-internal


@triton.jit
def _window(
    emit_ptr, alpha_ptr, t, k, gaps, b, W, B, L, l, inside
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Frame ``t``'s window for utterance ``b`` as a ``(WINDOW, BLOCK)`` tile: entry ``k`` is the
    forward variable of the previous label's emission ``W - k`` frames back (row ``t + k``)
    plus the weight of gap ``d = W - 1 - k`` (``-inf`` outside ``gaps``); and the weight of the
    far entry ``k = 0`` (every gap of ``W`` or more)."""
    came = tl.load(alpha_ptr + ((t + k) * B + b) * (L + 1) + l[None, :], mask=gaps, other=-math.inf)
    weight = tl.load(emit_ptr + ((t * W + k) * B + b) * L + l[None, :], mask=gaps, other=-math.inf)
    far_weight = tl.load(emit_ptr + ((t * W) * B + b) * L + l, mask=inside, other=0.0)
    return came + weight, far_weight


@triton.jit
def _log_sum_exp_window(terms, extra):  # pragma: no cover - compiled (or interpreted)
    """``log(sum_k exp(terms[k]) + exp(extra))`` per column of a ``(WINDOW, BLOCK)`` tile; ``-inf``
    where every entry is ``-inf``, ``inf`` where one is."""
    top = tl.maximum(tl.max(terms, axis=0), extra)
    top = tl.where((top > float("-inf")) & (top < float("inf")), top, 0.0)
    total = tl.sum(tl.exp(terms - top[None, :]), axis=0) + tl.exp(extra - top)
    return top + tl.log(total)


@triton.jit(do_not_specialize=["T", "W", "B", "L"])
def _alpha_kernel(
    emit_ptr, alpha_ptr, far_ptr, T, W, B, L, BLOCK: tl.constexpr, WINDOW: tl.constexpr
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Utterance ``b = program_id``: rows ``W ..`` of ``alpha`` ``(W + T, B, L + 1)`` (columns
    ``1 .. L``) and ``far`` ``(T, B, L)`` from ``emit`` ``(T + W, W, B, L)`` (``[t, k]`` holds
    gap ``d = W - 1 - k``); ``alpha``'s first ``W`` rows hold the start state on entry. A
    frame's window (entries ``k = 1 .. W - 1``, ``WINDOW >= W`` rows of a tile) is read at
    once."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    l = tl.arange(0, BLOCK)
    inside = l < L
    k = tl.arange(0, WINDOW)[:, None]  # gap d = W - 1 - k: the label before at frame t - d - 1
    gaps = (k >= 1) & (k < W) & inside[None, :]
    running = tl.zeros([BLOCK], dtype=alpha_ptr.dtype.element_ty) + float("-inf")
    t = 0
    while t < T:
        tl.debug_barrier()  # the rows stored by the last W steps are read
        before = tl.load(alpha_ptr + (t * B + b) * (L + 1) + l, mask=inside, other=float("-inf"))
        terms, far_weight = _window(emit_ptr, alpha_ptr, t, k, gaps, b, W, B, L, l, inside)
        running = log_add_exp(running, before)  # frames <= t - W
        tl.store(far_ptr + (t * B + b) * L + l, running, mask=inside)
        row = _log_sum_exp_window(terms, running + far_weight)
        tl.store(alpha_ptr + ((W + t) * B + b) * (L + 1) + 1 + l, row, mask=inside)
        t += 1


@triton.jit(do_not_specialize=["T", "W", "B", "L"])
def _beta_kernel(
    emit_ptr, beta_ptr, lengths_ptr, T, W, B, L, BLOCK: tl.constexpr, WINDOW: tl.constexpr
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Utterance ``b = program_id``: rows ``0 .. T - 1`` of ``beta`` ``(T + W, B, L + 1)``
    (columns ``0 .. L - 1``; column ``L_b`` stays 0) from ``emit`` as :func:`_alpha_kernel`'s;
    ``beta`` holds ``-inf`` and the end state on entry. A frame's window (the next label
    ``d + 1 = 1 .. W - 1`` frames on) is read at once."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    l = tl.arange(0, BLOCK)
    inside = l < L
    d = tl.arange(0, WINDOW)[:, None]  # the next label at frame t + d + 1, gap d
    gaps = (d < W - 1) & inside[None, :]
    labels = tl.load(lengths_ptr + b)
    running = tl.zeros([BLOCK], dtype=beta_ptr.dtype.element_ty) + float("-inf")
    t = T - 1
    while t >= 0:
        tl.debug_barrier()  # the rows stored by the last W steps are read
        far_emit = tl.load(emit_ptr + (((t + W) * W) * B + b) * L + l, mask=inside, other=0.0)
        far_beta = tl.load(
            beta_ptr + ((t + W) * B + b) * (L + 1) + 1 + l, mask=inside, other=float("-inf")
        )
        weight = tl.load(
            emit_ptr + (((t + 1 + d) * W + W - 1 - d) * B + b) * L + l[None, :],
            mask=gaps,
            other=float("-inf"),
        )
        after = tl.load(
            beta_ptr + ((t + 1 + d) * B + b) * (L + 1) + 1 + l[None, :],
            mask=gaps,
            other=float("-inf"),
        )
        running = log_add_exp(running, far_emit + far_beta)  # gaps of W or more
        row = _log_sum_exp_window(weight + after, running)
        row = tl.where(l == labels, 0.0, row)
        tl.store(beta_ptr + (t * B + b) * (L + 1) + l, row, mask=inside)
        t -= 1


@triton.jit(do_not_specialize=["T", "W", "B", "L"])
def _windowed_viterbi_kernel(
    emit_ptr,
    alpha_ptr,
    best_k_ptr,
    far_row_ptr,
    T,
    W,
    B,
    L,
    BLOCK: tl.constexpr,
    WINDOW: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Utterance ``b = program_id``: rows ``W ..`` of the max-product ``alpha`` ``(W + T, B,
    L + 1)`` (columns ``1 .. L``), the best entry ``k`` of each state's window ``best_k``
    ``(T, B, L)`` (0: every gap of ``W`` or more) and the row of the best of those
    ``far_row`` ``(T, B, L)``; ties keep the first, as the reference's ``max``, and a NaN
    entry never wins. A frame's window is read at once, as in :func:`_alpha_kernel`."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    l = tl.arange(0, BLOCK)
    inside = l < L
    k = tl.arange(0, WINDOW)[:, None]  # gap d = W - 1 - k: the label before at frame t - d - 1
    gaps = (k >= 1) & (k < W) & inside[None, :]
    far = tl.zeros([BLOCK], dtype=alpha_ptr.dtype.element_ty) + float("-inf")
    best_row = tl.zeros([BLOCK], dtype=tl.int32)
    t = 0
    while t < T:
        tl.debug_barrier()  # the rows stored by the last W steps are read
        before = tl.load(alpha_ptr + (t * B + b) * (L + 1) + l, mask=inside, other=float("-inf"))
        terms, far_weight = _window(emit_ptr, alpha_ptr, t, k, gaps, b, W, B, L, l, inside)
        better = before > far  # frames <= t - W
        far = tl.where(better, before, far)
        best_row = tl.where(better, t, best_row)
        tl.store(far_row_ptr + (t * B + b) * L + l, best_row, mask=inside)
        row = far + far_weight  # entry k = 0
        # a NaN entry never wins: it is no maximum, or a NaN maximum is not above the far entry
        top = tl.max(terms, axis=0)
        first = tl.min(tl.where(gaps & (terms == top[None, :]), k, WINDOW), axis=0)
        up = top > row  # strictly: a tie keeps the earlier entry
        row = tl.where(up, top, row)
        tl.store(alpha_ptr + ((W + t) * B + b) * (L + 1) + 1 + l, row, mask=inside)
        tl.store(best_k_ptr + (t * B + b) * L + l, tl.where(up, first, 0), mask=inside)
        t += 1


def _tile(L: int, W: int) -> tuple[int, int, int]:
    """``(BLOCK, WINDOW, num_warps)`` of a ``(WINDOW, BLOCK)`` tile holding a frame's window of
    ``W`` entries for ``L`` label states: warps for the tile's entries."""
    size = block(L)[0]
    window = max(2, triton.next_power_of_2(W))
    return size, window, block(window * size)[1]


def alpha(emit_rev: torch.Tensor, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~cbasr.losses.conditional_bernoulli_second_order._windowed_alpha`'s ``(alpha (W +
    T, B, L + 1), far (T, B, L))`` for ``emit_rev`` ``(T + W, W, B, L)``."""
    emit_rev = emit_rev.contiguous()
    _, W, B, _ = emit_rev.shape
    T = emit_rev.shape[0] - W
    alpha = emit_rev.new_full((W + T, B, L + 1), float("-inf"))
    alpha[W - 1, :, 0] = 0.0
    far = emit_rev.new_full((T, B, L), float("-inf"))
    if B and T and L:
        size, window, warps = _tile(L, W)
        _alpha_kernel[(B,)](
            emit_rev, alpha, far, T, W, B, L, BLOCK=size, WINDOW=window, num_warps=warps
        )
    return alpha, far


def beta(emit_rev: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """:func:`~cbasr.losses.conditional_bernoulli_second_order._windowed_beta`'s ``(T + W, B,
    L + 1)`` for ``emit_rev`` ``(T + W, W, B, L)``."""
    emit_rev = emit_rev.contiguous()
    _, W, B, L = emit_rev.shape
    T = emit_rev.shape[0] - W
    beta = emit_rev.new_full((T + W, B, L + 1), float("-inf"))
    lengths = target_lengths.to(device=emit_rev.device, dtype=torch.long)
    beta[:T, torch.arange(B, device=emit_rev.device), lengths] = 0.0
    if B and T and L:
        size, window, warps = _tile(L, W)
        _beta_kernel[(B,)](
            emit_rev, beta, lengths.to(torch.int32).contiguous(), T, W, B, L, BLOCK=size,
            WINDOW=window, num_warps=warps,
        )  # fmt: skip
    return beta


def viterbi(emit_rev: torch.Tensor, L: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`~cbasr.losses.conditional_bernoulli_second_order._windowed_viterbi`'s ``(alpha
    (W + T, B, L + 1), best_k (T, B, L), far_row (T, B, L))`` for ``emit_rev`` ``(T + W, W,
    B, L)``; the two index tables as int64."""
    emit_rev = emit_rev.contiguous()
    _, W, B, _ = emit_rev.shape
    T = emit_rev.shape[0] - W
    alpha = emit_rev.new_full((W + T, B, L + 1), float("-inf"))
    alpha[W - 1, :, 0] = 0.0
    best_k = torch.zeros(T, B, L, dtype=torch.int32, device=emit_rev.device)
    far_row = torch.zeros(T, B, L, dtype=torch.int32, device=emit_rev.device)
    if B and T and L:
        size, window, warps = _tile(L, W)
        _windowed_viterbi_kernel[(B,)](
            emit_rev, alpha, best_k, far_row, T, W, B, L, BLOCK=size, WINDOW=window,
            num_warps=warps,
        )  # fmt: skip
    return alpha, best_k.long(), far_row.long()
