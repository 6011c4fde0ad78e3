"""ID-checking, draft and bounded decompositions (CB paper eqs. 9-16) against enumeration."""

import math
import random

import pytest
import torch

from cbasr.distributions import (
    ConditionalBernoulli,
    bounded_bernoulli_log_probs,
    bounded_bernoulli_marginals,
    draft_log_probs,
    id_checking_log_probs,
    sequence_to_times,
)
from tests.distributions.cases import extreme_logits, random_logits
from tests.reference import cb_enumeration as ref


def _cases(T: int, seed: int):
    """For every length in {T, T - 2} and every k, a few support sequences of that CB."""
    rng = random.Random(seed)
    logits = random_logits(T, seed=seed)
    for length in sorted({T, max(T - 2, 0)}):
        for k in range(length + 1):
            support = ref.cb_support(T, k, length)
            for b in rng.sample(support, min(2, len(support))):
                yield logits, length, k, b


def _times(b, K):
    times = [t for t, bit in enumerate(b) if bit]
    return torch.tensor(times + [-1] * (K - len(times)))


@pytest.mark.parametrize("T", range(1, 9))
def test_id_checking_steps_match_enumeration(T):
    for logits, length, k, b in _cases(T, seed=50 + T):
        value = torch.tensor(b, dtype=torch.float64)
        steps = id_checking_log_probs(logits, k, value, torch.tensor(length))
        torch.testing.assert_close(steps, ref.id_checking_steps(logits, k, length, b))


@pytest.mark.parametrize("T", range(1, 9))
def test_bounded_steps_match_enumeration(T):
    for logits, length, k, b in _cases(T, seed=60 + T):
        steps = bounded_bernoulli_log_probs(logits, k, _times(b, k), torch.tensor(length))
        torch.testing.assert_close(
            steps, ref.bounded_steps(logits, k, length, _times(b, k).tolist())
        )


@pytest.mark.parametrize("T", range(1, 9))
def test_draft_steps_match_enumeration(T):
    rng = random.Random(T)
    for logits, length, k, b in _cases(T, seed=70 + T):
        drafts = [t for t, bit in enumerate(b) if bit]
        rng.shuffle(drafts)
        steps = draft_log_probs(
            logits, k, torch.tensor(drafts, dtype=torch.long), torch.tensor(length)
        )
        torch.testing.assert_close(steps, ref.draft_steps(logits, k, length, drafts))


@pytest.mark.parametrize("T", range(1, 9))
def test_marginals_match_enumeration_and_sum_to_mean(T):
    logits = random_logits(T, seed=80 + T)
    for length in sorted({T, max(T - 2, 0)}):
        totals = torch.arange(length + 1)
        marginals = bounded_bernoulli_marginals(
            logits, totals, torch.tensor(length)
        )  # (k + 1, K, T)
        assert marginals.shape == (length + 1, length, T)
        mean = ConditionalBernoulli(logits, totals, torch.tensor(length)).mean
        for k in range(length + 1):
            torch.testing.assert_close(marginals[k, :k], ref.bounded_marginals(logits, k, length))
            assert (marginals[k, k:] == 0).all()  # rows l >= total
            torch.testing.assert_close(marginals[k].sum(-2), mean[k])  # eq. (16)
            torch.testing.assert_close(marginals[k, :k].sum(-1), torch.ones(k, dtype=torch.float64))


@pytest.mark.parametrize("T", [4, 7])
def test_every_sequence_sums_to_its_log_prob(T):
    # eqs. (10), (12), (14) on the whole support at once.
    logits = random_logits(T, seed=90 + T)
    for k in range(T + 1):
        support, expected = ref.cb_log_probs(logits, k, T)
        values = torch.tensor(support, dtype=torch.float64)
        times = sequence_to_times(values, k)
        torch.testing.assert_close(id_checking_log_probs(logits, k, values).sum(-1), expected)
        torch.testing.assert_close(bounded_bernoulli_log_probs(logits, k, times).sum(-1), expected)
        reversed_drafts = times.flip(-1)
        draft = draft_log_probs(logits, k, reversed_drafts).sum(-1)
        torch.testing.assert_close(draft, expected - math.lgamma(k + 1))


