"""Second-order Conditional Bernoulli marginal likelihood with a bounded emission window.

The CB paper names, right after eq. (40), the extension of eq. (38) to higher-order models in
which ``P(y_l | ...)`` depends on a fixed-length history of emission times; section 3 argues
that a second-order model, ``P(y_l | t_l, t_{l-1}, y_<l)``, can already penalise emissions
that are too close. Here the label term depends on the current emission frame and on the gap
``t_l - t_{l-1}``, told apart up to ``W``: gaps ``1 .. W - 1`` each have their own term, and
every gap of ``W`` frames or more shares the last one (``d = W - 1``). This is the lattice of a
variable-window monotonic attention decoder, whose window for label ``l`` covers the frames
after the previous emission, at most the last ``W`` of them: a longer gap keeps the ``W``
frames ending at the emission. No gap and no first emission has probability zero by
construction, so words further apart than ``W`` frames are explained where they are, not by
emitting labels early, away from their words.

Each step's "gap of ``W`` or more" term sums the forward variables of every frame at least
``W`` back; a running log-sum-exp carries that sum from step to step (and a running suffix sum
in the backward pass), so the cost stays ``T`` steps of ``W`` terms.

Conventions (0-based frames):

- ``label_log_probs[b, t, d, l] = log P(y_l | t_l = t, t_l - t_{l-1} = d + 1, y_<l)``.
- ``d = W - 1`` stands for every gap of ``W`` frames or more.
- The first label's previous emission is the start, ``t_{-1} = -1``: ``y_0`` at frame ``t``
  uses ``d = min(t, W - 1)``; other entries are never read for ``l = 0``. After the last label
  any number of frames may pass.
- ``P(b) = prod_t P(b_t)`` as in the first-order model, so with ``W >= T`` and a label term
  constant over ``d`` this equals :func:`cb_marginal_nll`.
- Padding, ``impossible`` and the ``+inf`` / zero-gradient rule are as in
  :mod:`cbasr.losses.conditional_bernoulli`. Memory is ``O(B T W L)``.
"""

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from cbasr import _backends
from cbasr.checks import check_floating, check_lengths, check_shape, one_read
from cbasr.losses.conditional_bernoulli import _apply_impossible_policy, _cb_weights

__all__ = ["cb_marginal_nll_windowed", "cb_viterbi_windowed", "cb_posteriors_windowed"]

_NEG_INF = float("-inf")
_KERNEL_DTYPES = (torch.float32, torch.float64)


