"""Decoders: map encoder states to the distributions a loss needs."""

import torch
from torch import nn

__all__ = ["PointwiseDecoder"]


class PointwiseDecoder(nn.Module):
    """Feed-forward from the encoder state at each frame (Luo et al.; CB paper section 5.2).

    For CTC it gives blank-augmented frame log probabilities.

    Args:
        input_dim: encoder output dimension D.
        vocab_size: number of outputs V, blank included.
        hidden: width of an optional tanh hidden layer (0: a single linear layer).
    """

    def __init__(self, input_dim: int, vocab_size: int, hidden: int = 0, dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = []
        if hidden > 0:
            layers += [nn.Linear(input_dim, hidden), nn.Tanh(), nn.Dropout(dropout)]
            input_dim = hidden
        layers.append(nn.Linear(input_dim, vocab_size))
        self.net = nn.Sequential(*layers)

    def forward(self, h: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """``h (B, T, D) -> log_probs (B, T, V)``."""
        return self.net(h).log_softmax(dim=-1)
