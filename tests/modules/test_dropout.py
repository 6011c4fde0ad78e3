"""cbasr's Dropout: torch's distribution and scaling with a cheaper CPU mask."""

import math

import pytest
import torch
from torch import nn

from cbasr.modules.dropout import Dropout, dropout


def _realised(p: float) -> float:
    """The dropout probability the mask realises: ``p`` rounded to a multiple of ``2**-15``."""
    return round(p * 2**15) / 2**15


@pytest.mark.parametrize("p", [0.1, 0.3, 0.75])
def test_keeps_each_element_with_probability_one_minus_p_and_preserves_the_mean(p):
    torch.manual_seed(0)
    n = 2_000_001  # odd: the last draw's second lane is unused
    y = dropout(torch.ones(n, dtype=torch.float64), p)
    kept = (y != 0).double().mean().item()
    assert abs(_realised(p) - p) <= 2**-16
    assert abs(kept - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)  # 5 standard errors
    scale = 1 / (1 - _realised(p))  # kept elements: E[dropout(x)] = x exactly
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], scale), rtol=1e-12)
    assert abs(y.mean().item() - 1) < 5 * math.sqrt(p / (1 - p) / n)


def test_masks_are_independent_of_position():
    """Neighbouring elements are dropped independently (no structure from the integer draw),
    both the two lanes of one draw and the last lane of a draw and the first of the next."""
    torch.manual_seed(1)
    kept = dropout(torch.ones(1_000_000), 0.5) != 0
    for start in (0, 1):  # pairs (2i, 2i + 1) share a draw; pairs (2i + 1, 2i + 2) do not
        first, second = kept[start:-1:2], kept[start + 1 :: 2]
        pairs = (first & second).double().mean().item()
        n = len(first)
        assert abs(pairs - 0.25) < 5 * math.sqrt(0.25 * 0.75 / n)


def test_gradient_is_the_scaled_mask():
    torch.manual_seed(2)
    x = torch.randn(7, 11, 5, dtype=torch.float64, requires_grad=True)
    y = dropout(x, 0.4)
    g = torch.randn_like(y)
    y.backward(g)
    mask = (y != 0).double()
    keep = 1 - _realised(0.4)
    torch.testing.assert_close(x.grad, g * mask / keep)
    torch.testing.assert_close(y, x.detach() * mask / keep)


def test_module_is_torch_dropout_in_eval_with_p0_and_p1_and_reproducible_under_a_seed():
    x = torch.randn(4, 9)
    module = Dropout(0.2)
    assert isinstance(module, nn.Dropout) and module.state_dict() == {}
    assert torch.equal(module.eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))
    module.train()
    torch.manual_seed(3)
    a = module(x)
    torch.manual_seed(3)
    assert torch.equal(module(x), a)
    with pytest.raises(ValueError, match="probability"):
        dropout(x, 1.5)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_the_mask_is_exactly_the_seeded_draws_lanes_at_or_above_the_threshold(p):
    """Each int32 draw d gives lanes d & 0x7fff (element 2i) and (d >> 16) & 0x7fff (element
    2i + 1), and an element is kept when its lane is at least round(p * 2**15): the threshold
    itself is kept (about 2**-15 of the elements, some hundreds here)."""
    n, threshold = 2_000_001, round(p * 2**15)
    torch.manual_seed(5)
    draws = torch.empty((n + 1) // 2, dtype=torch.int32).random_().long()
    lanes = torch.stack([draws & 0x7FFF, (draws >> 16) & 0x7FFF], dim=1).flatten()[:n]
    assert int((lanes == threshold).sum()) > 20  # the boundary is exercised
    torch.manual_seed(5)
    kept = dropout(torch.ones(n), p) != 0
    assert torch.equal(kept, lanes >= threshold)
