"""The compiled CPU kernels against the PyTorch recursions and against their definitions."""

import math

import pytest
import torch
import torch.nn.functional as F

from cbasr._backends import use_backend
from cbasr.distributions import ConditionalBernoulli, PoissonBinomial, id_checking_sample
from cbasr.distributions._arguments import frame_mask
from cbasr.distributions._dispatch import tilt_for_total
from tests.distributions.cases import extreme_logits, random_logits

# Rows: padding, totals 0 / full / in between, forced frames, an impossible total.
LENGTHS = torch.tensor([9, 5, 9, 0, 7, 9, 3])
TOTALS = torch.tensor([4, 5, 0, 0, 3, 2, 4])  # the last row: 4 highs in 3 frames


def _logits(dtype=torch.float64) -> torch.Tensor:
    logits = random_logits(len(LENGTHS), 9, seed=5, dtype=dtype)
    logits[4, 1], logits[4, 5] = math.inf, -math.inf
    logits[5, :3] = -math.inf
    return logits


def _log_prob_and_gradient(logits, kernels: bool):
    """``log P(b | k)`` of a fixed draw (the impossible row: any value, ``-inf``) and the
    gradient of a weighted sum of the finite ones. (``log P(K = k)`` itself depends on the
    tilt, which the two paths find by different iterations; eq. 4 does not.)"""
    value = id_checking_sample(logits[:-1], TOTALS[:-1], LENGTHS[:-1], (), _seeded(1))
    value = torch.cat([value, value.new_zeros(1, value.shape[-1])])
    x = logits.detach().requires_grad_()
    with use_backend("numba" if kernels else "torch"):
        cb = ConditionalBernoulli(x, TOTALS, LENGTHS, validate_args=False)
        log_prob = cb.log_prob(value)
    weights = torch.linspace(0.5, 2.0, len(LENGTHS), dtype=logits.dtype)
    finite = torch.where(log_prob.isfinite(), log_prob, 0.0)
    (grad,) = torch.autograd.grad(finite @ weights, x)
    return log_prob.detach(), grad


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_log_prob_and_its_gradient_equal_the_pytorch_recursion():
    logits = _logits()
    got, got_grad = _log_prob_and_gradient(logits, kernels=True)
    want, want_grad = _log_prob_and_gradient(logits, kernels=False)
    assert got[-1] == -math.inf and want[-1] == -math.inf
    assert got[:-1].isfinite().all()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-10, atol=1e-12)
    assert (got_grad[-1] == 0).all()  # the impossible row gets no gradient
    assert (got_grad[1, 5:] == 0).all()  # nor does padding


def test_kernel_normaliser_equals_the_prefix_table_at_the_same_tilt():
    """The kernel's ``log P(K = k)`` (its forward) against the PyTorch prefix table, given the
    same tilted weights."""
    from cbasr.distributions._kernels import LogNormaliser
    from cbasr.distributions._tables import bernoulli_log_weights, count_table, gather_states

    logits = _logits()
    valid = frame_mask(LENGTHS, logits.shape[-1])
    with use_backend("torch"):
        tilt = tilt_for_total(logits, TOTALS, valid)
    log_off, log_on = bernoulli_log_weights(logits, valid, tilt)
    got = LogNormaliser.apply(log_off, log_on, TOTALS, LENGTHS, 10)
    table = count_table(log_off, log_on, 10)[-1]
    want = gather_states(table, TOTALS.clamp(max=9).unsqueeze(-1)).squeeze(-1)
    want[-1] = -math.inf  # more highs than frames
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


def test_float32_kernel_log_prob_is_accurate_on_long_extreme_sequences():
    """B = 4, T = 400, k = 100, logits with +-30 entries: float32 in, float64 reference."""
    logits = extreme_logits(4, 400, seed=3)
    total = torch.tensor([100, 40, 200, 1])
    value = ConditionalBernoulli(logits.double(), total).sample(
        generator=torch.Generator().manual_seed(0)
    )
    with use_backend("torch"):
        want = ConditionalBernoulli(logits.double(), total).log_prob(value)
    with use_backend("numba"):
        got = ConditionalBernoulli(logits, total).log_prob(value.float())
    torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=1e-4)


def test_kernel_tilt_puts_the_mean_count_at_the_total():
    logits = torch.cat(
        [extreme_logits(3, 50, seed=1).double(), _logits()[:, :9].repeat(1, 6)[:3, :50]]
    )
    total = torch.tensor([25, 1, 49, 3, 10, 30])
    lengths = torch.tensor([50, 50, 50, 20, 50, 40])
    valid = frame_mask(lengths, 50)
    with use_backend("numba"):
        tilt = tilt_for_total(logits, total, valid)
    finite = valid & logits.isfinite()
    mean = torch.where(finite, torch.sigmoid(logits - tilt.unsqueeze(-1)), 0.0).sum(-1)
    always = (valid & (logits == math.inf)).sum(-1)
    target = (total - always).double().clamp(min=0.5)
    target = torch.minimum(target, finite.sum(-1).double() - 0.5)
    torch.testing.assert_close(mean, target, rtol=1e-8, atol=1e-8)
    with use_backend("torch"):
        bisection = tilt_for_total(logits, total, valid)
    torch.testing.assert_close(tilt, bisection, rtol=1e-7, atol=1e-7)


