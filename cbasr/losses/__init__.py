"""Sequence losses, each returning per-utterance values ``(B,)``.

- :func:`cb_marginal_nll`, :func:`cb_posteriors`, :func:`cb_viterbi`: the Conditional
  Bernoulli exact marginal of CB paper eq. (38), its alignment posteriors and best path.
- :func:`cb_marginal_nll_windowed`, :func:`cb_viterbi_windowed`, :func:`cb_posteriors_windowed`:
  the second-order CB model with emission gaps ``<= W``.
- :func:`ctc_nll`: CTC (PyTorch's kernel).
- :func:`rnnt_nll`: RNN-T (torchaudio's kernel); :func:`rnnt_lattice_nll`: the same loss
  without torchaudio, from the fused :func:`gather_logsumexp` and
  :func:`transducer_lattice_nll` (the lattice from gathered per-node edge log-weights).
- :func:`hat_nll`, :func:`hat_nll_from_logits`, :func:`hat_internal_lm_score`: HAT paper
  eqs. (4) and (8).
- :func:`simple_transducer_nll`, :func:`pruned_transducer_nll` (with
  :func:`trivial_joint_log_probs` and :func:`prune_ranges`): the pruned RNN-T and HAT losses
  of Kuang et al. (2022): the joint on a few label positions per frame.
"""

from cbasr.losses._joint import gather_logsumexp
from cbasr.losses.cb_viterbi import cb_viterbi
from cbasr.losses.conditional_bernoulli import cb_marginal_nll, cb_posteriors
from cbasr.losses.conditional_bernoulli_second_order import (
    cb_marginal_nll_windowed,
    cb_posteriors_windowed,
    cb_viterbi_windowed,
)
from cbasr.losses.ctc import ctc_nll
from cbasr.losses.hat import hat_internal_lm_score, hat_nll, hat_nll_from_logits
from cbasr.losses.pruned import (
    prune_ranges,
    pruned_transducer_nll,
    simple_transducer_nll,
    trivial_joint_log_probs,
)
from cbasr.losses.rnnt import rnnt_lattice_nll, rnnt_nll
from cbasr.losses.transducer import transducer_lattice_nll

__all__ = [
    "cb_marginal_nll",
    "cb_marginal_nll_windowed",
    "cb_posteriors_windowed",
    "cb_viterbi_windowed",
    "cb_posteriors",
    "cb_viterbi",
    "ctc_nll",
    "gather_logsumexp",
    "hat_internal_lm_score",
    "hat_nll",
    "hat_nll_from_logits",
    "prune_ranges",
    "pruned_transducer_nll",
    "rnnt_lattice_nll",
    "rnnt_nll",
    "simple_transducer_nll",
    "transducer_lattice_nll",
    "trivial_joint_log_probs",
]
