"""Half-precision emission logits (a model's output under autocast): every sampling estimator
works in float32, as on the float32 logits of the same (rounded) values."""

import pytest
import torch

from cbasr.estimators import cb_monte_carlo_marginal, cb_reinforce, forced_suffix_reinforce
from tests.estimators.cases import ragged_batch

ESTIMATORS = {
    "global": lambda *a, g: cb_reinforce(*a, "global", 4, "loo", generator=g),
    "idb": lambda *a, g: cb_reinforce(*a, "idb", 4, "loo", generator=g),
    "bb": lambda *a, g: cb_reinforce(*a, "bb", 4, generator=g),
    "monte_carlo": lambda *a, g: cb_monte_carlo_marginal(*a, 4, generator=g),
    "forced_suffix": lambda *a, g: forced_suffix_reinforce(*a, 4, "loo", 0.1, generator=g),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_half_precision_logits_estimate_in_float32(name, dtype):
    logits, rewards, total, lengths = ragged_batch(31)
    half = logits.detach().to(dtype).requires_grad_()
    rounded = half.detach().float().requires_grad_()
    rewards = rewards.detach().float()
    run = ESTIMATORS[name]
    got = run(half, total, rewards, lengths, g=torch.Generator().manual_seed(5))
    want = run(rounded, total, rewards, lengths, g=torch.Generator().manual_seed(5))
    assert torch.equal(got.samples, want.samples)  # the same draws
    assert got.loss.dtype == got.value.dtype == torch.float32
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.value, want.value, rtol=1e-6, atol=1e-6)
    (grad,) = torch.autograd.grad(got.loss.sum(), half)
    (want_grad,) = torch.autograd.grad(want.loss.sum(), rounded)
    assert grad.dtype == dtype and want_grad.abs().sum() > 0
    torch.testing.assert_close(grad, want_grad.to(dtype))
