"""LM training text larger than memory: token-id shards built once, read one at a time.

:func:`build_shards` reads the text (or manifest) a line at a time and writes its token ids in
shards of about ``shard_tokens`` tokens: ``shard-NNNNN.ids.npy`` (int32) and
``shard-NNNNN.offsets.npy`` (int64, sentence ``i`` is ``ids[offsets[i]:offsets[i + 1]]``).
Unusable sentences go to ``skipped.tsv`` as they are met; ``index.json``, written last, records
the source (path, size, modification time), the vocabulary's hash, the units, the shard size
and each shard's sentence and token counts. A directory whose index matches is reused; an
interrupted or outdated one is built again. Memory stays at about one shard.

An epoch (:class:`EpochPlan`) visits the shards in an order drawn from its seed and, within
each shard, batches of similar lengths (at most ``max_tokens`` padded tokens) in an order drawn
from the seed and the shard: shuffling by shard, then within a shard-sized buffer. The plan is
a function of the seed alone, and slicing it (``plan[k:]``) skips batches without loading them,
so a resumed epoch continues with the same batches.
"""

import functools
import hashlib
import json
import logging
import os
import random
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cbasr.config.schema import positive
from cbasr.data.vocab import Vocabulary
from cbasr.lm.corpus import Sentences, encoded_sentences
from cbasr.storage.files import atomic_write, write_json

__all__ = ["ShardBatch", "ShardedText", "EpochPlan", "build_shards", "length_batches"]

log = logging.getLogger(__name__)
INDEX = "index.json"


def length_batches(
    lengths: np.ndarray, max_tokens: int, seed: int | None = None
) -> list[list[int]]:
    """Batches (indices) of similar lengths, each at most ``max_tokens`` padded tokens (a
    sentence and its end: ``length + 1``; a longer sentence is a batch of its own), in length
    order or shuffled with ``seed``."""
    order = np.argsort(np.asarray(lengths), kind="stable").tolist()
    batches, batch, longest = [], [], 0
    for i in order:
        longest_if_added = max(longest, int(lengths[i]) + 1)
        if batch and longest_if_added * (len(batch) + 1) > max_tokens:
            batches.append(batch)
            batch, longest_if_added = [], int(lengths[i]) + 1
        batch.append(i)
        longest = longest_if_added
    if batch:
        batches.append(batch)
    if seed is not None:
        random.Random(seed).shuffle(batches)
    return batches


def _source_stamp(path: Path) -> dict:
    status = path.stat()
    return {"path": str(path.resolve()), "size": status.st_size, "mtime_ns": status.st_mtime_ns}


def _vocab_hash(vocab: Vocabulary) -> str:
    return hashlib.sha256("\n".join(vocab.tokens).encode()).hexdigest()


def _save_array(path: Path, values: np.ndarray) -> None:
    atomic_write(path, lambda f: np.save(f, values), mode="wb")


