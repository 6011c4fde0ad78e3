"""Exact Conditional Bernoulli marginal likelihood and posteriors (the Viterbi alignment over
the same lattice: :mod:`cbasr.losses.cb_viterbi`).

CB paper (Robertson 2020, "The Conditional Bernoulli and its Application to Speech
Recognition"; docs/references.md) section 2.4. With independent emission
Bernoullis ``B_t ~ Bernoulli(sigmoid(a_t))`` and a label model that depends on the emission
times only through the current one, ``P(y_l | t_l, y_<l)``, eq. (38) is a first-order HMM over
states ``(t, l)`` = (frames read, labels emitted). Because ``P(L) P(b | L) = P(b)`` (section
2.4, before eq. 39), each frame either does not emit, with weight ``log sigmoid(-a_t)``, or emits
the next label ``y_l``, with weight ``log sigmoid(a_t) + log P(y_l | t_l = t, y_<l)``; the
forward sum over this lattice is ``log P(y) = log P(L) + log E_{b|L}[P(y | b)]`` (eq. 18),
``P(L)`` being the Poisson-Binomial.

Conventions: frames and emission times are 0-based; utterance ``b`` uses frames
``t < input_lengths[b]`` and labels ``l < target_lengths[b]``; values at padded positions are
ignored (they may hold anything finite or not) and receive zero gradient. Logits are assumed
finite on valid frames. ``target_lengths[b] > input_lengths[b]`` has no alignment: a ``ValueError`` naming the
batch index by default, or, with ``impossible="inf"``, a ``+inf`` loss with zero gradient;
count such utterances with ``torch.isinf(loss).sum()``. An utterance whose every alignment has
probability 0 (``-inf`` label log-probabilities) also gets ``+inf`` and zero gradient.
Memory is ``O(B T L)``.
"""

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from cbasr.checks import check_floating, check_lengths, check_shape, check_that, one_read
from cbasr.losses._cb_kernel import _CBKernel, _lattice_backend, cb_lattice

__all__ = ["cb_marginal_nll", "cb_posteriors"]

_NEG_INF = float("-inf")


def _work_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """At least float32: half-precision inputs run the lattice in float32."""
    dtype = torch.float32
    for x in tensors:
        dtype = torch.promote_types(dtype, x.dtype)
    return dtype


def _apply_impossible_policy(
    input_lengths: torch.Tensor, target_lengths: torch.Tensor, impossible: str
) -> None:
    """Apply the ``impossible`` policy to utterances with more labels than frames."""
    if impossible not in ("inf", "raise"):
        raise ValueError(f"impossible must be 'inf' or 'raise'; got {impossible!r}")
    if impossible == "raise":
        fits = target_lengths <= input_lengths.to(target_lengths.device)

        def fail():
            bad = (~fits).nonzero().flatten()
            b = int(bad[0])
            raise ValueError(
                f"target_lengths[{b}] = {int(target_lengths[b])} > input_lengths[{b}] = "
                f"{int(input_lengths[b])}: the CB lattice emits at most one label per frame, "
                f"so no alignment exists (batch indices {bad.tolist()[:10]}); "
                "pass impossible='inf' to get +inf losses instead"
            )

        check_that(fits, fail)


