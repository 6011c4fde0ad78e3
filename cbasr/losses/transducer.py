"""RNN Transducer lattice (Graves, 2012): torchaudio's loss and a gather-first lattice.

Lattice convention (torchaudio's, and the HAT paper's section 3.1 "RNNT lattice"): nodes
``(t, u)`` for frames ``0 <= t < T_b`` and labels emitted ``0 <= u <= U_b``; from ``(t, u)``
a blank edge goes to ``(t + 1, u)`` and a label edge emitting ``y_{u+1}`` (0-based
``targets[u]``) to ``(t, u + 1)``. A path starts at ``(0, 0)`` and ends with the blank leaving
``(T_b - 1, U_b)``: ``T_b`` blanks and ``U_b`` labels, ``T_b + U_b`` edges, and any number of
labels per frame.

:func:`transducer_lattice_nll` sums over that lattice given per-node edge log-weights, which
are only ``B * T * (U + 1)`` numbers: it walks the anti-diagonals ``n = t + u`` (``T + U + 1``
serial steps, each vectorised over ``(B, U + 1)``) forward and, in an explicit backward, in
reverse; its gradients are the edge posteriors.

The *one-label-per-frame* (monotonic) topology (Tripathi, Lu, Sak and Soltau 2019,
"Monotonic recurrent neural network transducer and decoding strategies", ASRU 2019; k2's
"modified" transducer, Kuang et al. 2022, arXiv:2206.13236) has the same nodes and edge
weights, but a label edge also advances the frame: it goes from ``(t, u)`` to
``(t + 1, u + 1)``. A path then takes exactly one edge per frame, ``T_b`` edges of which
``U_b`` emit (so it needs ``U_b <= T_b``), and ends at node ``(T_b, U_b)``. After emitting
``y_u`` at frame ``t`` the joint is next asked at frame ``t + 1``, never again at ``(t, u)``
with the label it has just emitted as its history: a repeated label (``y_{u+1} = y_u``)
cannot be confused with staying on the first one. ``monotonic=True`` selects it in every
function here; its recursion is frame-synchronous, ``T`` serial steps each vectorised over
``(B, U + 1)``.
"""

import math

import torch
import torch.nn.functional as F
import torchaudio.functional as AF
from torch.autograd.function import once_differentiable

from cbasr import _backends
from cbasr.checks import check_floating, check_label_ids, check_lengths, check_shape, one_read
from cbasr.losses._transducer_kernel import (
    monotonic_lattice,
    row_logsumexp,
    row_softmax,
    transducer_lattice,
)

__all__ = ["rnnt_nll", "rnnt_lattice_nll", "transducer_lattice_nll", "gather_logsumexp"]

_NEG_INF = float("-inf")


def _skew(x: torch.Tensor) -> torch.Tensor:
    """Anti-diagonal layout: ``(B, T1, U1) -> (T1 + U1 - 1, B, U1)``,
    ``out[n, b, u] = x[b, n - u, u]`` and ``-inf`` where ``n - u`` is outside ``[0, T1)``."""
    B, T1, U1 = x.shape
    n = torch.arange(T1 + U1 - 1, device=x.device)[:, None]
    u = torch.arange(U1, device=x.device)[None, :]
    t = n - u  # (N, U1)
    rows = t.clamp(0, T1 - 1)[:, None, :].expand(-1, B, -1)  # (N, B, U1)
    out = torch.gather(x.transpose(0, 1), 0, rows)  # (B, T1, U1) -> (T1, B, U1) -> (N, B, U1)
    return out.masked_fill(((t < 0) | (t >= T1))[:, None, :], _NEG_INF)


def _unskew(xs: torch.Tensor, T1: int) -> torch.Tensor:
    """Inverse of :func:`_skew`: ``(N, B, U1) -> (T1, B, U1)``,
    ``out[t, b, u] = xs[t + u, b, u]``."""
    _, B, U1 = xs.shape
    rows = torch.arange(T1, device=xs.device)[:, None] + torch.arange(U1, device=xs.device)
    return torch.gather(xs, 0, rows[:, None, :].expand(-1, B, -1))


