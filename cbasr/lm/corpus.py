"""Sentences for language-model training: token lists from manifests or plain text files.

- ``*.jsonl``: a cbasr manifest; each utterance's tokens are its ``units`` field (``phones``,
  ``phones_full``, ``words`` or ``chars``, as :func:`cbasr.data.vocab.tokens_of` reads them);
- any other file: one sentence per line (blank lines skipped): for ``chars`` and sentencepiece
  (``sp:<model>``) units a line is text, spelled as a transcript is (so the LM text of a
  character or piece recogniser is plain words, e.g. ``cbasr-prepare wsj-lm``'s
  ``lm_train.txt``); for other units, tokens separated by whitespace.

Sentences with tokens outside the vocabulary are skipped and counted, with their ids (or line
numbers) in the returned summary.
"""

from pathlib import Path

from cbasr.data.manifest import read_manifest
from cbasr.data.vocab import SENTENCEPIECE, Vocabulary, tokens_of

__all__ = ["read_sentences"]


def read_sentences(
    path: str | Path, vocab: Vocabulary, units: str = "phones"
) -> tuple[list[list[int]], list[str]]:
    """Token id sequences (ids ``1 .. V-1``) of every usable sentence in ``path``.

    Returns:
        ``(sentences, skipped)``: ``skipped`` lists ``"<id or file:line>\\t<reason>"``.

    Raises:
        FileNotFoundError: naming ``path``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: LM text not found (a .jsonl manifest or a text file)")
    if path.suffix == ".jsonl":
        items = [(r["id"], tokens_of(r, units)) for r in read_manifest(path)]
    else:
        spelled = units == "chars" or units.startswith(SENTENCEPIECE)
        with open(path, encoding="utf-8") as f:
            items = [
                (
                    f"{path}:{n}",
                    tokens_of({"words": line}, units) if spelled else line.split(),
                )
                for n, line in enumerate(f, start=1)
                if line.strip()
            ]
    sentences, skipped = [], []
    for name, tokens in items:
        unknown = [t for t in tokens if t not in vocab or vocab.encode([t])[0] == 0]
        if unknown:
            skipped.append(f"{name}\ttoken {unknown[0]!r} not in the vocabulary")
        elif not tokens:
            skipped.append(f"{name}\tempty")
        else:
            sentences.append(vocab.encode(tokens))
    return sentences, skipped
