"""Variational lower bounds with exactly-``L`` proposals (CB paper section 3.1, eqs. 46-47).

With a proposal ``Q(b)`` that always emits ``L`` highs (:mod:`cbasr.estimators.proposals`),

    log P(y) >= E_{b ~ Q}[log P(b) + log P(y | b) - log Q(b)]                         (46)
    log P(y) >= E_{b_1..K ~ Q}[log (1/K) sum_k P(y, b_k) / Q(b_k)]                    (47)

where ``P(b) = prod_t P(b_t)`` are the model's independent emission Bernoullis (eq. 6) and
``log P(y | b) = sum_l R_{t_l}``. Setting ``Q = P(b | L)`` (``"id_checking"`` with
``independent_logits = emit_logits``) turns eq. (46) into the REINFORCE bound of eq. (19).

Both ``P(b)`` and ``Q(b)`` factor over frames, so eq. (46) gets the local estimator of eq. (23):
frame ``t``'s score ``d log Q(b_t | b_<t, L)`` is weighted by the sum of the frame terms
``log P(b_t') + R_t' - log Q(b_t')`` for ``t' >= t``. The zero-mean pathwise term
``-d log Q(b)`` is left out. Eq. (47) has no such factorisation (its reward is global); its
score weights are VIMCO's (Mnih and Rezende, 2016) with ``baseline="loo"``.
"""

import math

import torch
import torch.nn.functional as F

from cbasr.distributions import sequence_to_times
from cbasr.estimators._common import (
    Estimate,
    Rewards,
    check_inputs,
    frame_rewards,
    label_rewards,
    masked_logits,
    reward_to_go,
    score_surrogate,
)
from cbasr.estimators.baselines import leave_one_out, vimco_signals
from cbasr.estimators.proposals import PROPOSALS, proposal_sample

__all__ = ["variational_lower_bound", "multi_sample_lower_bound"]


def _frame_terms(
    emit_logits, total, rewards, input_lengths, proposal, num_samples, independent_logits, generator
):
    """Sample from ``Q`` and return the per-frame terms of ``log P(y, b) - log Q(b)``.

    Returns:
        samples ``(M, B, T)``, times ``(M, B, L)``, ``log P(b_t) + R_t (M, B, T)``,
        ``log Q(b_t | b_<t, L) (M, B, T)`` and the frame mask ``(M, B, T)``.
    """
    L = check_inputs(emit_logits, total, rewards, input_lengths)
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS}; got {proposal!r}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1; got {num_samples}")
    B, T = emit_logits.shape
    emit_logits = masked_logits(emit_logits, input_lengths)
    total = total.to(emit_logits.device).long()
    samples, log_q = proposal_sample(
        proposal, emit_logits, total, input_lengths, num_samples, generator, independent_logits
    )
    samples = samples.detach()
    times = sequence_to_times(samples, L)  # (M, B, L)
    per_label = label_rewards(rewards, times, total)  # (M, B, L)
    valid = (torch.arange(T, device=samples.device) < input_lengths[:, None]).expand_as(samples)
    # log P(b_t) of the model's independent Bernoullis (eq. 6).
    log_p = torch.where(samples != 0, F.logsigmoid(emit_logits), F.logsigmoid(-emit_logits))
    log_p = torch.where(valid, log_p, 0.0)
    joint = log_p + frame_rewards(per_label, times, T)  # log P(b_t) + R_t
    return samples, times, joint, log_q, valid