def _finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """``x`` with NaN and +-inf made 0: one kernel (``isfinite`` is four on a GPU)."""
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def _shift_weights(
    blank: torch.Tensor, emit: torch.Tensor, monotonic: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Masked edge weights shifted so that the forward variables stay near 0 in float32, and
    ``(B,)`` the total shift every path carries (so ``log P(y)`` is the shifted lattice's plus
    it; the posteriors do not change). Standard lattice: every path takes one blank per frame
    and emits every label once, so each frame's blank weights and each label's emission
    weights are shifted by their maximum. One label per frame: every path takes exactly one
    edge per frame, so both edges of a frame are shifted by one constant."""
    blank, emit = blank.detach(), emit.detach()
    if monotonic:
        shift = blank.amax(dim=2)  # (B, T)
        if emit.shape[2]:
            shift = torch.maximum(shift, emit.amax(dim=2))
        shift = _finite_or_zero(shift)
        return blank - shift[:, :, None], emit - shift[:, :, None], shift.sum(dim=1)
    blank_shift = _finite_or_zero(blank.amax(dim=2))  # (B, T)
    emit_shift = _finite_or_zero(emit.amax(dim=1))  # (B, U)
    total = blank_shift.sum(dim=1) + emit_shift.sum(dim=1)
    return blank - blank_shift[:, :, None], emit - emit_shift[:, None, :], total


class _TransducerForwardBackward(torch.autograd.Function):
    """``log P(y)`` over the lattice from masked per-node edge weights.

    Inputs must already be masked: ``blank[b, t, :] = 0`` for padded frames ``t >= T_b`` (a
    free pass to the last row), ``emit[b, t, u] = -inf`` for ``t >= T_b`` or ``u >= U_b``.
    An extra node row ``t = T`` collects every utterance: its label edges are free for
    ``u >= U_b``, so all paths end at node ``(T, U)`` and ``log P(y) = alpha(T, U)``.
    """

    @staticmethod
    def forward(ctx, blank, emit, target_lengths):
        B, T, U1 = blank.shape
        U = U1 - 1
        device = blank.device
        blank, emit, shift = _shift_weights(blank, emit, monotonic=False)
        # Node weights over T + 1 rows; row T is the collecting row.
        last_blank = blank.new_full((B, 1, U1), _NEG_INF)
        u = torch.arange(U1, device=device)
        last_emit = torch.where(
            (u[None, :] >= target_lengths[:, None]) & (u[None, :] < U), 0.0, _NEG_INF
        ).to(blank.dtype)  # (B, U1)
        emit_nodes = torch.cat([F.pad(emit, (0, 1), value=_NEG_INF), last_emit[:, None]], 1)
        blank_s = _skew(torch.cat([blank, last_blank], dim=1))  # (N, B, U1), N = T + U + 1
        emit_s = _skew(emit_nodes)  # (N, B, U1)
        N = blank_s.shape[0]

        # Forward variables on anti-diagonals, RNN-T recursion (HAT paper eq. 4 edges):
        # alpha(t, u) = logaddexp(alpha(t-1, u) + blank(t-1, u), alpha(t, u-1) + emit(t, u-1)).
        alpha = blank.new_full((N, B, U1 + 1), _NEG_INF)  # column u + 1 is u; 0 is a sentinel
        alpha[0, :, 1] = 0.0
        arrive = F.pad(emit_s, (1, 0), value=_NEG_INF)[:, :, :U1]  # emit from (t, u - 1)
        # Per-diagonal views made once (unbind): the loop is dispatch-bound.
        at, left = alpha[:, :, 1:].unbind(0), alpha[:, :, :-1].unbind(0)
        blank_n, arrive = blank_s.unbind(0), arrive.unbind(0)
        via_blank, via_emit = blank.new_empty(B, U1), blank.new_empty(B, U1)
        for n in range(1, N):
            torch.add(at[n - 1], blank_n[n - 1], out=via_blank)
            torch.add(left[n - 1], arrive[n - 1], out=via_emit)
            torch.logaddexp(via_blank, via_emit, out=at[n])
        log_p = alpha[N - 1, :, U1]  # node (T, U)
        ctx.save_for_backward(blank, emit, blank_s, emit_s, alpha, log_p)
        return log_p + shift

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_p):
        blank, emit, blank_s, emit_s, alpha, log_p = ctx.saved_tensors
        N, B, U1 = blank_s.shape
        T = blank.shape[1]
        # beta(t, u) = logaddexp(beta(t+1, u) + blank(t, u), beta(t, u+1) + emit(t, u)).
        beta = blank.new_full((N, B, U1 + 1), _NEG_INF)  # column u is u; U1 is a sentinel
        beta[N - 1, :, U1 - 1] = 0.0
        at, right = beta[:, :, :-1].unbind(0), beta[:, :, 1:].unbind(0)
        blank_n, emit_n = blank_s.unbind(0), emit_s.unbind(0)
        via_blank, via_emit = blank.new_empty(B, U1), blank.new_empty(B, U1)
        for n in range(N - 2, -1, -1):
            torch.add(at[n + 1], blank_n[n], out=via_blank)
            torch.add(right[n + 1], emit_n[n], out=via_emit)
            torch.logaddexp(via_blank, via_emit, out=at[n])
        alpha_n = _unskew(alpha[:, :, 1:], T + 1)  # (T + 1, B, U1)
        beta_n = _unskew(beta[:, :, :-1], T + 1)  # (T + 1, B, U1)
        scale = grad_log_p[None, :, None]
        # No path: every alpha + weight + beta is -inf too; avoid -inf - (-inf).
        log_z = torch.where(torch.isneginf(log_p), 0.0, log_p)[None, :, None]
        # Edge posteriors: alpha(tail) + weight + beta(head) - log P(y).
        post_blank = torch.exp(alpha_n[:-1] + blank.transpose(0, 1) + beta_n[1:] - log_z)
        post_emit = torch.exp(
            alpha_n[:-1, :, :-1] + emit.transpose(0, 1) + beta_n[:-1, :, 1:] - log_z
        )
        # (T, B, U1) -> (B, T, U1) and (T, B, U) -> (B, T, U)
        return (post_blank * scale).transpose(0, 1), (post_emit * scale).transpose(0, 1), None


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


class _MonotonicForwardBackward(torch.autograd.Function):
    """``log P(y)`` over the one-label-per-frame lattice (module docstring) from masked edge
    weights: ``blank[b, t, :] = 0`` for padded frames ``t >= T_b`` (a free pass down),
    ``emit[b, t, u] = -inf`` for ``t >= T_b`` or ``u >= U_b``; ``log P(y) = alpha(T, U_b)``."""

    @staticmethod
    def forward(ctx, blank, emit, target_lengths):
        B, T, U1 = blank.shape
        blank, emit, shift = _shift_weights(blank, emit, monotonic=True)
        blank_t = blank.transpose(0, 1)  # (B, T, U + 1) -> (T, B, U + 1)
        emit_t = F.pad(emit, (1, 0), value=_NEG_INF).transpose(0, 1)  # arriving at u from u - 1
        # alpha(t + 1, u) = logaddexp(alpha(t, u) + blank(t, u), alpha(t, u - 1) + emit(t, u - 1))
        alpha = blank.new_full((T + 1, B, U1), _NEG_INF)
        alpha[0, :, 0] = 0.0
        via_blank, via_emit = blank.new_empty(B, U1), blank.new_empty(B, U1)
        at, blank_n, arrive = alpha.unbind(0), blank_t.unbind(0), emit_t.unbind(0)
        for t in range(T):
            torch.add(at[t], blank_n[t], out=via_blank)
            via_emit[:, 0] = _NEG_INF
            torch.add(at[t][:, :-1], arrive[t][:, 1:], out=via_emit[:, 1:])
            torch.logaddexp(via_blank, via_emit, out=at[t + 1])
        log_p = alpha[T].gather(1, target_lengths[:, None].long()).squeeze(1)  # (B,)
        ctx.save_for_backward(blank_t, emit.transpose(0, 1), alpha, log_p, target_lengths)
        return log_p + shift

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_p):
        blank_t, emit_t, alpha, log_p, target_lengths = ctx.saved_tensors
        T, B, U1 = blank_t.shape
        # beta(t, u) = logaddexp(blank(t, u) + beta(t + 1, u), emit(t, u) + beta(t + 1, u + 1))
        beta = blank_t.new_full((T + 1, B, U1), _NEG_INF)
        beta[T].scatter_(1, target_lengths[:, None].long(), 0.0)
        via_blank, via_emit = blank_t.new_empty(B, U1), blank_t.new_empty(B, U1)
        at, blank_n, emit_n = beta.unbind(0), blank_t.unbind(0), emit_t.unbind(0)
        for t in range(T - 1, -1, -1):
            torch.add(at[t + 1], blank_n[t], out=via_blank)
            via_emit[:, -1] = _NEG_INF
            torch.add(at[t + 1][:, 1:], emit_n[t], out=via_emit[:, :-1])
            torch.logaddexp(via_blank, via_emit, out=at[t])
        log_z = torch.where(torch.isneginf(log_p), 0.0, log_p)[None, :, None]  # no path: 0
        scale = grad_log_p[None, :, None]
        post_blank = torch.exp(alpha[:-1] + blank_t + beta[1:] - log_z)  # (T, B, U + 1)
        post_emit = torch.exp(alpha[:-1, :, :-1] + emit_t + beta[1:, :, 1:] - log_z)
        # (T, B, U + 1) -> (B, T, U + 1) and (T, B, U) -> (B, T, U)
        return (post_blank * scale).transpose(0, 1), (post_emit * scale).transpose(0, 1), None


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


# Joint entries per block of the fused log-softmax: blocks that stay in cache (measured fastest).
_CHUNK_ELEMENTS = 1 << 18
_BACKWARD_ELEMENTS = 1 << 20


class _ScaleGradient(torch.autograd.Function):
    """The identity, its gradient multiplied by ``factor``."""

    @staticmethod
    def forward(ctx, x, factor: float):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def _check_fastemit(fastemit: float) -> None:
    if not fastemit >= 0.0:
        raise ValueError(f"fastemit (FastEmit's lambda) must be >= 0, got {fastemit}")


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


def transducer_lattice_nll(
    blank_log_probs: torch.Tensor,
    emit_log_probs: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    monotonic: bool = False,
    fastemit: float = 0.0,
) -> torch.Tensor:
    """``-log P(y)`` summed over the RNN-T lattice from per-node edge log-weights.

    Gather first, lattice second: only ``B * T * (U + 1)`` values enter the lattice, whatever
    the vocabulary. On CPU (float32 and float64) one compiled loop computes it in float64,
    the utterances as its vector lanes (:mod:`cbasr.losses._transducer_kernel`), with the edge
    posteriors in the same pass as the backward variables. On CUDA, Triton kernels
    (:mod:`cbasr.losses._transducer_triton`) run the recursion, one program per utterance.
    Elsewhere (the ``torch`` backend, half precision), forward and backward are ``T + U + 1``
    serial anti-diagonal steps each, vectorised over ``(B, U + 1)``. Memory ``O(B (T + U) U)``
    in every case.

    Args:
        blank_log_probs: ``(B, T, U + 1)``; log weight of the blank edge leaving ``(t, u)``.
        emit_log_probs: ``(B, T, U)``; log weight of the edge emitting ``y_{u+1}`` at
            ``(t, u)``.
        input_lengths: ``(B,)`` frames, ``1 <= T_b <= T``.
        target_lengths: ``(B,)`` labels, ``0 <= U_b <= U``.
        monotonic: the one-label-per-frame topology (module docstring): a label edge leaves
            ``(t, u)`` for ``(t + 1, u + 1)``; ``T`` frame-synchronous steps. An utterance
            with ``U_b > T_b`` has no path.
        fastemit: FastEmit's ``lambda`` (Yu et al. 2021, "FastEmit: Low-latency Streaming ASR
            with Sequence-level Emission Regularization", arXiv:2010.11148, eqs. 8-10): the
            gradient w.r.t. every label edge's log weight is ``1 + lambda`` times the NLL's,
            the blank edges' unchanged, so training moves probability to emitting labels
            early rather than waiting with blanks. The value returned is the NLL.

    Returns:
        ``(B,)`` negative log likelihoods (``+inf`` with zero gradient where every path has
        weight zero), differentiable once w.r.t. both weight tensors. Padded entries get
        zero gradient.
    """
    check_floating("blank_log_probs", blank_log_probs)
    check_floating("emit_log_probs", emit_log_probs)
    check_shape("blank_log_probs", blank_log_probs, "(B, T, U + 1)", (None, None, None))
    B, T, U1 = blank_log_probs.shape
    check_shape("emit_log_probs", emit_log_probs, "(B, T, U)", (B, T, U1 - 1))
    _check_fastemit(fastemit)
    with one_read():
        check_lengths("input_lengths", input_lengths, B, T, min_len=1)
        check_lengths("target_lengths", target_lengths, B, U1 - 1)
    return _lattice_nll(
        blank_log_probs, emit_log_probs, input_lengths, target_lengths, monotonic, fastemit
    )


def _lattice_nll(
    blank_log_probs, emit_log_probs, input_lengths, target_lengths, monotonic, fastemit
):
    """:func:`transducer_lattice_nll` on arguments already checked."""
    B, T, U1 = blank_log_probs.shape
    device = blank_log_probs.device
    dtype = torch.promote_types(
        torch.promote_types(blank_log_probs.dtype, emit_log_probs.dtype), torch.float32
    )
    in_lens, tgt_lens = input_lengths.to(device), target_lengths.to(device)
    pad_t = (torch.arange(T, device=device)[None, :] >= in_lens[:, None])[:, :, None]  # (B, T, 1)
    u = torch.arange(U1, device=device)[None, None, :]
    beyond_u = u > tgt_lens[:, None, None]  # (B, 1, U1): nodes no path visits
    blank = torch.where(pad_t, 0.0, torch.where(beyond_u, _NEG_INF, blank_log_probs.to(dtype)))
    valid_emit = ~pad_t & (u[..., :-1] < tgt_lens[:, None, None])  # (B, T, U)
    emit = torch.where(valid_emit, emit_log_probs.to(dtype), _NEG_INF)
    if fastemit:  # FastEmit: the label edges' gradient scaled by 1 + lambda
        emit = _ScaleGradient.apply(emit, 1.0 + fastemit)
    which = _backends.backend(blank)
    if dtype not in (torch.float32, torch.float64):
        which = "torch"
    if which == "triton":
        log_p = _TransducerTriton.apply(blank, emit, tgt_lens, monotonic)  # (B,)
    else:
        if monotonic:
            lattice = _MonotonicKernel if which == "numba" else _MonotonicForwardBackward
        else:
            lattice = _TransducerKernel if which == "numba" else _TransducerForwardBackward
        log_p = lattice.apply(blank, emit, tgt_lens)  # (B,)
    return torch.where(torch.isneginf(log_p), float("inf"), -log_p)


def _check_rnnt_inputs(logits, targets, input_lengths, target_lengths, blank: int) -> None:
    """The argument checks both RNN-T losses make, each error naming the argument."""
    check_floating("logits", logits)
    check_shape("logits", logits, "(B, T, U + 1, V)", (None, None, None, None))
    B, T, U1, V = logits.shape
    check_shape("targets", targets, "(B, U)", (B, U1 - 1))
    if not 0 <= blank < V:
        raise ValueError(f"blank = {blank} must be in [0, {V})")
    with one_read():
        check_lengths("input_lengths", input_lengths, B, T, min_len=1)
        check_lengths("target_lengths", target_lengths, B, U1 - 1)
        check_label_ids("targets", targets, target_lengths, V, blank=blank)


def rnnt_lattice_nll(
    logits: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = 0,
    monotonic: bool = False,
    fastemit: float = 0.0,
) -> torch.Tensor:
    """RNN-T ``-log P(y | x)`` per utterance from the joint's logits, without torchaudio: the
    blank's and the next label's log-softmax at every node (:func:`gather_logsumexp`, no
    normalised joint tensor), then :func:`transducer_lattice_nll`. Same value as
    :func:`rnnt_nll`; float64 too; far faster on CPU, and its extra memory is one joint-sized
    gradient.

    Args:
        logits, targets, input_lengths, target_lengths, blank: as :func:`rnnt_nll`.
        monotonic: the one-label-per-frame topology (module docstring), which torchaudio's
            loss does not have.
        fastemit: FastEmit's ``lambda`` (:func:`transducer_lattice_nll`), which torchaudio's
            loss does not have either.
    """
    _check_rnnt_inputs(logits, targets, input_lengths, target_lengths, blank)
    _check_fastemit(fastemit)
    B, T, U1, V = logits.shape
    device = logits.device
    if blank == 0 and _fused_joint(logits, None, 0):
        return fused_joint_nll(
            logits,
            None,
            targets,
            input_lengths=input_lengths,
            target_lengths=target_lengths,
            monotonic=monotonic,
            fastemit=fastemit,
        )
    valid = torch.arange(U1 - 1, device=device)[None, :] < target_lengths.to(device)[:, None]
    labels = torch.where(valid, targets.to(device), blank)  # (B, U): padding -> any valid id
    labels = F.pad(labels, (0, 1), value=blank)  # (B, U + 1): nothing is emitted from u = U
    index = torch.stack([torch.full_like(labels, blank), labels], dim=-1)  # (B, U + 1, 2)
    index = index[:, None].expand(B, T, U1, 2)
    picked, lse = gather_logsumexp(logits, index)
    log_probs = picked - lse.unsqueeze(-1)  # (B, T, U + 1, 2)
    emit = log_probs[:, :, :-1, 1]
    return _lattice_nll(log_probs[..., 0], emit, input_lengths, target_lengths, monotonic, fastemit)


def rnnt_nll(
    logits: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = 0,
) -> torch.Tensor:
    """RNN-T ``-log P(y | x)`` per utterance: a thin wrapper over
    :func:`torchaudio.functional.rnnt_loss` (``reduction="none"``, fused log-softmax).

    torchaudio needs the logits' time and label dimensions to equal the batch's longest
    ``T_b`` and ``U_b + 1``; longer padding is sliced off here (which copies the joint).

    Args:
        logits: ``(B, T, U + 1, V)`` unnormalised joint scores over ``V`` classes including
            ``blank``; float32 or float16 (torchaudio has no float64 kernel).
        targets: ``(B, U)`` label ids in ``[0, V)``, never ``blank``; padded entries ignored.
        input_lengths: ``(B,)`` frames, ``1 <= T_b <= T``.
        target_lengths: ``(B,)`` labels, ``0 <= U_b <= U``.
        blank: id of the blank class.

    Returns:
        ``(B,)`` negative log likelihoods, differentiable w.r.t. ``logits``.
    """
    check_floating("logits", logits)
    check_shape("logits", logits, "(B, T, U + 1, V)", (None, None, None, None))
    B, T, U1, V = logits.shape
    if logits.dtype not in (torch.float32, torch.float16):
        raise ValueError(
            f"logits must be float32 or float16 for torchaudio's rnnt_loss; got {logits.dtype} "
            "(transducer_lattice_nll accepts float64)"
        )
    _check_rnnt_inputs(logits, targets, input_lengths, target_lengths, blank)
    if B == 0:
        return logits.flatten(1).sum(1)  # (0,), in the graph
    max_t, max_u = torch.stack(  # one read of the device
        [input_lengths.max(), target_lengths.to(input_lengths.device).max()]
    ).tolist()
    if (max_t, max_u + 1) != (T, U1):
        logits = logits[:, :max_t, : max_u + 1]
    return AF.rnnt_loss(
        logits.contiguous(),
        targets[:, :max_u].to(device=logits.device, dtype=torch.int32).contiguous(),
        input_lengths.to(device=logits.device, dtype=torch.int32),
        target_lengths.to(device=logits.device, dtype=torch.int32),
        blank=blank,
        reduction="none",
    )
