"""The RNN Transducer lattice (Graves, 2012), summed from per-node edge weights.

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

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from cbasr import _backends
from cbasr.checks import check_floating, check_lengths, check_shape, one_read
from cbasr.losses._joint import _finite_or_zero
from cbasr.losses._lattice_kernels import _MonotonicKernel, _TransducerKernel, _TransducerTriton

__all__ = ["transducer_lattice_nll"]

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
