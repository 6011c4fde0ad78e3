"""The transducer losses' joint-side passes, behind two calls.

- :func:`gather_logsumexp`: ``x.gather(-1, index)`` and ``logsumexp(x[..., start:], -1)`` of a
  joint's ``(B, T, U + 1, V)`` scores without a joint-sized temporary, one compiled pass per
  row (numba on a CPU, Triton on CUDA: :mod:`cbasr.losses._transducer_kernel`,
  :mod:`cbasr.losses._transducer_triton`) or blocked PyTorch operators elsewhere;
- :func:`fused_joint_nll`: on the Triton backend, the NLL straight from the joint's rows (the
  edges built in one kernel pass, the lattice, the joint's whole gradient in one more).

Both are checked against the plain log-softmax and the reference lattice of
:mod:`cbasr.losses.transducer` in ``tests/losses``.
"""

import math

import torch
from torch.autograd.function import once_differentiable

from cbasr import _backends
from cbasr.losses._transducer_kernel import row_logsumexp, row_softmax

__all__ = ["gather_logsumexp", "fused_joint_nll"]


def _finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """``x`` with NaN and +-inf made 0: one kernel (``isfinite`` is four on a GPU)."""
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


# Joint entries per block of the fused log-softmax: blocks that stay in cache (measured fastest).
_CHUNK_ELEMENTS = 1 << 18
_BACKWARD_ELEMENTS = 1 << 20


def _exp_floor(dtype: torch.dtype) -> float:
    """The least argument given to ``exp``: a little above the log of the smallest normal
    number. ``torch.exp`` of anything lower (down to -inf) takes a slow path on CPU, 5-40x."""
    return math.log(torch.finfo(dtype).tiny) + 0.5


