"""The three CB samplers (ID-checking, draft, bounded) draw from the enumerated CB (eq. 4)."""

import pytest
import torch

from cbasr.distributions import (
    bounded_bernoulli_sample,
    draft_sample,
    gumbel_noise,
    id_checking_sample,
    logistic_noise,
    sequence_to_times,
    times_to_sequence,
)
from tests.distributions.cases import chi_square_p_value, extreme_logits, random_logits
from tests.reference import cb_enumeration as ref

NUM_SAMPLES = 4000
P_VALUE = 1e-3  # a correct sampler fails this one time in a thousand; the seed is fixed


def _draw(sampler: str, logits, total, lengths, generator, num_samples=NUM_SAMPLES) -> torch.Tensor:
    """``(num_samples, *, T)`` sequences from the named sampler."""
    T = logits.shape[-1]
    if sampler == "id_checking":
        return id_checking_sample(logits, total, lengths, (num_samples,), generator)
    draw = bounded_bernoulli_sample if sampler == "bounded" else draft_sample
    return times_to_sequence(
        draw(logits, total, lengths, (num_samples,), generator), T, logits.dtype
    )


def _counts(samples: torch.Tensor, cells: list[tuple[int, ...]]) -> torch.Tensor:
    cells = torch.tensor(cells, dtype=samples.dtype)  # (C, E)
    hits = (samples.unsqueeze(1) == cells).all(-1)  # (N, C, E) -> (N, C)
    assert bool(hits.any(-1).all()), "a sample outside the enumerated support"
    return hits.sum(0).double()


@pytest.mark.parametrize("sampler", ["id_checking", "bounded", "draft"])
@pytest.mark.parametrize("T,k,length", [(5, 2, 5), (6, 3, 4)])
def test_goodness_of_fit_against_enumeration(sampler, T, k, length):
    logits = random_logits(T, seed=110 + T)
    support, log_probs = ref.cb_log_probs(logits, k, length)
    generator = torch.Generator().manual_seed(T)
    samples = _draw(sampler, logits, k, torch.tensor(length), generator)
    assert chi_square_p_value(_counts(samples, support), log_probs.exp()) > P_VALUE


def test_draft_order_is_the_draft_bernoulli():
    # Ordered drafts against eq. (10): P(A | k) / k! for every order of every set.
    logits = random_logits(4, seed=120)
    every = ref.draft_log_probs_all(logits, 2, 4)
    generator = torch.Generator().manual_seed(3)
    drafts = draft_sample(logits, 2, sample_shape=(NUM_SAMPLES,), generator=generator)
    cells = list(every)
    probs = torch.stack([every[c] for c in cells]).exp()
    assert chi_square_p_value(_counts(drafts, cells), probs) > P_VALUE


def test_chi_square_detects_a_wrong_distribution():
    # The same test rejects samples drawn with different logits (the test can fail).
    logits = random_logits(5, seed=111)
    support, log_probs = ref.cb_log_probs(logits, 2, 5)
    samples = _draw("bounded", logits.flip(0), 2, None, torch.Generator().manual_seed(0))
    assert chi_square_p_value(_counts(samples, support), log_probs.exp()) < P_VALUE


@pytest.mark.parametrize("sampler", ["id_checking", "bounded", "draft"])
def test_every_sample_has_total_highs_inside_lengths(sampler):
    logits = extreme_logits(6, 200, seed=6)
    totals = torch.tensor([0, 1, 60, 120, 150, 90])
    lengths = torch.tensor([200, 150, 60, 200, 180, 90])
    samples = _draw(
        sampler, logits, totals, lengths, torch.Generator().manual_seed(4), num_samples=50
    )
    assert torch.equal(samples.sum(-1), totals.float().expand(50, 6))
    assert (samples[:, torch.arange(200) >= lengths.unsqueeze(-1)] == 0).all()


def test_samplers_are_batched_and_reproducible():
    logits = random_logits(2, 3, 7, seed=121)
    total = torch.tensor([[1, 2, 3], [0, 7, 4]])
    for draw in (id_checking_sample, bounded_bernoulli_sample, draft_sample):
        first = draw(logits, total, sample_shape=(5,), generator=torch.Generator().manual_seed(9))
        second = draw(logits, total, sample_shape=(5,), generator=torch.Generator().manual_seed(9))
        assert torch.equal(first, second)
        assert first.shape[:3] == (5, 2, 3) and first.shape[-1] in (7,)
    times = bounded_bernoulli_sample(logits, total, sample_shape=(5,))
    assert (times[..., 0][total.expand(5, 2, 3) == 0] == -1).all()
    assert ((times.diff(dim=-1) > 0) | (times[..., 1:] == -1)).all()  # increasing, then -1


def test_impossible_total_raises():
    logits = random_logits(2, 4, seed=122)
    with pytest.raises(ValueError, match="total"):
        id_checking_sample(logits, torch.tensor([2, 3]), torch.tensor([4, 2]))
    with pytest.raises(ValueError, match="total"):
        bounded_bernoulli_sample(logits, -1)
    never = logits.clone()
    never[0, 1:] = float("-inf")  # only one frame can fire
    with pytest.raises(ValueError, match="cannot be met"):
        draft_sample(never, 2)


def test_times_and_sequences_round_trip():
    b = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float32)
    times = sequence_to_times(b)
    assert torch.equal(times, torch.tensor([[1, 2, 4], [-1, -1, -1], [0, -1, -1]]))
    assert torch.equal(times_to_sequence(times, 5), b)
    assert sequence_to_times(b, 6).shape == (3, 6)


def test_noise_is_finite_and_has_the_right_mean():
    generator = torch.Generator().manual_seed(5)
    logistic = logistic_noise((200000,), generator)
    gumbel = gumbel_noise((200000,), generator)
    assert torch.isfinite(logistic).all() and torch.isfinite(gumbel).all()
    assert abs(float(logistic.mean())) < 0.03  # Logistic(0, 1): mean 0, sd 1.81
    assert abs(float(gumbel.mean()) - 0.5772) < 0.02  # Gumbel(0, 1): Euler's constant, sd 1.28


@pytest.mark.parametrize("sampler", ["id_checking", "bounded", "draft"])
def test_goodness_of_fit_with_frames_always_and_never_high(sampler):
    """A ``+inf`` and a ``-inf`` logit (the reference takes ``+40`` for ``+inf``): the bounded
    steps after the forced frame are differences of sums that both held ``-inf``."""
    logits = random_logits(6, seed=130)
    logits[1], logits[4] = float("inf"), float("-inf")
    support, log_probs = ref.cb_log_probs(
        torch.where(logits.isinf(), logits.clamp(max=40), logits), 3, 6
    )
    generator = torch.Generator().manual_seed(5)
    samples = _draw(sampler, logits, 3, torch.tensor(6), generator)
    keep = log_probs.exp() > 1e-12  # (the cells a sample can reach)
    cells = [c for c, k in zip(support, keep) if k]
    assert chi_square_p_value(_counts(samples, cells), log_probs.exp()[keep]) > P_VALUE
