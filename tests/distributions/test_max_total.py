"""``max_total``: a caller's bound on the totals sizes the CB tables, so the largest total is
not read from the device; it changes no value, and a total above it is an error."""

import functools
import math

import pytest
import torch

from cbasr._backends import use_backend
from cbasr.checks import one_read
from cbasr.distributions import (
    ConditionalBernoulli,
    bounded_bernoulli_log_probs,
    bounded_bernoulli_marginals,
    bounded_bernoulli_sample,
    id_checking_log_probs,
    id_checking_sample,
    sequence_to_times,
)
from tests.device_reads import DeviceReads
from tests.distributions.cases import random_logits

LENGTHS = torch.tensor([6, 4, 6, 0, 5])
TOTALS = torch.tensor([3, 4, 0, 0, 2])
BOUND = 6  # two more count states than the largest total needs


@pytest.fixture(autouse=True, params=["numba", "torch", "triton"])
def recursion(request):
    """Each test on the CPU's compiled kernels, the PyTorch recursions and the Triton kernels
    (in Triton's interpreter: the CUDA code path)."""
    with use_backend(request.param):
        yield request.param


def _logits() -> torch.Tensor:
    logits = random_logits(len(LENGTHS), 6, seed=3)
    logits[4, 0], logits[0, 5] = math.inf, -math.inf  # a forced high and a forced low
    return logits


@functools.cache
def _draws() -> torch.Tensor:
    """Two fixed CB samples per row ``(2, B, T)`` (drawn once: no read in a test's count)."""
    with use_backend("torch"):
        return id_checking_sample(
            _logits(), TOTALS, LENGTHS, (2,), torch.Generator().manual_seed(7)
        )


def _with_bound(fn, bound):
    """``fn(x, bound)``'s value and the gradient of a weighted sum of its finite entries."""
    x = _logits().requires_grad_()
    value = fn(x, bound)
    finite = torch.where(value.isfinite(), value, 0.0)
    weights = torch.linspace(0.5, 2.0, finite.numel(), dtype=finite.dtype).view(finite.shape)
    (grad,) = torch.autograd.grad((finite * weights).sum(), x)
    return value.detach(), grad


def _pad_rows(marginals: torch.Tensor, rows: int) -> torch.Tensor:
    """``(B, K, T)`` marginals -> ``(B, rows, T)``: the rows past every total are 0."""
    return torch.nn.functional.pad(marginals, (0, 0, 0, rows - marginals.shape[1]))


VALUES = {
    "id_checking_log_probs": lambda x, k: id_checking_log_probs(
        x, TOTALS, _draws(), LENGTHS, max_total=k
    ),
    "bounded_bernoulli_log_probs": lambda x, k: bounded_bernoulli_log_probs(
        x, TOTALS, sequence_to_times(_draws(), BOUND), LENGTHS, max_total=k
    ),
    "log_prob": lambda x, k: ConditionalBernoulli(x, TOTALS, LENGTHS, max_total=k).log_prob(
        _draws()
    ),
    "mean": lambda x, k: ConditionalBernoulli(x, TOTALS, LENGTHS, max_total=k).mean,
    "marginals": lambda x, k: _pad_rows(
        bounded_bernoulli_marginals(x, TOTALS, LENGTHS, max_total=k), BOUND
    ),
}


@pytest.mark.parametrize("name", VALUES)
def test_the_bound_changes_no_value_or_gradient(name):
    want, want_grad = _with_bound(VALUES[name], None)
    for bound in (int(TOTALS.max()), BOUND, 50):  # tight, larger, more than the frames
        got, grad = _with_bound(VALUES[name], bound)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)