@pytest.mark.parametrize("name", ["id_checking", "bounded", "draft", "marginals"])
def test_gradcheck(name):
    logits = random_logits(2, 5, seed=100).requires_grad_()
    totals, lengths = torch.tensor([2, 3]), torch.tensor([5, 4])
    b = torch.tensor([[0, 1, 0, 0, 1], [1, 0, 1, 1, 0]], dtype=torch.float64)
    times = torch.tensor([[1, 4, -1], [0, 2, 3]])
    drafts = torch.tensor([[4, 1, -1], [2, 0, 3]])

    def f(x):
        if name == "id_checking":
            return id_checking_log_probs(x, totals, b, lengths)
        if name == "bounded":
            return bounded_bernoulli_log_probs(x, totals, times, lengths)
        if name == "draft":
            return draft_log_probs(x, totals, drafts, lengths)
        return bounded_bernoulli_marginals(x, totals, lengths)

    assert torch.autograd.gradcheck(f, (logits,))


def test_impossible_values_are_minus_inf_and_padding_steps_zero():
    logits = random_logits(5, seed=101).requires_grad_()
    lengths = torch.tensor(4)
    # ID-checking: too many highs, too few, a high in padding.
    for b in ([1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 1]):
        steps = id_checking_log_probs(logits, 2, torch.tensor(b, dtype=torch.float64), lengths)
        assert steps.sum() == -math.inf and not torch.isnan(steps).any()
    steps = id_checking_log_probs(
        logits, 2, torch.tensor([1, 0, 1, 0, 0], dtype=torch.float64), lengths
    )
    assert steps[4] == 0 and torch.isfinite(steps).all()
    # Bounded: not increasing, repeated, outside lengths; padded entries l >= total are 0.
    for times in ([2, 1, -1], [1, 1, -1], [1, 4, -1], [-1, 2, -1]):
        steps = bounded_bernoulli_log_probs(logits, 2, torch.tensor(times), lengths)
        assert steps.sum() == -math.inf and not torch.isnan(steps).any()
    assert bounded_bernoulli_log_probs(logits, 2, torch.tensor([0, 3, 7]), lengths)[2] == 0
    # Draft: repeated or outside lengths.
    for drafts in ([3, 3], [1, 4], [0, -2]):
        steps = draft_log_probs(logits, 2, torch.tensor(drafts), lengths)
        assert steps.sum() == -math.inf and not torch.isnan(steps).any()
    steps = id_checking_log_probs(
        logits, 2, torch.tensor([1, 1, 1, 0, 0], dtype=torch.float64), lengths
    )
    not_increasing = bounded_bernoulli_log_probs(logits, 2, torch.tensor([2, 1]), lengths)
    (steps[:1].sum() + not_increasing[0]).backward()
    assert torch.isfinite(logits.grad).all()
    with pytest.raises(ValueError, match="fewer than the largest total"):
        bounded_bernoulli_log_probs(logits, 2, torch.tensor([1]), lengths)


