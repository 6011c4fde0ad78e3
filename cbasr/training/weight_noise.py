"""Weight noise: Gaussian noise on the weights for one forward and backward pass.

Graves, Mohamed and Hinton (2013), "Speech recognition with deep recurrent neural networks",
section 4 (TIMIT): "weight noise (the addition of Gaussian noise to the network weights
during training) ... added once per training sequence" with standard deviation 0.075. Here
it is drawn once per optimizer step (per batch). The gradient is taken at the noisy weights;
the optimizer updates the clean ones, which are restored exactly (copied, not subtracted)
before it runs.
"""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

__all__ = ["noisy_parameters", "weight_noise"]


def noisy_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The weight matrices and kernels (``ndim >= 2``) of ``module``; biases and norm gains stay clean."""
    return [p for p in module.parameters() if p.requires_grad and p.ndim >= 2]


@contextmanager
def weight_noise(
    params: Sequence[torch.nn.Parameter], std: float, generator: torch.Generator
) -> Iterator[None]:
    """Add ``N(0, std^2)`` noise to ``params`` in place for the duration of the block.

    Run the forward and backward passes inside the block and the optimizer step after it.

    Args:
        params: the parameters to perturb (see :func:`noisy_parameters`).
        std: standard deviation; 0 does nothing.
        generator: source of the noise, on the parameters' device.
    """
    if std <= 0 or not params:
        yield
        return
    clean = []
    with torch.no_grad():
        for p in params:
            clean.append(p.detach().clone())
            p.add_(
                torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype), alpha=std
            )
    try:
        yield
    finally:
        with torch.no_grad():
            for p, c in zip(params, clean):
                p.copy_(c)
