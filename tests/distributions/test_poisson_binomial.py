"""PoissonBinomial (CB paper eq. 5) against enumeration of independent Bernoulli trials."""

import math

import pytest
import torch

from cbasr.distributions import PoissonBinomial
from tests.distributions.cases import extreme_logits, random_logits
from tests.reference import cb_enumeration as ref


@pytest.mark.parametrize("T", range(1, 9))
def test_log_prob_mean_variance_match_enumeration(T):
    logits = random_logits(2, T, seed=20 + T)
    lengths = torch.tensor([T, T // 2])
    pb = PoissonBinomial(logits, lengths)
    log_probs = pb.log_prob(pb.enumerate_support())  # (T + 1, 2)
    for row in range(2):
        n = int(lengths[row])
        expected = ref.pb_log_probs(logits[row], n)
        torch.testing.assert_close(log_probs[: n + 1, row], expected[: n + 1])
        assert torch.isinf(log_probs[n + 1 :, row]).all()  # above lengths: impossible
        mean, variance = ref.pb_mean_variance(logits[row], n)
        torch.testing.assert_close(pb.mean[row], mean)
        torch.testing.assert_close(pb.variance[row], variance)


def test_hand_worked_value_is_binomial():
    # Equal odds: K ~ Binomial(4, 1/2), P(K = 2) = 6/16.
    pb = PoissonBinomial(torch.zeros(4, dtype=torch.float64))
    expected = torch.tensor(math.log(6 / 16), dtype=torch.float64)
    torch.testing.assert_close(pb.log_prob(torch.tensor(2.0)), expected)


def test_infinite_logits_shift_the_count():
    # A trial at +inf always fires, one at -inf never: K = 1 + K of the other trials.
    logits = random_logits(3, seed=30)
    pb = PoissonBinomial(
        torch.cat([logits, torch.tensor([math.inf, -math.inf], dtype=torch.float64)])
    )
    expected = ref.pb_log_probs(logits, 3)
    torch.testing.assert_close(pb.log_prob(torch.arange(1.0, 5.0, dtype=torch.float64)), expected)
    assert pb.log_prob(torch.tensor(0.0)) == -math.inf


def test_gradcheck_log_prob():
    logits = random_logits(2, 5, seed=31).requires_grad_()
    lengths = torch.tensor([5, 3])
    value = torch.tensor([[2.0, 1.0], [4.0, 3.0]])
    assert torch.autograd.gradcheck(
        lambda x: PoissonBinomial(x, lengths).log_prob(value), (logits,)
    )


def test_padding_and_batch_never_change_a_result():
    logits = random_logits(2, 5, seed=32)
    padded = torch.cat([logits, random_logits(2, 4, seed=33)], -1)
    value = torch.arange(6.0, dtype=torch.float64).unsqueeze(-1)  # (6, 1) broadcast over rows
    alone = PoissonBinomial(logits[1]).log_prob(value[:, 0])
    together = PoissonBinomial(padded, torch.tensor([5, 5])).log_prob(value)
    torch.testing.assert_close(together[:, 1], alone, rtol=1e-14, atol=1e-14)


def test_float32_long_sequence_is_finite():
    logits = extreme_logits(2, 1000, seed=2).requires_grad_()
    pb = PoissonBinomial(logits)
    value = pb.mean.detach().round()
    log_prob = pb.log_prob(value)
    expected = PoissonBinomial(logits.detach().double()).log_prob(value.double())
    assert ((log_prob.double() - expected).abs() / expected.abs()).max() < 1e-4
    log_prob.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_validation():
    logits = random_logits(2, 4, seed=34)
    pb = PoissonBinomial(logits, torch.tensor([4, 2]), validate_args=True)
    for bad in (torch.tensor([-1.0, 0.0]), torch.tensor([5.0, 0.0]), torch.tensor([1.5, 0.0])):
        with pytest.raises(ValueError):
            pb.log_prob(bad)
    with pytest.raises(ValueError):
        PoissonBinomial(logits, torch.tensor([5, 2]), validate_args=True)  # lengths > T
    quiet = PoissonBinomial(logits, torch.tensor([4, 2]), validate_args=False)
    assert torch.isinf(quiet.log_prob(torch.tensor([-1.0, 3.0]))).all()  # negative; above lengths
    assert torch.isinf(quiet.log_prob(torch.tensor([1.5, 0.0]))[0])


def test_sample_shape_range_and_mean():
    logits = random_logits(3, 6, seed=35)
    lengths = torch.tensor([6, 4, 0])
    pb = PoissonBinomial(logits, lengths)
    samples = pb.sample((4000,), generator=torch.Generator().manual_seed(0))
    assert samples.shape == (4000, 3)
    assert (samples <= lengths).all() and (samples >= 0).all()
    standard_error = (pb.variance / 4000).sqrt()
    assert ((samples.mean(0) - pb.mean).abs() <= 5 * standard_error + 1e-12).all()
    again = pb.sample((4000,), generator=torch.Generator().manual_seed(0))
    assert torch.equal(samples, again)


def test_expand_and_support_shapes():
    pb = PoissonBinomial(random_logits(1, 3, seed=36))
    wide = pb.expand((4,))
    assert wide.batch_shape == (4,) and wide.logits.shape == (4, 3)
    assert pb.enumerate_support().shape == (4, 1)
    assert pb.enumerate_support(expand=False).shape == (4, 1)
    one = torch.tensor(1.0)
    torch.testing.assert_close(wide.log_prob(one), pb.log_prob(one).expand(4))
