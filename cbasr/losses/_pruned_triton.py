"""The pruned loss's simple loss (:func:`cbasr.losses.simple_transducer_nll`) as Triton kernels
(package-internal): the ``triton`` backend of the trivial joint, its lattice and the windows.

- :func:`_simple_edges_kernel`, one program per frame ``(b, t)``: the trivial joint's edge
  log-weights at every label position ``u``, ``am_t + lm_u`` normalised over the units ``c >=
  start`` by an online log-sum-exp over blocks of units (no ``(T, V) x (V, U + 1)`` product and
  no ``(B, T, U + 1, V)`` tensor), RNN-T's ``(blank - lse, label - lse)`` or HAT's eq. (4)
  ``(log b, log(1 - b) + label - lse)``, masked as the lattice takes them (padded frames pass
  the path down, positions past ``U_b`` do not exist), with each node's normaliser kept for the
  backward.
- the lattice's own kernels (:mod:`cbasr.losses._transducer_triton`): ``log P(y)`` and the edge
  posteriors.
- :func:`_windows_kernel`, one program per utterance: the windows of
  :func:`cbasr.losses.prune_ranges` from the posteriors (each node's occupancy is the summed
  posterior of the edges leaving it), frame by frame with the running maximum, then the
  running maximum from the end; and ``-log P(y)``.
- backward, :func:`_simple_grad_am_kernel` (a program per frame) and
  :func:`_simple_grad_lm_kernel` (a program per label position): the chain rule through the
  edges, ``d/d am_t[c] = sum_u (g_blank d blank / d am_t[c] + g_label d label / d am_t[c])``,
  the normaliser's share ``- w_tu softmax_tu(c)`` taken a block of units at a time, and the
  same for ``lm_u`` summed over frames.

Float32 and float64; importing this module needs Triton (``TRITON_INTERPRET=1`` runs it on CPU
tensors).
"""

import math

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from cbasr._triton import block, softplus

__all__: list[str] = []  # package-internal

_ROWS = 16  # label positions (or frames) per step of a program
_COLS = 64  # units per step


@triton.jit
def _finite_or_zero(x):  # pragma: no cover - compiled (or interpreted: the tests run it)
    return tl.where((x > float("-inf")) & (x < float("inf")), x, 0.0)


