"""Shared cases for the distribution tests: seeded logits and a chi-square p-value."""

import torch


def random_logits(*shape, scale=2.0, seed=0, dtype=torch.float64) -> torch.Tensor:
    """Seeded ``N(0, scale^2)`` logits."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator, dtype=torch.float64) * scale).to(dtype)


def extreme_logits(batch: int, frames: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """``N(0, 5^2)`` logits with a tenth of the frames at +30 and a tenth at -30."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, frames, generator=generator, dtype=torch.float64) * 5
    index = torch.randperm(frames, generator=generator)
    logits[:, index[: frames // 10]] = 30.0
    logits[:, index[frames // 10 : frames // 5]] = -30.0
    return logits.to(dtype)


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's goodness-of-fit p-value, ``Q(df / 2, X^2 / 2)`` with ``df = cells - 1``."""
    expected = probs * counts.sum()
    statistic = ((counts - expected) ** 2 / expected).sum()
    df = torch.tensor((len(counts) - 1) / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(df, statistic / 2))
