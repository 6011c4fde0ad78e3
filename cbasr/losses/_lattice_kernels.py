"""The compiled lattices behind :func:`cbasr.losses.transducer.transducer_lattice_nll`: the
numba CPU loops (:mod:`cbasr.losses._transducer_kernel`) and the Triton kernels
(:mod:`cbasr.losses._transducer_triton`) as autograd Functions, on the masked edge weights of
the reference recursions (``_TransducerForwardBackward``, ``_MonotonicForwardBackward``), each
tested equal to them."""

import torch
from torch.autograd.function import once_differentiable

from cbasr.losses._transducer_kernel import monotonic_lattice, transducer_lattice


class _TransducerKernel(torch.autograd.Function):
    """``log P(y)`` by the compiled CPU lattice (:mod:`cbasr.losses._transducer_kernel`), on
    the same masked weights as :class:`_TransducerForwardBackward`; it computes the edge
    posteriors in the forward pass when a gradient is needed."""

    @staticmethod
    def forward(ctx, blank, emit, target_lengths):
        want = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        log_p, post_blank, post_emit = transducer_lattice(blank, emit, target_lengths, want)
        ctx.save_for_backward(post_blank, post_emit)
        return log_p.to(blank.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_p: torch.Tensor):
        post_blank, post_emit = ctx.saved_tensors
        scale = grad_log_p[:, None, None]
        return post_blank * scale, post_emit * scale, None


class _MonotonicKernel(torch.autograd.Function):
    """:class:`_MonotonicForwardBackward` by the compiled CPU loop
    (:func:`cbasr.losses._transducer_kernel.monotonic_lattice`)."""

    @staticmethod
    def forward(ctx, blank, emit, target_lengths):
        want = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        log_p, post_blank, post_emit = monotonic_lattice(blank, emit, target_lengths, want)
        ctx.save_for_backward(post_blank, post_emit)
        return log_p.to(blank.dtype)

    backward = staticmethod(_TransducerKernel.backward)


class _TransducerTriton(torch.autograd.Function):
    """``log P(y)`` over either topology by the Triton kernels
    (:mod:`cbasr.losses._transducer_triton`), on the same masked weights and with the same
    exact shifts as :class:`_TransducerForwardBackward` and :class:`_MonotonicForwardBackward`
    (taken inside the forward kernel):
    one program per utterance runs the forward recursion; backward runs the backward recursion
    and the edge posteriors in one more."""

    @staticmethod
    def forward(ctx, blank, emit, target_lengths, monotonic: bool):
        from cbasr.losses import _transducer_triton

        log_p, lattice = _transducer_triton.forward(blank, emit, target_lengths, monotonic)
        ctx.save_for_backward(blank, emit, target_lengths, *lattice.tensors())
        ctx.monotonic = monotonic
        return log_p

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_p: torch.Tensor):
        from cbasr.losses import _transducer_triton

        blank, emit, target_lengths, *lattice = ctx.saved_tensors
        post_blank, post_emit = _transducer_triton.posteriors(
            blank, emit, _transducer_triton.Lattice(*lattice), target_lengths, ctx.monotonic
        )
        scale = grad_log_p[:, None, None]  # in place: no second pair of tables
        return post_blank.mul_(scale), post_emit.mul_(scale), None, None
