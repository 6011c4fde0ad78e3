"""Token inventories for phone and character targets.

A vocabulary file lists one token per line; line ``i`` is id ``i``. Id 0 is always the
blank ``<blk>`` (used by CTC and transducers; CB models ignore it).
"""

import functools
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from cbasr.storage.files import write_text

__all__ = [
    "BLANK",
    "SENTENCEPIECE",
    "Vocabulary",
    "tokens_of",
    "tokens_to_words",
    "train_sentencepiece",
]

BLANK = "<blk>"


SENTENCEPIECE = "sp:"  # units "sp:<model file>": sentencepiece pieces of the words


@functools.lru_cache(maxsize=8)
def _sentencepiece(path: str):
    import sentencepiece

    if not Path(path).is_file():
        raise FileNotFoundError(f"sentencepiece model {path} not found (units 'sp:{path}')")
    return sentencepiece.SentencePieceProcessor(model_file=path)


def tokens_of(record: dict, units: str, field: str = "words") -> list[str]:
    """The target token sequence of a manifest record.

    Args:
        units: ``"phones"`` or ``"phones_full"`` (a list field of the record), ``"words"``
            (whitespace-split transcript), ``"chars"`` (characters, ``|`` between words) or
            ``"sp:<model>"`` (the pieces of a sentencepiece model, ``\u2581`` starting a word).
        field: the text field for word, character and piece units (``"source"`` for the input
            side of a text-to-text corpus).
    """
    if units == "words":
        return record[field].split()
    if units == "chars":
        return list("|".join(record[field].split()))
    if units.startswith(SENTENCEPIECE):
        return _sentencepiece(units[len(SENTENCEPIECE) :]).encode(record[field], out_type=str)
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


def tokens_to_words(tokens: list[str], units: str) -> list[str]:
    """The words a token sequence spells, for word error rates: characters are joined and
    split at ``|``, sentencepiece pieces at ``\u2581``; word units are words already. Phone
    units have no words: the tokens are returned."""
    if units == "chars":
        return [w for w in "".join(tokens).split("|") if w]
    if units.startswith(SENTENCEPIECE):
        return "".join(tokens).replace("\u2581", " ").split()
    return list(tokens)


def train_sentencepiece(
    texts: Iterable[str], model_prefix: str | Path, vocab_size: int, model_type: str = "unigram"
) -> Path:
    """Train a sentencepiece model on ``texts`` (one sentence each); returns the model file.

    Deterministic for the same input (one thread, no sentence sampling).
    """
    import sentencepiece

    model_prefix = Path(model_prefix)
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(list(texts)),
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        num_threads=1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        minloglevel=2,
        hard_vocab_limit=False,
    )
    return model_prefix.with_suffix(".model")
