"""Poisson-Binomial and Conditional Bernoulli distributions (CB paper sections 2.1 and 2.3).

- :class:`PoissonBinomial` (eq. 5) and :class:`ConditionalBernoulli` (eq. 4), as
  ``torch.distributions.Distribution`` s with padding (``lengths``).
- Count functions ``C(v, S; w)`` (eq. 8): :func:`log_count`, :func:`log_count_prefix`,
  :func:`log_count_suffix`.
- Per-step log probabilities of the three decompositions, for the estimators of section 2.2:
  ID-checking (eq. 11), draft (eq. 9), bounded (eq. 13) and the bounded marginals (eq. 15).
- Exact samplers for each decomposition, and Concrete relaxations of the ID-checking and
  bounded steps with straight-through samples (section 2.3).

Conventions: frames are 0-based (frame ``t`` here is the paper's ``t + 1``); ``logits`` are
``log w_t``; everything is batched over leading dimensions ``*`` and computed in log space,
with ``-inf`` for impossible values.
"""

from cbasr.distributions.conditional_bernoulli import SAMPLERS, ConditionalBernoulli
from cbasr.distributions.counts import log_count, log_count_prefix, log_count_suffix
from cbasr.distributions.decompositions import (
    bounded_bernoulli_log_probs,
    bounded_bernoulli_marginals,
    draft_log_probs,
    id_checking_log_probs,
)
from cbasr.distributions.poisson_binomial import PoissonBinomial
from cbasr.distributions.relaxations import (
    BoundedRelaxation,
    IdCheckingRelaxation,
    bounded_bernoulli_conditional_noise,
    bounded_bernoulli_relaxed,
    concrete,
    concrete_bernoulli,
    id_checking_conditional_noise,
    id_checking_relaxed,
)
from cbasr.distributions.samplers import (
    bounded_bernoulli_sample,
    draft_sample,
    gumbel_noise,
    id_checking_sample,
    logistic_noise,
    sequence_to_times,
    times_to_sequence,
)

__all__ = [
    "PoissonBinomial",
    "ConditionalBernoulli",
    "SAMPLERS",
    "log_count",
    "log_count_prefix",
    "log_count_suffix",
    "id_checking_log_probs",
    "draft_log_probs",
    "bounded_bernoulli_log_probs",
    "bounded_bernoulli_marginals",
    "id_checking_sample",
    "draft_sample",
    "bounded_bernoulli_sample",
    "logistic_noise",
    "gumbel_noise",
    "times_to_sequence",
    "sequence_to_times",
    "concrete",
    "concrete_bernoulli",
    "IdCheckingRelaxation",
    "id_checking_relaxed",
    "id_checking_conditional_noise",
    "BoundedRelaxation",
    "bounded_bernoulli_relaxed",
    "bounded_bernoulli_conditional_noise",
]
