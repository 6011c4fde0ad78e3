"""ConditionalBernoulli (CB paper eq. 4) against enumeration, in float64 and float32."""

import math

import pytest
import torch

from cbasr.distributions import SAMPLERS, ConditionalBernoulli, log_count
from tests.distributions.cases import extreme_logits, random_logits
from tests.reference import cb_enumeration as ref


def _every_total(T: int, seed: int, length: int | None = None):
    """One row per total ``k = 0..length``: logits ``(length + 1, T)``, totals, lengths."""
    length = T if length is None else length
    logits = random_logits(T, seed=seed).expand(length + 1, T)
    return logits, torch.arange(length + 1), torch.full((length + 1,), length)


@pytest.mark.parametrize("T", range(1, 9))
@pytest.mark.parametrize("padded", [False, True])
def test_log_prob_mean_entropy_match_enumeration(T, padded):
    length = max(T - 2, 0) if padded else T
    logits, totals, lengths = _every_total(T, seed=40 + T, length=length)
    cb = ConditionalBernoulli(logits, totals, lengths, validate_args=False)
    for k in range(length + 1):
        support, expected = ref.cb_log_probs(logits[k], k, length)
        values = torch.tensor(support, dtype=torch.float64)  # (|support|, T)
        # Every sequence of row k's support as a sample for every row: (|support|, 1, T).
        log_probs = cb.log_prob(values.unsqueeze(1))  # (|support|, length + 1)
        torch.testing.assert_close(log_probs[:, k], expected)
        assert torch.isinf(log_probs[:, totals != k]).all()  # wrong count for the other rows
        torch.testing.assert_close(cb.mean[k], ref.cb_mean(logits[k], k, length))
        entropy = ref.cb_entropy(logits[k], k, length)
        torch.testing.assert_close(cb.entropy()[k], entropy, atol=1e-12, rtol=1e-9)


def test_hand_worked_value_is_uniform_over_subsets():
    # Equal odds: every one of the C(5, 2) = 10 sets is equally likely; P(B_t = 1) = 2/5.
    cb = ConditionalBernoulli(torch.full((5,), 0.7, dtype=torch.float64), 2)
    b = torch.tensor([0, 1, 0, 0, 1], dtype=torch.float64)
    torch.testing.assert_close(cb.log_prob(b), torch.tensor(-math.log(10), dtype=torch.float64))
    torch.testing.assert_close(cb.mean, torch.full((5,), 0.4, dtype=torch.float64))
    torch.testing.assert_close(cb.entropy(), torch.tensor(math.log(10), dtype=torch.float64))


def test_log_prob_is_eq_4_with_log_count():
    logits = random_logits(7, seed=41)
    b = torch.tensor([1, 0, 0, 1, 1, 0, 0], dtype=torch.float64)
    expected = (b * logits).sum() - log_count(logits)[3]  # eq. (4) in log space
    torch.testing.assert_close(ConditionalBernoulli(logits, 3).log_prob(b), expected)


