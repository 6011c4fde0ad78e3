"""WSJ's language-model data (CSR-II WSJ1, disc 13-32.1, ``wsj1/doc/lng_modl``).

- The LM training text, ``lm_train/np_data/{87,88,89}/*.z``: about 37 million words of WSJ
  newswire, 1987-89, with non-verbalised punctuation, Unix-``compress``ed. Lines that start
  with ``<`` are document markup; every other line is a sentence. It is normalised as the
  acoustic transcripts are (:func:`cbasr.corpora.wsj.normalize_transcript`: upper case,
  backslashes dropped, noise markers removed) into ``lm_train.txt``, one sentence per line,
  so that its characters or sentencepiece pieces are the acoustic model's.
- The baseline back-off n-grams, ``base_lm/*.z`` (ARPA, e.g. ``bcb20onp`` and ``tcb20onp``:
  the 20k closed-vocabulary bigram and trigram with non-verbalised punctuation that Kaldi's WSJ
  recipe decodes with), written as ``<name>.arpa.gz``.

``.z`` files are read with the system's ``gzip -dc`` when there is one (fast), else with
``unlzw3`` (pure Python). Everything is found on its disc directory, any disc, or a flat copy,
in either case (:class:`cbasr.corpora.wsj._Layout`).
"""

import gzip
import json
import logging
import shutil
import subprocess
from pathlib import Path

from cbasr.corpora.prepare import CorpusError, EmptySplitError, corpus_error, walk_files
from cbasr.corpora.wsj import NOISE_TOKENS, _Layout, normalize_transcript
from cbasr.storage.files import atomic_write, write_json

__all__ = ["LM_DIR", "read_compressed", "normalize_lm_line", "prepare_wsj_lm"]

log = logging.getLogger(__name__)

LM_DIR = ("13-32.1", "wsj1/doc/lng_modl")  # (disc, path on it)
TEXT_YEARS = ("87", "88", "89")
DONE = ".done"


def read_compressed(path: str | Path) -> bytes:
    """The contents of a Unix-``compress`` (``.z``/``.Z``) file; a plain file as it is.

    Raises:
        CorpusError: naming the file, when it is neither plain nor readable as compressed.
    """
    path = Path(path)
    data = path.read_bytes()
    if data[:2] != b"\x1f\x9d":  # compress's magic number
        return data
    gzip_binary = shutil.which("gzip")
    if gzip_binary is not None:
        run = subprocess.run([gzip_binary, "-dc", str(path)], capture_output=True)
        if run.returncode == 0:
            return run.stdout
    import unlzw3

    try:
        return unlzw3.unlzw(data)
    except Exception as error:  # unlzw3 raises plain ValueError/IndexError on damage
        raise CorpusError(f"{path}: not a readable compressed file ({error})") from error


def normalize_lm_line(line: str) -> list[str]:
    """The words of one text line of the LM corpus, normalised like an acoustic transcript
    (noise markers dropped); ``[]`` for markup and blank lines."""
    line = line.strip()
    if not line or line.startswith("<"):
        return []
    return [t for t in normalize_transcript(line) if t not in NOISE_TOKENS]


def _find_lm_dir(corpus_dir: Path) -> Path:
    layout = _Layout(corpus_dir)
    disc, relative = LM_DIR
    candidates = [corpus_dir / disc / relative, *(d / relative for d in layout.discs)]
    candidates.append(corpus_dir / relative)
    for path in candidates:
        for variant in (path, layout.upper_inside(path)):
            if variant.is_dir():
                return variant
    raise corpus_error(
        "WSJ with its LM data",
        corpus_dir,
        f"{disc}/{relative} (WSJ1's language-model disc, or {relative} in a flat copy)",
        "no such directory",
    )


def _by_name(directory: Path, *parts: str) -> Path | None:
    """``directory/parts...`` matched case-insensitively, or None."""
    for part in parts:
        if not directory.is_dir():
            return None
        match = [p for p in directory.iterdir() if p.name.lower() == part.lower()]
        if not match:
            return None
        directory = match[0]
    return directory


