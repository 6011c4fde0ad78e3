"""Token inventories for phone and character targets.

A vocabulary file lists one token per line; line ``i`` is id ``i``. Id 0 is always the
blank ``<blk>`` (used by CTC and transducers; CB models ignore it).
"""

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from cbasr.fileio import write_text

__all__ = ["BLANK", "Vocabulary", "tokens_of"]

BLANK = "<blk>"


def tokens_of(record: dict, units: str) -> list[str]:
    """The target token sequence of a manifest record.

    Args:
        units: ``"phones"`` or ``"phones_full"`` (a list field of the record), ``"words"``
            (whitespace-split transcript) or ``"chars"`` (characters, ``|`` between words).
    """
    if units == "words":
        return record["words"].split()
    if units == "chars":
        return list("|".join(record["words"].split()))
    if units not in record:
        raise KeyError(f"utterance {record.get('id', '?')!r} has no {units!r} field")
    return list(record[units])


class Vocabulary:
    """Bijection between tokens and integer ids, with the blank at id 0."""

    def __init__(self, tokens: Iterable[str]):
        self.tokens = [BLANK] + [t for t in tokens if t != BLANK]
        self._ids = {t: i for i, t in enumerate(self.tokens)}
        if len(self._ids) != len(self.tokens):
            raise ValueError("vocabulary has duplicate tokens")

    @classmethod
    def build(cls, token_lists: Iterable[list[str]]) -> "Vocabulary":
        """Every token seen, most frequent first (ties alphabetical), after the blank."""
        counts = Counter(t for tokens in token_lists for t in tokens)
        return cls(sorted(counts, key=lambda t: (-counts[t], t)))

    @classmethod
    def load(cls, path: str | Path) -> "Vocabulary":
        tokens = Path(path).read_text(encoding="utf-8").split("\n")
        tokens = [t for t in tokens if t]
        if not tokens or tokens[0] != BLANK:
            raise ValueError(f"{path}: a vocabulary file must start with {BLANK}")
        return cls(tokens[1:])

    def save(self, path: str | Path) -> None:
        write_text(path, "".join(t + "\n" for t in self.tokens))

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self._ids

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Ids of ``tokens``; raises ``KeyError`` naming the first unknown token."""
        try:
            return [self._ids[t] for t in tokens]
        except KeyError as e:
            raise KeyError(f"token {e.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.tokens[i] for i in ids]
