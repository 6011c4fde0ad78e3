"""Gigaword headline generation (Rush et al., 2015): manifests of (article, headline) pairs.

Both released layouts of the preprocessed pairs:

- ``org_data/{train,dev,test}.{src,tgt}.txt`` (aligned lines);
- ``sumdata/train/{train.article.txt, train.title.txt, valid.article.filter.txt,
  valid.title.filter.txt}`` with the test set in ``sumdata/Giga/{input.txt, task1_ref0.txt}``.

Each file may be gzip-compressed (``train.article.txt.gz``, as the ``sumdata`` release is often
kept), and ``--corpus-dir`` may name the layout's directory itself (``.../sumdata``) or its
parent. The text is already lower-cased and tokenised (digits as ``#``, rare words ``<unk>``, test
``UNK``): it is kept as is. A manifest line is ``{"id", "source", "words", "speaker"}``:
``source`` the article's first sentence (the model's input, one frame per source token after
the token-embedding front end), ``words`` the headline (the target). Splits: train, dev, test.
"""

import gzip
import logging
from itertools import zip_longest
from pathlib import Path

from cbasr.corpora.prepare import PreparedCorpus, corpus_error

__all__ = ["LAYOUTS", "EXPECTED", "prepare_gigaword"]

log = logging.getLogger(__name__)

# Layout name -> split -> (source file, target file), relative to the corpus directory.
LAYOUTS = {
    "org_data": {
        split: (f"org_data/{split}.src.txt", f"org_data/{split}.tgt.txt")
        for split in ("train", "dev", "test")
    },
    "sumdata": {
        "train": ("sumdata/train/train.article.txt", "sumdata/train/train.title.txt"),
        "dev": ("sumdata/train/valid.article.filter.txt", "sumdata/train/valid.title.filter.txt"),
        "test": ("sumdata/Giga/input.txt", "sumdata/Giga/task1_ref0.txt"),
    },
}
EXPECTED = {"train": 3_803_957, "dev": 189_651, "test": 1_951}


def _file(root: Path, relative: str) -> Path | None:
    """``root / relative``, or its gzip-compressed ``.gz`` copy; None if neither exists."""
    for path in (root / relative, root / f"{relative}.gz"):
        if path.is_file():
            return path
    return None


def _open(path: Path):
    return (
        gzip.open(path, "rt", encoding="utf-8")
        if path.suffix == ".gz"
        else open(path, encoding="utf-8")
    )


def _find_layout(corpus_dir: Path) -> tuple[Path, str]:
    roots = (
        (corpus_dir, *sorted(p for p in corpus_dir.iterdir() if p.is_dir()), corpus_dir.parent)
        if corpus_dir.is_dir()
        else ()
    )
    for root in roots:
        for name, files in LAYOUTS.items():
            if all(_file(root, src) and _file(root, tgt) for src, tgt in files.values()):
                return root, name
    found = (
        sorted(p.name for p in corpus_dir.iterdir())
        if corpus_dir.is_dir()
        else "nothing (no such directory)"
    )
    expected = (
        " or ".join(
            f"{name}/ with " + ", ".join(f for pair in files.values() for f in pair)
            for name, files in LAYOUTS.items()
        )
        + " (each plain or .gz)"
    )
    raise corpus_error("Gigaword", corpus_dir, expected, found)


def _pairs(root: Path, source: str, target: str, split: str, skipped: list):
    """Aligned (id, source, target) lines; a length mismatch is an error naming both files."""
    with _open(_file(root, source)) as src, _open(_file(root, target)) as tgt:
        for n, (article, title) in enumerate(zip_longest(src, tgt), start=1):
            if article is None or title is None:
                raise corpus_error(
                    "Gigaword",
                    root,
                    f"{source} and {target} with one line per pair",
                    f"{'the source' if article is None else 'the target'} ends at line {n - 1}",
                )
            utt = f"{split}-{n:07d}"
            article, title = article.split(), title.split()
            if not article or not title:
                skipped.append(
                    (
                        split,
                        utt,
                        f"empty {'article' if not article else 'headline'} "
                        f"(line {n} of {source if not article else target})",
                    )
                )
                continue
            yield {
                "id": utt,
                "source": " ".join(article),
                "words": " ".join(title),
                "speaker": split,
            }


def prepare_gigaword(corpus_dir: str | Path, out_dir: str | Path, strict: bool = True) -> dict:
    """Write ``train/dev/test.jsonl`` into ``out_dir``.

    Args:
        strict: require the released sizes (:data:`EXPECTED`, empty lines included).

    Raises:
        CorpusError: neither layout, misaligned files, or (strict) other sizes.
    """
    corpus_dir = Path(corpus_dir)
    out = PreparedCorpus(out_dir, ("train", "dev", "test"))
    params = {"corpus": "gigaword", "corpus_dir": str(corpus_dir.resolve()), "strict": strict}
    if out.is_complete(params):
        log.info("%s: Gigaword manifests complete, nothing to do", out_dir)
        return out.summary()
    root, layout = _find_layout(corpus_dir)
    log.info("Gigaword in the %s layout under %s", layout, root)
    skipped: list[tuple[str, str, str]] = []
    records = {
        split: list(_pairs(root, source, target, split, skipped))
        for split, (source, target) in LAYOUTS[layout].items()
    }
    found = {split: len(r) + sum(s == split for s, _, _ in skipped) for split, r in records.items()}
    if strict and found != EXPECTED:
        raise corpus_error(
            "Gigaword",
            corpus_dir,
            f"pairs per split {EXPECTED}",
            f"{found}; pass --allow-partial to prepare a subset",
        )
    return out.write(params, records, skipped)