@triton.jit(do_not_specialize=["T", "U1", "V"])
def _simple_edges_kernel(
    am_ptr,
    lm_ptr,
    targets_ptr,
    input_lengths_ptr,
    target_lengths_ptr,
    blank_ptr,
    emit_ptr,
    lse_ptr,
    T,
    U1,
    V,
    start,
    FLOOR: tl.constexpr,
    HAT: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Frame ``(b, t) = divmod(program_id, T)``: ``blank (B, T, U + 1)``, ``emit (B, T, U)`` and
    ``lse (B, T, U + 1)`` at every label position, ``ROWS`` positions at a time."""
    row = tl.program_id(0).to(tl.int64)  # b * T + t, 64-bit offsets
    b = row // T
    t = row % T
    U = U1 - 1
    frame = t < tl.load(input_lengths_ptr + b)
    k = tl.load(target_lengths_ptr + b)
    cols = tl.arange(0, COLS)
    dtype = blank_ptr.dtype.element_ty
    u0 = 0
    while u0 < U1:
        u = u0 + tl.arange(0, ROWS)
        node = (u < U1) & (u <= k) & frame  # a node some path visits
        lm_rows = lm_ptr + (b * U1 + u) * V
        # the normaliser over the units c >= start, an online log-sum-exp over blocks of them
        top = tl.full([ROWS], float("-inf"), dtype)
        total = tl.zeros([ROWS], dtype)
        c = start
        while c < V:
            at = c + cols
            unit = at < V
            a = tl.load(am_ptr + row * V + at, mask=unit & frame, other=-math.inf)
            mask = node[:, None] & unit[None, :]
            x = a[None, :] + tl.load(lm_rows[:, None] + at[None, :], mask=mask, other=-math.inf)
            grown = tl.maximum(top, tl.max(x, axis=1))
            shift = _finite_or_zero(grown)
            d = x - shift[:, None]
            low = tl.zeros_like(d) + FLOOR  # (exact: see cbasr._triton)
            terms = tl.where(mask, tl.exp(tl.where(d < low, low, d)), 0.0)
            rescale = tl.where(top > float("-inf"), tl.exp(_finite_or_zero(top) - shift), 1.0)
            total = total * rescale + tl.sum(terms, axis=1)
            top = grown
            c += COLS
        lse = _finite_or_zero(top) + tl.log(total)
        label = tl.load(targets_ptr + b * U + u, mask=node & (u < k), other=0)  # y_{u+1}'s unit
        beta = tl.load(am_ptr + row * V, mask=frame, other=0.0) + tl.load(
            lm_rows, mask=node, other=0.0
        )
        score = tl.load(am_ptr + row * V + label, mask=node, other=0.0) + tl.load(
            lm_rows + label, mask=node, other=0.0
        )
        if HAT:  # eq. (4): a blank Bernoulli from unit 0, a softmax over the rest
            blank = -softplus(-beta)
            emit = -softplus(beta) + score - lse
        else:
            blank = beta - lse
            emit = score - lse
        blank = tl.where(frame, tl.where(u <= k, blank, float("-inf")), 0.0)
        emit = tl.where(frame & (u < k), emit, float("-inf"))
        tl.store(blank_ptr + row * U1 + u, blank, mask=u < U1)
        tl.store(emit_ptr + row * U + u, emit, mask=u < U)
        tl.store(lse_ptr + row * U1 + u, tl.where(node, lse, 0.0), mask=u < U1)
        u0 += ROWS


@triton.jit(do_not_specialize=["T", "U1", "S"])
def _windows_kernel(
    post_blank_ptr,
    post_emit_ptr,
    log_p_ptr,
    input_lengths_ptr,
    target_lengths_ptr,
    starts_ptr,
    nll_ptr,
    T,
    U1,
    S,
    MONOTONIC: tl.constexpr,
    BLOCK: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Utterance ``b = program_id``: ``nll[b] = -log P(y)`` (``inf`` where ``log P(y)`` is
    ``-inf``) and the window starts ``(B, T)`` of :func:`cbasr.losses.prune_ranges` (its
    docstring gives the bounds), from the posteriors: the window of ``S`` positions with the
    most occupancy (the first of equal ones), clamped, raised to the running maximum, then to the
    running maximum of ``s_t - t rise`` from the end."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets
    log_p = tl.load(log_p_ptr + b)
    tl.store(nll_ptr + b, tl.where(log_p == float("-inf"), float("inf"), -log_p))
    n = tl.load(input_lengths_ptr + b)
    k = tl.load(target_lengths_ptr + b)
    U = U1 - 1
    if MONOTONIC:
        rise = 1
    else:
        rise = S - 1
    top = tl.maximum(k - S + 1, 0)
    v = tl.arange(0, BLOCK)
    fits = v + S <= U1  # the windows [v, v + S) inside the lattice
    running = top * 0
    t = 0
    while t < T:
        at = (b * T + t) * U1
        occupancy = tl.load(post_blank_ptr + at + v, mask=v < U1, other=0.0).to(tl.float64)
        occupancy += tl.load(post_emit_ptr + (b * T + t) * U + v, mask=v < U, other=0.0).to(
            tl.float64
        )
        window = tl.zeros_like(occupancy)
        j = 0
        while j < S:
            window += tl.gather(occupancy, tl.minimum(v + j, BLOCK - 1), 0)
            j += 1
        desired = tl.argmax(tl.where(fits, window, -1.0), axis=0, tie_break_left=True)
        desired = tl.where(U1 > S, desired, 0)
        last = tl.minimum(t, n - 1)  # padded frames take the last frame's bounds
        if MONOTONIC:
            frames_left = n - last
        else:
            frames_left = n - 1 - last
        low = tl.maximum(top - frames_left * rise, 0)
        high = tl.minimum(last * rise, top)
        running = tl.maximum(running, tl.maximum(tl.minimum(desired, high), low))
        tl.store(starts_ptr + b * T + t, running)
        t += 1
    tl.debug_barrier()  # the starts stored above are read back below
    best = running - T * rise
    t = T - 1
    while t >= 0:
        best = tl.maximum(best, tl.load(starts_ptr + b * T + t) - t * rise)
        tl.store(starts_ptr + b * T + t, best + t * rise)
        t -= 1


@triton.jit
def _edge_gradients(
    post_blank_ptr, post_emit_ptr, lse_ptr, node_at, emit_at, node, emits, g, beta, HAT
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """For a block of nodes: the gradients ``g_blank``, ``g_label`` of ``-g log P(y)`` w.r.t.
    their edges, the weight of their normaliser's softmax (``g_blank + g_label`` for RNN-T,
    ``g_label`` for HAT), the gradient w.r.t. unit 0's score (RNN-T's blank; HAT's ``beta``
    through both log-sigmoids) and the normalisers."""
    g_blank = -g * tl.load(post_blank_ptr + node_at, mask=node, other=0.0)
    g_label = -g * tl.load(post_emit_ptr + emit_at, mask=emits, other=0.0)
    lse = tl.load(lse_ptr + node_at, mask=node, other=0.0)
    if HAT:
        on = 1.0 / (1.0 + tl.exp(-beta))
        return g_label, g_label, g_blank * (1.0 - on) - g_label * on, lse
    return g_label, g_blank + g_label, g_blank, lse


@triton.jit(do_not_specialize=["T", "U1", "V"])
def _simple_grad_am_kernel(
    am_ptr,
    lm_ptr,
    targets_ptr,
    input_lengths_ptr,
    target_lengths_ptr,
    lse_ptr,
    post_blank_ptr,
    post_emit_ptr,
    grad_ptr,
    stride,
    grad_am_ptr,
    T,
    U1,
    V,
    start,
    HAT: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Frame ``(b, t) = divmod(program_id, T)``: ``grad_am[b, t]``, ``COLS`` units at a time,
    each summed over the label positions ``ROWS`` at a time; 0 on a padded frame."""
    row = tl.program_id(0).to(tl.int64)  # b * T + t, 64-bit offsets
    b = row // T
    t = row % T
    U = U1 - 1
    frame = t < tl.load(input_lengths_ptr + b)
    k = tl.load(target_lengths_ptr + b)
    g = tl.load(grad_ptr + b * stride)  # (stride 0 for a gradient expanded from a sum)
    cols = tl.arange(0, COLS)
    a0 = tl.load(am_ptr + row * V, mask=frame, other=0.0)
    c0 = 0
    while c0 < V:
        at = c0 + cols
        unit = at < V
        a = tl.load(am_ptr + row * V + at, mask=unit & frame, other=0.0)
        acc = tl.zeros([COLS], a.dtype)
        u0 = 0
        while u0 < U1:
            u = u0 + tl.arange(0, ROWS)
            node = (u < U1) & (u <= k) & frame
            emits = node & (u < k)
            lm_rows = lm_ptr + (b * U1 + u) * V
            beta = a0 + tl.load(lm_rows, mask=node, other=0.0)
            g_label, weight, g_zero, lse = _edge_gradients(
                post_blank_ptr, post_emit_ptr, lse_ptr, row * U1 + u, row * U + u, node, emits,
                g, beta, HAT,
            )  # fmt: skip
            mask = node[:, None] & (unit & (at >= start))[None, :]
            x = a[None, :] + tl.load(lm_rows[:, None] + at[None, :], mask=mask, other=0.0)
            share = tl.where(mask, tl.exp(tl.where(mask, x - lse[:, None], 0.0)), 0.0)
            acc -= tl.sum(weight[:, None] * share, axis=0)
            label = tl.load(targets_ptr + b * U + u, mask=emits, other=0)
            acc += tl.sum(tl.where(label[:, None] == at[None, :], g_label[:, None], 0.0), axis=0)
            acc += tl.where(at == 0, tl.sum(g_zero, axis=0), 0.0)
            u0 += ROWS
        tl.store(grad_am_ptr + row * V + at, tl.where(frame, acc, 0.0), mask=unit)
        c0 += COLS


