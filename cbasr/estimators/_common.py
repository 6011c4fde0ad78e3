"""Argument checks, reward bookkeeping and the surrogate shared by the estimators (internal).

Conventions (as in :mod:`cbasr.distributions`): frames and emission times are 0-based;
utterance ``b`` has frames ``t < input_lengths[b]`` and ``total[b]`` labels; ``times`` are
increasing emission frames, ``-1`` past ``total``. A memoryless reward tensor ``R (B, T, L)``
holds ``R[b, t, l] = log P(y_l | t_l = t, y_<l)``; a reward callable maps sampled times
``(M, B, L)`` to per-label rewards ``(M, B, L)``.

Every estimator returns an :class:`Estimate` whose ``loss`` has the value ``-value`` and the
gradient ``-(gradient estimate)``: the score-function part of the surrogate is
``A.detach() * (log q - log q.detach())``, which is 0 in value.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch

from cbasr.checks import (
    check_floating,
    check_lengths,
    check_none,
    check_shape,
    one_read,
    read,
)

__all__: list[str] = []  # package-internal

Rewards = torch.Tensor | Callable[[torch.Tensor], torch.Tensor]


class Estimate(NamedTuple):
    """What every sampling estimator returns.

    Attributes:
        loss: ``(B,)``; its value is ``-value`` and its autograd gradient is minus the
            estimator's gradient estimate of the objective. Reduction is the caller's.
        value: ``(B,)`` detached Monte Carlo estimate of the objective.
        samples: ``(M, B, T)`` 0./1. sampled emission sequences.
        times: ``(M, B, L)`` int64 emission frames of the samples, ``-1`` for ``l >= total``.
        control_variate_loss: ``(B,)`` loss that trains a learned baseline or control variate
            (differentiate it w.r.t. that module's parameters only), or None.
    """

    loss: torch.Tensor
    value: torch.Tensor
    samples: torch.Tensor
    times: torch.Tensor
    control_variate_loss: torch.Tensor | None = None


def check_inputs(
    emit_logits: torch.Tensor,
    total: torch.Tensor,
    rewards: Rewards,
    input_lengths: torch.Tensor,
) -> int:
    """Check the common estimator arguments; return ``L``, the rewards' label dimension.

    ``L`` is ``rewards.shape[2]`` for a tensor and ``max(total)`` for a callable (read with
    the checks).
    Raises ValueError naming the argument: a wrong shape or dtype, ``total > input_lengths``,
    ``total`` above the rewards' ``L``, or a non-finite reward at a valid position. The value
    checks read the device once (:func:`cbasr.checks.one_read`).
    """
    check_floating("emit_logits", emit_logits)
    check_shape("emit_logits", emit_logits, "(B, T)", (None, None))
    B, T = emit_logits.shape
    tensor_rewards = not callable(rewards) or isinstance(rewards, torch.Tensor)
    if tensor_rewards:
        check_floating("rewards", rewards)
        check_shape("rewards", rewards, "(B, T, L)", (B, T, None))
    with one_read():
        check_lengths("input_lengths", input_lengths, B, T)
        check_lengths("total", total, B, torch.iinfo(torch.int64).max)
        over = total.to(input_lengths.device) > input_lengths

        def too_many():
            b = _first(over)
            raise ValueError(
                f"total[{b}] = {int(total[b])} > input_lengths[{b}] = {int(input_lengths[b])}: "
                "a CB sample places at most one label per frame (batch indices "
                f"{over.nonzero().flatten().tolist()[:10]})"
            )

        check_none(over, too_many)
        if tensor_rewards:
            L = rewards.shape[2]
            short = total.to(rewards.device) > L

            def no_column():
                b = _first(short)
                raise ValueError(
                    f"total[{b}] = {int(total[b])} > rewards.shape[2] = {L}: rewards (B, T, L) "
                    "needs a column for every label"
                )

            check_none(short, no_column)
            check_finite("rewards", rewards, reward_mask(input_lengths, total, T, L))
        elif B:  # the largest total, read with the checks (which run first)
            L = int(read(total.max())[0])
        else:
            L = 0
    return L


def _first(bad: torch.Tensor) -> int:
    """The first index where the boolean ``(B,)`` ``bad`` is true (for an error message)."""
    return int(bad.nonzero()[0, 0])


def masked_logits(emit_logits: torch.Tensor, input_lengths: torch.Tensor) -> torch.Tensor:
    """``emit_logits`` with padding frames (``t >= input_lengths``) set to 0, so that NaN or
    inf there reaches neither a result nor a gradient, in at least float32: half-precision
    logits (a model's output under autocast) would run the CB distribution's count tables in
    their own precision (the error in bfloat16: recipes/synth/RESULTS.md, "Measurements behind
    defaults"), and would fall back from its Triton kernels, which take float32 and float64."""
    dtype = torch.promote_types(emit_logits.dtype, torch.float32)
    frames = torch.arange(emit_logits.shape[1], device=emit_logits.device)
    return torch.where(frames < input_lengths[:, None], emit_logits.to(dtype), 0.0)


def check_finite(name: str, values: torch.Tensor, valid: torch.Tensor) -> None:
    """Raise ValueError if ``values`` holds NaN or +-inf where ``valid`` is True (at the end of
    the enclosing :func:`cbasr.checks.one_read` block, if any)."""
    bad = valid & ~torch.isfinite(values.detach())

    def fail():
        hits = bad.nonzero()
        index = tuple(int(i) for i in hits[0])
        raise ValueError(
            f"{name}{list(index)} = {float(values[index])}: rewards must be finite at valid "
            f"positions (frames < input_lengths, labels < total); {hits.shape[0]} such entries"
        )

    check_none(bad, fail)


def reward_mask(input_lengths: torch.Tensor, total: torch.Tensor, T: int, L: int) -> torch.Tensor:
    """``(B, T, L)`` bool: ``t < input_lengths[b]`` and ``l < total[b]``."""
    device = input_lengths.device
    frames = torch.arange(T, device=device) < input_lengths[:, None]  # (B, T)
    labels = torch.arange(L, device=device) < total.to(device)[:, None]  # (B, L)
    return frames[:, :, None] & labels[:, None, :]


def label_mask(total: torch.Tensor, L: int) -> torch.Tensor:
    """``(B, L)`` bool: ``l < total[b]``."""
    return torch.arange(L, device=total.device) < total[:, None]


def pad_times(times: torch.Tensor, L: int) -> torch.Tensor:
    """``(..., K)`` times -> ``(..., L)``, ``L >= K``, padded with -1."""
    return torch.nn.functional.pad(times, (0, L - times.shape[-1]), value=-1)


def label_rewards(rewards: Rewards, times: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """Per-label rewards ``R_{t_l}`` at sampled ``times (M, B, L)``: ``(M, B, L)``, 0 past total.

    A tensor ``(B, T, L)`` is gathered (differentiably) at the emission frames; a callable is
    called on the times and its output checked.
    """
    M, B, L = times.shape
    valid = label_mask(total.to(times.device), L).expand(M, B, L)
    if isinstance(rewards, torch.Tensor):
        # A flat index into (B, T, L): gathering from the reward tensor expanded over the
        # samples instead would make its backward write an (M, B, T, L) gradient first.
        T = rewards.shape[1]
        rows = torch.arange(B, device=times.device)[:, None] * T  # (B, 1)
        labels = torch.arange(L, device=times.device)  # (L,)
        flat = (rows + times.clamp(min=0)) * L + labels  # (M, B, L)
        gathered = rewards.reshape(-1).take(flat)
    else:
        gathered = rewards(times)
        if not isinstance(gathered, torch.Tensor) or gathered.shape != times.shape:
            shape = tuple(gathered.shape) if isinstance(gathered, torch.Tensor) else type(gathered)
            raise ValueError(
                f"rewards (a callable) must return per-label rewards (M, B, L) = "
                f"{tuple(times.shape)}, like the times it is given; got {shape}"
            )
        check_finite("rewards (callable output)", gathered, valid)
    return torch.where(valid, gathered, 0.0)


def frame_rewards(per_label: torch.Tensor, times: torch.Tensor, num_frames: int) -> torch.Tensor:
    """Scatter per-label rewards ``(M, B, L)`` to their emission frames: ``(M, B, T)``.

    This is ``R_t`` of eq. (2): the label's reward at its frame, 0 at every other frame.
    """
    M, B, _ = times.shape
    at = torch.where(times >= 0, times, num_frames)  # -1 -> a dummy frame T
    out = per_label.new_zeros(M, B, num_frames + 1)
    return out.scatter_add(2, at, per_label)[..., :num_frames]


def reward_to_go(rewards: torch.Tensor) -> torch.Tensor:
    """``sum_{s' >= s} r_{s'}`` along the last dimension (the return of eqs. 1, 23, 28)."""
    return rewards.flip(-1).cumsum(-1).flip(-1)


def score_surrogate(
    step_log_probs: torch.Tensor, coefficients: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """``sum_s A_s (log q_s - log q_s.detach())`` over the last dimension, mean over samples.

    Zero in value; its gradient is the score-function term ``mean_m sum_s A_s d log q_s``.

    Args:
        step_log_probs: ``(M, B, S)`` log probabilities of the sampled steps (finite where valid).
        coefficients: ``(M, B, S)`` learning signals (return minus baseline); detached here.
        valid: ``(M, B, S)`` or broadcastable bool; steps that exist.

    Returns:
        ``(B,)``.
    """
    step_log_probs = torch.where(valid, step_log_probs, 0.0)  # no -inf - -inf on missing steps
    centred = step_log_probs - step_log_probs.detach()
    terms = torch.where(valid, coefficients.detach() * centred, 0.0)
    return terms.sum(-1).mean(0)


def emitted_before(samples: torch.Tensor) -> torch.Tensor:
    """``l_{t-1}``: highs strictly before each frame of ``samples (..., T)``, int64."""
    high = (samples != 0).long()
    return high.cumsum(-1) - high
