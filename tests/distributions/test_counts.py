"""Count functions C(v, S; w) of CB paper eq. (8) against enumeration, in float64 and float32."""

import math

import pytest
import torch

from cbasr.distributions import log_count, log_count_prefix, log_count_suffix
from cbasr.distributions._tables import count_table
from tests.distributions.cases import extreme_logits, random_logits
from tests.reference import cb_enumeration as ref


def _finite_close(actual, expected, **kwargs):
    """Equal ``-inf`` pattern, and close where finite."""
    assert torch.equal(torch.isinf(actual), torch.isinf(expected))
    finite = torch.isfinite(expected)
    torch.testing.assert_close(actual[finite], expected[finite], **kwargs)


@pytest.mark.parametrize("T", range(1, 9))
def test_log_count_matches_enumeration(T):
    logits = random_logits(3, T, seed=T)
    lengths = torch.tensor([T, max(T - 2, 0), T // 2])
    actual = log_count(logits, lengths)
    assert actual.shape == (3, T + 1)
    for row in range(3):
        _finite_close(actual[row], ref.log_count(logits[row], int(lengths[row])))


@pytest.mark.parametrize("T", [1, 4, 6])
def test_prefix_and_suffix_tables_match_enumeration(T):
    logits = random_logits(2, T, seed=10 + T)
    lengths = torch.tensor([T, T - 1])
    suffix = log_count_suffix(logits, lengths)
    prefix = log_count_prefix(logits, lengths, max_count=T - 1)
    assert suffix.shape == (2, T + 1, T + 1) and prefix.shape == (2, T + 1, T)
    for row in range(2):
        n = int(lengths[row])
        _finite_close(suffix[row], ref.log_count_suffix(logits[row], n))
        for t in range(T + 1):
            # Row t counts over the first t frames: the full count of a truncated sequence.
            expected = torch.full((T,), -math.inf, dtype=torch.float64)
            counts = ref.log_count(logits[row, :t], min(t, n))[:T]
            expected[: len(counts)] = counts
            _finite_close(prefix[row, t], expected)


def test_hand_worked_value_is_binomial_coefficient():
    # With every w_t = 1, eq. (8) is the binomial coefficient C(T, v).
    actual = log_count(torch.zeros(6, dtype=torch.float64))
    expected = torch.tensor([math.log(math.comb(6, v)) for v in range(7)], dtype=torch.float64)
    torch.testing.assert_close(actual, expected)


def test_minus_infinity_logit_is_an_absent_frame():
    logits = random_logits(5, seed=3)
    with_gap = torch.cat([logits[:2], torch.tensor([-math.inf], dtype=torch.float64), logits[2:]])
    _finite_close(log_count(with_gap)[:6], log_count(logits))


def test_padding_never_changes_a_result():
    logits = random_logits(2, 5, seed=4)
    padded = torch.cat([logits, random_logits(2, 3, seed=5) * 10], -1)
    lengths = torch.tensor([5, 5])
    # Equal up to rounding: a wider count dimension takes other SIMD paths.
    _finite_close(log_count(padded, lengths)[:, :6], log_count(logits), rtol=1e-14, atol=1e-14)
    assert torch.isinf(log_count(padded, lengths)[:, 6:]).all()
    for table in (log_count_suffix, log_count_prefix):
        _finite_close(table(padded, lengths)[:, :6, :6], table(logits), rtol=1e-14, atol=1e-14)


def test_log_count_gradcheck():
    logits = random_logits(2, 5, seed=6).requires_grad_()
    lengths = torch.tensor([5, 3])
    # Entries v > lengths are -inf for every input: check the finite ones.
    assert torch.autograd.gradcheck(lambda x: log_count(x, lengths)[:, :4], (logits,))

    def finite_suffix(x):
        suffix = log_count_suffix(x, lengths, max_count=2)
        return torch.where(torch.isfinite(suffix), suffix, 0.0)

    assert torch.autograd.gradcheck(finite_suffix, (logits,))


def test_count_recursion_gradgradcheck():
    # The adjoint is written in differentiable ops: second derivatives (RELAX) work too.
    off = (-random_logits(2, 5, seed=7).abs()).requires_grad_()  # (B, T)
    on = random_logits(2, 5, seed=8).requires_grad_()

    for suffix in (False, True):

        def finite_table(a, c, suffix=suffix):
            table = count_table(a, c, 3, suffix=suffix)
            return torch.where(torch.isfinite(table), table, 0.0)

        assert torch.autograd.gradgradcheck(finite_table, (off, on))


def test_gradient_of_log_count_is_inclusion_probability():
    # d log C(k, I) / d logit_t = w_t C(k - 1, I \ t) / C(k, I) = P(B_t = 1 | k)  (eq. 16).
    logits = random_logits(6, seed=9).requires_grad_()
    log_count(logits)[3].backward()
    torch.testing.assert_close(logits.grad, ref.cb_mean(logits.detach(), 3, 6))


def test_float32_long_sequence_is_accurate_and_finite():
    logits = extreme_logits(2, 1000, seed=1).requires_grad_()
    actual = log_count(logits)
    expected = log_count(logits.detach().double())
    # Relative to the float64 value; the floor covers v = 0, where log C = 0 exactly.
    error = (actual.double() - expected).abs() / expected.abs().clamp(min=1.0)
    assert torch.isfinite(actual).all() and error.max() < 1e-4
    actual[:, 1:].sum().backward()
    assert torch.isfinite(logits.grad).all()
