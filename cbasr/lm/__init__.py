"""Language models for shallow fusion: ARPA back-off n-grams and the toolkit's LSTM LM.

- :mod:`cbasr.lm.arpa`: read ARPA files, back-off probabilities.
- :mod:`cbasr.lm.corpus`: sentences from manifests or text files.
- :mod:`cbasr.lm.training`: ``cbasr-train-lm``'s loop, checkpoints and perplexity.
"""

from cbasr.lm.arpa import ArpaError, ArpaModel, read_arpa

__all__ = ["ArpaError", "ArpaModel", "read_arpa"]