def test_the_marginals_and_bounded_draws_have_a_row_per_bounded_label(recursion):
    assert bounded_bernoulli_marginals(_logits(), TOTALS, LENGTHS, max_total=5).shape == (5, 5, 6)
    assert bounded_bernoulli_marginals(_logits(), TOTALS, LENGTHS, max_total=9).shape == (5, 6, 6)
    gen = torch.Generator().manual_seed(2)
    times = bounded_bernoulli_sample(_logits(), TOTALS, LENGTHS, (3,), gen, max_total=BOUND)
    assert times.shape == (3, 5, BOUND)
    label = torch.arange(BOUND)
    active = label < TOTALS[:, None]
    assert ((times >= 0) == active).all() and (times < LENGTHS[:, None]).all()
    assert (times[..., 1:] > times[..., :-1])[active[:, 1:].expand(3, -1, -1)].all()
    if recursion == "torch":  # a Gumbel draw per label: the first K labels' draws as unbounded
        gen = torch.Generator().manual_seed(2)
        want = bounded_bernoulli_sample(_logits(), TOTALS, LENGTHS, (3,), gen)
        assert torch.equal(times[..., : want.shape[-1]], want)


def test_id_checking_draws_are_the_unbounded_ones():
    def draw(bound):
        gen = torch.Generator().manual_seed(11)
        return id_checking_sample(_logits(), TOTALS, LENGTHS, (4,), gen, max_total=bound)

    assert torch.equal(draw(BOUND), draw(None))


CALLS = {
    "id_checking_sample": lambda x, k: id_checking_sample(x, TOTALS, LENGTHS, (2,), max_total=k),
    "bounded_bernoulli_sample": lambda x, k: bounded_bernoulli_sample(
        x, TOTALS, LENGTHS, (2,), max_total=k
    ),
    **VALUES,
}


@pytest.mark.parametrize("name", CALLS)
def test_with_a_bound_nothing_is_read_before_the_block_s_end(name, recursion):
    """Inside a ``one_read`` block the bound leaves the largest total unread, and the checks
    (the bound's, whether each total can be met) wait for the block's one read; without the
    bound the same call reads the largest total (on the CUDA code path: triton, torch)."""
    if recursion == "numba":  # (the normaliser's kernel reads on the host, where it costs nothing)
        pytest.skip("the CPU's compiled kernels are not the CUDA code path")
    x = _logits().requires_grad_(name not in ("id_checking_sample", "bounded_bernoulli_sample"))
    _draws()  # (drawn once, before the count)
    with one_read():
        with DeviceReads() as inside:
            CALLS[name](x, BOUND)
        assert inside.count == 0
        with DeviceReads() as unbounded:
            CALLS[name](x, None)
        assert unbounded.count >= 1


@pytest.mark.parametrize("name", CALLS)
def test_a_total_above_the_bound_is_an_error(name):
    """At once outside a block, at the block's end inside one; meanwhile the tables hold the
    bound's states and no kernel indexes past them (the totals are clamped to the bound)."""
    x = _logits()
    message = r"total\[1\] = 4 > max_total = 3"
    with pytest.raises(ValueError, match=message):
        CALLS[name](x, 3)
    reached = False
    with pytest.raises(ValueError, match=message):
        with one_read():
            CALLS[name](x, 3)
            reached = True
    assert reached


def test_a_bound_of_zero_serves_totals_of_zero():
    zero, logits = torch.zeros_like(TOTALS), random_logits(len(LENGTHS), 6, seed=3)
    draws = id_checking_sample(logits, zero, LENGTHS, (2,), max_total=0)
    assert draws.shape == (2, 5, 6) and not draws.any()
    log_prob = ConditionalBernoulli(logits, zero, LENGTHS, max_total=0).log_prob(draws)
    torch.testing.assert_close(log_prob, torch.zeros_like(log_prob))  # the one sequence


@pytest.mark.parametrize("bound", [-1, True, 2.0, "4"])
def test_a_bound_that_is_not_a_count_is_refused(bound):
    with pytest.raises(ValueError, match="max_total must be"):
        id_checking_sample(_logits(), TOTALS, LENGTHS, max_total=bound)
    with pytest.raises(ValueError, match="max_total must be"):
        ConditionalBernoulli(_logits(), TOTALS, LENGTHS, max_total=bound).log_prob(_draws())
