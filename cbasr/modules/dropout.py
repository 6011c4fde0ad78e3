"""Dropout whose CPU mask takes one random draw per two elements.

On a CPU, ``torch.nn.Dropout`` draws its mask with ``bernoulli_``, one double-precision draw
per element on one thread. This module draws one 31-bit integer (``random_``) per two elements
and splits it into two 15-bit lanes (bits 0-14 and 16-30 of each draw: the two halves of its
int16 view, sign bit masked). An element is kept when its lane is at least
``round(p * 2**15)``, so the dropout probability is ``p`` to within ``2**-16``, and the kept
elements are scaled by ``1 / (1 - p)`` with that same rounded ``p``, so that
``E[dropout(x)] = x`` exactly. The backward multiplies by the saved mask. On other devices it
is ``torch.nn.functional.dropout`` (one fused kernel on CUDA). What the CPU masks cost:
recipes/synth/RESULTS.md, "Measurements behind defaults".
"""

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Dropout", "dropout"]

_RANGE = 2**15  # each lane is uniform on [0, 2**15 - 1]


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Zero each element of ``x`` with probability ``p`` and scale the rest by ``1 / (1 - p)``."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p == 1.0:
        return F.dropout(x, p, training=True)
    threshold = round(p * _RANGE)
    if threshold == _RANGE:  # p within 2**-16 of 1: nothing is kept
        return x * 0.0
    # random_() on int32 draws uniformly from [0, 2**31 - 1]: 31 random bits, two lanes.
    draws = torch.empty((x.numel() + 1) // 2, dtype=torch.int32).random_()
    lanes = draws.view(torch.int16)[: x.numel()].bitwise_and(_RANGE - 1)
    keep = (lanes >= threshold).view(x.shape)
    return x * keep.to(x.dtype).mul_(_RANGE / (_RANGE - threshold))


class Dropout(nn.Dropout):
    """``torch.nn.Dropout`` with :func:`dropout`'s CPU mask (no parameters, same state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            raise ValueError("cbasr's Dropout has no in-place form")
        return dropout(x, self.p, self.training)