def _cb_weights(
    emit_logits: torch.Tensor,
    label_log_probs: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked lattice weights, with every frame's non-emission weight factored out.

    Each path takes one transition per frame, so ``sum_t log sigmoid(-a_t)`` is common to all
    paths; what is left is weight 0 for not emitting and, for emitting label ``l`` at frame
    ``t``, ``log sigmoid(a_t) - log sigmoid(-a_t) + log P(y_l | t, y_<l) = a_t + lp[t, l]``.

    Args:
        emit_logits: ``(B, T)``.
        label_log_probs: ``(B, T, L)``, or ``(B, T, W, L)`` for the second-order lattice
            (masked the same way for every ``d``).
        input_lengths, target_lengths: ``(B,)``.

    Returns:
        ``stay`` ``(B,)``: ``sum_{t < T_b} log P(B_t = 0)``.
        ``emit``: like ``label_log_probs``; ``a_t + lp[t, ..., l]`` on valid ``(t, l)``,
        ``-inf`` elsewhere.
    """
    dtype = _work_dtype(emit_logits, label_log_probs)
    B, T, L = label_log_probs.shape[0], label_log_probs.shape[1], label_log_probs.shape[-1]
    inner = [1] * (label_log_probs.dim() - 3)  # [] or [1] for the window dimension
    device = emit_logits.device
    valid_t = torch.arange(T, device=device)[None, :] < input_lengths.to(device)[:, None]  # (B, T)
    valid_l = torch.arange(L, device=device)[None, :] < target_lengths.to(device)[:, None]  # (B, L)
    valid = (valid_t[:, :, None] & valid_l[:, None, :]).view(B, T, *inner, L)  # (B, T, [1,] L)
    # Padded entries are replaced before any nonlinearity so that NaN or inf there cannot
    # reach a gradient.
    a = torch.where(valid_t, emit_logits.to(dtype), 0.0)  # (B, T)
    stay = F.logsigmoid(-a).masked_fill(~valid_t, 0.0).sum(dim=1)  # (B,)
    lp = torch.where(valid, label_log_probs.to(dtype), 0.0)  # (B, T, [W,] L)
    emit = torch.where(valid, a.view(B, T, *inner, 1) + lp, _NEG_INF)  # (B, T, [W,] L)
    return stay, emit


def _cb_alpha(emit_t: torch.Tensor) -> torch.Tensor:
    """Forward variables of eq. (38), vectorised over labels: ``T`` serial steps.

    ``alpha[t, b, l + 1] = log sum over paths through frames < t having emitted l labels``
    (non-emission weights factored out, see :func:`_cb_weights`); column 0 is a ``-inf``
    sentinel for ``l = -1``. Recursion (CB paper section 2.4, the HMM reading of eq. 38):
    ``alpha[t+1, l] = logaddexp(alpha[t, l], alpha[t, l-1] + emit[t, l-1])``.

    Args:
        emit_t: ``(T, B, L)`` emission weights, frame-major.

    Returns:
        ``(T + 1, B, L + 2)``.
    """
    T, B, L = emit_t.shape
    alpha = emit_t.new_full((T + 1, B, L + 2), _NEG_INF)
    alpha[0, :, 1] = 0.0
    arrive = F.pad(emit_t, (1, 0), value=_NEG_INF)  # (T, B, L + 1): weight of arriving in l
    # Per-frame views made once (unbind) rather than sliced in the loop: the loop is
    # dispatch-bound, each step being two small ops.
    came_from, stay_at = alpha[:, :, :-1].unbind(0), alpha[:, :, 1:].unbind(0)
    arrive = arrive.unbind(0)
    step = emit_t.new_empty(B, L + 1)
    for t in range(T):
        torch.add(came_from[t], arrive[t], out=step)
        torch.logaddexp(stay_at[t], step, out=stay_at[t + 1])
    return alpha


def _reverse_lattice(emit_t: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """The lattice read backwards: frames reversed, and each utterance's ``L_b`` labels reversed.

    ``reversed[s, b, l] = emit[T - 1 - s, b, L_b - 1 - l]`` for ``l < L_b``. Its forward
    variables are the backward variables of ``emit_t`` (:func:`_cb_beta_of`). Padded frames
    (weight 0 for staying, ``-inf`` for emitting) are the identity wherever they stand, so
    reversing all ``T`` frames is exact for every ``T_b``. Labels ``l >= L_b`` repeat the first
    label's weights: they lead only to states beyond ``L_b``, which no backward variable
    reads (the states of a prefix never depend on later labels).
    """
    T, B, L = emit_t.shape
    labels = torch.arange(L, device=emit_t.device)[None, :]  # (1, L)
    lengths = target_lengths.to(emit_t.device)[:, None]  # (B, 1)
    index = (lengths - 1 - labels).clamp(min=0)  # (B, L)
    return emit_t.flip(0).gather(2, index[None].expand(T, B, L))


def _cb_beta_of(alpha_reversed: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """Backward variables from the forward variables of :func:`_reverse_lattice`.

    ``beta[t, b, l]`` = log weight of completing from state ``(t, l)``: the paths from
    ``(t, l)`` to ``(T, L_b)`` are, read backwards, the paths of the reversed lattice from
    ``(0, 0)`` to ``(T - t, L_b - l)``, with the same weights. So
    ``beta[t, b, l] = alpha_reversed[T - t, b, L_b - l + 1]`` for ``l <= L_b`` (the ``+ 1``:
    alpha's column 0 is its ``-inf`` sentinel), ``-inf`` beyond.

    Args:
        alpha_reversed: ``(T + 1, B, L + 2)``.
        target_lengths: ``(B,)``.

    Returns:
        ``(T + 1, B, L + 2)``; column ``l`` is state ``l``, column ``L + 1`` a ``-inf`` sentinel.
    """
    T1, B, L2 = alpha_reversed.shape
    states = torch.arange(L2, device=alpha_reversed.device)[None, :]  # (1, L + 2)
    lengths = target_lengths.to(alpha_reversed.device)[:, None]  # (B, 1)
    index = torch.where(states <= lengths, lengths - states + 1, 0)  # column 0: -inf
    return alpha_reversed.flip(0).gather(2, index[None].expand(T1, B, L2))


def _cb_alpha_beta(
    emit_t: torch.Tensor, target_lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward variables from one pass of :func:`_cb_alpha`: the reversed
    lattice rides along as ``B`` more batch rows, so the ``T`` serial steps are paid once.

    Returns:
        ``alpha`` and ``beta``, ``(T + 1, B, L + 2)`` each (see :func:`_cb_alpha`,
        :func:`_cb_beta_of`).
    """
    B = emit_t.shape[1]
    both = _cb_alpha(torch.cat([emit_t, _reverse_lattice(emit_t, target_lengths)], dim=1))
    return both[:, :B], _cb_beta_of(both[:, B:], target_lengths)


def _cb_emission_posteriors(
    alpha: torch.Tensor, beta: torch.Tensor, emit_t: torch.Tensor, log_z: torch.Tensor
) -> torch.Tensor:
    """``P(t_l = t | y) = exp(alpha[t, l] + emit[t, l] + beta[t+1, l+1] - log Z)``.

    Args:
        alpha, beta: ``(T + 1, B, L + 2)`` from :func:`_cb_alpha_beta`.
        emit_t: ``(T, B, L)``.
        log_z: ``(B,)``; ``-inf`` (no path) gives all-zero posteriors.

    Returns:
        ``(T, B, L)``.
    """
    L = emit_t.shape[2]
    # With no path every alpha + emit + beta is -inf too; log Z := 0 there gives exp(-inf) = 0
    # instead of NaN from -inf - (-inf).
    log_z = torch.where(torch.isneginf(log_z), 0.0, log_z)
    log_post = alpha[:-1, :, 1 : L + 1] + emit_t + beta[1:, :, 1 : L + 1] - log_z[None, :, None]
    # Posteriors below about twice the smallest normal number are 0: torch.exp of lower
    # arguments (-inf included: the unreachable states) is a slow path on CPU, 5-40x.
    floor = math.log(torch.finfo(log_post.dtype).tiny) + 0.5
    negligible = log_post < floor
    return log_post.clamp_(min=floor).exp_().masked_fill_(negligible, 0.0)


def _shift_labels(emit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Subtract from each label column its best frame's weight; the lattice runs on the rest.

    Every path emits each label exactly once, so ``log Z = log Z' + sum_l c_l`` exactly and the
    edge posteriors do not change; the forward variables then stay near 0 instead of growing
    like ``sum_l lp``, which keeps float32 round-off small for long utterances.

    Args:
        emit: ``(B, T, L)`` weights, ``-inf`` where masked.

    Returns:
        ``(T, B, L)`` shifted weights (frame-major, contiguous) and ``(B,)`` ``sum_l c_l``.
    """
    B, T, L = emit.shape
    c = emit.amax(dim=1) if T else emit.new_zeros(B, L)  # (B, L); -inf for padded labels
    c = torch.nan_to_num(c, nan=0.0, posinf=0.0, neginf=0.0)  # (one kernel: isfinite is 4)
    shifted = (emit - c[:, None, :]).transpose(0, 1).contiguous()  # (B, T, L) -> (T, B, L)
    return shifted, c.sum(dim=1)


class _CBForwardBackward(torch.autograd.Function):
    """``log Z = log sum_paths exp(sum of emission weights)`` with an explicit backward.

    The gradient of ``log Z`` w.r.t. each emission weight is its edge posterior, so backward is
    one vectorised ``exp`` of ``alpha + emit + beta``; no per-step autograd graph. The forward
    pass runs the alpha and beta recursions together (:func:`_cb_alpha_beta`).
    """

    @staticmethod
    def forward(ctx, emit: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
        emit_t, shift = _shift_labels(emit.detach())  # (T, B, L), (B,)
        alpha, beta = _cb_alpha_beta(emit_t, target_lengths)
        batch = torch.arange(emit.shape[0], device=emit.device)
        log_z = alpha[-1, batch, target_lengths.to(emit.device) + 1]  # (B,)
        ctx.save_for_backward(emit_t, alpha, beta, log_z)
        return log_z + shift

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_z: torch.Tensor):
        emit_t, alpha, beta, log_z = ctx.saved_tensors
        post = _cb_emission_posteriors(alpha, beta, emit_t, log_z)  # (T, B, L)
        grad = post * grad_log_z[None, :, None]
        return grad.transpose(0, 1), None  # (T, B, L) -> (B, T, L)


def _check_cb_inputs(emit_logits, label_log_probs, input_lengths, target_lengths) -> None:
    check_floating("emit_logits", emit_logits)
    check_floating("label_log_probs", label_log_probs)
    check_shape("emit_logits", emit_logits, "(B, T)", (None, None))
    B, T = emit_logits.shape
    check_shape("label_log_probs", label_log_probs, "(B, T, L)", (B, T, None))
    with one_read():
        check_lengths("input_lengths", input_lengths, B, T)
        check_lengths("target_lengths", target_lengths, B, label_log_probs.shape[2])


def cb_marginal_nll(
    emit_logits: torch.Tensor,
    label_log_probs: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    *,
    impossible: str = "raise",
) -> torch.Tensor:
    """``-log P(y)`` of CB paper eq. (38), exactly, one value per utterance.

    ``P(y) = sum_b prod_t P(b_t) prod_l P(y_l | t_l, y_<l)`` over every emission pattern
    ``b`` with exactly ``L`` ones, which equals ``P(L) E_{b|L}[P(y|b)]`` (eq. 18).
    On CPU, for float32 and float64 inputs, one compiled loop (:mod:`cbasr.losses._cb_kernel`)
    computes in float64 the forward variables, then the backward variables and the edge
    posteriors (the gradient) together, over each utterance's band of reachable states.
    On CUDA, Triton kernels (:mod:`cbasr.losses._cb_triton`) run the recursion over frames,
    one program per utterance. Elsewhere (the ``torch`` backend, half precision on CPU): ``T``
    serial steps vectorised over ``(B, L)`` that compute the alpha and the beta variables
    together (the reversed lattice as more batch rows). Backward is the edge posteriors, not
    autograd through the loop. Memory ``O(B T L)`` in every case.

    Args:
        emit_logits: ``(B, T)`` logits ``a_t`` of ``P(B_t = 1) = sigmoid(a_t)``.
        label_log_probs: ``(B, T, L)``; ``[b, t, l] = log P(y_l | t_l = t, y_<l)``, already
            gathered for the reference labels (any normalisation is the caller's).
        input_lengths: ``(B,)`` valid frames ``T_b <= T``.
        target_lengths: ``(B,)`` valid labels ``L_b <= L``; ``0`` gives ``-sum_t log P(B_t=0)``.
        impossible: ``"raise"`` (default): an utterance with ``L_b > T_b`` is a
            ``ValueError`` naming its batch index; ``"inf"``: it gets ``+inf`` and zero gradient.

    Returns:
        ``(B,)`` negative log likelihoods, differentiable (once) w.r.t. both float inputs,
        in their (at least float32) dtype.
    """
    with one_read():
        _check_cb_inputs(emit_logits, label_log_probs, input_lengths, target_lengths)
        _apply_impossible_policy(input_lengths, target_lengths, impossible)
    input_lengths, target_lengths = input_lengths.long(), target_lengths.long()
    which = _lattice_backend(emit_logits, label_log_probs)
    if which == "numba":
        dtype = _work_dtype(emit_logits, label_log_probs)
        return _CBKernel.apply(emit_logits, label_log_probs, input_lengths, target_lengths, dtype)
    if which == "triton":  # the whole loss in two kernels: one forward, one backward
        from cbasr.losses import _cb_triton

        dtype, device = _work_dtype(emit_logits, label_log_probs), emit_logits.device
        return _cb_triton.marginal_nll(  # (the kernels read lengths at stride 1, as int64)
            emit_logits.to(dtype),
            label_log_probs.to(dtype),
            input_lengths.to(device, torch.int64).contiguous(),
            target_lengths.to(device, torch.int64).contiguous(),
        )
    stay, emit = _cb_weights(emit_logits, label_log_probs, input_lengths, target_lengths)
    log_z = _CBForwardBackward.apply(emit, target_lengths.to(emit.device))  # (B,)
    # -inf log Z means no alignment: return +inf with zero gradient for that utterance.
    return torch.where(torch.isneginf(log_z), float("inf"), -(stay + log_z))


@torch.no_grad()
def cb_posteriors(
    emit_logits: torch.Tensor,
    label_log_probs: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """Alignment posteriors ``P(t_l = t | y)`` by forward-backward (CB paper section 2.4).

    Args:
        emit_logits, label_log_probs, input_lengths, target_lengths: as
            :func:`cb_marginal_nll`.

    Returns:
        ``(B, T, L)`` posteriors, not differentiable; for each valid ``l`` they sum to 1 over
        ``t < T_b``. Zero at padded ``(t, l)`` and for utterances with no alignment.
    """
    _check_cb_inputs(emit_logits, label_log_probs, input_lengths, target_lengths)
    input_lengths, target_lengths = input_lengths.long(), target_lengths.long()
    which = _lattice_backend(emit_logits, label_log_probs)
    if which == "numba":
        _, _, post = cb_lattice(emit_logits, label_log_probs, input_lengths, target_lengths, True)
        return post.to(_work_dtype(emit_logits, label_log_probs))
    _, emit = _cb_weights(emit_logits, label_log_probs, input_lengths, target_lengths)
    emit_t, _ = _shift_labels(emit)  # (T, B, L)
    target_lengths = target_lengths.to(emit.device)
    if which == "triton":
        from cbasr.losses import _cb_triton

        alpha, log_z = _cb_triton.forward(emit_t, target_lengths)
        return _cb_triton.posteriors(emit_t, alpha, log_z, target_lengths).transpose(0, 1)
    alpha, beta = _cb_alpha_beta(emit_t, target_lengths)
    log_z = alpha[-1, torch.arange(emit.shape[0], device=emit.device), target_lengths + 1]
    post = _cb_emission_posteriors(alpha, beta, emit_t, log_z)  # (T, B, L)
    return post.transpose(0, 1)  # (T, B, L) -> (B, T, L)