class _GatherLogSumExp(torch.autograd.Function):
    """``(x.gather(-1, index), logsumexp(x[..., start:], -1))`` without a joint-sized temporary
    in forward and with one joint-sized gradient in backward (see :func:`gather_logsumexp`).

    Half-precision inputs are computed in float32 block by block (outputs in float32, the
    gradient cast back), as autocast runs a log-softmax."""

    @staticmethod
    def forward(ctx, x, index, start):
        V = x.shape[-1]
        work = torch.promote_types(x.dtype, torch.float32)
        rows, flat_index = x.reshape(-1, V), index.reshape(-1, index.shape[-1])
        ctx.start, ctx.which = start, _row_backend(rows, start)
        if ctx.which != "torch":  # one compiled pass per row
            if ctx.which == "triton":
                from cbasr.losses import _transducer_triton

                lse = _transducer_triton.row_logsumexp(rows, start, _exp_floor(work), work)
            else:
                lse = row_logsumexp(rows, start, _exp_floor(work))
            ctx.save_for_backward(x, index, lse)
            picked = rows.gather(-1, flat_index).to(work)
            return picked.view(index.shape), lse.view(x.shape[:-1])
        lse = torch.empty(rows.shape[0], dtype=work, device=x.device)
        floor = _exp_floor(work)
        for i, step in _blocks(rows.shape[0], V - start, _CHUNK_ELEMENTS, x.is_cuda):
            block = rows[i : i + step, start:].to(work)
            top = block.amax(-1, keepdim=True)
            top = _finite_or_zero(top)  # an all -inf (or inf) row
            # exp below the smallest normal number is a slow path on CPU (and adds nothing
            # to a sum that holds exp(0) = 1): clamped there
            terms = torch.sub(block, top).clamp_(min=floor).exp_()
            torch.log(terms.sum(-1), out=lse[i : i + step]).add_(top[:, 0])
        picked = rows.gather(-1, flat_index).to(work)
        ctx.save_for_backward(x, index, lse)
        return picked.view(index.shape), lse.view(x.shape[:-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_picked, grad_lse):
        x, index, lse = ctx.saved_tensors
        start, V = ctx.start, x.shape[-1]
        rows = x.reshape(-1, V)
        if ctx.which != "torch" and grad_lse is not None:  # exp(x - lse) * grad_lse, one pass
            floor = _exp_floor(lse.dtype)
            if ctx.which == "triton":
                from cbasr.losses import _transducer_triton

                grad = _transducer_triton.row_softmax(rows, start, lse, grad_lse.reshape(-1), floor)
            else:
                grad = row_softmax(rows, start, lse, grad_lse.reshape(-1), floor)
        else:
            grad = torch.empty_like(rows)
            grad[:, :start] = 0.0
            if grad_lse is None:
                grad[:, start:] = 0.0
            else:
                # d lse / d x = softmax(x[start:]), times grad_lse, written in place. With weights
                # >= 0 (a loss's occupancies) the weight joins the exponent: two passes, not three
                # (on a CPU: deciding costs a GPU a synchronisation).
                g = grad_lse.reshape(-1).to(lse.dtype)
                signed = x.is_cuda or bool((g < 0).any())
                shift = lse if signed else lse - g.log()  # log 0 = -inf: rows zeroed below
                floor = _exp_floor(lse.dtype)
                same = x.dtype == lse.dtype  # else half precision: each block in float32
                for i, step in _blocks(rows.shape[0], V - start, _BACKWARD_ELEMENTS, x.is_cuda):
                    out = grad[i : i + step, start:]
                    block = (
                        out if same else torch.empty(out.shape, dtype=lse.dtype, device=x.device)
                    )
                    torch.sub(rows[i : i + step, start:], shift[i : i + step, None], out=block)
                    block.clamp_(min=floor).exp_()
                    if signed:
                        block.mul_(g[i : i + step, None])
                    if not same:
                        out.copy_(block)
                # rows the loss does not read (padding) may hold anything: exactly 0 there
                if x.is_cuda:
                    grad.masked_fill_((g == 0)[:, None], 0.0)
                else:
                    grad.index_fill_(0, (g == 0).nonzero().flatten(), 0.0)
        if grad_picked is not None:
            flat_index = index.reshape(-1, index.shape[-1])
            grad.scatter_add_(-1, flat_index, grad_picked.reshape(flat_index.shape).to(x.dtype))
        return grad.view(x.shape), None, None


def _fused_joint(x: torch.Tensor, blank: torch.Tensor | None, start: int) -> bool:
    """Whether :class:`_FusedJoint` takes this joint: the Triton backend, a floating dtype its
    kernels read (half precision too), unit column stride, columns to normalise."""
    floating = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    if _backends.backend(x) != "triton" or x.dtype not in floating:
        return False
    if blank is not None and blank.dtype not in floating:
        return False
    return x.shape[-1] > start and x.stride(-1) == 1


class _FusedJoint(torch.autograd.Function):
    """A transducer's NLLs straight from its joint's rows on the Triton backend: forward, one
    kernel builds the masked edges in one pass over the joint (the softmax's normaliser, the
    blank unit, the emitted label's column; HAT's two log-sigmoids), then the lattice with its
    shifts taken inside; backward, the lattice's posteriors, then one kernel writes the joint's
    whole gradient (``_transducer_triton.joint_forward``, ``JointLayout`` for the arguments).
    The other backends build the edges, masks and shifts from PyTorch operators."""

    @staticmethod
    def forward(ctx, x, blank, targets, starts, input_lengths, target_lengths, options):
        from cbasr.losses import _transducer_triton as kernels

        hat, start, offset, monotonic, fastemit = options
        layout = kernels.JointLayout(
            x, blank, targets, starts, input_lengths, target_lengths, hat, start, offset
        )
        work = torch.promote_types(x.dtype, torch.float32)
        ctx.floor = _exp_floor(work)
        nll, saved = kernels.joint_forward(layout, monotonic, work, ctx.floor)
        ctx.save_for_backward(
            x, blank, targets, starts, input_lengths, target_lengths, *saved.tensors()
        )
        ctx.options = options
        return nll

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_nll):
        from cbasr.losses import _transducer_triton as kernels

        x, blank, targets, starts, input_lengths, target_lengths, *tensors = ctx.saved_tensors
        hat, start, offset, monotonic, fastemit = ctx.options
        layout = kernels.JointLayout(
            x, blank, targets, starts, input_lengths, target_lengths, hat, start, offset
        )
        saved = kernels.JointSaved.of(tensors, monotonic)
        grad, grad_blank = kernels.joint_backward(
            layout, saved, grad_nll, 1.0 + fastemit, ctx.floor
        )
        return grad.view(x.shape), grad_blank, None, None, None, None, None


