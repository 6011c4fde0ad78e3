"""WSJ (CSR-I WSJ0 LDC93S6 and CSR-II WSJ1 LDC94S13): manifests for si84, si284, dev93,
eval92 and eval93 from the corpus's own ``.ndx`` indices and ``.dot`` transcripts.

Copies come as disc directories (``11-13.1/wsj0/...``, ``13-34.1/wsj1/...``) or flattened
(``wsj0/...``, ``wsj1/...``); both work, in either case of file names. Index entries
``11_2_1:wsj0/si_tr_s/011/011c0201.wv1`` (WSJ1: ``13_34_1: /wsj1/...``; eval92: no ``.wv1``)
name a disc and a path; the path is looked up on that disc, then on any disc (eval93's index
names disc 13_32_1 but the audio is on 13-33.1), then in the flat layout.

Audio stays where it is (``.wv1``, Shorten-compressed SPHERE; :mod:`cbasr.data.audio` decodes
it through ffmpeg). Transcripts are normalised by Kaldi's rules (:func:`normalize_transcript`);
``words`` drops the noise markers (what WER is scored on), ``words_with_noise`` keeps them.
"""

import logging
import re
from pathlib import Path

from cbasr.corpora.prepare import DurationFilter, PreparedCorpus, corpus_error, walk_files
from cbasr.data.audio import AudioError
from cbasr.data.sphere import SphereError, read_header

__all__ = [
    "INDICES",
    "EXPECTED",
    "SPLITS",
    "normalize_transcript",
    "read_index",
    "read_dots",
    "prepare_wsj",
]

log = logging.getLogger(__name__)

# Split -> (disc, index path on that disc) of each index it unites.
INDICES = {
    "si84": [("11-13.1", "wsj0/doc/indices/train/tr_s_wv1.ndx")],
    "si284": [
        ("11-13.1", "wsj0/doc/indices/train/tr_s_wv1.ndx"),
        ("13-34.1", "wsj1/doc/indices/si_tr_s.ndx"),
    ],
    "dev93": [("13-34.1", "wsj1/doc/indices/h1_p0.ndx")],
    "eval92": [("11-13.1", "wsj0/doc/indices/test/nvp/si_et_20.ndx")],
    "eval93": [("13-32.1", "wsj1/doc/indices/wsj1/eval/h1_p0.ndx")],
}
SPLITS = tuple(INDICES)
# Utterances per split in the full corpus, after the exclusions below.
EXPECTED = {"si84": 7138, "si284": 37414, "dev93": 503, "eval92": 333, "eval93": 213}
EXCLUDED_SPEAKER_DIRS = {"si84": {"401"}, "si284": {"401"}}  # si84 minus speaker 401 (Kaldi)
SPOKEN_NOISE = {"[AH]", "[UH]", "[UM]", "[EH]", "[CROSS_TALK]", "[UNINTELLIGIBLE]"}
NOISE_TOKENS = ("<NOISE>", "<SPOKEN_NOISE>")


def normalize_transcript(text: str) -> list[str]:
    """Kaldi's WSJ normalisation of one ``.dot`` transcript (without its ``(uttid)``).

    Upper case; backslashes dropped (``I\\.`` -> ``I.``); ``%PERCENT`` -> ``PERCENT`` and
    ``.POINT`` -> ``POINT``; noise markers with ``<``, ``>`` or ``/`` inside the brackets
    (overlapping noise), ``~`` and a lone ``.`` deleted; spoken noise (``[UM]``, ...) ->
    ``<SPOKEN_NOISE>``; other ``[...]`` -> ``<NOISE>``; ``<word>`` (a word the speaker left
    out) -> ``word``; ``--DASH`` -> ``-DASH``; verbalised punctuation (``,COMMA``) kept.
    """
    out = []
    for token in text.upper().replace("\\", "").split():
        if token in ("~", "."):
            continue
        if token.startswith("[") and token.endswith("]"):
            inner = token[1:-1]
            if any(c in inner for c in "<>/"):
                continue  # [<noise] [noise>] [noise/] [/noise]: noise overlapping speech
            out.append("<SPOKEN_NOISE>" if token in SPOKEN_NOISE else "<NOISE>")
            continue
        if token.startswith("<") and token.endswith(">") and len(token) > 2:
            token = token[1:-1]
        if token in ("%PERCENT", ".POINT"):
            token = token[1:]
        elif token.startswith("--"):
            token = token[1:]
        out.append(token)
    return out