def prepare_wsj_lm(corpus_dir: str | Path, out_dir: str | Path, strict: bool = True) -> dict:
    """Write ``lm_train.txt`` and ``<name>.arpa.gz`` of every ``base_lm/*.z`` into ``out_dir``.

    Args:
        strict: require the three years of LM text (``87``, ``88``, ``89``) and the base LMs;
            False prepares what the copy holds.

    Returns:
        The summary, also written to ``out_dir/.done``: files, sentences, words, markup and
        empty lines skipped, the ARPA files written.

    Raises:
        CorpusError: no LM directory, or (strict) a year or ``base_lm`` missing; a damaged
            ``.z`` file, named; :class:`~cbasr.corpora.prepare.EmptySplitError` when no
            sentence is left.
    """
    corpus_dir, out = Path(corpus_dir), Path(out_dir)
    params = {"corpus": "wsj_lm", "corpus_dir": str(corpus_dir.resolve()), "strict": strict}
    done = out / DONE
    if done.is_file():
        summary = json.loads(done.read_text())
        written = [out / "lm_train.txt", *(out / name for name in summary.get("arpa", []))]
        if summary.get("params") == params and all(p.is_file() for p in written):
            log.info("%s: WSJ LM data complete, nothing to do", out)
            return summary
    lm_dir = _find_lm_dir(corpus_dir)
    years = {year: _by_name(lm_dir, "lm_train", "np_data", year) for year in TEXT_YEARS}
    base_lm = _by_name(lm_dir, "base_lm")
    missing = [f"lm_train/np_data/{y}" for y, d in years.items() if d is None]
    missing += [] if base_lm is not None else ["base_lm"]
    if strict and missing:
        raise corpus_error(
            "WSJ's LM data",
            lm_dir,
            "lm_train/np_data/{87,88,89}/*.z and base_lm/*.z",
            f"no {', '.join(missing)}; pass --allow-partial to prepare what is there",
        )
    files = [
        p
        for d in years.values()
        if d is not None
        for p in walk_files(d)
        if p.suffix.lower() == ".z"
    ]
    compressed_lms = [p for p in walk_files(base_lm) if p.suffix.lower() == ".z"] if base_lm else []
    if strict and (not files or not compressed_lms):
        raise corpus_error(
            "WSJ's LM data",
            lm_dir,
            "lm_train/np_data/{87,88,89}/*.z and base_lm/*.z",
            f"{len(files)} text files and {len(compressed_lms)} ARPA files; pass "
            "--allow-partial to prepare what is there",
        )
    out.mkdir(parents=True, exist_ok=True)
    counts = {"files": len(files), "sentences": 0, "words": 0, "skipped_lines": 0}

    def write_text(f) -> None:
        for path in files:
            for line in read_compressed(path).decode("latin-1").splitlines():
                words = normalize_lm_line(line)
                if not words:
                    counts["skipped_lines"] += 1
                    continue
                f.write(" ".join(words) + "\n")
                counts["sentences"] += 1
                counts["words"] += len(words)

    atomic_write(out / "lm_train.txt", write_text)
    if not counts["sentences"]:
        raise EmptySplitError(
            f"split lm_train: no usable sentence in {len(files)} text files, "
            f"{counts['skipped_lines']} markup or empty lines skipped"
            + ("" if files else f" (none under {lm_dir}/lm_train/np_data)")
        )
    arpas = []
    for path in compressed_lms:
        name = path.name.split(".")[0].lower() + ".arpa.gz"
        data = read_compressed(path)
        atomic_write(out / name, lambda f, data=data: f.write(gzip.compress(data, 6)), "wb")
        arpas.append(name)
    summary = {"params": params, **counts, "arpa": arpas, "missing": missing}
    write_json(done, summary)
    log.info(
        "%s: %d sentences (%d words) from %d files, %d markup or empty lines skipped; ARPA: %s",
        out,
        counts["sentences"],
        counts["words"],
        counts["files"],
        counts["skipped_lines"],
        ", ".join(arpas) or "none",
    )
    return summary
