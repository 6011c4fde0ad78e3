"""The CB marginal lattice of :mod:`cbasr.losses.conditional_bernoulli` as Triton kernels
(package-internal): the ``triton`` backend of :mod:`cbasr._backends`.

The same forward-backward as the PyTorch reference (CB paper section 2.4, the HMM reading of
eq. 38), on the reference's shifted weights (:func:`~cbasr.losses.conditional_bernoulli.
_shift_labels`), with one program per utterance that runs the whole recursion over frames
itself instead of ``T`` launches of small operations:

- :func:`forward`: the forward variables ``alpha[t, s]`` (``s`` labels emitted after ``t``
  frames) row by row, ``alpha[t + 1, s] = logaddexp(alpha[t, s], alpha[t, s - 1] +
  emit[t, s - 1])``, and ``log Z = alpha[T, L_b]``. A frame's row lives in registers and
  the shifted read ``alpha[t, s - 1]`` is a ``tl.gather`` of it (through shared memory on a
  GPU), so no step waits on global memory: the rows are stored for the backward pass only, and
  the next frame's weights are loaded while this frame computes.
- :func:`posteriors`: the backward variables the other way, and each frame's edge posteriors
  ``P(t_l = t | y) = exp(alpha[t, l] + emit[t, l] + beta[t + 1, l + 1] - log Z)`` as it goes,
  which are the gradient of ``log Z``.
- :func:`viterbi`: the max-product forward pass of the Viterbi alignment, with the bit of each
  (frame, state) that says whether the best way in emitted; the backtrace stays on the host.

Padded frames (weight 0 for staying, ``-inf`` for emitting) are the identity, so each program
runs all ``T`` frames and needs no length of its own but ``L_b``. Float32 and float64; the
state vector of an utterance (``L + 1`` states) is one block, exchanged through shared memory
by ``tl.gather``, so ``L + 1`` is bounded by one block's shared memory (``2**15`` float32 or
``2**14`` float64 states on an H100, beyond which the launch fails: far beyond any label
sequence).

Importing this module needs Triton; set ``TRITON_INTERPRET=1`` first to run the kernels on
CPU tensors in Triton's interpreter (the tests do).
"""

import math

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from cbasr._triton import block as _block
from cbasr._triton import log_add_exp as _log_add_exp
from cbasr._triton import softplus as _softplus

__all__: list[str] = []  # package-internal