def variational_lower_bound(
    emit_logits: torch.Tensor,
    total: torch.Tensor,
    rewards: Rewards,
    input_lengths: torch.Tensor,
    proposal: str,
    num_samples: int = 1,
    baseline: str | None = None,
    independent_logits: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Estimate:
    """The evidence lower bound of eq. (46) and its local REINFORCE gradient estimate.

    Args:
        emit_logits: ``(B, T)`` log odds of the model's emission Bernoullis ``P(b_t)``; also
            the ``w_t`` of every proposal.
        total, rewards, input_lengths: as :func:`~cbasr.estimators.cb_reinforce` (rewards may
            be a callable).
        proposal: ``"forced_suffix"`` (eq. 48), ``"id_checking"`` (eq. 50) or ``"binomial"``
            (eq. 51).
        num_samples: ``M`` samples, averaged.
        baseline: None or ``"loo"`` (the other samples' frame returns; ``M >= 2``).
        independent_logits: ``(B, T)`` the ``w'`` of eq. (50) (default ``emit_logits``);
            the bound's gradient reaches them through ``Q``.
        generator: source of randomness.

    Returns:
        :class:`~cbasr.estimators.Estimate`; ``value`` estimates the bound.
    """
    samples, times, joint, log_q, valid = _frame_terms(
        emit_logits,
        total,
        rewards,
        input_lengths,
        proposal,
        num_samples,
        independent_logits,
        generator,
    )
    # Per-frame learning signal of eq. (46); its reward-to-go weights each step's score.
    signal = (joint - log_q).detach()
    returns = reward_to_go(signal)  # (M, B, T)
    if baseline is None:
        base = torch.zeros_like(returns)
    elif baseline == "loo":
        base = leave_one_out(returns)
    else:
        raise ValueError(f"baseline must be None or 'loo'; got {baseline!r}")
    score = score_surrogate(log_q, returns - base, valid)
    bound = (joint - log_q.detach()).sum(-1).mean(0)  # (B,); d: E[d log P(y, b)]
    return Estimate(-(bound + score), bound.detach(), samples, times)


def multi_sample_lower_bound(
    emit_logits: torch.Tensor,
    total: torch.Tensor,
    rewards: Rewards,
    input_lengths: torch.Tensor,
    proposal: str,
    num_samples: int,
    baseline: str | None = "loo",
    independent_logits: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Estimate:
    """The ``K``-sample bound of eq. (47) and its gradient estimate.

    ``log (1/K) sum_k exp(s_k)`` with ``s_k = log P(y, b_k) - log Q(b_k)``; the gradient
    estimate is ``sum_k softmax(s)_k d s_k + sum_k (bound - c_k) d log Q(b_k)``. With
    ``baseline="loo"`` (``K >= 2``), ``c_k`` is VIMCO's: the bound with ``s_k`` replaced by the
    mean of the other ``s_j``; with None, ``c_k = 0``. ``K = 1`` is eq. (46) with a global
    reward.

    Args:
        num_samples: ``K``.
        Others: as :func:`variational_lower_bound`.

    Returns:
        :class:`~cbasr.estimators.Estimate`; ``value`` is the ``K``-sample bound estimate.
    """
    samples, times, joint, log_q, valid = _frame_terms(
        emit_logits,
        total,
        rewards,
        input_lengths,
        proposal,
        num_samples,
        independent_logits,
        generator,
    )
    K = num_samples
    log_q_total = torch.where(valid, log_q, 0.0).sum(-1)  # (K, B)
    weights = joint.sum(-1) - log_q_total  # s_k, differentiable
    # Importance-weighted bound, CB paper eq. (47).
    bound = torch.logsumexp(weights, 0) - math.log(K)  # (B,)
    fixed = weights.detach()
    if baseline is None:
        base = torch.zeros_like(fixed)
    elif baseline == "loo":
        # (K, B): s_k swapped for the others' mean
        base = bound.detach().unsqueeze(0) - vimco_signals(fixed)
    else:
        raise ValueError(f"baseline must be None or 'loo'; got {baseline!r}")
    coefficients = (bound.detach().unsqueeze(0) - base).unsqueeze(-1)  # (K, B, 1)
    score = K * score_surrogate(
        log_q_total.unsqueeze(-1), coefficients, torch.ones_like(coefficients, dtype=torch.bool)
    )
    return Estimate(-(bound + score), bound.detach(), samples, times)