@pytest.mark.parametrize("quantity", ["log_prob", "mean", "entropy"])
def test_gradcheck(quantity):
    logits = random_logits(3, 5, seed=42).requires_grad_()
    totals, lengths = torch.tensor([2, 0, 3]), torch.tensor([5, 4, 3])
    b = torch.tensor([[1, 0, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float64)

    def f(x):
        cb = ConditionalBernoulli(x, totals, lengths)
        if quantity == "log_prob":
            return cb.log_prob(b)
        return cb.mean if quantity == "mean" else cb.entropy()

    assert torch.autograd.gradcheck(f, (logits,))


@pytest.mark.parametrize("k", [0, 6])
def test_edge_totals_have_zero_finite_gradients(k):
    # k = 0 and k = T leave one sequence: log P = 0, entropy 0, and no NaN from inf - inf.
    logits = torch.tensor([30.0, -30.0, 0.5, -2.0, 4.0, 1.0], requires_grad=True)
    cb = ConditionalBernoulli(logits, k)
    b = torch.full((6,), float(k > 0))
    (cb.log_prob(b) + cb.mean.sum() + cb.entropy()).backward()
    assert cb.log_prob(b) == 0 and torch.equal(cb.mean, b)
    assert torch.isfinite(logits.grad).all() and (logits.grad.abs() < 1e-6).all()


def test_infinite_logits_force_frames():
    logits = random_logits(5, seed=43)
    forced = logits.clone()
    forced[1], forced[3] = math.inf, -math.inf
    cb = ConditionalBernoulli(forced.requires_grad_(), 3)
    assert cb.mean[1] == 1 and cb.mean[3] == 0
    # The rest is a CB with one high fewer over the other frames.
    rest = ConditionalBernoulli(logits[[0, 2, 4]], 2)
    torch.testing.assert_close(cb.mean[[0, 2, 4]], rest.mean)
    torch.testing.assert_close(cb.entropy(), rest.entropy())
    b = torch.tensor([1, 1, 0, 0, 1], dtype=torch.float64)
    torch.testing.assert_close(cb.log_prob(b), rest.log_prob(b[[0, 2, 4]]))
    (cb.log_prob(b) + cb.mean.sum() + cb.entropy()).backward()
    assert torch.isfinite(forced.grad).all()


def test_padding_and_batch_never_change_a_result():
    logits = random_logits(2, 6, seed=44)
    totals = torch.tensor([2, 5])
    b = torch.tensor([[0, 1, 0, 0, 1, 0], [1, 1, 1, 0, 1, 1]], dtype=torch.float64)
    plain = ConditionalBernoulli(logits, totals)
    padding = 40 * random_logits(2, 3, seed=45)
    padded = ConditionalBernoulli(torch.cat([logits, padding], -1), totals, torch.tensor([6, 6]))
    b_padded = torch.cat([b, torch.zeros(2, 3, dtype=torch.float64)], -1)
    alone = ConditionalBernoulli(logits[0], 2)
    close = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(padded.log_prob(b_padded), plain.log_prob(b), **close)
    torch.testing.assert_close(padded.mean[:, :6], plain.mean, **close)
    assert (padded.mean[:, 6:] == 0).all()
    torch.testing.assert_close(padded.entropy(), plain.entropy(), **close)
    torch.testing.assert_close(plain.log_prob(b)[0], alone.log_prob(b[0]), **close)
    torch.testing.assert_close(plain.mean[0], alone.mean, **close)


def test_float32_long_sequence_is_accurate_and_finite():
    frames, total = 1000, 300
    logits = extreme_logits(2, frames, seed=3).requires_grad_()
    cb = ConditionalBernoulli(logits, total)
    b = cb.sample(generator=torch.Generator().manual_seed(0))
    log_prob, mean, entropy = cb.log_prob(b), cb.mean, cb.entropy()
    exact = ConditionalBernoulli(logits.detach().double(), total)
    pairs = ((log_prob, exact.log_prob(b.double())), (mean, exact.mean), (entropy, exact.entropy()))
    for actual, expected in pairs:
        assert torch.isfinite(actual).all()
        # Relative error, also for the smallest inclusion probabilities.
        assert ((actual.double() - expected).abs() / expected.abs().clamp(min=1e-30)).max() < 1e-4
    weights = torch.linspace(-1.0, 1.0, frames)
    (log_prob.sum() + (mean * weights).sum() + entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all()


def test_validation_raises_clear_errors():
    logits = random_logits(2, 5, seed=46)
    with pytest.raises(ValueError, match="total"):
        ConditionalBernoulli(logits, torch.tensor([2, 4]), torch.tensor([5, 3]), validate_args=True)
    with pytest.raises(ValueError, match="total"):
        ConditionalBernoulli(logits, torch.tensor([2, -1]), validate_args=True)
    with pytest.raises(ValueError, match="total=4 with lengths=3 at .* index 1"):
        ConditionalBernoulli(logits, torch.tensor([0, 4]), torch.tensor([5, 3]), validate_args=True)
    with pytest.raises(ValueError, match="Expected parameter total .* IntegerGreaterThan"):
        ConditionalBernoulli(logits, torch.tensor([2.0, 1.5]), validate_args=True)  # not made 1
    with pytest.raises(ValueError, match="Expected parameter total .* IntegerGreaterThan"):
        ConditionalBernoulli(logits, 1.5, validate_args=True)  # a Python float, the same
    whole = ConditionalBernoulli(logits, torch.tensor([2.0, 1.0]), validate_args=True)
    assert whole.total.tolist() == [2, 1]
    with pytest.raises(ValueError, match="lengths"):
        ConditionalBernoulli(logits, 1, torch.tensor([6, 3]), validate_args=True)
    cb = ConditionalBernoulli(
        logits, torch.tensor([2, 1]), torch.tensor([5, 3]), validate_args=True
    )
    good = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 1, 0, 0]], dtype=torch.float64)
    cb.log_prob(good)
    with pytest.raises(ValueError, match="3 highs but total is 2"):
        cb.log_prob(torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 0, 0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="padding"):
        cb.log_prob(torch.tensor([[1, 1, 0, 0, 0], [0, 0, 0, 1, 0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="binary"):
        cb.log_prob(good * 0.5)
    with pytest.raises(ValueError, match="sampler"):
        ConditionalBernoulli(logits, 1, sampler="forced_suffix")


def test_without_validation_impossible_values_have_minus_inf_log_prob():
    logits = random_logits(2, 5, seed=47).requires_grad_()
    cb = ConditionalBernoulli(
        logits, torch.tensor([2, 1]), torch.tensor([5, 3]), validate_args=False
    )
    wrong_count = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.float64)
    in_padding = torch.tensor([[1, 0, 0, 0, 1], [0, 0, 0, 1, 0]], dtype=torch.float64)
    assert torch.isinf(cb.log_prob(wrong_count)).all()
    log_prob = cb.log_prob(in_padding)
    assert torch.isfinite(log_prob[0]) and log_prob[1] == -math.inf
    # An impossible total (more highs than frames, or negative): every value is impossible.
    impossible = ConditionalBernoulli(
        logits, torch.tensor([4, -1]), torch.tensor([5, 3]), validate_args=False
    )
    value = torch.tensor([[1, 1, 1, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.float64)
    assert (impossible.log_prob(value)[1] == -math.inf) and torch.isfinite(
        impossible.log_prob(value)[0]
    )
    # ... its inclusion probabilities are 0 and its entropy -inf (no NaN either way).
    assert (impossible.mean[1] == 0).all() and impossible.entropy()[1] == -math.inf
    weights = torch.linspace(-1, 1, 5, dtype=torch.float64)
    loss = cb.log_prob(in_padding)[0] + impossible.log_prob(value)[0]
    (loss + (impossible.mean * weights).sum()).backward()
    assert torch.isfinite(logits.grad).all()


def test_expand_and_shapes():
    cb = ConditionalBernoulli(random_logits(1, 4, seed=48), 2, sampler="id_checking")
    wide = cb.expand((3,))
    assert wide.batch_shape == (3,) and wide.event_shape == (4,) and wide.sampler == "id_checking"
    b = torch.tensor([1, 0, 0, 1], dtype=torch.float64)
    torch.testing.assert_close(wide.log_prob(b), cb.log_prob(b).expand(3))
    assert wide.sample((2,)).shape == (2, 3, 4)
    assert wide.mean.shape == (3, 4) and wide.entropy().shape == (3,)
    torch.testing.assert_close(wide.variance, cb.mean * (1 - cb.mean).expand(3, 4))


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_samples_have_exactly_total_highs_inside_lengths(sampler):
    logits = extreme_logits(4, 40, seed=4, dtype=torch.float64)
    totals, lengths = torch.tensor([0, 7, 30, 25]), torch.tensor([40, 20, 30, 33])
    cb = ConditionalBernoulli(logits, totals, lengths, sampler=sampler)
    samples = cb.sample((50,), generator=torch.Generator().manual_seed(1))
    assert samples.shape == (50, 4, 40) and samples.dtype == logits.dtype
    assert torch.equal(samples.sum(-1), totals.double().expand(50, 4))
    inside = torch.arange(40) < lengths.unsqueeze(-1)
    assert (samples[:, ~inside] == 0).all()
    assert torch.isfinite(cb.log_prob(samples)).all()


@pytest.mark.gpu
def test_device_results_match_cpu(device):
    logits = extreme_logits(3, 200, seed=8)
    totals, lengths = torch.tensor([0, 60, 150]), torch.tensor([200, 120, 150])
    on_cpu = ConditionalBernoulli(logits.double(), totals, lengths)
    on_device = ConditionalBernoulli(logits.to(device), totals.to(device), lengths.to(device))
    b = on_device.sample()
    assert b.device.type == torch.device(device).type
    assert torch.equal(b.sum(-1).cpu(), totals.float())
    torch.testing.assert_close(
        on_device.log_prob(b).cpu().double(), on_cpu.log_prob(b.cpu().double())
    )
    torch.testing.assert_close(on_device.mean.cpu().double(), on_cpu.mean, atol=1e-5, rtol=1e-4)
