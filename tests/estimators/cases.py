"""Shared cases for the estimator tests: a ragged batch and a Monte Carlo gradient check."""

import torch

F64 = torch.float64

# (frames, labels) per utterance: full length, padding, L = 0, L = T.
LENGTHS = [(6, 3), (5, 2), (4, 0), (3, 3)]


def ragged_batch(seed: int, lengths=LENGTHS, device="cpu", pad_value=None):
    """``emit_logits (B, T)``, ``rewards (B, T, L)`` (leaf tensors), ``total``, ``input_lengths``.

    Padded entries hold random values, or ``pad_value``.
    """
    g = torch.Generator().manual_seed(seed)
    B, T, L = len(lengths), max(t for t, _ in lengths), max(max(l for _, l in lengths), 1)
    logits = 1.5 * torch.randn(B, T, generator=g, dtype=F64)
    rewards = -2.0 * torch.rand(B, T, L, generator=g, dtype=F64)
    if pad_value is not None:
        for b, (tb, lb) in enumerate(lengths):
            logits[b, tb:] = pad_value
            rewards[b, tb:] = pad_value
            rewards[b, :, lb:] = pad_value
    total = torch.tensor([l for _, l in lengths], device=device)
    input_lengths = torch.tensor([t for t, _ in lengths], device=device)
    return (
        logits.to(device).requires_grad_(),
        rewards.to(device).requires_grad_(),
        total,
        input_lengths,
    )


def replicate(x: torch.Tensor, copies: int) -> torch.Tensor:
    """``(B, ...)`` -> a leaf ``(copies * B, ...)`` holding ``copies`` copies of the batch.

    Each copy's loss depends on its own rows only, so the gradient of the summed loss w.r.t.
    the replicated leaf holds one independent gradient estimate per copy.
    """
    return x.detach().repeat(copies, *([1] * (x.dim() - 1))).requires_grad_()


def assert_unbiased(estimates: torch.Tensor, exact: torch.Tensor, z: float = 5.0) -> None:
    """Every component of the mean of ``estimates (R, ...)`` lies within ``z`` standard errors
    (``std / sqrt(R)``, shrinking like 1/sqrt(R)) of ``exact (...)``.

    A component that no draw moved (zero sample variance) may belong to an event too rare to
    be seen in ``R`` draws; its error is bounded by ``max |estimate| * z / R`` instead (the
    "rule of three": an unseen event has probability below about ``3 / R``).
    """
    R = estimates.shape[0]
    mean = estimates.mean(0)
    error = estimates.std(0) / R**0.5 + estimates.abs().max() / R
    worst = ((mean - exact).abs() / (error + 1e-12)).max()
    assert worst < z, f"mean estimate is {float(worst):.1f} standard errors from the exact gradient"
