"""The Monte Carlo CB marginal: the sampled criterion of the CB paper's experiments.

With ``M`` exact samples ``b_m ~ P(b | L)`` of the Conditional Bernoulli (eq. 4),

    ``log P^_M(y | L) = log P(L) + log (1/M) sum_m P(y | b_m)``,

where ``log P(y | b_m) = sum_l R_{t_l}`` sums the label rewards at the sample's emission
times. ``(1/M) sum_m P(y | b_m)`` is an unbiased estimate of ``P(y | L) / P(L) = E_{b|L}[P(y |
b)]``, so ``E[log P^_M]`` is a lower bound on ``log P(y | L)`` (the marginal of eq. 38) that
rises monotonically to it as ``M`` grows (Burda et al., 2016, "Importance Weighted
Autoencoders", arXiv:1509.00519, Theorem 1, with ``P(b | L)`` as the proposal). Eq. (19)'s
``E[sum_l R]`` is the ``M = 1`` member of this family, and stays below the marginal by
``KL(P(b | L) || P(b | y, L))`` however many samples average it.

Its gradient (Mnih & Rezende, 2016, "Variational Inference for Monte Carlo Objectives",
arXiv:1602.06725, eqs. 5-10) has three parts:

- ``d log P(L)``: exact (Poisson-Binomial, eq. 8).
- the pathwise part ``sum_m w_m d log P(y | b_m)`` with importance weights
  ``w_m = softmax_m(log P(y | b_m))`` (autograd through the log-mean-exp).
- the score-function part ``sum_m (L^ - L^_{-m}) d log P(b_m | L)``, with VIMCO's per-sample
  leave-one-out baseline ``L^_{-m}``: the same log-mean-exp with ``log P(y | b_m)`` replaced
  by the mean of the other samples' (a function of the other samples only, so unbiased).
  With a constant ``log P(y | b)`` every learning signal is exactly zero.
"""

import math

import torch

from cbasr.checks import one_read
from cbasr.distributions import (
    ConditionalBernoulli,
    PoissonBinomial,
    id_checking_sample,
    sequence_to_times,
    times_to_sequence,
)
from cbasr.estimators._common import (
    Estimate,
    Rewards,
    check_inputs,
    label_rewards,
    masked_logits,
)
from cbasr.estimators.baselines import vimco_signals

__all__ = ["cb_monte_carlo_marginal", "cb_monte_carlo_marginal_from_samples"]


def cb_monte_carlo_marginal(
    emit_logits: torch.Tensor,
    total: torch.Tensor,
    rewards: Rewards,
    input_lengths: torch.Tensor,
    num_samples: int,
    generator: torch.Generator | None = None,
) -> Estimate:
    """The Monte Carlo marginal ``log P(L) + log (1/M) sum_m P(y | b_m)`` and its VIMCO
    gradient estimate, with ``M = num_samples`` exact CB samples per utterance.

    Args:
        emit_logits: ``(B, T)`` emission log odds ``log w_t`` (eq. 4).
        total: ``(B,)`` int64 number of labels ``L_b <= input_lengths[b]``.
        rewards: a tensor ``(B, T, L)`` of memoryless rewards ``R[b, t, l] = log P(y_l | t_l =
            t, y_<l)``, ``L >= max(total)``; or a callable from emission times ``(M, B, L)``
            to per-label rewards ``(M, B, L)`` for label terms that read earlier emission
            times (the autoregressive decoders).
        input_lengths: ``(B,)`` int64 number of frames.
        num_samples: ``M >= 2`` (VIMCO's baseline leaves one sample out).
        generator: source of randomness for the samples.

    Returns:
        :class:`~cbasr.estimators.Estimate`: ``loss (B,)`` is minus the Monte Carlo marginal
        in value, and its gradient is minus the estimate.
    """
    L = check_inputs(emit_logits, total, rewards, input_lengths)
    _check_num_samples(num_samples)
    emit_logits = masked_logits(emit_logits, input_lengths)
    total = total.to(emit_logits.device).long()
    with one_read():  # the sampler's check joins the estimate's (see _estimate)
        with torch.no_grad():
            samples = id_checking_sample(
                emit_logits.detach(), total, input_lengths, (num_samples,), generator, max_total=L
            )
            times = sequence_to_times(samples, L)  # (M, B, L), -1 past each total
        return _estimate(emit_logits, total, rewards, input_lengths, times)


def cb_monte_carlo_marginal_from_samples(
    emit_logits: torch.Tensor,
    total: torch.Tensor,
    rewards: Rewards,
    input_lengths: torch.Tensor,
    times: torch.Tensor,
) -> Estimate:
    """:func:`cb_monte_carlo_marginal` at given CB samples (e.g. for exact expectations).

    Args:
        times: ``(M, B, L)`` int64 increasing emission frames, ``total[b]`` of them per row
            (the rest -1), all before ``input_lengths[b]``; ``M >= 2``.
        Others: as :func:`cb_monte_carlo_marginal`.
    """
    L = check_inputs(emit_logits, total, rewards, input_lengths)
    _check_num_samples(times.shape[0] if times.dim() == 3 else 0)
    emit_logits = masked_logits(emit_logits, input_lengths)
    total = total.to(emit_logits.device).long()
    if times.dim() != 3 or times.shape[1:] != (len(total), L) or times.is_floating_point():
        raise ValueError(
            f"times must be int64 (M, B, L) = (*, {len(total)}, {L}); got {tuple(times.shape)}"
        )
    return _estimate(emit_logits, total, rewards, input_lengths, times)


def _check_num_samples(num_samples: int) -> None:
    if num_samples < 2:
        raise ValueError(
            f"num_samples must be >= 2 for the Monte Carlo marginal (VIMCO's baseline leaves one "
            f"sample out); got {num_samples}"
        )


def _estimate(emit_logits, total, rewards, input_lengths, times) -> Estimate:
    """Value and surrogate of the Monte Carlo marginal at ``times (M, B, L)``, whose ``L`` the
    checks have found at least every total: the CB tables are sized by it (``max_total``), and
    every value check of the distributions joins the one read of the device that
    PoissonBinomial's ``log_prob`` makes (:func:`cbasr.checks.read`)."""
    with one_read():
        return _value_and_surrogate(emit_logits, total, rewards, input_lengths, times)


def _value_and_surrogate(emit_logits, total, rewards, input_lengths, times) -> Estimate:
    M, L = times.shape[0], times.shape[-1]
    samples = times_to_sequence(times, emit_logits.shape[1], dtype=emit_logits.dtype)  # (M, B, T)
    log_weights = label_rewards(rewards, times, total).sum(-1)  # log P(y | b_m), (M, B)
    # Pathwise part: autograd through the log-mean-exp gives sum_m w_m d log P(y | b_m).
    log_mean = torch.logsumexp(log_weights, dim=0) - math.log(M)  # (B,)
    # Score-function part: (L^ - L^_{-m}) d log P(b_m | L), zero in value.
    log_q = ConditionalBernoulli(emit_logits, total, input_lengths, max_total=L).log_prob(samples)
    score = (vimco_signals(log_weights) * (log_q - log_q.detach())).sum(0)  # (B,)
    log_prior = PoissonBinomial(emit_logits, input_lengths).log_prob(total)  # (B,), exact
    value = (log_prior + log_mean).detach()
    return Estimate(-(log_prior + log_mean + score), value, samples, times)
