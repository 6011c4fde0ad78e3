"""The CTC lattice of :func:`cbasr.losses.ctc_nll` as Triton kernels (package-internal), for a
step replayed from a CUDA graph (``trainer.cuda_graphs``), where torch's CUDA ``ctc_loss``
cannot run: it reads the lengths on the host.

Graves et al. (2006), "Connectionist Temporal Classification", section 4.1: over the label
sequence with a blank before, between and after the labels (``S_b = 2 L_b + 1`` states, state
``s`` holding blank for even ``s`` and label ``(s - 1) / 2`` for odd), the forward variables

    alpha[0, s] = lp[0, sym(s)] for s < 2, else -inf
    alpha[t, s] = lp[t, sym(s)] + logsumexp(alpha[t-1, s], alpha[t-1, s-1], alpha[t-1, s-2])

with the last term only for a label state whose label differs from the one two states back,
and ``log P(y | x) = logaddexp(alpha[T_b - 1, S_b - 1], alpha[T_b - 1, S_b - 2])``. The backward
variables run the other way from the last frame, and each state's posterior ``alpha[t, s] +
beta[t, s] - lp[t, sym(s)] - log P`` is added into the gradient of ``lp[t, sym(s)]`` (an atomic
add: several states share a symbol). One program per utterance runs all its frames, its
state vector in registers (the shifted reads are ``tl.gather``, as in :mod:`._cb_triton`).

The gradient is the true one of ``-log P`` with respect to ``log_probs`` (torch's fused CUDA
kernel returns the one with respect to the logits instead; through a ``log_softmax`` both give
the same). Float32 and float64; importing this module needs Triton (``TRITON_INTERPRET=1``
first, for CPU tensors in Triton's interpreter: the tests).
"""

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from cbasr._triton import block as _block

__all__: list[str] = []  # package-internal


@triton.jit
def _log_add_exp3(x, y, z):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """``log(exp(x) + exp(y) + exp(z))``; ``-inf`` when all three are."""
    m = tl.maximum(tl.maximum(x, y), z)
    safe = tl.where(m == float("-inf"), 0.0, m)
    return safe + tl.log(tl.exp(x - safe) + tl.exp(y - safe) + tl.exp(z - safe))


