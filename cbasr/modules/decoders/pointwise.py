"""Pointwise decoder: a feed-forward map of the encoder state at each frame (Luo et al.).

One output layer of ``V`` units serves both families (CB paper section 5.2, decoder 1):

- CTC reads it as blank-augmented frame log probabilities, ``log_softmax`` over all ``V``;
- the CB models read unit 0 as the emission logit ``a_t`` of ``P(B_t = 1)`` and units
  ``1 .. V-1`` as the label distribution ``P(y | t_l = t)``, which then depends neither on the
  label history nor on earlier emission times: the most memoryless decoder there is.
"""

import torch
from torch import nn

from cbasr.config.schema import PointwiseDecoderConfig
from cbasr.modules.decoders.base import CBDecoder, LabelOrder, gather_targets
from cbasr.modules.dropout import Dropout

__all__ = ["PointwiseDecoder"]


class PointwiseDecoder(CBDecoder):
    """Feed-forward from the encoder state at each frame.

    Args:
        input_dim: encoder output dimension D.
        vocab_size: number of outputs V, blank included.
        hidden: width of an optional tanh hidden layer (0: a single linear layer).
        dropout: after the hidden layer.
    """

    order = LabelOrder.MEMORYLESS

    def __init__(
        self,
        input_dim: int,
        vocab_size: int,
        hidden: int = PointwiseDecoderConfig.hidden,
        dropout: float = PointwiseDecoderConfig.dropout,
    ):
        super().__init__()
        layers: list[nn.Module] = []
        if hidden > 0:
            layers += [nn.Linear(input_dim, hidden), nn.Tanh(), Dropout(dropout)]
            input_dim = hidden
        layers.append(nn.Linear(input_dim, vocab_size))
        self.net = nn.Sequential(*layers)

    def emission_bias(self) -> torch.Tensor:
        """CB: the bias of output unit 0, the emission logit, ``(1,)`` (a view of the layer's)."""
        return self.net[-1].bias[:1]

    def forward(self, h: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """CTC: ``h (B, T, D) -> log_probs (B, T, V)``."""
        return self.net(h).log_softmax(dim=-1)

    def frame_outputs(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(emit_logits (B, T), label log probabilities (B, T, V - 1))``."""
        out = self.net(h)  # (B, T, V)
        return out[..., 0], out[..., 1:].log_softmax(dim=-1)

    def cb_terms(self, h, lens, targets, target_lens):
        """``(emit_logits (B, T), log P(y_l | t_l = t) (B, T, L))``."""
        emit_logits, log_probs = self.frame_outputs(h)
        L = targets.shape[1]
        # (B, T, V-1) -> (B, T, L, V-1), a view
        per_label = log_probs.unsqueeze(2).expand(-1, -1, L, -1)
        return emit_logits, gather_targets(per_label, targets)

    def begin(self, h, lens):
        emit_logits, log_probs = self.frame_outputs(h)
        return {"emit_logits": emit_logits, "log_probs": log_probs}

    def candidates(self, state, t):
        return state["emit_logits"][:, t], state["log_probs"][:, t]

    def commit(self, state, t, emitted, labels):
        return state
