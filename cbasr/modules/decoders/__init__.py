"""Decoders: map encoder states to the distributions a loss needs (CB paper section 5.2).

- :class:`PointwiseDecoder` (1): frame-wise; CTC and CB.
- :class:`AutoregressiveDecoder` (2): fed the encoder state at each emission (Raffel et al.);
  sampling estimators only.
- :class:`MonotonicAttentionDecoder` (3): soft attention over a fixed window (first order) or
  a window from the previous emission (second order).
- :class:`AttentionEmissionDecoder` (4): label-history decoder with an encoder joint (Wu et al.).
- :class:`TransducerDecoder` (5): prediction network + RNN-T or HAT joint.

The CB decoders share the interface of :class:`CBDecoder`.
"""

from cbasr.modules.decoders.attention_emission import AttentionEmissionDecoder
from cbasr.modules.decoders.autoregressive import AutoregressiveDecoder
from cbasr.modules.decoders.base import CBDecoder, EmissionHead, LabelOrder
from cbasr.modules.decoders.monotonic import MonotonicAttentionDecoder
from cbasr.modules.decoders.pointwise import PointwiseDecoder
from cbasr.modules.decoders.transducer import JOINTS, TransducerDecoder

__all__ = [
    "CBDecoder",
    "EmissionHead",
    "LabelOrder",
    "PointwiseDecoder",
    "AutoregressiveDecoder",
    "MonotonicAttentionDecoder",
    "AttentionEmissionDecoder",
    "TransducerDecoder",
    "JOINTS",
]