def test_padding_batch_and_sample_dimensions_never_change_a_result():
    logits = random_logits(2, 6, seed=102)
    padded = torch.cat([logits, 30 * random_logits(2, 2, seed=103)], -1)
    totals, lengths = torch.tensor([2, 4]), torch.tensor([6, 6])
    b = torch.tensor([[0, 1, 0, 0, 1, 0], [1, 1, 0, 1, 0, 1]], dtype=torch.float64)
    b_padded = torch.cat([b, torch.zeros(2, 2, dtype=torch.float64)], -1)
    times = sequence_to_times(b, 4)
    close = dict(rtol=1e-12, atol=1e-12)
    id_plain = id_checking_log_probs(logits, totals, b)
    id_padded = id_checking_log_probs(padded, totals, b_padded, lengths)
    torch.testing.assert_close(id_padded[:, :6], id_plain, **close)
    torch.testing.assert_close(id_checking_log_probs(logits[0], 2, b[0]), id_plain[0], **close)
    bb_plain = bounded_bernoulli_log_probs(logits, totals, times)
    bb_padded = bounded_bernoulli_log_probs(padded, totals, times, lengths)
    torch.testing.assert_close(bb_padded, bb_plain, **close)
    bb_alone = bounded_bernoulli_log_probs(logits[0], 2, times[0, :2])
    torch.testing.assert_close(bb_alone, bb_plain[0, :2], **close)
    # Samples as a leading dimension: (3, 2, T) against (2, T) parameters.
    stacked = id_checking_log_probs(logits, totals, b.expand(3, 2, 6))
    torch.testing.assert_close(stacked, id_plain.expand(3, 2, 6))
    draft_plain = draft_log_probs(logits, totals, times)
    torch.testing.assert_close(
        draft_log_probs(padded, totals, times, lengths), draft_plain, **close
    )
    marginals = bounded_bernoulli_marginals(padded, totals, lengths)
    torch.testing.assert_close(
        marginals[..., :6], bounded_bernoulli_marginals(logits, totals), **close
    )


def test_float32_long_sequence_steps_sum_to_log_prob():
    logits = extreme_logits(2, 1000, seed=5).requires_grad_()
    cb = ConditionalBernoulli(logits, 300)
    b = cb.sample(generator=torch.Generator().manual_seed(2))
    expected = ConditionalBernoulli(logits.detach().double(), 300).log_prob(b.double())
    times = sequence_to_times(b, 300)
    id_steps = id_checking_log_probs(logits, 300, b)
    bb_steps = bounded_bernoulli_log_probs(logits, 300, times)
    exact = logits.detach().double()
    id_exact = id_checking_log_probs(exact, 300, b.double())
    bb_exact = bounded_bernoulli_log_probs(exact, 300, times)
    for steps, steps_exact in ((id_steps, id_exact), (bb_steps, bb_exact)):
        assert torch.isfinite(steps).all()
        assert ((steps.sum(-1).double() - expected).abs() / expected.abs()).max() < 1e-4
        # Each step too (about 1e-6 here; summing the skipped frames in float32 gives 2e-4).
        assert (steps.double() - steps_exact).abs().max() < 2e-5
    drafts = times.flip(-1)
    draft_steps = draft_log_probs(logits, 300, drafts)
    assert (draft_steps.double() - draft_log_probs(exact, 300, drafts)).abs().max() < 1e-3
    (id_steps.sum() + bb_steps.sum() + draft_steps.sum()).backward()
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("T", [4, 6])
def test_bounded_steps_after_a_frame_that_is_always_high(T):
    """A ``+inf`` logit (``log(1 - p) = -inf``) before a high: the frames skipped after it are
    a difference of prefix sums that would both hold ``-inf`` (NaN). The reference takes
    ``+40`` for ``+inf`` (the sequences without that frame weigh ``e^-40`` in the CB)."""
    logits = random_logits(T, seed=90 + T)
    logits[1], logits[T - 2] = math.inf, -math.inf
    near = torch.where(logits == math.inf, 40.0, logits)
    for length in (T, T - 1):
        for k in range(1, length - 1):
            for b in ref.cb_support(T, k, length):
                steps = bounded_bernoulli_log_probs(logits, k, _times(b, k), torch.tensor(length))
                assert not steps.isnan().any()
                if b[1] and not b[T - 2]:  # possible
                    want = ref.bounded_steps(near, k, length, _times(b, k).tolist())
                    torch.testing.assert_close(steps, want, rtol=0, atol=1e-9)
                else:
                    assert steps.sum() == -math.inf