@triton.jit(do_not_specialize=["T", "U1", "V"])
def _simple_grad_lm_kernel(
    am_ptr,
    lm_ptr,
    targets_ptr,
    input_lengths_ptr,
    target_lengths_ptr,
    lse_ptr,
    post_blank_ptr,
    post_emit_ptr,
    grad_ptr,
    stride,
    grad_lm_ptr,
    T,
    U1,
    V,
    start,
    HAT: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Label position ``(b, u) = divmod(program_id, U + 1)``: ``grad_lm[b, u]``, ``COLS`` units
    at a time, each summed over the frames ``ROWS`` at a time; 0 past ``U_b``."""
    position = tl.program_id(0).to(tl.int64)  # b * (U + 1) + u, 64-bit offsets
    b = position // U1
    u = position % U1
    U = U1 - 1
    n = tl.load(input_lengths_ptr + b)
    k = tl.load(target_lengths_ptr + b)
    exists = u <= k
    g = tl.load(grad_ptr + b * stride)  # (stride 0 for a gradient expanded from a sum)
    label = tl.load(targets_ptr + b * U + u, mask=exists & (u < k), other=0)  # y_{u+1}'s unit
    cols = tl.arange(0, COLS)
    l0 = tl.load(lm_ptr + position * V, mask=exists, other=0.0)
    c0 = 0
    while c0 < V:
        at = c0 + cols
        unit = at < V
        lm = tl.load(lm_ptr + position * V + at, mask=unit & exists, other=0.0)
        acc = tl.zeros([COLS], lm.dtype)
        t0 = 0
        while t0 < T:
            t = t0 + tl.arange(0, ROWS)
            node = (t < T) & (t < n) & exists
            rows = b * T + t
            beta = tl.load(am_ptr + rows * V, mask=node, other=0.0) + l0
            g_label, weight, g_zero, lse = _edge_gradients(
                post_blank_ptr, post_emit_ptr, lse_ptr, rows * U1 + u, rows * U + u, node,
                node & (u < k), g, beta, HAT,
            )  # fmt: skip
            mask = node[:, None] & (unit & (at >= start))[None, :]
            x = lm[None, :] + tl.load(
                am_ptr + rows[:, None] * V + at[None, :], mask=mask, other=0.0
            )
            share = tl.where(mask, tl.exp(tl.where(mask, x - lse[:, None], 0.0)), 0.0)
            acc -= tl.sum(weight[:, None] * share, axis=0)
            acc += tl.where(at == label, tl.sum(g_label, axis=0), 0.0)
            acc += tl.where(at == 0, tl.sum(g_zero, axis=0), 0.0)
            t0 += ROWS
        tl.store(grad_lm_ptr + position * V + at, tl.where(exists, acc, 0.0), mask=unit)
        c0 += COLS


def windows(post_blank, post_emit, log_p, input_lengths, target_lengths, prune_range, monotonic):
    """``(-log P(y) (B,), starts (B, T))`` by :func:`_windows_kernel` from the edge posteriors
    ``post_blank (B, T, U + 1)``, ``post_emit (B, T, U)`` and ``log P(y) (B,)``; lengths int64
    on their device."""
    B, T, U1 = post_blank.shape
    nll = post_blank.new_empty(B)
    starts = torch.empty(B, T, dtype=torch.long, device=post_blank.device)
    if B:
        size, warps = block(U1)
        _windows_kernel[(B,)](
            post_blank.contiguous(), post_emit.contiguous(), log_p, input_lengths, target_lengths,
            starts, nll, T, U1, prune_range, MONOTONIC=monotonic, BLOCK=size, num_warps=warps,
        )  # fmt: skip
    return nll, starts


class SimpleLoss(torch.autograd.Function):
    """``(nll (B,), starts (B, T))`` of :func:`cbasr.losses.simple_transducer_nll` on checked
    arguments: ``am (B, T, V)``, ``lm (B, U + 1, V)`` of one float dtype (float32 or float64),
    ``targets (B, U)``, ``input_lengths``, ``target_lengths`` ``(B,)`` int64 on their device;
    differentiable once w.r.t. ``am`` and ``lm`` (the windows are not differentiated)."""

    @staticmethod
    def forward(ctx, am, lm, targets, input_lengths, target_lengths, prune_range, hat, monotonic):
        from cbasr.losses import _transducer_triton

        am, lm, targets = am.detach().contiguous(), lm.detach().contiguous(), targets.contiguous()
        B, T, V = am.shape
        U1 = lm.shape[1]
        blank, lse = am.new_empty(B, T, U1), am.new_empty(B, T, U1)
        emit = am.new_empty(B, T, U1 - 1)
        start = 1 if hat else 0
        floor = math.log(torch.finfo(am.dtype).tiny) + 0.5
        if B and T:
            _simple_edges_kernel[(B * T,)](
                am, lm, targets, input_lengths, target_lengths, blank, emit, lse, T, U1, V,
                start, FLOOR=floor, HAT=hat, ROWS=_ROWS, COLS=_COLS, num_warps=4,
            )  # fmt: skip
        log_p, lattice = _transducer_triton.forward(blank, emit, target_lengths, monotonic)
        post_blank, post_emit = _transducer_triton.posteriors(
            blank, emit, lattice, target_lengths, monotonic
        )
        nll, starts = windows(
            post_blank, post_emit, log_p, input_lengths, target_lengths, prune_range, monotonic
        )
        ctx.save_for_backward(
            am, lm, targets, input_lengths, target_lengths, lse, post_blank, post_emit
        )
        ctx.hat = hat
        ctx.mark_non_differentiable(starts)
        ctx.set_materialize_grads(False)  # (no zeros made for the starts' gradient)
        return nll, starts

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, _):
        if grad is None:
            return (None,) * 8
        am, lm, targets, input_lengths, target_lengths, lse, post_blank, post_emit = (
            ctx.saved_tensors
        )
        B, T, V = am.shape
        U1 = lm.shape[1]
        grad_am, grad_lm = torch.empty_like(am), torch.empty_like(lm)
        arguments = (am, lm, targets, input_lengths, target_lengths, lse, post_blank, post_emit)
        options = {"HAT": ctx.hat, "ROWS": _ROWS, "COLS": _COLS, "num_warps": 4}
        start = 1 if ctx.hat else 0
        if B and T:
            _simple_grad_am_kernel[(B * T,)](
                *arguments, grad, grad.stride(0), grad_am, T, U1, V, start, **options
            )
        if B:
            _simple_grad_lm_kernel[(B * U1,)](
                *arguments, grad, grad.stride(0), grad_lm, T, U1, V, start, **options
            )
        return grad_am, grad_lm, None, None, None, None, None, None