def read_index(path: Path) -> list[tuple[str, str]]:
    """``(disc directory, path on the disc)`` of every entry of an ``.ndx`` file."""
    entries = []
    for lineno, line in enumerate(path.read_text(encoding="latin-1").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith(";"):
            continue
        disc, sep, rest = line.partition(":")
        if not sep:
            raise ValueError(f"{path}:{lineno}: expected '<disc>:<path>', got {line!r}")
        disc = re.sub(r"^(\d+)_(\d+)_(\d+)$", r"\1-\2.\3", disc.strip())
        rest = rest.strip().lstrip("/")
        if not rest.lower().endswith(".wv1"):
            rest += ".wv1"
        entries.append((disc, rest))
    return entries


def read_dots(root: Path) -> dict[str, str]:
    """``{utterance id: raw transcript}`` from every ``.dot`` file under ``root``."""
    texts = {}
    for dot in (p for p in walk_files(root) if p.suffix.lower() == ".dot"):
        for line in dot.read_text(encoding="latin-1").splitlines():
            match = re.match(r"^(.*)\((\w+)\)\s*$", line)
            if match:
                texts[match.group(2).lower()] = match.group(1).strip()
    return texts


class _Layout:
    """Resolves index files and audio paths in a disc-directory or a flat copy."""

    def __init__(self, root: Path):
        self.root = root
        self.discs = sorted(
            p for p in root.iterdir() if p.is_dir() and re.match(r"^\d+-\d+\.\d+$", p.name)
        )
        self.flat = [
            root / name for name in ("wsj0", "wsj1", "WSJ0", "WSJ1") if (root / name).is_dir()
        ]
        if not self.discs and not self.flat:
            found = (
                sorted(p.name for p in root.iterdir())
                if root.is_dir()
                else "nothing (no such directory)"
            )
            raise corpus_error(
                "WSJ", root, "disc directories (11-13.1, 13-34.1, ...) or wsj0/ and wsj1/", found
            )

    def find(self, disc: str, relative: str) -> Path | None:
        candidates = (
            [self.root / disc / relative]
            + [d / relative for d in self.discs]
            + [self.root / relative]
        )
        for path in candidates:
            for variant in (path, path.with_name(path.name.upper()), self.upper_inside(path)):
                if variant.is_file():
                    return variant
        return None

    def upper_inside(self, path: Path) -> Path:
        """``path`` with its part inside the corpus upper-cased (upper-case copies of the
        discs), the corpus's own location left as it is."""
        try:
            return self.root / str(path.relative_to(self.root)).upper()
        except ValueError:
            return path


def _utterance(path: Path, utt: str, transcripts: dict[str, str]) -> dict:
    if utt not in transcripts:
        raise ValueError(f"{path}: no transcript for {utt} in any .dot file")
    tokens = normalize_transcript(transcripts[utt])
    words = [t for t in tokens if t not in NOISE_TOKENS]
    if not words:
        raise ValueError(f"{path}: empty transcript for {utt}")
    try:
        header = read_header(path)
    except SphereError as e:
        raise AudioError(str(e)) from e
    if "sample_count" not in header:
        raise AudioError(f"{path}: SPHERE header without sample_count")
    return {
        "id": utt,
        "audio": str(path.resolve()),
        "speaker": utt[:3],
        "duration": round(header["sample_count"] / header.get("sample_rate", 16000), 4),
        "words": " ".join(words),
        "words_with_noise": " ".join(tokens),
    }


def prepare_wsj(
    corpus_dir: str | Path,
    out_dir: str | Path,
    strict: bool = True,
    durations: DurationFilter | None = None,
) -> dict:
    """Write ``si84/si284/dev93/eval92/eval93.jsonl`` into ``out_dir``.

    Args:
        strict: require the full corpus's utterance counts (:data:`EXPECTED`); False prepares
            whatever the indices name and the copy holds.

    Raises:
        CorpusError: not a WSJ copy, an index missing, or (strict) counts other than expected.
    """
    corpus_dir = Path(corpus_dir)
    out = PreparedCorpus(out_dir, SPLITS, durations)
    params = {"corpus": "wsj", "corpus_dir": str(corpus_dir.resolve()), "strict": strict}
    if out.is_complete(params):
        log.info("%s: WSJ manifests complete, nothing to do", out_dir)
        return out.summary()
    layout = _Layout(corpus_dir)
    transcripts = read_dots(corpus_dir)
    records: dict[str, list[dict]] = {split: [] for split in SPLITS}
    skipped: list[tuple[str, str, str]] = []
    missing_audio: dict[str, int] = {}
    for split, indices in INDICES.items():
        seen = set()
        for disc, index in indices:
            path = layout.find(disc, index)
            if path is None:
                raise corpus_error(
                    "WSJ",
                    corpus_dir,
                    f"the {split} index {disc}/{index}",
                    "no such file (disc or flat layout)",
                )
            for entry_disc, relative in read_index(path):
                parts = relative.lower().split("/")
                utt = Path(parts[-1]).stem
                if utt in seen or parts[-2] in EXCLUDED_SPEAKER_DIRS.get(split, ()):
                    continue
                seen.add(utt)
                audio = layout.find(entry_disc, relative)
                if audio is None:
                    missing_audio[split] = missing_audio.get(split, 0) + 1
                    skipped.append((split, utt, f"audio {entry_disc}/{relative} not found"))
                    continue
                try:
                    records[split].append(_utterance(audio, utt, transcripts))
                except (AudioError, ValueError) as e:
                    skipped.append((split, utt, str(e)))
    counts = {split: len(r) for split, r in records.items()}
    if strict and counts != EXPECTED:
        raise corpus_error(
            "WSJ",
            corpus_dir,
            f"utterances per split {EXPECTED}",
            f"{counts} ({missing_audio or 'no'} audio missing); pass --allow-partial "
            "to prepare what is there",
        )
    return out.write(params, records, skipped)
