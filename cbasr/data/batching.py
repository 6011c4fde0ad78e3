"""Length-bucketed batches with a frame budget, reproducible per (seed, epoch), and their shards.

With several processes (DistributedDataParallel), every process builds the same global batches
and trains on its own shard of each (:func:`shard`), so the global batch, and hence the
optimisation, is the same whatever the number of processes.
"""

import random
from collections.abc import Iterator, Sequence

from cbasr.config.schema import positive

__all__ = ["BucketBatchSampler", "shard"]


def shard(batch: Sequence[int], rank: int, world_size: int) -> list[int]:
    """Process ``rank``'s part of a global ``batch``: every ``world_size``-th utterance.

    The shards of a batch are disjoint and together hold all of it; a batch sorted by length
    (as :meth:`BucketBatchSampler.batches` makes them) gives shards of similar padded size.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside a world of {world_size} processes")
    return list(batch[rank::world_size])


class BucketBatchSampler:
    """Batches of similar-length utterances whose padded size stays under a frame budget.

    Utterances are sorted by length and cut into batches so that ``max_len * batch_size``
    stays at most ``max_frames`` (and the batch at most ``max_utts``). With ``shuffle`` the
    order of the batches (and the ties within a length) changes each epoch, deterministically
    from ``(seed, epoch)``, so a resumed run sees the same batches in the same order. Each
    batch lists its utterances from shortest to longest.

    Args:
        lengths: number of frames of each utterance.
        min_utts: every batch holds at least this many utterances (the number of processes
            that share each batch): a smaller one is merged into its neighbour in length
            order, even past the frame budget.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        max_frames: int,
        max_utts: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        min_utts: int = 1,
    ):
        positive("max_frames", max_frames)  # data.max_frames's rule (DataConfig); decoding too
        if 0 < len(lengths) < min_utts:
            raise ValueError(
                f"{len(lengths)} utterances cannot fill batches of at least {min_utts}"
            )
        self.min_utts = min_utts
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
        batches = self._merge_small(batches)
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def _merge_small(self, batches: list[list[int]]) -> list[list[int]]:
        """Merge each batch of fewer than ``min_utts`` utterances into the previous (or next) one."""
        merged: list[list[int]] = []
        for batch in batches:
            if merged and (len(batch) < self.min_utts or len(merged[-1]) < self.min_utts):
                merged[-1] = merged[-1] + batch
            else:
                merged.append(batch)
        return merged

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())

    def __len__(self) -> int:
        return len(self.batches())
