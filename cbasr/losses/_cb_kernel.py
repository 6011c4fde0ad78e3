"""The CB marginal lattice of :mod:`cbasr.losses.conditional_bernoulli` as one compiled CPU
loop per utterance (package-internal).

The same forward-backward as the PyTorch path (CB paper section 2.4, the HMM reading of
eq. 38), fused: the lattice weights, the forward and the backward variables, ``log Z`` and the
edge posteriors (the gradient) in one pass over each utterance's valid ``T_b x L_b`` block, in
float64 whatever the input precision (the weights need no per-label shift then). Each state
update is a :func:`cbasr._compiled.log_add_exp64`, which vectorises over the labels of a frame;
the posteriors use :func:`cbasr._compiled.exp64`. Padded frames and labels are never read.
"""

import math

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from cbasr import _backends
from cbasr._compiled import exp64, jit, log_add_exp64

__all__: list[str] = []  # package-internal

_NEG_INF = -math.inf


@jit
def _softplus(x):  # pragma: no cover - compiled
    """``log(1 + exp(x))``, scalar, without overflow."""
    return (x if x > 0.0 else 0.0) + math.log1p(math.exp(-abs(x)))


@jit(fastmath=frozenset({"contract", "reassoc"}))  # reassoc: the posterior sums vectorise
def _lattice(a, lp, input_lengths, target_lengths, want_posteriors, nll, grad_a, post):
    """For each utterance ``b``: ``nll[b] = -log P(y)`` and, if ``want_posteriors``, the edge
    posteriors ``post[b, t, l] = P(t_l = t | y)`` and ``grad_a[b, t] = d nll / d a_t =
    sigmoid(a_t) - sum_l post[b, t, l]`` (``d nll / d lp = -post``). ``nll`` is ``+inf``
    (gradients 0) where no alignment has positive probability.

    ``a``: ``(B, T)``; ``lp``: ``(B, T, L)``; ``grad_a`` and ``post`` zero-filled on entry.
    The frame loop is the outer one and the utterances take turns within it (a loop over one
    utterance's frames inside a loop over utterances ran 3-4x slower, whatever the cause).
    """  # pragma: no cover - compiled
    B, T, L = lp.shape
    # alpha[t, b, l + 1]: log weight of the paths through frames < t that have emitted l
    # labels (column 0: a -inf sentinel); beta[., b, l]: of completing from state l.
    alpha = np.full((T + 1, B, L + 2), _NEG_INF)
    alpha[0, :, 1] = 0.0
    for t in range(T):
        for b in range(B):
            if t >= input_lengths[b]:
                continue
            at, src, dst, w = a[b, t], alpha[t, b], alpha[t + 1, b], lp[b, t]
            lb = target_lengths[b]
            dst[1] = src[1]
            # States 1 <= l <= lb at t + 1, within the band: at most t + 1 labels emitted, and
            # lb - l at most the frames left (the rest stay -inf: no path, or none that ends).
            lo = max(1, lb - input_lengths[b] + t + 1)
            for k in range(min(lb, t + 1) - lo + 1):  # (a loop from 0 vectorises)
                l = lo + k  # state l: emit label l - 1 from state l - 1
                dst[l + 1] = log_add_exp64(src[l + 1], src[l] + (at + w[l - 1]))
    log_z = np.empty(B)
    for b in range(B):
        tb, lb = input_lengths[b], target_lengths[b]
        log_z[b] = alpha[tb, b, lb + 1]
        stay = 0.0  # sum_t log P(B_t = 0)
        for t in range(tb):
            stay -= _softplus(a[b, t])
        nll[b] = math.inf if log_z[b] == _NEG_INF else -(stay + log_z[b])
    if not want_posteriors:
        return
    # The backward pass keeps two rows per utterance, and takes each frame's posteriors as it
    # goes: those of frame t need alpha at t and beta at t + 1, the row it has in hand.
    beta = np.full((2, B, L + 2), _NEG_INF)
    for b in range(B):
        beta[0, b, target_lengths[b]] = 0.0
    for s in range(T):
        for b in range(B):
            tb, lb, z = input_lengths[b], target_lengths[b], log_z[b]
            if s >= tb or z == _NEG_INF:
                continue
            t = tb - 1 - s
            at, w, before, p = a[b, t], lp[b, t], alpha[t, b], post[b, t]
            src, dst = beta[s % 2, b], beta[(s + 1) % 2, b]  # frames t + 1 and t
            total = 0.0
            # States in the band at frame t (the rest of both rows stays as it was: -inf
            # below it, never read above it); the posteriors outside it are 0.
            lo = max(0, lb - tb + t)
            for k in range(min(lb - 1, t) - lo + 1):
                l = lo + k  # state l: stay, or emit label l into state l + 1
                through = (at + w[l]) + src[l + 1]
                dst[l] = log_add_exp64(src[l], through)
                q = exp64(before[l + 1] + through - z)
                p[l] = q
                total += q
            dst[lb] = src[lb]
            grad_a[b, t] = 1.0 / (1.0 + math.exp(-at)) - total