def test_double_backward_through_the_kernel():
    value = torch.tensor([[1.0, 0, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0]], dtype=torch.float64)
    logits = random_logits(2, 6, seed=2).requires_grad_()
    total, lengths = torch.tensor([3, 1]), torch.tensor([6, 4])

    def log_prob(x):
        return ConditionalBernoulli(x, total, lengths).log_prob(value)

    with use_backend("numba"):
        assert torch.autograd.gradcheck(log_prob, (logits,))
        assert torch.autograd.gradgradcheck(log_prob, (logits,))


@pytest.mark.parametrize("sample_shape", [(), (200,)])
def test_kernel_draws_the_same_sequences_as_the_loop(sample_shape):
    """Both decide frame t by the same uniform (the loop through its logistic transform), so
    in float64 they agree draw for draw."""
    logits = _logits()[:-1]  # every total can be met
    total, lengths = TOTALS[:-1], LENGTHS[:-1]
    draws = {}
    for kernels in (True, False):
        with use_backend("numba" if kernels else "torch"):
            generator = torch.Generator().manual_seed(11)
            draws[kernels] = id_checking_sample(logits, total, lengths, sample_shape, generator)
    assert torch.equal(draws[True], draws[False])
    assert torch.equal(draws[True].sum(-1), total.double().expand(draws[True].shape[:-1]))


def test_poisson_binomial_tails_by_the_tilted_kernel():
    """``log P(K = k)`` one count per row, far into both tails (``K = n``: every trial high,
    ``K = 0``: none), where the probabilities are ``e^-300`` or less, against their closed
    forms, and in between against the PyTorch table; with its gradient."""
    logits = random_logits(4, 400, seed=9).requires_grad_()
    lengths = torch.tensor([400, 400, 300, 400])
    count = torch.tensor([400, 0, 300, 150])
    with use_backend("numba"):
        got = PoissonBinomial(logits, lengths).log_prob(count)
    valid = frame_mask(lengths, 400)
    every = torch.where(valid, F.logsigmoid(logits), 0.0).sum(-1)
    none = torch.where(valid, F.logsigmoid(-logits), 0.0).sum(-1)
    torch.testing.assert_close(got[[0, 2]], every[[0, 2]], rtol=1e-12, atol=0)
    torch.testing.assert_close(got[1], none[1], rtol=1e-12, atol=0)
    assert float(got[0].detach()) < -300
    with use_backend("torch"):
        want = PoissonBinomial(logits, lengths).log_prob(count)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    (got_grad,) = torch.autograd.grad(got.sum(), logits)
    (want_grad,) = torch.autograd.grad(want.sum(), logits)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-9, atol=1e-12)


def test_log_prob_with_no_frames_and_with_sample_rows():
    """No frames: the only sequence is empty (log P = 0 for total 0). Sample rows ``(S, *batch,
    T)`` against a ``(2, 3)`` batch: each equals its own row's log probability."""
    empty = ConditionalBernoulli(torch.zeros(3, 0), 0)
    assert torch.equal(empty.log_prob(torch.zeros(3, 0)), torch.zeros(3))
    assert torch.equal(empty.log_prob(torch.zeros(2, 3, 0)), torch.zeros(2, 3))
    logits = random_logits(2, 3, 6, seed=4)
    total = torch.tensor([[1, 2, 3], [0, 6, 2]])
    values = id_checking_sample(logits, total, None, (4,), _seeded(2))  # (4, 2, 3, 6)
    together = ConditionalBernoulli(logits, total).log_prob(values)
    for s in range(4):
        for i in range(2):
            for j in range(3):
                alone = ConditionalBernoulli(logits[i, j], total[i, j]).log_prob(values[s, i, j])
                torch.testing.assert_close(together[s, i, j], alone, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sampler", ["id_checking", "bounded"])
def test_kernel_samples_have_the_inclusion_probabilities_of_eq_16(sampler):
    """Beyond enumeration (T = 40, k = 12, padding): each frame's empirical frequency of highs
    over 20,000 kernel draws is within 5 standard errors of ``P(B_t = 1 | k)``."""
    logits = random_logits(2, 40, seed=6)
    total, lengths = torch.tensor([12, 5]), torch.tensor([40, 31])
    with use_backend("torch"):
        mean = ConditionalBernoulli(logits, total, lengths).mean  # the PyTorch tables
    with use_backend("numba"):
        cb = ConditionalBernoulli(logits, total, lengths, sampler=sampler)
        draws = cb.sample((20_000,), generator=_seeded(7))
    frequency = draws.mean(0)
    error = 5 * (mean * (1 - mean) / 20_000).sqrt() + 1e-12
    assert ((frequency - mean).abs() <= error).all()
    assert (draws[:, 1, 31:] == 0).all() and torch.equal(draws.sum(-1)[0], total.double())
