"""Sentences for language-model training: token lists from manifests or plain text files.

- ``*.jsonl``: a cbasr manifest; each utterance's tokens are its ``units`` field (``phones``,
  ``phones_full``, ``words`` or ``chars``, as :func:`cbasr.data.vocab.tokens_of` reads them);
- any other file: one sentence per line (blank lines skipped): for ``chars`` and sentencepiece
  (``sp:<model>``) units a line is text, spelled as a transcript is (so the LM text of a
  character or piece recogniser is plain words, e.g. ``cbasr-prepare wsj-lm``'s
  ``lm_train.txt``); for other units, tokens separated by whitespace.

Sentences with tokens outside the vocabulary are skipped and counted, with their ids (or line
numbers) in the returned summary. A text file is read a line at a time and the sentences are
kept flat (:class:`Sentences`), so WSJ's 37M words of LM text take about 150 MB, not the
gigabytes of per-sentence Python lists.
"""

from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from cbasr.data.manifest import read_manifest
from cbasr.data.vocab import SENTENCEPIECE, Vocabulary, tokens_of

__all__ = ["Sentences", "encoded_sentences", "read_sentences"]


class Sentences(Sequence):
    """Token-id sentences held flat: one int32 array of ids and one int64 array of offsets.

    ``sentences[i]`` is sentence ``i``'s ids, a read-only int32 view; ``len(sentences[i])`` its
    length.
    """

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self.ids = np.asarray(ids, dtype=np.int32)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        if self.offsets.ndim != 1 or len(self.offsets) == 0 or self.offsets[-1] != len(self.ids):
            raise ValueError("offsets must run from 0 to len(ids)")
        self.ids.flags.writeable = False

    @classmethod
    def of(cls, sentences: Sequence[Sequence[int]]) -> "Sentences":
        """From token-id lists."""
        lengths = [len(s) for s in sentences]
        ids = np.fromiter((t for s in sentences for t in s), np.int32, sum(lengths))
        return cls(ids, np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"Sentences are indexed by int, not {type(i).__name__}")
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"sentence {i} of {len(self)}")
        return self.ids[self.offsets[i] : self.offsets[i + 1]]


def _items(path: Path, units: str) -> Iterator[tuple[str, list[str]]]:
    """``(utterance id or file:line, tokens)`` of each sentence, a text file read a line at a time."""
    if path.suffix == ".jsonl":
        for record in read_manifest(path):
            yield record["id"], tokens_of(record, units)
        return
    spelled = units == "chars" or units.startswith(SENTENCEPIECE)
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if line.strip():
                yield f"{path}:{n}", tokens_of({"words": line}, units) if spelled else line.split()


def encoded_sentences(
    path: Path, vocab: Vocabulary, units: str
) -> Iterator[tuple[str, list[int] | None, str | None]]:
    """``(name, ids, None)`` of each usable sentence of ``path`` and ``(name, None, reason)`` of
    each other (a token outside the vocabulary, or the blank; an empty sentence)."""
    for name, tokens in _items(path, units):
        try:
            ids = vocab.encode(tokens)
        except KeyError:
            unknown = next(t for t in tokens if t not in vocab)
            yield name, None, f"token {unknown!r} not in the vocabulary"
            continue
        if 0 in ids:
            yield name, None, f"token {vocab.tokens[0]!r} not in the vocabulary"
        elif not ids:
            yield name, None, "empty"
        else:
            yield name, ids, None


def read_sentences(
    path: str | Path, vocab: Vocabulary, units: str = "phones"
) -> tuple[Sentences, list[str]]:
    """Token id sequences (ids ``1 .. V-1``) of every usable sentence in ``path``.

    Returns:
        ``(sentences, skipped)``: ``skipped`` lists ``"<id or file:line>\\t<reason>"``.

    Raises:
        FileNotFoundError: naming ``path``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: LM text not found (a .jsonl manifest or a text file)")
    ids, offsets, skipped = array("i"), array("q", [0]), []
    for name, sentence, reason in encoded_sentences(path, vocab, units):
        if sentence is None:
            skipped.append(f"{name}\t{reason}")
        else:
            ids.extend(sentence)
            offsets.append(len(ids))
    return Sentences(np.array(ids, dtype=np.int32), np.array(offsets, dtype=np.int64)), skipped
