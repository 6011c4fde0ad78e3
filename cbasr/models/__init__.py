"""Models: an encoder and a decoder with the loss that trains them and the greedy search.

- :class:`CTCModel`: CTC over a pointwise decoder.
- :class:`CBModel`: Conditional Bernoulli models (CB paper section 2.4).
- :class:`TransducerModel`: RNN-T and HAT.
"""

from cbasr.models.base import AsrModel, LossOutput
from cbasr.models.conditional_bernoulli import CBModel
from cbasr.models.ctc import CTCModel
from cbasr.models.transducer import TransducerModel

__all__ = ["AsrModel", "LossOutput", "CTCModel", "CBModel", "TransducerModel"]