def cb_lattice(
    emit_logits: torch.Tensor,
    label_log_probs: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    posteriors: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``-log P(y)`` ``(B,)`` in float64 and, if ``posteriors``, ``d nll / d a`` ``(B, T)`` and
    the posteriors ``(B, T, L)`` (``= -d nll / d lp``), each in its input's dtype.

    Inputs are CPU tensors in float32 or float64, checked by the caller; they are read, not
    differentiated.
    """
    a = emit_logits.detach().contiguous()
    lp = label_log_probs.detach().contiguous()
    B, T, L = lp.shape
    nll = torch.empty(B, dtype=torch.float64)
    grad_a = torch.zeros_like(a) if posteriors else a.new_zeros(0, 0)
    post = torch.zeros_like(lp) if posteriors else lp.new_zeros(0, 0, 0)
    _lattice(
        a.numpy(),
        lp.numpy(),
        input_lengths.to(torch.int64).contiguous().numpy(),
        target_lengths.to(torch.int64).contiguous().numpy(),
        posteriors,
        nll.numpy(),
        grad_a.numpy(),
        post.numpy(),
    )
    return nll, (grad_a if posteriors else None), (post if posteriors else None)


class _CBKernel(torch.autograd.Function):
    """``-log P(y)`` by the compiled CPU lattice (:mod:`cbasr.losses._cb_kernel`), which
    computes the gradient in the forward pass when one is needed."""

    @staticmethod
    def forward(ctx, emit_logits, label_log_probs, input_lengths, target_lengths, dtype):
        want = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        nll, grad_a, post = cb_lattice(
            emit_logits, label_log_probs, input_lengths, target_lengths, want
        )
        ctx.save_for_backward(grad_a, post)
        return nll.to(dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_nll: torch.Tensor):
        grad_a, post = ctx.saved_tensors
        grad_emit = grad_a * grad_nll[:, None] if ctx.needs_input_grad[0] else None
        grad_lp = post * -grad_nll[:, None, None] if ctx.needs_input_grad[1] else None
        return grad_emit, grad_lp, None, None, None


def _lattice_backend(emit_logits: torch.Tensor, label_log_probs: torch.Tensor) -> str:
    """Which lattice serves these inputs (:mod:`cbasr._backends`): ``numba`` (the compiled CPU
    loop, for float32 and float64 inputs), ``triton`` (the kernels of
    :mod:`cbasr.losses._cb_triton`, on the reference's weights in at least float32) or
    ``torch`` (the reference)."""
    which = _backends.backend(emit_logits)
    exact = (torch.float32, torch.float64)
    if which == "numba" and not (emit_logits.dtype in exact and label_log_probs.dtype in exact):
        return "torch"
    return which
