"""The count recursion of :mod:`cbasr.distributions._tables` as Triton kernels (package-internal):
the ``triton`` backend of the Poisson-Binomial normaliser and its gradient, and of the tilt.

One program per parameter row runs the whole recursion over frames, its row of count states in
registers (a state vector of ``max(k) + 1`` entries: one block):

- :func:`tilt`: :func:`~cbasr.distributions._tables.tilt_for_total` by the same 40 bisection
  steps in float64, over the row's frames at once.
- :class:`LogNormaliser`: ``log P(K = k)`` of independent trials with ``log_off = log(1 - p_t)``
  and ``log_on = log p_t`` (eq. 5). The forward pass keeps the prefix table ``prefix[t, v] =
  log P(K_{<t} = v)``,

      prefix[t + 1, v] = logaddexp(prefix[t, v] + log_off[t], prefix[t, v - 1] + log_on[t]),

  the shifted state ``v - 1`` a ``tl.gather`` of the row in registers (through shared memory
  on a GPU), so no step waits on global memory; each frame's weights (and, backward, its prefix
  row) are loaded while the frame before computes. The
  backward pass runs the suffix recursion the other way in "count so far" form, ``gamma[t, v] =
  log P(K_{>=t} = k - v)``,

      gamma[t, v] = logaddexp(gamma[t + 1, v] + log_off[t], gamma[t + 1, v + 1] + log_on[t]),

  from ``gamma[T, k] = 0``, and each frame's inclusion probability (eq. 16) as it goes,
  ``P(B_t = 1 | k) = sum_v exp(prefix[t, v] + log_on[t] + gamma[t + 1, v + 1] - log P(K = k))``,
  which is the gradient: ``d/d log_on_t = P(B_t = 1 | k)``, ``d/d log_off_t = 1 - P(B_t = 1 | k)``.

- :class:`CountTable`: the reference's whole table (:func:`~cbasr.distributions._tables.count_table`,
  prefix or suffix, time-major) and its adjoint, the table's gradient carried back through each
  frame's two branches by their shares of the row it wrote, as the reference's backward does;
  what the ID-checking estimator's steps (eq. 11) and the bounded-Bernoulli marginals are
  differentiated through (before, ``T`` PyTorch steps each way).

Padding frames (``log_off = 0``, ``log_on = -inf``) are identity steps, as in the reference.
Float32 and float64, in log space like the PyTorch reference (whose accuracy the tilt provides).
Importing this module needs Triton; ``TRITON_INTERPRET=1`` runs it on CPU tensors.
"""

import math

import torch
import triton
import triton.language as tl

from cbasr._triton import block, log_add_exp, softplus
from cbasr.distributions._tables import (
    normaliser_double_backward,
    normaliser_gradients,
)

__all__: list[str] = []  # package-internal

_BISECTIONS = 40  # as the reference


@triton.jit
def _row_tilt(x, valid, total, STEPS: tl.constexpr):  # pragma: no cover - compiled (or interpreted)
    """The bisection of :func:`~cbasr.distributions._tables.tilt_for_total` for one row, in
    float64: ``x`` its logits (a block of frames), ``valid`` its frame mask, ``total`` its
    ``k``."""
    x = x.to(tl.float64)
    finite = valid & (x == x) & (tl.abs(x) != float("inf"))
    always = valid & (x == float("inf"))
    count = tl.sum(finite.to(tl.float64), axis=0)
    target = total.to(tl.float64) - tl.sum(always.to(tl.float64), axis=0)
    target = tl.minimum(tl.maximum(target, 0.5), count - 0.5)
    low = tl.min(tl.where(finite, x, float("inf")), axis=0)
    high = tl.max(tl.where(finite, x, float("-inf")), axis=0)
    low = tl.where(count > 0, low - 40.0, 0.0)
    high = tl.where(count > 0, high + 40.0, 0.0)
    step = 0
    while step < STEPS:
        mid = 0.5 * (low + high)
        mean = tl.sum(tl.where(finite, 1.0 / (1.0 + tl.exp(mid - x)), 0.0), axis=0)
        too_many = mean > target
        low = tl.where(too_many, mid, low)
        high = tl.where(too_many, high, mid)
        step += 1
    return 0.5 * (low + high)


@triton.jit
def _frames_of(lengths_ptr, b, T):  # pragma: no cover - compiled (or interpreted)
    """Row ``b``'s number of frames, ``lengths[b]`` clamped to ``[0, T]``."""
    return tl.minimum(tl.maximum(tl.load(lengths_ptr + b), 0), T)


@triton.jit
def _log_weights(x, there):  # pragma: no cover - compiled (or interpreted)
    """``(log(1 - p), log p)`` of ``p = sigmoid(x)`` as
    :func:`~cbasr.distributions._tables.bernoulli_log_weights` (``log sigmoid(x) =
    -softplus(-x)``); ``(0, -inf)``, the identity step, where not ``there``."""
    off = tl.where(there, -softplus(x), 0.0)
    on = tl.where(there, -softplus(-x), float("-inf"))
    return off, on