def _windowed_alpha(emit_rev: torch.Tensor, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward variables of the second-order lattice: ``T`` serial steps over frames.

    ``alpha[W + t, b, l + 1]`` = log weight of all prefixes whose label ``l`` is emitted at
    frame ``t``; column 0 is the start state, finite only at frame ``-1`` (row ``W - 1``).
    Second-order form of eq. (38): ``alpha[t, l] = logsumexp_{d < W - 1} alpha[t - d - 1,
    l - 1] + emit[t, d, l]``, plus ``far[t, l - 1] + emit[t, W - 1, l]`` where ``far[t, l] =
    logsumexp_{s <= t - W} alpha[s, l]`` (every gap of ``W`` or more).

    Args:
        emit_rev: ``(T + W, W, B, L)``, ``emit_rev[t, k] = emit[t, d = W - 1 - k]`` for
            ``t < T``, ``-inf`` rows after.
        L: number of label positions.

    Returns:
        ``alpha (W + T, B, L + 1)``, row ``r`` frame ``r - W``, and ``far (T, B, L)``.
    """
    T = emit_rev.shape[0] - emit_rev.shape[1]
    _, W, B, _ = emit_rev.shape
    alpha = emit_rev.new_full((W + T, B, L + 1), _NEG_INF)
    alpha[W - 1, :, 0] = 0.0
    # window[t] = rows t .. t + W - 1 = frames t - W .. t - 1, i.e. gaps W .. 1 (k = 0 .. W - 1).
    window = alpha.unfold(0, W, 1)[:, :, :L]  # (T + 1, B, L, W)
    window = window.permute(0, 3, 1, 2)  # (T + 1, B, L, W) -> (T + 1, W, B, L)
    window, arrive, out = window.unbind(0), emit_rev.unbind(0), alpha[W:, :, 1:].unbind(0)
    far = emit_rev.new_full((T, B, L), _NEG_INF)
    running = emit_rev.new_full((B, L), _NEG_INF)  # logsumexp of rows 0 .. t: frames <= t - W
    step = emit_rev.new_empty(W, B, L)
    for t in range(T):
        torch.logaddexp(running, alpha[t, :, :L], out=running)
        far[t] = running
        torch.add(window[t], arrive[t], out=step)
        torch.add(running, arrive[t][0], out=step[0])  # k = 0: every gap of W or more
        torch.logsumexp(step, dim=0, out=out[t])
    return alpha, far


def _windowed_beta(emit_rev: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """Backward variables: ``beta[t, b, l]`` = log weight of completing the path given that
    ``l`` labels are emitted, the last at frame ``t``.

    ``beta[t, L_b] = 0``; otherwise ``beta[t, l] = logsumexp_{d < W - 1} emit[t + d + 1, d,
    l] + beta[t + d + 1, l + 1]``, plus ``logsumexp_{s >= t + W} emit[s, W - 1, l] + beta[s,
    l + 1]`` (every gap of ``W`` or more), a running suffix sum.

    Args:
        emit_rev: ``(T + W, W, B, L)`` as in :func:`_windowed_alpha`.
        target_lengths: ``(B,)``.

    Returns:
        ``(T + W, B, L + 1)``; row ``r`` is frame ``r`` (rows ``>= T`` are ``-inf``).
    """
    T = emit_rev.shape[0] - emit_rev.shape[1]
    _, W, B, L = emit_rev.shape
    # next_emit[t, d] = emit_rev[t + 1 + d, W - 1 - d] = emit[t + 1 + d, d]: a strided view.
    s0, s1, s2, s3 = emit_rev.stride()
    next_emit = emit_rev.as_strided(
        (T, W, B, L), (s0, s0 - s1, s2, s3), emit_rev.storage_offset() + s0 + (W - 1) * s1
    )
    beta = emit_rev.new_full((T + W, B, L + 1), _NEG_INF)
    end = torch.zeros(B, L + 1, dtype=torch.bool, device=emit_rev.device)  # (B, L + 1)
    end[torch.arange(B, device=emit_rev.device), target_lengths] = True
    beta[:T].masked_fill_(end, 0.0)
    # window[t] = rows t + 1 .. t + W = frames after t, gaps 1 .. W (d = 0 .. W - 1).
    window = beta[1:].unfold(0, W, 1)[:, :, 1:]  # (T, B, L, W)
    window = window.permute(0, 3, 1, 2)  # (T, B, L, W) -> (T, W, B, L)
    window, next_emit, rows = window.unbind(0), next_emit.unbind(0), beta.unbind(0)
    step = emit_rev.new_empty(W, B, L)
    running = emit_rev.new_full((B, L), _NEG_INF)  # gaps of W or more: emissions at s >= t + W
    for t in range(T - 1, -1, -1):
        torch.logaddexp(running, emit_rev[t + W, 0] + rows[t + W][:, 1:], out=running)
        torch.add(next_emit[t], window[t], out=step)
        step[W - 1] = running
        torch.logsumexp(step, dim=0, out=rows[t][:, :L])
        rows[t].masked_fill_(end, 0.0)
    return beta


def _windowed_viterbi(
    emit_rev: torch.Tensor, L: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The max-product form of :func:`_windowed_alpha`: ``T`` serial steps over frames.

    ``alpha[W + t, b, l + 1] = max(max_{d < W - 1} alpha[t - d - 1, l] + emit[t, d, l],
    far[t, l] + emit[t, W - 1, l])`` with ``far[t, l] = max_{s <= t - W} alpha[s, l]``.

    Returns:
        ``alpha (W + T, B, L + 1)`` (rows as :func:`_windowed_alpha`'s), ``best_k (T, B, L)``
        the best entry of each state's window (``k = W - 1 - d``; 0 for every gap of ``W`` or
        more) and ``far_row (T, B, L)`` the row of ``alpha`` behind ``far``; ties keep the
        first entry and the earliest row. Both int64.
    """
    T = emit_rev.shape[0] - emit_rev.shape[1]
    _, W, B, _ = emit_rev.shape
    device = emit_rev.device
    alpha = emit_rev.new_full((W + T, B, L + 1), _NEG_INF)  # row r: frame r - W
    alpha[W - 1, :, 0] = 0.0
    best_k = torch.zeros(T, B, L, dtype=torch.long, device=device)
    # (T + 1, B, L, W) -> (T + 1, W, B, L)
    window = alpha.unfold(0, W, 1)[:, :, :L].permute(0, 3, 1, 2)
    far = emit_rev.new_full((B, L), _NEG_INF)  # best of rows 0 .. t (frames <= t - W) ...
    far_row = torch.zeros(T, B, L, dtype=torch.long, device=device)  # ... and its row
    best_row = torch.zeros(B, L, dtype=torch.long, device=device)
    for t in range(T):
        better = alpha[t, :, :L] > far
        far = torch.where(better, alpha[t, :, :L], far)
        best_row = torch.where(better, t, best_row)
        far_row[t] = best_row
        scores = window[t] + emit_rev[t]  # (W, B, L): over the W previous frames ...
        scores[0] = far + emit_rev[t, 0]  # ... k = 0 standing for every gap of W or more
        alpha[W + t, :, 1:], best_k[t] = scores.max(dim=0)
    return alpha, best_k, far_row


class _WindowedForwardBackward(torch.autograd.Function):
    """``log Z`` of the second-order lattice with an explicit posterior backward. Its two
    recursions run as Triton kernels (:mod:`cbasr.losses._cb_second_order_triton`) where the
    backend is ``triton`` (:mod:`cbasr._backends`) and the dtype float32 or float64, as the
    loops above elsewhere."""

    @staticmethod
    def forward(ctx, emit: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
        B, T, W, L = emit.shape
        # Each path emits every label once: shifting a label's weights by their maximum is
        # exact and keeps float32 round-off small (as in the first-order lattice).
        shift = emit.detach().amax(dim=(1, 2)) if T else emit.new_zeros(B, L)  # (B, L)
        shift = torch.nan_to_num(shift, nan=0.0, posinf=0.0, neginf=0.0)  # non-finite: 0
        emit_rev = _reversed_window(emit.detach() - shift[:, None, None, :])  # k = W - 1 - d
        ctx.triton = _backends.backend(emit) == "triton" and emit.dtype in _KERNEL_DTYPES
        if ctx.triton:
            from cbasr.losses import _cb_second_order_triton

            alpha, far = _cb_second_order_triton.alpha(emit_rev, L)
        else:
            alpha, far = _windowed_alpha(emit_rev, L)
        ends = alpha[:, torch.arange(B, device=emit.device), target_lengths]  # (W + T, B)
        log_z = torch.logsumexp(ends, dim=0)  # (B,)
        ctx.save_for_backward(emit_rev, alpha, far, target_lengths, log_z)
        return log_z + shift.sum(dim=1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_z: torch.Tensor):
        emit_rev, alpha, far, target_lengths, log_z = ctx.saved_tensors
        W = emit_rev.shape[1]
        T = emit_rev.shape[0] - W
        L = alpha.shape[2] - 1
        if ctx.triton:
            from cbasr.losses import _cb_second_order_triton

            beta = _cb_second_order_triton.beta(emit_rev, target_lengths)
        else:
            beta = _windowed_beta(emit_rev, target_lengths)
        log_z = torch.where(torch.isneginf(log_z), 0.0, log_z)  # no path: avoid -inf - (-inf)
        # source[t, k] = alpha row t + k = frame t - W + k = t - d - 1 for d = W - 1 - k.
        source = alpha.unfold(0, W, 1)[:T, :, :L]  # (T, B, L, W)
        source = source.permute(0, 3, 1, 2).clone()  # (T, B, L, W) -> (T, W, B, L)
        source[:, 0] = far  # k = 0 (d = W - 1): every frame at least W back
        log_post = source + emit_rev[:T] + beta[:T, None, :, 1:] - log_z[None, None, :, None]
        post = torch.exp(log_post) * grad_log_z[None, None, :, None]
        return post.flip(1).permute(2, 0, 1, 3), None  # (T, W, B, L) -> (B, T, W, L), d order


def _check_windowed_inputs(emit_logits, label_log_probs, input_lengths, target_lengths) -> None:
    check_floating("emit_logits", emit_logits)
    check_floating("label_log_probs", label_log_probs)
    check_shape("emit_logits", emit_logits, "(B, T)", (None, None))
    B, T = emit_logits.shape
    check_shape("label_log_probs", label_log_probs, "(B, T, W, L)", (B, T, None, None))
    if label_log_probs.shape[2] < 1:
        raise ValueError("label_log_probs must have a window W >= 1 (its dimension 2)")
    with one_read():
        check_lengths("input_lengths", input_lengths, B, T)
        check_lengths("target_lengths", target_lengths, B, label_log_probs.shape[3])


def _reversed_window(emit: torch.Tensor) -> torch.Tensor:
    """``(B, T, W, L)`` -> ``(T + W, W, B, L)`` with ``[t, k] = emit[:, t, d = W - 1 - k]``;
    ``-inf`` rows after ``T``."""
    B, T, W, L = emit.shape
    emit_rev = emit.new_full((T + W, W, B, L), _NEG_INF)
    emit_rev[:T] = emit.flip(2).permute(1, 2, 0, 3)  # (B, T, W, L) -> (T, W, B, L), d reversed
    return emit_rev


def cb_marginal_nll_windowed(
    emit_logits: torch.Tensor,
    label_log_probs: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    *,
    impossible: str = "raise",
) -> torch.Tensor:
    """``-log P(y)`` of the second-order CB model with emission gaps told apart up to ``W``.

    ``P(y) = sum_b prod_t P(b_t) prod_l P(y_l | t_l, min(t_l - t_{l-1}, W), y_<l)`` over
    emission patterns with ``L`` ones (``t_{-1} = -1``). Forward: ``T`` serial steps, each a
    log-sum-exp over the ``W - 1`` previous frames and the running sum of those further back,
    vectorised over ``(B, L)``; backward: explicit beta recursion. Memory ``O(B T W L)``.

    Args:
        emit_logits: ``(B, T)`` logits of ``P(B_t = 1)``.
        label_log_probs: ``(B, T, W, L)``; ``[b, t, d, l] = log P(y_l | t_l = t,
            t_l - t_{l-1} = d + 1, y_<l)``, ``d = W - 1`` for every gap of ``W`` or more (see
            the module docstring for ``l = 0``).
        input_lengths: ``(B,)`` valid frames.
        target_lengths: ``(B,)`` valid labels.
        impossible: ``"inf"`` or ``"raise"`` for ``L_b > T_b``, as in
            :func:`cb_marginal_nll`.

    Returns:
        ``(B,)`` negative log likelihoods, differentiable (once) w.r.t. both float inputs.
    """
    with one_read():
        _check_windowed_inputs(emit_logits, label_log_probs, input_lengths, target_lengths)
        _apply_impossible_policy(input_lengths, target_lengths, impossible)

    # Same masking and non-emission factoring as the first-order lattice, for every gap d.
    stay, emit = _cb_weights(emit_logits, label_log_probs, input_lengths, target_lengths)
    log_z = _WindowedForwardBackward.apply(emit, target_lengths.to(emit.device))  # (B,)
    return torch.where(torch.isneginf(log_z), float("inf"), -(stay + log_z))


@torch.no_grad()
def cb_viterbi_windowed(
    emit_logits: torch.Tensor,
    label_log_probs: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Most likely emission times of the second-order model: the max-product form of the
    windowed lattice (``alpha[t, l] = max_d alpha[t - d - 1, l - 1] + emit[t, d, l]``, the
    best of every frame at least ``W`` back for ``d = W - 1``) and a backtrace on the host. The
    forward pass is a Triton kernel for CUDA tensors (float32 and float64), the PyTorch loop
    elsewhere.

    Args:
        as :func:`cb_marginal_nll_windowed`.

    Returns:
        ``times (B, L)`` int64 (``-1`` at padded labels and where no alignment exists) and
        ``log_prob (B,)`` ``log P(b*, y)`` (``-inf`` where none exists).
    """
    _check_windowed_inputs(emit_logits, label_log_probs, input_lengths, target_lengths)
    stay, emit = _cb_weights(emit_logits, label_log_probs, input_lengths, target_lengths)
    B, T, W, L = emit.shape
    emit_rev = _reversed_window(emit)
    if _backends.backend(emit) == "triton" and emit.dtype in _KERNEL_DTYPES:
        from cbasr.losses import _cb_second_order_triton

        alpha, best_k, far_row = _cb_second_order_triton.viterbi(emit_rev, L)
    else:
        alpha, best_k, far_row = _windowed_viterbi(emit_rev, L)
    lengths = target_lengths.to(emit.device)
    # (W + T, B): last label at each frame
    ends = alpha[:, torch.arange(B, device=emit.device), lengths]
    best_end, last_row = ends.max(dim=0)
    log_prob = best_end + stay
    # Backtrace on the host: row r holds frame r - W; entry k of frame t's window is row t + k.
    best_k, rows, far_row = best_k.cpu().numpy(), last_row.cpu().numpy(), far_row.cpu().numpy()
    times = np.full((B, L), -1, dtype=np.int64)
    for b in range(B):
        if not np.isfinite(float(best_end[b])):
            continue
        row = int(rows[b])
        for l in range(int(lengths[b]) - 1, -1, -1):
            t = row - W
            times[b, l] = t
            k = int(best_k[t, b, l])
            row = t + k if k > 0 else int(far_row[t, b, l])
    return torch.from_numpy(times).to(emit.device), log_prob


def cb_posteriors_windowed(
    emit_logits: torch.Tensor,
    label_log_probs: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """``P(t_l = t | y)`` of the second-order model, ``(B, T, L)``: the lattice's edge
    posteriors (the gradient of ``log Z``, from the explicit backward pass) summed over gaps."""
    with torch.enable_grad():
        terms = label_log_probs.detach().clone().requires_grad_()
        nll = cb_marginal_nll_windowed(
            emit_logits.detach(), terms, input_lengths, target_lengths, impossible="inf"
        )
        finite = torch.isfinite(nll)
        (grad,) = torch.autograd.grad(-torch.where(finite, nll, 0.0).sum(), terms)
    return grad.sum(dim=2)  # (B, T, W, L) -> (B, T, L)