def fused_joint_nll(
    x: torch.Tensor,
    blank: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    starts: torch.Tensor | None = None,
    hat: bool = False,
    start: int = 0,
    offset: int = 0,
    monotonic: bool = False,
    fastemit: float = 0.0,
) -> torch.Tensor:
    """:class:`_FusedJoint` (package-internal; the callers check the arguments): ``x`` ``(B,
    T, R, V)`` the joint's rows (``R = U + 1``, or the ``S`` rows of the windows at ``starts``
    ``(B, T)``), ``blank`` the separate blank logits or None (column 0), ``targets`` ``(B,
    U)`` whose label ``y`` is column ``offset + y``, the softmax over columns ``start:``."""
    device = x.device
    return _FusedJoint.apply(
        x.contiguous(),
        blank if blank is None else blank.contiguous(),
        targets.to(device),
        None if starts is None else starts.to(device),
        input_lengths.to(device),
        target_lengths.to(device),
        (hat, start, offset, monotonic, fastemit),
    )


def _row_backend(rows: torch.Tensor, start: int) -> str:
    """Which backend runs the row passes of this ``(N, V)`` view of a joint: ``numba`` for a
    contiguous float32/float64 CPU tensor, ``triton`` for a CUDA one with unit column stride
    (half precision included, read into float32), ``torch`` otherwise and when no column is
    normalised."""
    which = _backends.backend(rows)
    if rows.shape[1] <= start:
        return "torch"
    if which == "numba" and rows.dtype in (torch.float32, torch.float64) and rows.is_contiguous():
        return "numba"
    halves = (torch.float16, torch.bfloat16)
    if which == "triton" and rows.dtype in (*halves, torch.float32, torch.float64):
        return "triton" if rows.stride(1) == 1 else "torch"
    return "torch"


def _blocks(rows: int, width: int, elements: int, whole: bool):
    """``(first row, rows)`` of the blocks of a ``(rows, width)`` pass: about ``elements``
    entries each (cache-sized on a CPU); one block when ``whole`` (a GPU, where each block
    costs kernel launches instead)."""
    step = rows if whole else max(1, elements // max(width, 1))
    return [(i, step) for i in range(0, rows, max(step, 1))]


def gather_logsumexp(
    x: torch.Tensor, index: torch.Tensor, start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.gather(-1, index)`` and ``logsumexp(x[..., start:], -1)``, fused for joint tensors.

    A transducer loss reads only a few entries of each ``(t, u)`` row of the joint's
    ``(B, T, U + 1, V)`` scores and their normaliser, so the normalised log-softmax need
    never exist: its log probabilities are ``picked - lse``. On CPU (float32 and float64,
    contiguous) each pass is one compiled loop per row, in the input's precision, the rows
    split over PyTorch's threads (:mod:`cbasr.losses._transducer_kernel`). On CUDA each pass
    is one Triton kernel over tiles of rows (:mod:`cbasr.losses._transducer_triton`; half
    precision too), with no joint-sized temporary. Elsewhere forward works in blocks of rows
    (temporaries of at most ``2**18`` entries). Backward writes the one joint-sized gradient
    in place, ``softmax(x[..., start:]) * grad_lse`` plus ``grad_picked`` scattered at
    ``index``. Peak extra memory is that gradient; ``x`` is kept for the backward (a
    log-softmax keeps its joint-sized output instead). Exponentials below about twice the
    smallest normal number are computed as that (``exp`` of lower arguments is a slow path on
    CPU, 5-40x): an error below ``2e-38`` (float32) per softmax entry. Differentiable once.

    Args:
        x: ``(..., V)`` scores.
        index: ``(..., K)`` int64 columns to pick.
        start: the normaliser sums columns ``start:`` (1 for HAT's joint, whose unit 0 is the
            blank logit outside the label softmax).

    Returns:
        ``picked (..., K)`` and ``lse (...)``.
    """
    return _GatherLogSumExp.apply(x, index, start)