@triton.jit(do_not_specialize=["T"])
def _tilt_kernel(
    logits_ptr, lengths_ptr, total_ptr, tilt_ptr, T, STEPS: tl.constexpr, BLOCK: tl.constexpr
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Row ``b = program_id``: the bisection of the reference in float64, ``tilt[b]`` (stored in
    the logits' dtype)."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    t = tl.arange(0, BLOCK)
    valid = t < _frames_of(lengths_ptr, b, T)
    x = tl.load(logits_ptr + b * T + t, mask=valid, other=0.0)
    tl.store(tilt_ptr + b, _row_tilt(x, valid, tl.load(total_ptr + b), STEPS))


@triton.jit
def _frame(off_ptr, on_ptr, b, t, T):  # pragma: no cover - compiled (or interpreted)
    """Frame ``t``'s ``(log_off, log_on)`` of row ``b`` (an identity step outside ``[0, T)``)."""
    there = (t >= 0) & (t < T)
    off = tl.load(off_ptr + b * T + t, mask=there, other=0.0)
    on = tl.load(on_ptr + b * T + t, mask=there, other=-math.inf)
    return off, on


@triton.jit
def _lanes(V, BLOCK: tl.constexpr):  # pragma: no cover - compiled (or interpreted)
    """A row's count-state lanes ``v``, which of them exist (``v < V``), and the shifts'
    sources: count ``v - 1`` (``came_in``, from lane ``left``) and ``v + 1`` (``ahead_in``, from
    lane ``right``), the index 0 where there is none (the caller masks it)."""
    v = tl.arange(0, BLOCK)
    inside = v < V
    came_in = (v >= 1) & inside
    ahead_in = v + 1 < V
    return v, inside, came_in, tl.where(came_in, v - 1, 0), ahead_in, tl.where(ahead_in, v + 1, 0)


@triton.jit(do_not_specialize=["T", "V"])
def _prefix_kernel(
    off_ptr, on_ptr, total_ptr, prefix_ptr, normaliser_ptr, T, V, BLOCK: tl.constexpr
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Row ``b = program_id``: ``prefix`` ``(B, T + 1, V)`` and ``normaliser[b] = prefix[T, k]``
    from ``log_off``, ``log_on`` ``(B, T)``."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    v, inside, came_in, left, _, _ = _lanes(V, BLOCK)
    row = tl.where(v == 0, 0.0, float("-inf")).to(prefix_ptr.dtype.element_ty)
    tl.store(prefix_ptr + b * (T + 1) * V + v, row, mask=inside)
    off, on = _frame(off_ptr, on_ptr, b, 0, T)
    t = 0
    while t < T:  # (a while loop: Triton's interpreter cannot take range() of an argument)
        off_next, on_next = _frame(off_ptr, on_ptr, b, t + 1, T)  # loaded while this one runs
        came = tl.where(came_in, tl.gather(row, left, 0), float("-inf"))  # prefix[t, v - 1]
        row = log_add_exp(row + off, came + on)
        tl.store(prefix_ptr + (b * (T + 1) + t + 1) * V + v, row, mask=inside)
        off, on = off_next, on_next
        t += 1
    k = tl.load(total_ptr + b)
    found = tl.sum(tl.where(v == k, row, 0.0), axis=0)
    tl.store(normaliser_ptr + b, tl.where((k >= 0) & (k < V), found, float("-inf")))


@triton.jit(do_not_specialize=["T", "V"])
def _inclusion_kernel(
    off_ptr,
    on_ptr,
    total_ptr,
    prefix_ptr,
    normaliser_ptr,
    inclusion_ptr,
    FLOOR: tl.constexpr,
    T,
    V,
    BLOCK: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Row ``b = program_id``: ``inclusion`` ``(B, T)``, ``P(B_t = 1 | k)`` (0 where ``K = k`` is
    impossible)."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    v = tl.arange(0, BLOCK)
    inside = v < V
    ahead_in = v + 1 < V
    right = tl.where(ahead_in, v + 1, 0)
    k = tl.load(total_ptr + b)
    log_z = tl.load(normaliser_ptr + b)
    possible = log_z != float("-inf")
    log_z = tl.where(possible, log_z, 0.0)
    gamma = tl.where(v == k, 0.0, float("-inf")).to(prefix_ptr.dtype.element_ty)
    off, on = _frame(off_ptr, on_ptr, b, T - 1, T)
    prefix = tl.load(
        prefix_ptr + (b * (T + 1) + T - 1) * V + v, mask=inside & (T > 0), other=-math.inf
    )
    t = T - 1
    while t >= 0:
        # the previous frame's weights and prefix row, loaded while this frame computes
        off_next, on_next = _frame(off_ptr, on_ptr, b, t - 1, T)
        prefix_next = tl.load(
            prefix_ptr + (b * (T + 1) + t - 1) * V + v, mask=inside & (t >= 1), other=-math.inf
        )
        ahead = tl.where(ahead_in, tl.gather(gamma, right, 0), float("-inf"))  # gamma[t+1, v+1]
        log_share = prefix + on + ahead - log_z
        # below about twice the smallest normal number: 0, as the reference
        low = tl.zeros_like(log_share) + FLOOR  # (exact: see cbasr._triton)
        share = tl.where(log_share < low, 0.0, tl.exp(tl.maximum(log_share, low)))
        included = tl.sum(share, axis=0)
        tl.store(inclusion_ptr + b * T + t, tl.where(possible, included, 0.0))
        gamma = log_add_exp(gamma + off, ahead + on)
        off, on, prefix = off_next, on_next, prefix_next
        t -= 1


def tilt(logits: torch.Tensor, total: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``(B,)`` tilt of :func:`~cbasr.distributions._tables.tilt_for_total` for ``logits (B,
    T)``, ``total (B,)``, ``lengths (B,)`` (each row's frames ``< lengths`` are valid); a
    constant (no gradient), in ``logits``' dtype."""
    logits = logits.detach().contiguous()
    B, T = logits.shape
    out = logits.new_empty(B)
    if B:
        size, warps = block(T)
        _tilt_kernel[(B,)](
            logits, lengths, total, out, T, STEPS=_BISECTIONS, BLOCK=size, num_warps=warps
        )
    return out


class LogNormaliser(torch.autograd.Function):
    """``log P(K = k)`` of independent trials, as :class:`cbasr.distributions._kernels.
    LogNormaliser` (same arguments: ``log_off``, ``log_on`` ``(B, T)`` float32 or float64 with
    identity steps on padding, ``total``, ``lengths`` ``(B,)``, ``num_states > max(total)``)
    -> ``(B,)``; the backward is eq. (16) from the kernel, or under ``create_graph`` the
    differentiable reference recursion (double backward)."""

    @staticmethod
    def forward(ctx, log_off, log_on, total, lengths, num_states):
        log_off, log_on = log_off.contiguous(), log_on.contiguous()
        B, T = log_on.shape
        prefix = log_on.new_empty(B, T + 1, num_states)
        normaliser = log_on.new_empty(B)
        if B:
            size, warps = block(num_states)
            _prefix_kernel[(B,)](
                log_off, log_on, total, prefix, normaliser, T, num_states, BLOCK=size,
                num_warps=warps,
            )  # fmt: skip
        ctx.save_for_backward(log_off, log_on, total, lengths, prefix, normaliser)
        return normaliser

    @staticmethod
    def backward(ctx, grad):
        log_off, log_on, total, lengths, prefix, normaliser = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the differentiable recursion
            num_states = prefix.shape[-1]
            grads = normaliser_double_backward(log_off, log_on, total, num_states, grad)
            return grads + (None, None, None)
        B, T = log_on.shape
        inclusion = log_on.new_zeros(B, T)
        if B and T:
            size, warps = block(prefix.shape[-1])
            floor = math.log(torch.finfo(log_on.dtype).tiny) + 0.5
            _inclusion_kernel[(B,)](
                log_off, log_on, total, prefix, normaliser, inclusion,
                floor, T, prefix.shape[-1], BLOCK=size, num_warps=warps,
            )  # fmt: skip
        grads = normaliser_gradients(grad, inclusion, torch.isfinite(normaliser), lengths)
        return grads + (None, None, None)


# ---- log_prob, fused ------------------------------------------------------------------------


@triton.jit(do_not_specialize=["B", "S", "T", "V"])
def _log_prob_kernel(
    logits_ptr,
    lengths_ptr,
    total_ptr,
    value_ptr,
    tilt_ptr,
    prefix_ptr,
    normaliser_ptr,
    out_ptr,
    codes_ptr,
    B,
    S,
    T,
    V,
    STEPS: tl.constexpr,
    FRAMES: tl.constexpr,
    BLOCK: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Parameter row ``b = program_id``: its tilt (:func:`_row_tilt`), the prefix table of the
    tilted trials ``(B, T + 1, V)`` over its ``n`` frames and ``log P(K = k)`` (as
    :func:`_prefix_kernel`), then for each of the ``S`` values ``m = s B + b`` ``(S B, T)``,
    ``log P(b | k) = sum_t log P(b_t) - log P(K = k)`` (eq. 4 under the tilt, eq. 6) into
    ``out[m]``, ``-inf`` for a value outside the support, and ``codes[m]``, what is wrong with
    it: 3 not binary, 2 a high at a padding frame, 1 not ``k`` highs, 0 nothing."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    n = _frames_of(lengths_ptr, b, T)
    k = tl.load(total_ptr + b)
    t = tl.arange(0, FRAMES)
    valid = t < n
    x = tl.load(logits_ptr + b * T + t, mask=valid, other=0.0)
    tilt = _row_tilt(x, valid, k, STEPS).to(x.dtype)  # the reference shifts in the logits' dtype
    tl.store(tilt_ptr + b, tilt)
    v = tl.arange(0, BLOCK)
    inside = v < V
    came_in = (v >= 1) & inside
    left = tl.where(came_in, v - 1, 0)
    row = tl.where(v == 0, 0.0, float("-inf")).to(x.dtype)
    tl.store(prefix_ptr + b * (T + 1) * V + v, row, mask=inside)
    here = tl.load(logits_ptr + b * T, mask=n > 0, other=0.0)
    f = 0
    while f < n:  # frames past n are identity steps: their rows are never read
        ahead = tl.load(logits_ptr + b * T + f + 1, mask=f + 1 < n, other=0.0)  # loaded early
        off, on = _log_weights(here - tilt, f < n)
        came = tl.where(came_in, tl.gather(row, left, 0), float("-inf"))  # prefix[f, v - 1]
        row = log_add_exp(row + off, came + on)
        tl.store(prefix_ptr + (b * (T + 1) + f + 1) * V + v, row, mask=inside)
        here = ahead
        f += 1
    found = tl.sum(tl.where(v == k, row, 0.0), axis=0)
    log_z = tl.where((k >= 0) & (k < V), found, float("-inf"))
    tl.store(normaliser_ptr + b, log_z)
    frame = t < T
    off, on = _log_weights(x - tilt, valid)
    s = 0
    while s < S:
        m = s * B + b
        value = tl.load(value_ptr + m * T + t, mask=frame, other=0.0)
        high = value != 0
        count = tl.sum(high.to(tl.int64), axis=0)
        frames = tl.sum(tl.where(high, on, off), axis=0)
        fits = (count == k) & (log_z != float("-inf"))
        tl.store(out_ptr + m, tl.where(fits, frames - log_z, float("-inf")))
        binary = tl.sum((high & (value != 1)).to(tl.int32), axis=0) == 0
        padded = tl.sum((high & ~valid).to(tl.int32), axis=0) > 0
        code = tl.where(binary, tl.where(padded, 2, tl.where(count != k, 1, 0)), 3)
        tl.store(codes_ptr + m, code.to(tl.int8))
        s += 1


@triton.jit(do_not_specialize=["B", "S", "T", "V"])
def _log_prob_backward_kernel(
    logits_ptr,
    lengths_ptr,
    total_ptr,
    value_ptr,
    tilt_ptr,
    prefix_ptr,
    normaliser_ptr,
    out_ptr,
    grad_ptr,
    stride,
    grad_logits_ptr,
    FLOOR: tl.constexpr,
    B,
    S,
    T,
    V,
    FRAMES: tl.constexpr,
    BLOCK: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Parameter row ``b = program_id``: ``grad_logits[b, t] = sum_s g_m (b_{m, t} - P(B_t = 1 |
    k))`` over its values ``m = s B + b`` of finite log probability, ``g`` the incoming gradient
    (the tilt cancels in eq. 4, and ``d log P(K = k) / d logit_t = P(B_t = 1 | k) - p_t``, eq.
    16); 0 on padding. The inclusion probabilities come from the suffix recursion run backwards
    against the forward's prefix table, as :func:`_inclusion_kernel`, into ``grad_logits``' row
    first."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    n = _frames_of(lengths_ptr, b, T)
    k = tl.load(total_ptr + b)
    tilt = tl.load(tilt_ptr + b)
    log_z = tl.load(normaliser_ptr + b)
    possible = log_z != float("-inf")
    log_z = tl.where(possible, log_z, 0.0)
    v = tl.arange(0, BLOCK)
    inside = v < V
    ahead_in = v + 1 < V
    right = tl.where(ahead_in, v + 1, 0)
    gamma = tl.where(v == k, 0.0, float("-inf")).to(prefix_ptr.dtype.element_ty)
    f = n - 1
    here = tl.load(logits_ptr + b * T + f, mask=f >= 0, other=0.0)
    prefix = tl.load(prefix_ptr + (b * (T + 1) + f) * V + v, mask=inside & (f >= 0), other=0.0)
    while f >= 0:
        # the previous frame's logit and prefix row, loaded while this frame computes
        before = tl.load(logits_ptr + b * T + f - 1, mask=f >= 1, other=0.0)
        prefix_before = tl.load(
            prefix_ptr + (b * (T + 1) + f - 1) * V + v, mask=inside & (f >= 1), other=0.0
        )
        off, on = _log_weights(here - tilt, f < n)
        ahead = tl.where(ahead_in, tl.gather(gamma, right, 0), float("-inf"))  # gamma[f+1, v+1]
        log_share = tl.where(inside, prefix + on + ahead - log_z, float("-inf"))
        # below about twice the smallest normal number: 0, as the reference
        low = tl.zeros_like(log_share) + FLOOR  # (exact: see cbasr._triton)
        share = tl.where(log_share < low, 0.0, tl.exp(tl.maximum(log_share, low)))
        tl.store(grad_logits_ptr + b * T + f, tl.sum(share, axis=0))
        gamma = log_add_exp(gamma + off, ahead + on)
        here, prefix = before, prefix_before
        f -= 1
    tl.debug_barrier()  # the inclusion probabilities stored above are read back as a block
    t = tl.arange(0, FRAMES)
    valid = t < n
    included = tl.load(grad_logits_ptr + b * T + t, mask=valid, other=0.0)
    weight = tl.sum(tl.zeros_like(included), axis=0)
    highs = tl.zeros_like(included)
    s = 0
    while s < S:
        m = s * B + b
        g = tl.load(grad_ptr + m * stride)  # (0 for a gradient expanded from a sum)
        g = tl.where(tl.load(out_ptr + m) != float("-inf"), g, 0.0)
        value = tl.load(value_ptr + m * T + t, mask=valid, other=0.0)
        highs += tl.where(value != 0, g, 0.0)
        weight += g
        s += 1
    grad = tl.where(valid, tl.where(possible, highs - included * weight, 0.0), 0.0)
    tl.store(grad_logits_ptr + b * T + t, grad, mask=t < T)


class LogProb(torch.autograd.Function):
    """``log P(b | k)`` (eq. 4) of values ``(S B, T)`` (row ``m`` of parameter row ``m % B``)
    under ``logits (B, T)`` float32 or float64, ``total``, ``lengths`` ``(B,)``, with
    ``num_states > max(total)``: one kernel forward (tilt, count table, normaliser, the values'
    sums and their validity codes), one backward (``b_t - P(B_t = 1 | k)``, eq. 16). Returns the
    ``(S B,)`` log probabilities and the ``(S B,)`` int8 codes of :func:`_log_prob_kernel`.
    Under ``create_graph`` the backward differentiates ``reference(logits)``, the unfused
    computation of the same log probabilities (double backward)."""

    @staticmethod
    def forward(ctx, logits, total, lengths, value, num_states, reference):
        x = logits.detach().contiguous()
        value = value.to(x.dtype).contiguous()
        B, T = x.shape
        N = value.shape[0]
        tilt, normaliser = x.new_empty(B), x.new_empty(B)
        prefix = x.new_empty(B, T + 1, num_states)
        out = x.new_empty(N)
        codes = torch.empty(N, dtype=torch.int8, device=x.device)
        if B:
            frames, _ = block(T)
            size, warps = block(num_states)
            _log_prob_kernel[(B,)](
                x, lengths, total, value, tilt, prefix, normaliser, out, codes, B, N // B, T,
                num_states, STEPS=_BISECTIONS, FRAMES=frames, BLOCK=size, num_warps=warps,
            )  # fmt: skip
        ctx.save_for_backward(logits, total, lengths, value, tilt, prefix, normaliser, out)
        ctx.reference = reference
        ctx.mark_non_differentiable(codes)
        ctx.set_materialize_grads(False)  # (no zeros made for the codes' gradient)
        return out, codes

    @staticmethod
    def backward(ctx, grad, _):
        logits, total, lengths, value, tilt, prefix, normaliser, out = ctx.saved_tensors
        if grad is None:
            return None, None, None, None, None, None
        if torch.is_grad_enabled():  # create_graph: through the differentiable computation
            (grad_logits,) = torch.autograd.grad(
                ctx.reference(logits), logits, grad, create_graph=True
            )
            return grad_logits, None, None, None, None, None
        x = logits.detach().contiguous()
        B, T = x.shape
        grad_logits = torch.empty_like(x)
        if B:
            frames, _ = block(T)
            size, warps = block(prefix.shape[-1])
            floor = math.log(torch.finfo(x.dtype).tiny) + 0.5
            _log_prob_backward_kernel[(B,)](
                x, lengths, total, value, tilt, prefix, normaliser, out, grad, grad.stride(0),
                grad_logits, floor, B, value.shape[0] // B, T, prefix.shape[-1], FRAMES=frames,
                BLOCK=size, num_warps=warps,
            )  # fmt: skip
        return grad_logits, None, None, None, None, None


# ---- samplers -------------------------------------------------------------------------------


@triton.jit
def _weights_at(logits_ptr, tilt, i, t, n, T, there):  # pragma: no cover - compiled
    """Frame ``t``'s tilted ``(log_off, log_on)`` of row(s) ``i`` with ``n`` frames (the
    identity step at ``t >= n``); ``there`` masks the load."""
    x = tl.load(logits_ptr + i * T + t, mask=there & (t < n), other=0.0)
    return _log_weights(x - tilt, t < n)


@triton.jit(do_not_specialize=["T", "V"])
def _suffix_kernel(
    logits_ptr, tilt_ptr, lengths_ptr, total_ptr, suffix_ptr, possible_ptr, T, V,
    BLOCK: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)  # fmt: skip
    """Row ``b = program_id``: ``suffix`` ``(B, T + 1, V)``, ``suffix[b, t, v] = log P(K_{>=t}
    = k - v)`` (``v`` highs placed before ``t``), from ``suffix[b, T, k] = 0``, of the trials
    ``sigmoid(logit - tilt)``; padding frames are identity steps. ``possible[b]``: whether ``k``
    highs can be placed at all (``suffix[b, 0, 0] > -inf``)."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    n = _frames_of(lengths_ptr, b, T)
    tilt = tl.load(tilt_ptr + b)
    v = tl.arange(0, BLOCK)
    inside = v < V
    ahead_in = v + 1 < V
    k = tl.load(total_ptr + b)
    row = tl.where(v == k, 0.0, float("-inf")).to(suffix_ptr.dtype.element_ty)
    tl.store(suffix_ptr + (b * (T + 1) + T) * V + v, row, mask=inside)
    right = tl.where(ahead_in, v + 1, 0)
    off, on = _weights_at(logits_ptr, tilt, b, T - 1, n, T, T >= 1)
    t = T - 1
    while t >= 0:
        # the frame before, loaded while this one runs
        off_next, on_next = _weights_at(logits_ptr, tilt, b, t - 1, n, T, t >= 1)
        ahead = tl.where(ahead_in, tl.gather(row, right, 0), float("-inf"))  # suffix[t+1, v+1]
        row = log_add_exp(row + off, ahead + on)
        tl.store(suffix_ptr + (b * (T + 1) + t) * V + v, row, mask=inside)
        off, on = off_next, on_next
        t -= 1
    first = tl.sum(tl.where(v == 0, row, 0.0), axis=0)
    tl.store(possible_ptr + b, first != float("-inf"))


@triton.jit(do_not_specialize=["B", "N", "T", "V"])
def _id_checking_kernel(
    logits_ptr,
    tilt_ptr,
    lengths_ptr,
    total_ptr,
    suffix_ptr,
    uniform_ptr,
    out_ptr,
    B,
    N,
    T,
    V,
    BLOCK: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Samples ``m`` of block ``program_id``, one lane each, of parameter row ``m % B``: frame
    by frame, with ``r`` highs still to place, high when ``u_t > P(low) = p_low / (p_low +
    p_high)``, ``p_low = (1 - p_t) P(K_{>t} = r)`` and ``p_high = p_t P(K_{>t} = r - 1)`` (eq.
    11); ``out`` ``(N, T)`` 0 / 1 in its own dtype."""
    m = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)  # 64-bit offsets
    live = m < N
    i = m % B
    n = tl.load(lengths_ptr + i, mask=live, other=0)
    n = tl.minimum(tl.maximum(n, 0), T)
    k = tl.load(total_ptr + i, mask=live, other=0)
    tilt = tl.load(tilt_ptr + i, mask=live, other=0.0)
    placed = tl.zeros_like(k)
    t = 0
    while t < T:
        active = live & (t < n) & (placed < k)
        off, on = _weights_at(logits_ptr, tilt, i, t, n, T, active)
        after = suffix_ptr + (i * (T + 1) + t + 1) * V + placed
        low = off + tl.load(after, mask=active, other=-math.inf)
        high = on + tl.load(after + 1, mask=active, other=-math.inf)
        u = tl.load(uniform_ptr + m * T + t, mask=active, other=0.0)
        # P(low) without overflow: sigmoid(low - high), 1 where high is -inf, 0 where low is
        diff = low - tl.where(high == float("-inf"), 0.0, high)
        diff = tl.where(high == float("-inf"), float("inf"), diff)
        diff = tl.where(low == float("-inf"), float("-inf"), diff)
        p_low = 1.0 / (1.0 + tl.exp(-diff))
        hit = active & (u > p_low)
        tl.store(out_ptr + m * T + t, hit.to(out_ptr.dtype.element_ty), mask=live)
        placed += hit.to(placed.dtype)
        t += 1


@triton.jit(do_not_specialize=["B", "N", "T", "V", "K"])
def _bounded_kernel(
    logits_ptr,
    tilt_ptr,
    lengths_ptr,
    total_ptr,
    suffix_ptr,
    uniform_ptr,
    out_ptr,
    B,
    N,
    T,
    V,
    K,
    BLOCK: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Samples ``m`` of block ``program_id``, one lane each, of parameter row ``m % B``: Bounded
    Bernoulli steps (eq. 13) by inversion in one pass over the frames. With the previous high
    before frame ``t`` and ``r`` highs to place, the next is the first ``u >= t`` where
    ``sum_{t <= w <= u} prod_{t <= v < w} (1 - p_v) p_w P(K_{>w} = r - 1)`` exceeds ``U
    P(K_{>=t} = r)`` (in logs); ``out`` ``(N, K)`` int64 frames, -1 past the total."""
    m = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)  # 64-bit offsets
    live = m < N
    i = m % B
    n = tl.load(lengths_ptr + i, mask=live, other=0)
    n = tl.minimum(tl.maximum(n, 0), T)
    k = tl.load(total_ptr + i, mask=live, other=0)
    tilt = tl.load(tilt_ptr + i, mask=live, other=0.0)
    step = tl.zeros_like(k)  # highs placed
    first = live & (k > 0)
    u0 = tl.load(uniform_ptr + m * K, mask=first, other=1.0)
    start = tl.load(suffix_ptr + i * (T + 1) * V, mask=first, other=0.0)  # P(K_{>=0} = k)
    target = tl.log(u0) + start
    running = tl.zeros_like(target) + float("-inf")
    skipped = tl.zeros_like(target)
    t = 0
    while t < T:
        active = live & (step < k)
        r = k - step
        off, on = _weights_at(logits_ptr, tilt, i, t, n, T, active)
        after = tl.load(
            suffix_ptr + (i * (T + 1) + t + 1) * V + step + 1, mask=active, other=-math.inf
        )
        running = log_add_exp(running, skipped + on + after)
        chosen = active & ((running > target) | (t >= n - r))  # the latest frame that fits
        tl.store(out_ptr + m * K + step, tl.zeros_like(step).to(tl.int64) + t, mask=chosen)
        step += chosen.to(step.dtype)
        more = chosen & (step < k)
        u = tl.load(uniform_ptr + m * K + step, mask=more, other=1.0)
        rest = tl.load(suffix_ptr + (i * (T + 1) + t + 1) * V + step, mask=more, other=0.0)
        target = tl.where(more, tl.log(u) + rest, target)
        running = tl.where(chosen, float("-inf"), running)
        skipped = tl.where(chosen, 0.0, skipped + off)
        t += 1


_SAMPLES = 32  # samples per program of the samplers: one lane each of one warp (num_warps=1)


def _suffix_table(logits, tilt, total, lengths, num_states: int):
    """The suffix table ``(B, T + 1, V)``, ``V = num_states`` (more than the largest total), of
    the trials ``sigmoid(logits - tilt)`` and whether each row's total can be met ``(B,)``
    (:func:`_suffix_kernel`)."""
    B, T = logits.shape
    suffix = logits.new_empty(B, T + 1, num_states)
    possible = torch.empty(B, dtype=torch.bool, device=logits.device)
    if B:
        size, warps = block(num_states)
        _suffix_kernel[(B,)](
            logits, tilt, lengths, total, suffix, possible, T, num_states, BLOCK=size,
            num_warps=warps,
        )  # fmt: skip
    return suffix, possible


def id_checking(logits, tilt, total, lengths, uniform, num_states: int):
    """ID-checking draws (eq. 11), as :func:`cbasr.distributions._kernels.id_checking` with
    sample row ``m`` of parameter row ``m % B``: ``(N, T)`` 0. / 1. in ``logits``' dtype and
    the ``(B,)`` feasibility of each row's total. ``logits (B, T)`` and ``tilt (B,)`` of one
    dtype; ``total``, ``lengths`` ``(B,)`` int64, every total below ``num_states``; ``uniform
    (N, T)`` in ``(0, 1)``."""
    logits = logits.contiguous()
    suffix, possible = _suffix_table(logits, tilt, total, lengths, num_states)
    B, T = logits.shape
    N = uniform.shape[0]
    out = logits.new_empty(N, T)
    if N and T:
        _id_checking_kernel[(triton.cdiv(N, _SAMPLES),)](
            logits, tilt, lengths, total, suffix, uniform.to(logits.dtype).contiguous(), out,
            B, N, T, suffix.shape[-1], BLOCK=_SAMPLES, num_warps=1,
        )  # fmt: skip
    return out, possible


def bounded(logits, tilt, total, lengths, uniform):
    """Bounded Bernoulli draws (eq. 13) by inversion, one uniform per high, as
    :func:`cbasr.distributions._kernels.bounded` with sample row ``m`` of parameter row ``m %
    B``: ``(N, K)`` int64 increasing frames (-1 past the total) and the ``(B,)`` feasibility of
    each row's total. Arguments as :func:`id_checking`'s, ``uniform (N, K)``, every total at
    most ``K``."""
    logits = logits.contiguous()
    N, K = uniform.shape
    suffix, possible = _suffix_table(logits, tilt, total, lengths, K + 1)
    B, T = logits.shape
    out = torch.full((N, K), -1, dtype=torch.int64, device=logits.device)
    if N and K and T:
        _bounded_kernel[(triton.cdiv(N, _SAMPLES),)](
            logits, tilt, lengths, total, suffix, uniform.to(logits.dtype).contiguous(), out, B,
            N, T, suffix.shape[-1], K, BLOCK=_SAMPLES, num_warps=1,
        )  # fmt: skip
    return out, possible


# ---- the count recursion of :mod:`cbasr.distributions._tables`, with its adjoint ---------------


@triton.jit
def _share(log_share):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """``exp(log_share)``, 0 for NaN and below the smallest normal number (the reference's
    ``_share``)."""
    keep = log_share > math.log(1.1754943508222875e-38)
    return tl.where(keep, tl.exp(tl.where(keep, log_share, 0.0)), 0.0)


@triton.jit(do_not_specialize=["T", "B", "V"])
def _count_kernel(
    off_ptr, on_ptr, table_ptr, T, B, V, REVERSE: tl.constexpr, BLOCK: tl.constexpr
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Column ``b = program_id`` of the time-major ``table (T + 1, B, V)`` from ``log_off``,
    ``log_on (T, B)``: row 0 (``REVERSE``: row ``T``) is the count 0, and frame ``t`` takes row
    ``t`` to ``t + 1`` (``REVERSE``: ``t + 1`` to ``t``), the count staying or growing by one."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    v, inside, came_in, left, _, _ = _lanes(V, BLOCK)
    row = tl.where(v == 0, 0.0, float("-inf")).to(table_ptr.dtype.element_ty)
    first = T if REVERSE else 0
    tl.store(table_ptr + (first * B + b) * V + v, row, mask=inside)
    i = 0
    while i < T:  # (a while loop: Triton's interpreter cannot take range() of an argument)
        t = T - 1 - i if REVERSE else i
        off = tl.load(off_ptr + t * B + b)
        on = tl.load(on_ptr + t * B + b)
        came = tl.where(came_in, tl.gather(row, left, 0), float("-inf"))  # count v - 1
        row = log_add_exp(row + off, came + on)
        dst = t if REVERSE else t + 1
        tl.store(table_ptr + (dst * B + b) * V + v, row, mask=inside)
        i += 1


@triton.jit(do_not_specialize=["T", "B", "V"])
def _count_backward_kernel(
    off_ptr, on_ptr, table_ptr, grad_table_ptr, grad_off_ptr, grad_on_ptr, T, B, V,
    REVERSE: tl.constexpr, BLOCK: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)  # fmt: skip
    """The adjoint of :func:`_count_kernel` for column ``b = program_id``: frames in the other
    order, the adjoint of the row a frame wrote split between its two branches by their shares
    of it, ``grad_off[t, b]`` and ``grad_on[t, b]`` the adjoint that went through each; every
    row's own ``grad_table`` joins the adjoint as the recursion reaches it."""
    b = tl.program_id(0).to(tl.int64)
    v, inside, came_in, left, ahead_in, right = _lanes(V, BLOCK)
    last = 0 if REVERSE else T
    adjoint = tl.load(grad_table_ptr + (last * B + b) * V + v, mask=inside, other=0.0)
    i = 0
    while i < T:
        t = i if REVERSE else T - 1 - i
        src = t + 1 if REVERSE else t
        dst = t if REVERSE else t + 1
        off = tl.load(off_ptr + t * B + b)
        on = tl.load(on_ptr + t * B + b)
        came = tl.load(table_ptr + (src * B + b) * V + v, mask=inside, other=float("-inf"))
        went = tl.load(table_ptr + (dst * B + b) * V + v, mask=inside, other=float("-inf"))
        went = tl.where(went == float("-inf"), 0.0, went)  # unreached: both branches -inf
        stay = _share(came + off - went)
        below = tl.where(came_in, tl.gather(came, left, 0), float("-inf"))  # count v - 1
        move = tl.where(came_in, _share(below + on - went), 0.0)
        tl.store(grad_off_ptr + t * B + b, tl.sum(adjoint * stay, axis=0))
        tl.store(grad_on_ptr + t * B + b, tl.sum(adjoint * move, axis=0))
        moved = adjoint * move  # to count v from v - 1: back to v - 1
        back = tl.load(grad_table_ptr + (src * B + b) * V + v, mask=inside, other=0.0)
        adjoint = back + adjoint * stay + tl.where(ahead_in, tl.gather(moved, right, 0), 0.0)
        i += 1


class CountTable(torch.autograd.Function):
    """:class:`cbasr.distributions._tables._CountRecursion` by :func:`_count_kernel` and
    :func:`_count_backward_kernel`: ``log_off, log_on (T, B)`` contiguous, float32 or float64 -> ``table
    (T + 1, B, V)``. A backward that builds a graph (double backward) runs the reference's
    differentiable adjoint instead."""

    @staticmethod
    def forward(ctx, log_off, log_on, num_states, reverse):
        # (contiguous already: a copy made here would be saved cut off from the inputs' graph)
        T, B = log_off.shape
        table = log_off.new_empty(T + 1, B, num_states)
        if B:
            size, warps = block(num_states)
            _count_kernel[(B,)](
                log_off, log_on, table, T, B, num_states, REVERSE=reverse, BLOCK=size,
                num_warps=warps,
            )  # fmt: skip
        ctx.save_for_backward(log_off, log_on, table)
        ctx.reverse, ctx.num_states = reverse, num_states
        return table

    @staticmethod
    def backward(ctx, grad_table):
        from cbasr.distributions import _tables

        log_off, log_on, table = ctx.saved_tensors
        needs = ctx.needs_input_grad[:2]
        if torch.is_grad_enabled():  # a graph of the backward: the reference's adjoint
            again = _tables._CountRecursion.apply(log_off, log_on, ctx.num_states, ctx.reverse)
            inputs = [x for x, need in zip((log_off, log_on), needs) if need]
            got = iter(torch.autograd.grad(again, inputs, grad_table, create_graph=True))
            return tuple(next(got) if need else None for need in needs) + (None, None)
        T, B = log_off.shape
        grad_off, grad_on = torch.empty_like(log_off), torch.empty_like(log_on)
        if B:
            size, warps = block(ctx.num_states)
            _count_backward_kernel[(B,)](
                log_off, log_on, table, grad_table.contiguous(), grad_off, grad_on, T, B,
                ctx.num_states, REVERSE=ctx.reverse, BLOCK=size, num_warps=warps,
            )  # fmt: skip
        return grad_off, grad_on, None, None