@triton.jit
def _states(targets_ptr, b, labels, L, blank, s):  # pragma: no cover - compiled
    """Each state's symbol, whether it exists (``s < 2 L_b + 1``) and whether the state two
    back may be skipped into it (a label unlike the one before it)."""
    valid = s < 2 * labels + 1
    is_label = ((s % 2) == 1) & valid
    k = tl.where(is_label, (s - 1) // 2, 0)
    label = tl.load(targets_ptr + b * L + k, mask=is_label, other=0)
    before = tl.load(targets_ptr + b * L + k - 1, mask=is_label & (s >= 3), other=0)
    sym = tl.where(is_label, label, blank)
    skip = is_label & (s >= 3) & (label != before)
    return sym, valid, skip


@triton.jit(do_not_specialize=["T", "L", "V", "S", "blank"])
def _ctc_forward_kernel(
    lp_ptr,
    targets_ptr,
    input_lengths_ptr,
    target_lengths_ptr,
    alpha_ptr,
    nll_ptr,
    T,
    L,
    V,
    S,
    blank,
    BLOCK: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Utterance ``b = program_id``: ``nll[b]`` (``inf`` where no alignment exists) and the
    forward variables ``alpha`` ``(B, T, S)`` of its frames, for the backward pass."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, BLOCK)
    frames = tl.load(input_lengths_ptr + b).to(tl.int64)
    labels = tl.load(target_lengths_ptr + b).to(tl.int64)
    sym, valid, skip = _states(targets_ptr, b, labels, L, blank, s)
    one = tl.where(s >= 1, s - 1, 0)
    two = tl.where(s >= 2, s - 2, 0)
    dtype = alpha_ptr.dtype.element_ty
    lp_t = tl.load(lp_ptr + b * T * V + sym, mask=valid & (frames > 0), other=float("-inf"))
    row = tl.where(valid & (s < 2), lp_t, float("-inf")).to(dtype)
    tl.store(alpha_ptr + b * T * S + s, row, mask=(s < S) & (frames > 0))
    t = 1
    while t < frames:
        lp_t = tl.load(lp_ptr + (b * T + t) * V + sym, mask=valid, other=float("-inf"))
        came = tl.where(s >= 1, tl.gather(row, one, 0), float("-inf"))
        skipped = tl.where(skip, tl.gather(row, two, 0), float("-inf"))
        row = tl.where(valid, _log_add_exp3(row, came, skipped) + lp_t, float("-inf"))
        tl.store(alpha_ptr + (b * T + t) * S + s, row, mask=s < S)
        t += 1
    S_b = 2 * labels + 1
    ends = (s == S_b - 1) | (s == S_b - 2)
    end = tl.where(ends & (frames > 0), row, float("-inf"))
    top = tl.max(end, axis=0)
    safe = tl.where(top == float("-inf"), 0.0, top)
    log_p = safe + tl.log(tl.sum(tl.exp(end - safe), axis=0))
    log_p = tl.where((frames == 0) & (labels == 0), 0.0, log_p)  # nothing to emit, no frame
    tl.store(nll_ptr + b, tl.where(log_p == float("-inf"), float("inf"), -log_p))


@triton.jit(do_not_specialize=["T", "L", "V", "S", "blank"])
def _ctc_backward_kernel(
    lp_ptr,
    targets_ptr,
    input_lengths_ptr,
    target_lengths_ptr,
    alpha_ptr,
    nll_ptr,
    grad_nll_ptr,
    grad_ptr,
    T,
    L,
    V,
    S,
    blank,
    BLOCK: tl.constexpr,
):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """Utterance ``b``: adds ``grad_nll[b]`` times the gradient of ``nll[b]`` with respect to
    ``lp`` into ``grad`` ``(B, T, V)`` (zeros: padded frames, and an utterance without an
    alignment, stay 0)."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, BLOCK)
    frames = tl.load(input_lengths_ptr + b).to(tl.int64)
    labels = tl.load(target_lengths_ptr + b).to(tl.int64)
    sym, valid, skip = _states(targets_ptr, b, labels, L, blank, s)
    right = tl.where(s + 1 < BLOCK, s + 1, 0)
    right2 = tl.where(s + 2 < BLOCK, s + 2, 0)
    skip_in = tl.gather(skip.to(tl.int32), right2, 0) != 0  # s + 2 may be skipped into from s
    nll = tl.load(nll_ptr + b)
    possible = nll < float("inf")
    g = tl.where(possible, tl.load(grad_nll_ptr + b), 0.0)
    log_p = tl.where(possible, -nll, 0.0)
    S_b = 2 * labels + 1
    t = frames - 1
    lp_t = tl.load(lp_ptr + (b * T + t) * V + sym, mask=valid & (t >= 0), other=float("-inf"))
    beta = tl.where(valid & (s >= S_b - 2), lp_t, float("-inf"))
    while t >= 0:
        alpha = tl.load(alpha_ptr + (b * T + t) * S + s, mask=valid, other=float("-inf"))
        live = valid & (lp_t > float("-inf")) & (alpha > float("-inf"))
        post = tl.exp(tl.where(live, alpha + beta - lp_t - log_p, float("-inf")))
        post = tl.where(possible, post, 0.0)
        tl.atomic_add(grad_ptr + (b * T + t) * V + sym, -g * post, mask=valid)
        before = t >= 1
        lp_t = tl.load(lp_ptr + (b * T + t - 1) * V + sym, mask=valid & before, other=0.0)
        ahead = tl.where(s + 1 < S_b, tl.gather(beta, right, 0), float("-inf"))
        ahead2 = tl.where(skip_in & (s + 2 < S_b), tl.gather(beta, right2, 0), float("-inf"))
        beta = tl.where(valid, _log_add_exp3(beta, ahead, ahead2) + lp_t, float("-inf"))
        t -= 1


def ctc_nll(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
) -> torch.Tensor:
    """``(B,)`` CTC negative log likelihoods of checked inputs (``log_probs`` ``(B, T, V)``,
    float32 or float64); its backward a second kernel: two launches, no read of the device."""
    return _CTCNLL.apply(log_probs, targets, input_lengths, target_lengths, blank)


class _CTCNLL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, log_probs, targets, input_lengths, target_lengths, blank):
        lp = log_probs.contiguous()
        targets = targets.to(device=lp.device, dtype=torch.int64).contiguous()
        input_lengths = input_lengths.to(device=lp.device, dtype=torch.int64).contiguous()
        target_lengths = target_lengths.to(device=lp.device, dtype=torch.int64).contiguous()
        B, T, V = lp.shape
        L = targets.shape[1]
        S = 2 * L + 1
        alpha = lp.new_empty(B, T, S)
        nll = lp.new_empty(B)
        block, warps = _block(S)
        if B:
            _ctc_forward_kernel[(B,)](
                lp, targets, input_lengths, target_lengths, alpha, nll, T, L, V, S, blank,
                BLOCK=block, num_warps=warps,
            )  # fmt: skip
        ctx.save_for_backward(lp, targets, input_lengths, target_lengths, alpha, nll)
        ctx.blank, ctx.block, ctx.warps = blank, block, warps
        return nll

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_nll):
        lp, targets, input_lengths, target_lengths, alpha, nll = ctx.saved_tensors
        B, T, V = lp.shape
        L = targets.shape[1]
        grad = torch.zeros_like(lp)
        if B:
            _ctc_backward_kernel[(B,)](
                lp, targets, input_lengths, target_lengths, alpha, nll,
                grad_nll.contiguous(), grad, T, L, V, 2 * L + 1, ctx.blank,
                BLOCK=ctx.block, num_warps=ctx.warps,
            )  # fmt: skip
        return grad, None, None, None, None
