"""Length-bucketed batches with a frame budget, reproducible per (seed, epoch)."""

import random
from collections.abc import Iterator, Sequence

__all__ = ["BucketBatchSampler"]


class BucketBatchSampler:
    """Batches of similar-length utterances whose padded size stays under a frame budget.

    Utterances are sorted by length and cut into batches so that ``max_len * batch_size``
    stays at most ``max_frames`` (and the batch at most ``max_utts``). With ``shuffle`` the
    order of the batches (and the ties within a length) changes each epoch, deterministically
    from ``(seed, epoch)``, so a resumed run sees the same batches in the same order.

    Args:
        lengths: number of frames of each utterance.
    """

    def __init__(self, lengths: Sequence[int], max_frames: int, max_utts: int = 0,
                 shuffle: bool = True, seed: int = 0):
        if max_frames <= 0:
            raise ValueError(f"max_frames must be positive, got {max_frames}")
        self.lengths = list(lengths)
        self.max_frames = max_frames
        self.max_utts = max_utts
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        """All batches of the current epoch, in order."""
        rng = random.Random(self.seed * 100003 + self.epoch)
        order = list(range(len(self.lengths)))
        if self.shuffle:
            rng.shuffle(order)  # random tie-break among equal lengths
        order.sort(key=lambda i: self.lengths[i])
        batches, batch, longest = [], [], 0
        for i in order:
            longest_if_added = max(longest, self.lengths[i])
            full = self.max_utts and len(batch) >= self.max_utts
            if batch and (longest_if_added * (len(batch) + 1) > self.max_frames or full):
                batches.append(batch)
                batch, longest_if_added = [], self.lengths[i]
            batch.append(i)
            longest = longest_if_added
        if batch:
            batches.append(batch)
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())

    def __len__(self) -> int:
        return len(self.batches())
