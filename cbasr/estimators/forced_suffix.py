"""Luo et al.'s forced-suffix REINFORCE and its bias (CB paper section 1, eqs. 1-3, 48).

To emit exactly ``L`` highs, Luo et al. sample each ``B_t`` from the model but force the
suffix: high once the frames left equal the highs left, low once ``L`` highs are out. As a
distribution over ``b`` this is the proposal ``Q_FS`` of eq. (48). It is not ``P(b | L)``: with
i.i.d. ``p`` the first ``L`` frames keep probability ``p`` and the end is forced, giving the
marginals of eq. (3) (Figure 1) instead of ``L / T``.

- :func:`forced_suffix_sample`: samples and step log probabilities ``log Q_FS(b_t | b_<t, L)``
  for independent log odds; for log odds that depend on earlier samples, drive a
  :class:`~cbasr.estimators.ProposalSampler` with ``"forced_suffix"`` frame by frame.
- :func:`forced_suffix_marginals`: eq. (3), ``P*(B_t = 1)`` for i.i.d. ``p``.
- :func:`forced_suffix_reinforce`: eq. (1) on forced-suffix samples, with a baseline and
  Luo et al.'s entropy regularisation; :func:`forced_suffix_reinforce_from_samples` at
  samples drawn elsewhere (step by step, for autoregressive emissions).
"""

import torch
import torch.nn.functional as F

from cbasr.checks import one_read
from cbasr.distributions import sequence_to_times
from cbasr.estimators._common import (
    Estimate,
    Rewards,
    check_inputs,
    emitted_before,
    frame_rewards,
    label_mask,
    label_rewards,
    masked_logits,
    reward_to_go,
    score_surrogate,
)
from cbasr.estimators.baselines import baseline_values
from cbasr.estimators.proposals import proposal_sample

__all__ = [
    "forced_suffix_sample",
    "forced_suffix_marginals",
    "forced_suffix_reinforce",
    "forced_suffix_reinforce_from_samples",
]