@triton.jit(do_not_specialize=["T", "B", "L"])
def _forward_kernel(
    emit_ptr, alpha_ptr, log_z_ptr, lengths_ptr, T, B, L, BLOCK: tl.constexpr
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """One utterance ``b = program_id``: ``alpha`` ``(T + 1, B, L + 1)`` and ``log_z[b]``
    from ``emit`` ``(T, B, L)``."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    s = tl.arange(0, BLOCK)
    inside = s <= L
    came_in = (s >= 1) & inside  # states reached by emitting label s - 1
    left = tl.where(came_in, s - 1, 0)
    row = tl.where(s == 0, 0.0, float("-inf")).to(alpha_ptr.dtype.element_ty)
    tl.store(alpha_ptr + b * (L + 1) + s, row, mask=inside)
    weight = tl.load(emit_ptr + b * L + s - 1, mask=came_in & (T > 0), other=-math.inf)
    t = 0
    while t < T:  # (a while loop: Triton's interpreter cannot take range() of an argument)
        ahead = tl.load(  # the next frame's weights, on their way while this frame computes
            emit_ptr + ((t + 1) * B + b) * L + s - 1, mask=came_in & (t + 1 < T), other=-math.inf
        )
        came = tl.where(came_in, tl.gather(row, left, 0), float("-inf"))  # alpha[t, s - 1]
        row = _log_add_exp(row, came + weight)
        tl.store(alpha_ptr + ((t + 1) * B + b) * (L + 1) + s, row, mask=inside)
        weight = ahead
        t += 1
    labels = tl.load(lengths_ptr + b)
    tl.store(log_z_ptr + b, tl.sum(tl.where(s == labels, row, 0.0), axis=0))


@triton.jit(do_not_specialize=["T", "B", "L"])
def _posterior_kernel(
    emit_ptr,
    alpha_ptr,
    log_z_ptr,
    lengths_ptr,
    post_ptr,
    FLOOR: tl.constexpr,
    T,
    B,
    L,
    BLOCK: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """One utterance ``b = program_id``: the backward variables from ``beta[T, L_b] = 0``, and
    ``post`` ``(T, B, L)``."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    s = tl.arange(0, BLOCK)
    emits = s < L  # states that can emit label s
    right = tl.where(emits, s + 1, 0)
    labels = tl.load(lengths_ptr + b)
    log_z = tl.load(log_z_ptr + b)
    log_z = tl.where(log_z == float("-inf"), 0.0, log_z)  # no path: every posterior is 0
    beta = tl.where(s == labels, 0.0, float("-inf")).to(alpha_ptr.dtype.element_ty)
    last = emits & (T > 0)
    weight = tl.load(emit_ptr + ((T - 1) * B + b) * L + s, mask=last, other=-math.inf)
    alpha = tl.load(alpha_ptr + ((T - 1) * B + b) * (L + 1) + s, mask=last, other=-math.inf)
    t = T - 1
    while t >= 0:
        before = emits & (t >= 1)  # the previous frame's weights and alphas, loaded early
        weight_next = tl.load(emit_ptr + ((t - 1) * B + b) * L + s, mask=before, other=-math.inf)
        alpha_next = tl.load(
            alpha_ptr + ((t - 1) * B + b) * (L + 1) + s, mask=before, other=-math.inf
        )
        ahead = tl.where(emits, tl.gather(beta, right, 0), float("-inf"))  # beta[t + 1, s + 1]
        through = weight + ahead
        log_post = alpha + through - log_z
        # below about twice the smallest normal number: 0, as the reference
        low = tl.zeros_like(log_post) + FLOOR  # (exact: see cbasr._triton)
        post = tl.where(log_post < low, 0.0, tl.exp(tl.maximum(log_post, low)))
        tl.store(post_ptr + (t * B + b) * L + s, post, mask=emits)
        beta = _log_add_exp(beta, through)
        weight, alpha = weight_next, alpha_next
        t -= 1


@triton.jit(do_not_specialize=["T", "L"])
def _marginal_forward_kernel(
    a_ptr,
    lp_ptr,
    input_lengths_ptr,
    target_lengths_ptr,
    alpha_ptr,
    shift_ptr,
    log_z_ptr,
    nll_ptr,
    T,
    L,
    BLOCK: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """The whole of ``cb_marginal_nll`` for utterance ``b = program_id`` from the raw inputs,
    ``a`` ``(B, T)`` and ``lp`` ``(B, T, L)``: ``nll[b]``, and for the backward pass the
    forward variables ``alpha`` ``(B, T + 1, L + 1)`` of the shifted weights, the shifts
    ``(B, L)`` and their lattice's ``log_z[b]``. The reference's masking
    (:func:`~cbasr.losses.conditional_bernoulli._cb_weights`) and label shift
    (:func:`~cbasr.losses.conditional_bernoulli._shift_labels`) happen here, on loads: padded
    frames and labels are never read, and the frames past ``T_b`` are not run."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    s = tl.arange(0, BLOCK)
    frames = tl.load(input_lengths_ptr + b).to(tl.int64)
    labels = tl.load(target_lengths_ptr + b).to(tl.int64)
    dtype = alpha_ptr.dtype.element_ty
    is_label = s < labels  # label columns l = s of this utterance
    # Pass 1: each label's best weight a_t + lp[t, l] over the frames (its shift: every path
    # emits each label once) and sum_t log P(B_t = 0) (every path takes each frame once).
    best = tl.zeros([BLOCK], dtype) + float("-inf")
    stay = tl.sum(tl.zeros([BLOCK], dtype), axis=0)
    t = 0
    while t < frames:
        a_t = tl.load(a_ptr + b * T + t)
        lp_t = tl.load(lp_ptr + (b * T + t) * L + s, mask=is_label, other=0.0)
        best = tl.maximum(best, tl.where(is_label, a_t + lp_t, float("-inf")))
        stay -= _softplus(a_t)
        t += 1
    shift = tl.where((best > float("-inf")) & (best < float("inf")), best, 0.0)
    tl.store(shift_ptr + b * L + s, shift, mask=s < L)
    # Pass 2: alpha[t + 1, s] = logaddexp(alpha[t, s], alpha[t, s - 1] + w[t, s - 1]), with
    # w[t, l] = a_t + lp[t, l] - shift[l]: state s is reached by emitting label s - 1.
    inside = s <= L
    came_in = (s >= 1) & inside
    left = tl.where(came_in, s - 1, 0)
    emit_in = came_in & (s <= labels)
    shift_in = tl.gather(shift, left, 0)
    row = tl.where(s == 0, 0.0, float("-inf")).to(dtype)
    tl.store(alpha_ptr + b * (T + 1) * (L + 1) + s, row, mask=inside)
    a_t = tl.load(a_ptr + b * T, mask=frames > 0, other=0.0)
    lp_t = tl.load(lp_ptr + b * T * L + s - 1, mask=emit_in & (frames > 0), other=0.0)
    t = 0
    while t < frames:
        more = t + 1 < frames  # the next frame's inputs, on their way while this one computes
        a_next = tl.load(a_ptr + b * T + t + 1, mask=more, other=0.0)
        lp_next = tl.load(lp_ptr + (b * T + t + 1) * L + s - 1, mask=emit_in & more, other=0.0)
        weight = tl.where(emit_in, a_t + lp_t - shift_in, float("-inf"))
        came = tl.where(came_in, tl.gather(row, left, 0), float("-inf"))  # alpha[t, s - 1]
        row = _log_add_exp(row, came + weight)
        tl.store(alpha_ptr + (b * (T + 1) + t + 1) * (L + 1) + s, row, mask=inside)
        a_t, lp_t = a_next, lp_next
        t += 1
    log_z = tl.sum(tl.where(s == labels, row, 0.0), axis=0)
    tl.store(log_z_ptr + b, log_z)
    total = stay + log_z + tl.sum(tl.where(is_label, shift, 0.0), axis=0)
    tl.store(nll_ptr + b, tl.where(log_z == float("-inf"), float("inf"), -total))


@triton.jit(do_not_specialize=["T", "L"])
def _marginal_backward_kernel(
    a_ptr,
    lp_ptr,
    input_lengths_ptr,
    target_lengths_ptr,
    alpha_ptr,
    shift_ptr,
    log_z_ptr,
    grad_ptr,
    grad_a_ptr,
    grad_lp_ptr,
    FLOOR: tl.constexpr,
    T,
    L,
    BLOCK: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Utterance ``b = program_id``: the gradients of ``grad[b] * nll[b]``, ``grad_a`` ``(B,
    T)`` and ``grad_lp`` ``(B, T, L)`` (every entry written; 0 where padded, and everywhere
    when no path exists). The backward variables run from ``beta[T_b, L_b] = 0``; with the
    edge posteriors ``post[t, l]``, ``d nll / d lp[t, l] = -post[t, l]`` and ``d nll / d a_t =
    sigmoid(a_t) - sum_l post[t, l]``."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    s = tl.arange(0, BLOCK)
    frames = tl.load(input_lengths_ptr + b).to(tl.int64)
    labels = tl.load(target_lengths_ptr + b).to(tl.int64)
    dtype = alpha_ptr.dtype.element_ty
    emits = s < L  # states that can emit label s
    is_label = s < labels
    right = tl.where(emits, s + 1, 0)
    log_z = tl.load(log_z_ptr + b)
    possible = log_z > float("-inf")
    g = tl.where(possible, tl.load(grad_ptr + b), 0.0)  # no path: +inf, zero gradient
    log_z = tl.where(possible, log_z, 0.0)
    shift = tl.load(shift_ptr + b * L + s, mask=emits, other=0.0)
    zero = tl.zeros([BLOCK], dtype)
    t = frames
    while t < T:  # padded frames: zero gradient
        tl.store(grad_a_ptr + b * T + t, tl.sum(zero, axis=0))
        tl.store(grad_lp_ptr + (b * T + t) * L + s, zero, mask=emits)
        t += 1
    beta = tl.where(s == labels, 0.0, float("-inf")).to(dtype)
    t = frames - 1
    now = emits & (t >= 0)
    a_t = tl.load(a_ptr + b * T + t, mask=t >= 0, other=0.0)
    lp_t = tl.load(lp_ptr + (b * T + t) * L + s, mask=is_label & (t >= 0), other=0.0)
    alpha = tl.load(alpha_ptr + (b * (T + 1) + t) * (L + 1) + s, mask=now, other=-math.inf)
    while t >= 0:
        before = t >= 1  # the previous frame's inputs and alphas, loaded early
        a_next = tl.load(a_ptr + b * T + t - 1, mask=before, other=0.0)
        lp_next = tl.load(lp_ptr + (b * T + t - 1) * L + s, mask=is_label & before, other=0.0)
        alpha_next = tl.load(
            alpha_ptr + (b * (T + 1) + t - 1) * (L + 1) + s, mask=emits & before, other=-math.inf
        )
        weight = tl.where(is_label, a_t + lp_t - shift, float("-inf"))
        ahead = tl.where(emits, tl.gather(beta, right, 0), float("-inf"))  # beta[t + 1, s + 1]
        through = weight + ahead
        log_post = alpha + through - log_z
        # below about twice the smallest normal number: 0, as the reference
        low = tl.zeros_like(log_post) + FLOOR  # (exact: see cbasr._triton)
        post = tl.where(log_post < low, 0.0, tl.exp(tl.maximum(log_post, low)))
        post = tl.where(is_label, post, 0.0)
        tl.store(grad_lp_ptr + (b * T + t) * L + s, -g * post, mask=emits)
        fired = tl.sum(post, axis=0)  # P(B_t = 1 | y)
        tl.store(grad_a_ptr + b * T + t, g * (1.0 / (1.0 + tl.exp(-a_t)) - fired))
        beta = _log_add_exp(beta, through)
        a_t, lp_t, alpha = a_next, lp_next, alpha_next
        t -= 1


@triton.jit(do_not_specialize=["T", "B", "L"])
def _viterbi_kernel(
    emit_ptr, emitted_ptr, best_ptr, lengths_ptr, T, B, L, BLOCK: tl.constexpr
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """One utterance ``b = program_id``: the max-product forward pass, ``emitted`` ``(T, B,
    L + 1)`` (1 where reaching state ``s`` at frame ``t + 1`` by emitting beats staying) and
    ``best[b]``, the best path's score."""
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a table may pass 2**31 elements
    s = tl.arange(0, BLOCK)
    inside = s <= L
    came_in = (s >= 1) & inside
    left = tl.where(came_in, s - 1, 0)
    row = tl.where(s == 0, 0.0, float("-inf")).to(emit_ptr.dtype.element_ty)
    weight = tl.load(emit_ptr + b * L + s - 1, mask=came_in & (T > 0), other=-math.inf)
    t = 0
    while t < T:
        ahead = tl.load(  # the next frame's weights, on their way while this frame computes
            emit_ptr + ((t + 1) * B + b) * L + s - 1, mask=came_in & (t + 1 < T), other=-math.inf
        )
        came = tl.where(came_in, tl.gather(row, left, 0), float("-inf"))
        step = came + weight
        hit = step > row  # ties stay: the reference's rule
        tl.store(emitted_ptr + (t * B + b) * (L + 1) + s, hit.to(tl.int8), mask=inside)
        row = tl.maximum(row, step)
        weight = ahead
        t += 1
    labels = tl.load(lengths_ptr + b)
    tl.store(best_ptr + b, tl.sum(tl.where(s == labels, row, 0.0), axis=0))


def forward(
    emit_t: torch.Tensor, target_lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward variables ``(T + 1, B, L + 1)`` and ``log Z`` ``(B,)`` of the shifted weights
    ``emit_t`` ``(T, B, L)`` (float32 or float64, ``-inf`` where masked)."""
    emit_t = emit_t.contiguous()
    T, B, L = emit_t.shape
    alpha = emit_t.new_empty(T + 1, B, L + 1)
    log_z = emit_t.new_empty(B)
    if B == 0:
        return alpha, log_z
    block, warps = _block(L + 1)
    lengths = target_lengths.to(device=emit_t.device, dtype=torch.int32).contiguous()
    _forward_kernel[(B,)](emit_t, alpha, log_z, lengths, T, B, L, BLOCK=block, num_warps=warps)
    return alpha, log_z


def posteriors(
    emit_t: torch.Tensor, alpha: torch.Tensor, log_z: torch.Tensor, target_lengths: torch.Tensor
) -> torch.Tensor:
    """Edge posteriors ``(T, B, L)`` from :func:`forward`'s results; all 0 where ``log Z`` is
    ``-inf``."""
    emit_t = emit_t.contiguous()
    T, B, L = emit_t.shape
    post = emit_t.new_empty(T, B, L)  # the kernel writes every entry
    if B == 0 or L == 0:
        return post
    block, warps = _block(L + 1)
    floor = math.log(torch.finfo(emit_t.dtype).tiny) + 0.5
    lengths = target_lengths.to(device=emit_t.device, dtype=torch.int32).contiguous()
    _posterior_kernel[(B,)](
        emit_t, alpha, log_z, lengths, post, floor, T, B, L, BLOCK=block, num_warps=warps
    )
    return post


def marginal_nll(
    emit_logits: torch.Tensor,
    label_log_probs: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """``cb_marginal_nll`` ``(B,)`` of checked inputs of one float dtype (float32 or float64)
    on one device, its backward by :func:`_MarginalNLL`: two kernel launches in all."""
    return _MarginalNLL.apply(emit_logits, label_log_probs, input_lengths, target_lengths)


class _MarginalNLL(torch.autograd.Function):
    """:func:`marginal_nll`: the forward kernel, then the backward kernel's gradients."""

    @staticmethod
    def forward(ctx, emit_logits, label_log_probs, input_lengths, target_lengths):
        a, lp = emit_logits.contiguous(), label_log_probs.contiguous()
        B, T, L = lp.shape
        alpha = a.new_empty(B, T + 1, L + 1)
        shift, log_z, nll = a.new_empty(B, L), a.new_empty(B), a.new_empty(B)
        if B:
            block, warps = _block(L + 1)
            _marginal_forward_kernel[(B,)](
                a, lp, input_lengths, target_lengths, alpha, shift, log_z, nll, T, L,
                BLOCK=block, num_warps=warps,
            )  # fmt: skip
        ctx.save_for_backward(a, lp, input_lengths, target_lengths, alpha, shift, log_z)
        return nll

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_nll):
        a, lp, input_lengths, target_lengths, alpha, shift, log_z = ctx.saved_tensors
        B, T, L = lp.shape
        grad_a, grad_lp = torch.empty_like(a), torch.empty_like(lp)
        if B:
            block, warps = _block(L + 1)
            floor = math.log(torch.finfo(a.dtype).tiny) + 0.5
            _marginal_backward_kernel[(B,)](
                a, lp, input_lengths, target_lengths, alpha, shift, log_z,
                grad_nll.contiguous(), grad_a, grad_lp, floor, T, L,
                BLOCK=block, num_warps=warps,
            )  # fmt: skip
        return grad_a, grad_lp, None, None


def viterbi(
    emit_t: torch.Tensor, target_lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The max-product pass of :func:`~cbasr.losses.cb_viterbi.cb_viterbi` on the
    shifted weights ``emit_t`` ``(T, B, L)``: ``emitted`` ``(T, B, L + 1)`` (bool) for the
    backtrace and the best path's score ``(B,)`` (``-inf`` where there is none)."""
    emit_t = emit_t.contiguous()
    T, B, L = emit_t.shape
    emitted = torch.zeros(T, B, L + 1, dtype=torch.int8, device=emit_t.device)
    best = emit_t.new_empty(B)
    if B == 0:
        return emitted.bool(), best
    block, warps = _block(L + 1)
    lengths = target_lengths.to(device=emit_t.device, dtype=torch.int32).contiguous()
    _viterbi_kernel[(B,)](emit_t, emitted, best, lengths, T, B, L, BLOCK=block, num_warps=warps)
    return emitted.bool(), best