class ShardedText:
    """The shards in ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.index = json.loads((self.directory / INDEX).read_text())
        self.shards: list[dict] = self.index["shards"]

    def __len__(self) -> int:
        return sum(s["sentences"] for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards)

    @property
    def skipped(self) -> int:
        return self.index["skipped"]

    def _path(self, shard: int, kind: str) -> Path:
        return self.directory / f"shard-{shard:05d}.{kind}.npy"

    def lengths(self, shard: int) -> np.ndarray:
        return np.diff(np.load(self._path(shard, "offsets")))

    def load(self, shard: int) -> Sentences:
        return Sentences(np.load(self._path(shard, "ids")), np.load(self._path(shard, "offsets")))

    def batch_counts(self, max_tokens: int) -> list[int]:
        """Batches per shard at ``max_tokens`` (the same for every epoch's order)."""
        return [len(length_batches(self.lengths(s), max_tokens)) for s in range(len(self.shards))]


def build_shards(
    source: str | Path,
    vocab: Vocabulary,
    units: str,
    directory: str | Path,
    shard_tokens: int = 10_000_000,
) -> ShardedText:
    """The shards of ``source`` in ``directory``, built unless an up-to-date index is there.

    Raises:
        FileNotFoundError: naming ``source``.
    """
    source, directory = Path(source), Path(directory)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: LM text not found (a .jsonl manifest or a text file)")
    positive("shard_tokens", shard_tokens)  # data.shard_tokens's rule (LMDataConfig)
    params = {
        "source": _source_stamp(source),
        "vocab_sha256": _vocab_hash(vocab),
        "units": units,
        "shard_tokens": shard_tokens,
    }
    try:
        index = json.loads((directory / INDEX).read_text())
        if index["params"] == params:
            return ShardedText(directory)
        log.info("%s: built from other text or settings; building again", directory)
    except (OSError, ValueError, KeyError):
        pass
    directory.mkdir(parents=True, exist_ok=True)
    (directory / INDEX).unlink(missing_ok=True)
    for old in directory.glob("shard-*.npy"):
        old.unlink()
    log.info("tokenising %s into shards of %d tokens in %s", source, shard_tokens, directory)
    shards, skipped = [], 0
    ids, offsets = array("i"), array("q", [0])

    def flush():
        n = len(shards)
        _save_array(directory / f"shard-{n:05d}.ids.npy", np.frombuffer(ids, dtype=np.int32))
        _save_array(
            directory / f"shard-{n:05d}.offsets.npy", np.frombuffer(offsets, dtype=np.int64)
        )
        shards.append({"sentences": len(offsets) - 1, "tokens": len(ids)})

    tmp = directory / "skipped.tsv.tmp"
    with open(tmp, "w", encoding="utf-8") as skipped_file:
        for name, sentence, reason in encoded_sentences(source, vocab, units):
            if sentence is None:
                skipped += 1
                skipped_file.write(f"{name}\t{reason}\n")
                continue
            ids.extend(sentence)
            offsets.append(len(ids))
            if len(ids) >= shard_tokens:
                flush()
                ids, offsets = array("i"), array("q", [0])
    if len(offsets) > 1:
        flush()
    os.replace(tmp, directory / "skipped.tsv")
    write_json(directory / INDEX, {"params": params, "shards": shards, "skipped": skipped})
    text = ShardedText(directory)
    log.info(
        "%s: %d sentences, %d tokens in %d shards; %d skipped",
        directory,
        len(text),
        text.tokens,
        len(shards),
        skipped,
    )
    return text


@dataclass(frozen=True)
class ShardBatch:
    """One batch of an epoch: sentence ``indices`` of ``shard``, ``tokens`` predicted."""

    shard: int
    indices: tuple[int, ...]
    tokens: int


class EpochPlan(Sequence):
    """The batches of one epoch over ``text`` (module docstring), from batch ``start`` on."""

    def __init__(
        self,
        text: ShardedText,
        max_tokens: int,
        seed: int,
        counts: list[int],
        start: int = 0,
        _drawn=None,
    ):
        self.text, self.max_tokens, self.seed, self.counts = text, max_tokens, seed, counts
        self.start = start
        self.order = list(range(len(counts)))
        random.Random(seed).shuffle(self.order)
        # The walks of one epoch (the trainer's, its loader's and the loader's sentences) go
        # through the plan side by side: each shard's batches are drawn once and kept while the
        # walks are in it (a slice shares them).
        self._drawn = _drawn or functools.lru_cache(maxsize=2)(self._draw)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_drawn"}  # (a bound method)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._drawn = functools.lru_cache(maxsize=2)(self._draw)

    def _draw(self, shard: int) -> list[ShardBatch]:
        lengths = self.text.lengths(shard)
        batches = length_batches(lengths, self.max_tokens, seed=self.seed * 100_003 + shard)
        return [ShardBatch(shard, tuple(b), int(lengths[b].sum()) + len(b)) for b in batches]

    def __len__(self) -> int:
        return max(sum(self.counts) - self.start, 0)

    def __getitem__(self, item):
        if isinstance(item, slice) and item.step in (None, 1) and item.stop is None:
            start = self.start + (item.start or 0)
            return EpochPlan(
                self.text, self.max_tokens, self.seed, self.counts, start, _drawn=self._drawn
            )
        if isinstance(item, int):
            for i, batch in enumerate(self):
                if i == (item if item >= 0 else len(self) + item):
                    return batch
            raise IndexError(f"batch {item} of {len(self)}")
        raise TypeError("an epoch plan takes an index or an open slice [k:]")

    def __iter__(self) -> Iterator[ShardBatch]:
        skip = self.start
        for shard in self.order:
            if skip >= self.counts[shard]:
                skip -= self.counts[shard]
                continue
            yield from self._drawn(shard)[skip:]
            skip = 0


def sentences_of(text: ShardedText, batches: Sequence[ShardBatch]) -> Iterator[list[np.ndarray]]:
    """Each batch's sentences, one shard in memory at a time."""
    loaded, sentences = None, None
    for batch in batches:
        if batch.shard != loaded:
            loaded, sentences = batch.shard, text.load(batch.shard)
        yield [sentences[i] for i in batch.indices]
