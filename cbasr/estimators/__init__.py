"""Sampling estimators for latent-emission models (CB paper sections 1, 2.2, 2.3 and 3).

The objective of section 2.2 is ``R = log P(L) + E_{b|L}[sum_l R_{t_l}]`` (eq. 19), with
memoryless rewards ``R[t, l] = log P(y_l | t_l = t, y_<l)`` given as a tensor ``(B, T, L)``
or, for decoders that look at earlier emission times, as a callable from sampled times
``(M, B, L)`` to per-label rewards ``(M, B, L)``.

- :func:`cb_expected_reward`: ``R`` exactly for memoryless rewards (eq. 15); the oracle.
- :func:`cb_reinforce`: REINFORCE with CB samples, ``"global"`` (eq. 21), ``"idb"`` (eq. 23),
  ``"bb"`` (eq. 28) or ``"mbb"`` (eq. 29); :func:`cb_reinforce_from_samples` at given samples.
- :func:`cb_monte_carlo_marginal`: the Monte Carlo marginal ``log P(L) + log (1/M) sum_m
  P(y | b_m)``, which tends to the exact marginal (eq. 38) as ``M`` grows, with VIMCO's
  leave-one-out gradient; :func:`cb_monte_carlo_marginal_from_samples` at given samples.
- Baselines: ``"loo"``, :class:`RunningMeanBaseline`, :class:`LearnedBaseline`.
- Luo et al.'s forced suffix (section 1): :func:`forced_suffix_sample` (eq. 48),
  :func:`forced_suffix_marginals` (eq. 3), :func:`forced_suffix_reinforce` (eq. 1).
- Variational training (section 3): proposals ``Q_FS``, ``Q_IDB``, ``Q_Bin`` (eqs. 48, 50,
  51) through :class:`ProposalSampler` / :func:`proposal_sample`;
  :func:`variational_lower_bound` (eq. 46), :func:`multi_sample_lower_bound` (eq. 47).
- Relaxations (section 2.3): :func:`straight_through_cb` (eq. 37), :func:`relax_cb` with a
  :class:`RebarControlVariate` (eq. 36).

Every estimator returns an :class:`Estimate` whose ``loss (B,)`` has the value ``-value``
and the gradient minus the estimate of the objective's gradient. Frames and times are
0-based; frames ``t >= input_lengths`` and labels ``l >= total`` are padding.
"""

from cbasr.estimators._common import Estimate
from cbasr.estimators.baselines import LearnedBaseline, RunningMeanBaseline
from cbasr.estimators.conditional_bernoulli_reinforce import (
    ESTIMATORS,
    cb_reinforce,
    cb_reinforce_from_samples,
)
from cbasr.estimators.continuous_relaxations import (
    RELAXATIONS,
    RebarControlVariate,
    relax_cb,
    straight_through_cb,
)
from cbasr.estimators.expected_reward import cb_expected_reward
from cbasr.estimators.forced_suffix import (
    forced_suffix_marginals,
    forced_suffix_reinforce,
    forced_suffix_reinforce_from_samples,
    forced_suffix_sample,
)
from cbasr.estimators.monte_carlo_marginal import (
    cb_monte_carlo_marginal,
    cb_monte_carlo_marginal_from_samples,
)
from cbasr.estimators.proposals import PROPOSALS, ProposalSampler, proposal_sample
from cbasr.estimators.variational import multi_sample_lower_bound, variational_lower_bound

__all__ = [
    "Estimate",
    "ESTIMATORS",
    "PROPOSALS",
    "RELAXATIONS",
    "cb_expected_reward",
    "cb_reinforce",
    "cb_reinforce_from_samples",
    "cb_monte_carlo_marginal",
    "cb_monte_carlo_marginal_from_samples",
    "RunningMeanBaseline",
    "LearnedBaseline",
    "forced_suffix_sample",
    "forced_suffix_marginals",
    "forced_suffix_reinforce",
    "forced_suffix_reinforce_from_samples",
    "ProposalSampler",
    "proposal_sample",
    "variational_lower_bound",
    "multi_sample_lower_bound",
    "straight_through_cb",
    "relax_cb",
    "RebarControlVariate",
]
