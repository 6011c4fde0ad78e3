"""Search: beam searches for every decoder family, shallow fusion with external LMs.

- :func:`cb_beam_search`: time-synchronous prefix beam search for CB models (CB paper
  footnote 5), exact ``argmax_y P(y)`` without pruning for memoryless and second-order decoders.
- :func:`cb_label_beam_search`: label-synchronous beam search for the autoregressive CB
  decoders, exact without pruning.
- :func:`ctc_prefix_beam_search`: CTC prefix beam search, exact without pruning.
- :func:`transducer_beam_search`: RNN-T and HAT, a cap on labels per frame, HAT eq. (9).
- :func:`beam_search`: any model, its family's search.
- :class:`LabelScorer` (:class:`NeuralLMScorer`, :class:`ArpaLMScorer`, :class:`WordArpaScorer`),
  :func:`load_language_model`.

Scores and options: :mod:`cbasr.search.hypotheses`.
"""

from cbasr.search.conditional_bernoulli import cb_beam_search
from cbasr.search.ctc import ctc_prefix_beam_search
from cbasr.search.fusion import (
    ArpaLMScorer,
    LabelScorer,
    NeuralLMScorer,
    WordArpaScorer,
    load_language_model,
)
from cbasr.search.hypotheses import CB_SEARCHES, MERGES, BeamSearchOptions, Hypothesis
from cbasr.search.label_synchronous import cb_label_beam_search
from cbasr.search.models import beam_search, cb_search_kind, check_options, search_family
from cbasr.search.transducer import hat_internal_lm_step, transducer_beam_search

__all__ = [
    "BeamSearchOptions",
    "CB_SEARCHES",
    "MERGES",
    "Hypothesis",
    "beam_search",
    "check_options",
    "search_family",
    "cb_search_kind",
    "cb_beam_search",
    "cb_label_beam_search",
    "ctc_prefix_beam_search",
    "transducer_beam_search",
    "hat_internal_lm_step",
    "LabelScorer",
    "NeuralLMScorer",
    "ArpaLMScorer",
    "WordArpaScorer",
    "load_language_model",
]
