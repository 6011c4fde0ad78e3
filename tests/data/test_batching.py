import random

import pytest

from cbasr.data.batching import BucketBatchSampler


def _lengths(n=200, seed=0):
    rng = random.Random(seed)
    return [rng.randint(50, 800) for _ in range(n)]


def test_every_utterance_once_and_frame_budget_respected():
    lengths = _lengths()
    sampler = BucketBatchSampler(lengths, max_frames=3000, max_utts=8)
    batches = sampler.batches()
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= 8
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 3000


def test_single_utterance_longer_than_budget_gets_its_own_batch():
    batches = BucketBatchSampler([100, 5000, 120], max_frames=1000, shuffle=False).batches()
    assert [1] in batches and sorted(i for b in batches for i in b) == [0, 1, 2]


def test_a_budget_of_no_frames_is_refused():
    """Decoding passes its own ``max_frames``, not the ``data`` group's: the sampler checks it."""
    with pytest.raises(ValueError, match="max_frames must be > 0, got 0"):
        BucketBatchSampler([5, 6], max_frames=0)
    assert BucketBatchSampler([5, 6], max_frames=1, shuffle=False).batches() == [[0], [1]]


def test_deterministic_per_seed_and_epoch():
    lengths = _lengths()
    a, b = BucketBatchSampler(lengths, 3000, seed=3), BucketBatchSampler(lengths, 3000, seed=3)
    assert a.batches() == b.batches()
    a.set_epoch(1)
    assert a.batches() != b.batches()
    b.set_epoch(1)
    assert a.batches() == b.batches()
    assert (
        BucketBatchSampler(lengths, 3000, seed=4).batches()
        != BucketBatchSampler(lengths, 3000, seed=3).batches()
    )


def test_batches_group_similar_lengths():
    lengths = _lengths(400)
    batches = BucketBatchSampler(lengths, 4000).batches()
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    assert sum(lengths) / padded > 0.9  # random batches of this size waste about 40%


def test_every_batch_can_be_shared_by_min_utts_processes():
    lengths = [100, 5000, 120, 130, 6000, 110]  # two utterances longer than the budget alone
    batches = BucketBatchSampler(lengths, max_frames=1000, min_utts=2, shuffle=False).batches()
    assert all(len(b) >= 2 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert BucketBatchSampler(lengths, max_frames=1000, shuffle=False).batches()[-2:] == [[1], [4]]
    with pytest.raises(ValueError, match="6 utterances cannot fill batches of at least 8"):
        BucketBatchSampler(lengths, 1000, min_utts=8)