def forced_suffix_sample(
    logits: torch.Tensor,
    total: torch.Tensor | int,
    lengths: torch.Tensor | None = None,
    num_samples: int = 1,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forced-suffix samples (eq. 48) for independent log odds.

    Args:
        logits: ``(B, T)`` log odds of ``P(B_t = 1)``.
        total: ``(B,)`` (or int) number of highs ``L <= lengths``.
        lengths: ``(B,)`` existing frames; default ``T``.
        num_samples: ``M``.
        generator: source of randomness.

    Returns:
        ``samples (M, B, T)`` 0./1. with exactly ``total`` highs and
        ``step_log_probs (M, B, T)`` ``log Q_FS(b_t | b_<t, L)``: ``log sigmoid(+-logit_t)`` on
        sampled steps, 0 on forced steps and padding; differentiable w.r.t. ``logits``.
    """
    return proposal_sample("forced_suffix", logits, total, lengths, num_samples, generator)


def _incomplete_beta(x: float, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Regularised incomplete beta ``I_x(a, b)`` for integers ``a >= 0, b >= 1`` (float64).

    ``I_x(a, b) = P(Binomial(a + b - 1, x) >= a)``: the negative-binomial CDF that the
    appendix of the CB paper calls ``B(x; a, b)``. Summed in log space term by term.
    """
    n = (a + b - 1).double()  # (...,)
    j = torch.arange(int(n.max()) + 1 if n.numel() else 1, dtype=torch.float64)  # (J,)
    n, a = n.unsqueeze(-1), a.double().unsqueeze(-1)  # (...,) -> (..., 1)
    x = torch.tensor(float(x), dtype=torch.float64)
    log_binom = torch.lgamma(n + 1) - torch.lgamma(j + 1) - torch.lgamma((n - j).clamp(min=0) + 1)
    terms = log_binom + torch.xlogy(j, x) + torch.xlogy(n - j, 1 - x)
    terms = torch.where((j >= a) & (j <= n), terms, float("-inf"))
    return torch.logsumexp(terms, -1).exp()


def forced_suffix_marginals(p: float, total: int, num_frames: int) -> torch.Tensor:
    """``P*(B_t = 1)`` under forced-suffix sampling of i.i.d. Bernoulli(p) trials, eq. (3).

    ``P* = p - [t > L] p I_p(L, t - L) + [t > T - L] (1 - p) I_{1-p}(T - L, t - T + L)``
    (1-based ``t``): a high is lost once ``L`` highs came first and gained once ``T - L``
    lows came first. The paper states it for ``L < T - L``; the same argument (the two
    events are disjoint for ``t <= T``) gives it for every ``0 <= L <= T``.

    Args:
        p: the trials' probability, in ``[0, 1]``.
        total: ``L``, ``0 <= L <= T``.
        num_frames: ``T``.

    Returns:
        ``(T,)`` float64, frame ``t`` (0-based) at index ``t``.
    """
    T, L = num_frames, total
    if not 0 <= L <= T:
        raise ValueError(f"total must lie in [0, num_frames={T}]; got {L}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must lie in [0, 1]; got {p}")
    t = torch.arange(1, T + 1, dtype=torch.long)
    late = t > L
    too_many_highs = _incomplete_beta(p, torch.full_like(t, L), (t - L).clamp(min=1))
    end = t > T - L
    too_many_lows = _incomplete_beta(1.0 - p, torch.full_like(t, T - L), (t - T + L).clamp(min=1))
    # Forced-suffix emission probability, CB paper eq. (3).
    return (
        p
        - torch.where(late, p * too_many_highs, 0.0)
        + torch.where(end, (1 - p) * too_many_lows, 0.0)
    )


def forced_suffix_reinforce(
    emit_logits: torch.Tensor,
    total: torch.Tensor,
    rewards: Rewards,
    input_lengths: torch.Tensor,
    num_samples: int,
    baseline=None,
    entropy_weight: float = 0.0,
    generator: torch.Generator | None = None,
) -> Estimate:
    """Luo et al.'s REINFORCE (eq. 1) with forced-suffix samples (eq. 48).

    The objective is ``E_{b ~ Q_FS}[sum_t R_t] + entropy_weight * sum_t H(B_t)``; its gradient
    estimate is ``sum_t (d R_t + (sum_{t' >= t} R_{t'} - c_t) d log Q_FS(b_t | b_<t, L))``
    averaged over samples, plus the exact gradient of the entropy term. Forced steps have
    ``Q_FS = 1``: no score. ``H(B_t)`` is the entropy of ``Bernoulli(sigmoid(emit_logits_t))``
    on existing frames (Luo et al.'s regulariser against saturated emission probabilities).
    Unlike eqs. (21)-(29) there is no ``log P(L)`` term, and the samples are not from
    ``P(b | L)``: the estimate is biased for the CB objective (section 1).

    Args:
        emit_logits, total, rewards, input_lengths, num_samples, generator: as
            :func:`~cbasr.estimators.cb_reinforce` (rewards may be a callable).
        baseline: as :func:`~cbasr.estimators.cb_reinforce`; per frame, scaled by the labels
            left.
        entropy_weight: weight of the entropy term, ``>= 0``.

    Returns:
        :class:`~cbasr.estimators.Estimate`; ``value`` is the objective estimate.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1; got {num_samples}")
    # the arguments' checks and the sampler's own (the same) in one read; the sampler indexes
    # nothing by the values checked, and what it drew is dropped if a check fails
    with one_read():
        L = check_inputs(emit_logits, total, rewards, input_lengths)
        emit_logits = masked_logits(emit_logits, input_lengths)
        total = total.to(emit_logits.device).long()
        samples, steps = forced_suffix_sample(
            emit_logits, total, input_lengths, num_samples, generator
        )
    samples = samples.detach()
    times = sequence_to_times(samples, L)  # (M, B, L)
    per_label = label_rewards(rewards, times, total)  # (M, B, L)
    return forced_suffix_reinforce_from_samples(
        emit_logits.unsqueeze(0),
        samples,
        steps,
        per_label,
        total,
        input_lengths,
        baseline,
        entropy_weight,
    )


def forced_suffix_reinforce_from_samples(
    emit_logits: torch.Tensor,
    samples: torch.Tensor,
    step_log_probs: torch.Tensor,
    per_label: torch.Tensor,
    total: torch.Tensor,
    input_lengths: torch.Tensor,
    baseline=None,
    entropy_weight: float = 0.0,
) -> Estimate:
    """Eq. (1) at forced-suffix samples already drawn, e.g. frame by frame from a model whose
    emission logits depend on its earlier emissions (Luo et al.'s autoregressive emissions,
    through :class:`~cbasr.estimators.ProposalSampler`).

    Args:
        emit_logits: ``(M, B, T)`` (or ``(1, B, T)``) the emission log odds each sample was
            drawn with, for the entropy term; differentiable.
        samples: ``(M, B, T)`` 0./1. forced-suffix samples with ``total`` highs.
        step_log_probs: ``(M, B, T)`` ``log Q_FS(b_t | b_<t, L)``, differentiable (0 on forced
            steps and padding).
        per_label: ``(M, B, L)`` rewards ``log P(y_l | ...)`` of the sampled emissions,
            differentiable (the pathwise term), 0 past ``total``.
        total, input_lengths: ``(B,)``.
        baseline, entropy_weight: as :func:`forced_suffix_reinforce`.

    Returns:
        :class:`~cbasr.estimators.Estimate`.
    """
    if entropy_weight < 0:
        raise ValueError(f"entropy_weight must be >= 0; got {entropy_weight}")
    M, B, T = samples.shape
    L = per_label.shape[-1]
    samples = samples.detach()
    times = sequence_to_times(samples, L)  # (M, B, L)
    fixed = per_label.detach()
    label_valid = label_mask(total, L).expand(M, B, L)
    # REINFORCE with forced-suffix samples, CB paper eq. (1): reward-to-go times each step.
    returns = reward_to_go(frame_rewards(fixed, times, T))  # (M, B, T)
    covered = total[None, :, None] - emitted_before(samples).long()
    valid = (torch.arange(T, device=samples.device) < input_lengths[:, None]).expand(M, B, T)
    base, control_variate_loss = baseline_values(baseline, returns, covered, fixed, label_valid)
    score = score_surrogate(step_log_probs, returns - base, valid)
    pathwise = per_label.sum(-1).mean(0)  # (B,)
    probs_on, probs_off = F.logsigmoid(emit_logits), F.logsigmoid(-emit_logits)
    entropy = -(probs_on.exp() * probs_on + probs_off.exp() * probs_off)  # (M', B, T)
    entropy = torch.where(valid[: entropy.shape[0]], entropy, 0.0).sum(-1).mean(0)  # (B,)
    objective = pathwise + entropy_weight * entropy
    return Estimate(-(objective + score), objective.detach(), samples, times, control_variate_loss)
