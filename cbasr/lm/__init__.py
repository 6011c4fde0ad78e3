"""Language models for shallow fusion: ARPA back-off n-grams and the toolkit's LSTM LM.

- :mod:`cbasr.lm.arpa`: read ARPA files, back-off probabilities.
- :mod:`cbasr.lm.corpus`: sentences from manifests or text files.
- :mod:`cbasr.lm.neural`: the LSTM token LM's checkpoints, batches and perplexity (its training
  task is :mod:`cbasr.training.lm_task` on the shared loop).
"""

from cbasr.lm.arpa import ArpaError, ArpaModel, read_arpa

__all__ = ["ArpaError", "ArpaModel", "read_arpa"]
