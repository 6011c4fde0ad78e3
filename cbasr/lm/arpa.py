"""Back-off n-gram language models read from ARPA files.

The ARPA format (Doug Paul's; written by SRILM, KenLM, MITLM): a ``\\data\\`` section with the
count of each order, then per order ``\\N-grams:`` lines ``log10 P  w_1 ... w_N  [log10 bo]``,
then ``\\end\\``. Katz back-off gives every word a probability after any history ``h``:

    P(w | h) = P*(w | h)                         if the n-gram h w is listed
             = bo(h) P(w | h[1:])                otherwise (bo(h) = 1 when h is not listed)

Probabilities are kept as natural logs (``ln 10`` times the file's values). Words are strings;
:class:`ArpaModel` numbers them in file order.
"""

import gzip
import math
from pathlib import Path

import numpy as np

__all__ = ["ArpaModel", "read_arpa", "ArpaError"]

_LN10 = math.log(10.0)


class ArpaError(ValueError):
    """A malformed ARPA file; the message names the file and line."""


class ArpaModel:
    """An n-gram back-off model.

    Attributes:
        order: the largest ``n``.
        words: the vocabulary, in the order of the unigrams.
        index: ``{word: id}``.
        ngrams: ``{(id, ...): (ln P*, ln bo)}`` over every order.
    """

    def __init__(
        self,
        order: int,
        words: list[str],
        ngrams: dict[tuple[int, ...], tuple[float, float]],
        source: str = "<memory>",
    ):
        self.order, self.words, self.ngrams, self.source = order, words, ngrams, source
        self.index = {w: i for i, w in enumerate(words)}
        self._children: dict[tuple[int, ...], dict[int, float]] = {}
        for gram, (log_p, _) in ngrams.items():
            if len(gram) > 1:
                self._children.setdefault(gram[:-1], {})[gram[-1]] = log_p
        self._unigrams = np.full(len(words), -np.inf)
        for i in range(len(words)):
            self._unigrams[i] = ngrams[(i,)][0]
        self._cache: dict[tuple[int, ...], np.ndarray] = {}

    def word_id(self, word: str) -> int:
        if word not in self.index:
            raise KeyError(f"{word!r} is not in the vocabulary of {self.source}")
        return self.index[word]

    def _truncate(self, history: tuple[int, ...]) -> tuple[int, ...]:
        """The last ``order - 1`` words: all an n-gram model reads."""
        return history[max(0, len(history) - (self.order - 1)) :] if self.order > 1 else ()

    def log_prob(self, word: int, history: tuple[int, ...]) -> float:
        """``ln P(word | history)`` by the back-off recursion (module docstring), one word."""
        history = self._truncate(history)
        gram = history + (word,)
        if gram in self.ngrams:
            return self.ngrams[gram][0]
        if not history:
            return -math.inf  # a word of the vocabulary always has a unigram
        return self.ngrams.get(history, (0.0, 0.0))[1] + self.log_prob(word, history[1:])

    def distribution(self, history: tuple[int, ...]) -> np.ndarray:
        """``ln P(w | history)`` for every word ``w``, ``(len(words),)``; cached per history.

        The same recursion as :meth:`log_prob`, for all words at once: the shorter history's
        distribution plus ``ln bo(history)``, overwritten by the n-grams listed after it.
        """
        history = self._truncate(history)
        cached = self._cache.get(history)
        if cached is not None:
            return cached
        if not history:
            dist = self._unigrams
        else:
            dist = self.distribution(history[1:]) + self.ngrams.get(history, (0.0, 0.0))[1]
            children = self._children.get(history)
            if children:
                dist = dist.copy()
                dist[list(children)] = list(children.values())
        self._cache[history] = dist
        return dist

    def sentence_log_prob(self, words: list[str]) -> float:
        """``ln P(<s> words </s>)``: every word and the end of sentence, after ``<s>``."""
        ids = [self.word_id("<s>")] + [self.word_id(w) for w in words] + [self.word_id("</s>")]
        return sum(self.log_prob(w, tuple(ids[:i])) for i, w in enumerate(ids) if i > 0)


def _open(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_arpa(path: str | Path) -> ArpaModel:
    """Read an ARPA file (optionally gzipped).

    Raises:
        FileNotFoundError: no such file.
        ArpaError: a malformed file, naming it and the line: no ``\\data\\`` header, a line
            that is not ``log10 P words [log10 bo]``, an n-gram over a word that has no unigram,
            counts that differ from the header, no ``<s>`` or ``</s>``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: ARPA language model not found")
    counts: dict[int, int] = {}
    seen: dict[int, int] = {}
    words: list[str] = []
    index: dict[str, int] = {}
    ngrams: dict[tuple[int, ...], tuple[float, float]] = {}
    section = None  # None before \data\, 0 inside it, n inside \n-grams:
    with _open(path) as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.strip()
            where = f"{path}:{lineno}"
            if not line:
                continue
            if line == "\\data\\":
                section = 0
                continue
            if section is None:
                continue  # text before \data\ is a comment
            if line == "\\end\\":
                break
            if line.startswith("\\") and line.endswith("-grams:"):
                try:
                    section = int(line[1 : -len("-grams:")])
                except ValueError:
                    raise ArpaError(f"{where}: bad section header {line!r}") from None
                if section not in counts:
                    raise ArpaError(f"{where}: {section}-grams are not announced in \\data\\")
                seen[section] = 0
                continue
            if section == 0:
                if not line.startswith("ngram ") or "=" not in line:
                    raise ArpaError(f"{where}: expected 'ngram N=count' in \\data\\, got {line!r}")
                n, _, count = line[len("ngram ") :].partition("=")
                try:
                    counts[int(n)] = int(count)
                except ValueError:
                    raise ArpaError(f"{where}: bad count line {line!r}") from None
                continue
            fields = line.split()
            n = section
            if len(fields) not in (n + 1, n + 2):
                raise ArpaError(
                    f"{where}: a {n}-gram line needs 'log10 P' and {n} words (and an optional "
                    f"back-off), got {line!r}"
                )
            try:
                log_p = float(fields[0]) * _LN10
                backoff = float(fields[n + 1]) * _LN10 if len(fields) == n + 2 else 0.0
            except ValueError:
                raise ArpaError(f"{where}: not a number in {line!r}") from None
            gram_words = fields[1 : n + 1]
            if n == 1:
                if gram_words[0] in index:
                    raise ArpaError(f"{where}: unigram {gram_words[0]!r} is listed twice")
                index[gram_words[0]] = len(words)
                words.append(gram_words[0])
            missing = [w for w in gram_words if w not in index]
            if missing:
                raise ArpaError(
                    f"{where}: {n}-gram {' '.join(gram_words)!r} uses {missing[0]!r}, "
                    "which has no unigram"
                )
            ngrams[tuple(index[w] for w in gram_words)] = (log_p, backoff)
            seen[n] += 1
    if section is None:
        raise ArpaError(f"{path}: no \\data\\ header: not an ARPA file")
    for n, count in counts.items():
        if seen.get(n, 0) != count:
            raise ArpaError(
                f"{path}: \\data\\ announces {count} {n}-grams but the file lists {seen.get(n, 0)}"
            )
    for symbol in ("<s>", "</s>"):
        if symbol not in index:
            raise ArpaError(f"{path}: no {symbol} unigram")
    return ArpaModel(max(counts), words, ngrams, source=str(path))
