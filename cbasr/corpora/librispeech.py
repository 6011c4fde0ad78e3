"""LibriSpeech (Panayotov et al. 2015, "Librispeech: an ASR corpus based on public domain audio
books", ICASSP) and Mini LibriSpeech: downloads from OpenSLR and manifests.

Every archive unpacks to ``LibriSpeech/<subset>/<speaker>/<chapter>/`` with
``<speaker>-<chapter>-<utt>.flac`` files and one ``<speaker>-<chapter>.trans.txt`` of
``<utterance id> WORDS ...`` lines; ``LibriSpeech/SPEAKERS.TXT`` has each reader's sex. The
subsets are found where users keep them: ``--corpus-dir`` is the ``LibriSpeech/`` folder, or
holds it (one level deeper), or holds one extracted folder per archive
(``<dir>/<anything>/LibriSpeech/<subset>``); several subsets merged into one ``LibriSpeech/``
are the usual case.

Manifests are written per subset (``train-clean-100.jsonl``, ``dev-clean.jsonl``, ...), with
the unions ``train-460.jsonl`` (train-clean-100 + train-clean-360) and ``train-960.jsonl``
(+ train-other-500) when their parts are there. Transcripts are kept as published (upper case,
apostrophes); speakers come from the path, ``gender`` (``m``/``f``) from SPEAKERS.TXT when it
is present.
"""

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import soundfile

from cbasr.corpora.download import Remote, extract_tar, fetch
from cbasr.corpora.prepare import DurationFilter, PreparedCorpus, corpus_error
from cbasr.progress import progress_bar

__all__ = [
    "OPENSLR",
    "SUBSETS",
    "TRAIN_SETS",
    "LM_FILES",
    "Subset",
    "subset_remote",
    "lm_remote",
    "download_librispeech",
    "find_subsets",
    "read_speakers",
    "prepare_librispeech",
]

log = logging.getLogger(__name__)
OPENSLR = "https://www.openslr.org/resources"


@dataclass(frozen=True)
class Subset:
    """One downloadable subset: its OpenSLR resource, published checksum and sizes (speakers
    None where no count is published)."""

    resource: int
    utterances: int
    speakers: int | None
    sha256: str | None = None
    md5: str | None = None


# Checksums as published: SHA-256 for SLR12 (the sums torchaudio's LIBRISPEECH dataset checks),
# MD5 for SLR31 (OpenSLR's md5sum.txt). Utterance and speaker counts of the LibriSpeech paper's
# Table 1 and the distributed trees; Mini LibriSpeech publishes no speaker counts.
SUBSETS = {
    "train-clean-5": Subset(31, 1519, None, md5="5df7d4e78065366204ca6845bb08f490"),
    "dev-clean-2": Subset(31, 1089, None, md5="6d7ab67ac6a1d2c993d050e16d61080d"),
    "train-clean-100": Subset(
        12, 28539, 251, "d4ddd1d5a6ab303066f14971d768ee43278a5f2a0aa43dc716b0e64ecbbbf6e2"
    ),
    "train-clean-360": Subset(
        12, 104014, 921, "146a56496217e96c14334a160df97fffedd6e0a04e66b9c5af0d40be3c792ecf"
    ),
    "train-other-500": Subset(
        12, 148688, 1166, "ddb22f27f96ec163645d53215559df6aa36515f26e01dd70798188350adcb6d2"
    ),
    "dev-clean": Subset(
        12, 2703, 40, "76f87d090650617fca0cac8f88b9416e0ebf80350acb97b343a85fa903728ab3"
    ),
    "dev-other": Subset(
        12, 2864, 33, "12661c48e8c3fe1de2c1caa4c3e135193bfb1811584f11f569dd12645aa84365"
    ),
    "test-clean": Subset(
        12, 2620, 40, "39fde525e59672dc6d1551919b1478f724438a95aa55f874b576be21967e6c23"
    ),
    "test-other": Subset(
        12, 2939, 33, "d09c181bba5cf717b3dee7d4d592af11a3ee3a09e08ae025c5506f6ebe961c29"
    ),
}
# The training sets by the recipe's --train-set, and the unions written beside the subsets.
TRAIN_SETS = {
    "mini": ("train-clean-5",),
    "100": ("train-clean-100",),
    "460": ("train-clean-100", "train-clean-360"),
    "960": ("train-clean-100", "train-clean-360", "train-other-500"),
}
UNIONS = {"train-460": TRAIN_SETS["460"], "train-960": TRAIN_SETS["960"]}
# SLR11: the LibriSpeech language-model resources (no checksums published: gzip-checked).
LM_FILES = (
    "3-gram.arpa.gz",
    "3-gram.pruned.1e-7.arpa.gz",
    "3-gram.pruned.3e-7.arpa.gz",
    "4-gram.arpa.gz",
    "librispeech-lm-norm.txt.gz",
    "librispeech-vocab.txt",
    "librispeech-lexicon.txt",
)
UTT_ID = re.compile(r"^(\d+)-(\d+)-(\d+)$")


def _base(mirror: str | None) -> str:
    return (mirror or OPENSLR).rstrip("/")


def subset_remote(subset: str, mirror: str | None = None, sums: dict | None = None) -> Remote:
    """The archive of ``subset`` at OpenSLR (or ``mirror``, laid out as ``<mirror>/12/...``);
    ``sums`` (archive name -> SHA-256 or MD5) replaces the published sum, for a mirror that
    repacked the archives."""
    if subset not in SUBSETS:
        raise ValueError(f"unknown LibriSpeech subset {subset!r}; known: {', '.join(SUBSETS)}")
    info = SUBSETS[subset]
    name = f"{subset}.tar.gz"
    url = f"{_base(mirror)}/{info.resource}/{name}"
    if sums and name in sums:
        digest = sums[name]
        return Remote(url, sha256=digest) if len(digest) == 64 else Remote(url, md5=digest)
    return Remote(url, sha256=info.sha256, md5=info.md5)


def lm_remote(name: str, mirror: str | None = None) -> Remote:
    if name not in LM_FILES:
        raise ValueError(f"unknown LibriSpeech LM file {name!r}; known: {', '.join(LM_FILES)}")
    return Remote(f"{_base(mirror)}/11/{name}")


def download_librispeech(
    subsets: list[str],
    directory: str | Path,
    mirror: str | None = None,
    sums: dict | None = None,
    keep_archives: bool = True,
) -> Path:
    """Download and unpack ``subsets`` under ``directory`` (archives in ``directory``, the
    tree in ``directory/LibriSpeech``); a subset whose folder is already there is left alone.
    Returns the ``LibriSpeech`` folder."""
    directory = Path(directory)
    for subset in subsets:
        remote = subset_remote(subset, mirror, sums)
        marker = directory / f".{remote.name}.extracted"
        tree = directory / "LibriSpeech" / subset
        if marker.is_file() or (tree.is_dir() and not (directory / remote.name).exists()):
            log.info("%s: already extracted in %s", subset, tree)
            continue
        archive = fetch(remote, directory)
        extract_tar(archive, directory)
        if not tree.is_dir():
            raise corpus_error(
                "LibriSpeech", archive, f"LibriSpeech/{subset}/ inside", "no such folder"
            )
        if not keep_archives:
            archive.unlink()
    return directory / "LibriSpeech"


def find_subsets(corpus_dir: str | Path) -> dict[str, Path]:
    """``{subset: folder}`` of every known subset under ``corpus_dir`` in the layouts above.

    Raises:
        CorpusError: no subset found, or one subset in two places.
    """
    corpus_dir = Path(corpus_dir)
    if not corpus_dir.is_dir():
        raise corpus_error("LibriSpeech", corpus_dir, "a folder", "nothing (no such directory)")
    roots = [corpus_dir, corpus_dir / "LibriSpeech"]
    roots += sorted(p / "LibriSpeech" for p in corpus_dir.iterdir() if p.is_dir())
    found: dict[str, Path] = {}
    for root in roots:
        for subset in SUBSETS:
            folder = root / subset
            if not folder.is_dir() or not any(
                p.is_dir() and p.name.isdigit() for p in folder.iterdir()
            ):
                continue  # not there, or a folder of that name holding LibriSpeech/ itself
            if subset in found and found[subset].resolve() != folder.resolve():
                raise corpus_error(
                    "LibriSpeech",
                    corpus_dir,
                    f"one {subset} folder",
                    f"two: {found[subset]} and {folder}",
                )
            found.setdefault(subset, folder)
    if not found:
        entries = sorted(p.name for p in corpus_dir.iterdir())[:10]
        raise corpus_error(
            "LibriSpeech",
            corpus_dir,
            "LibriSpeech/<subset>/ folders (train-clean-100, dev-clean, ...) here, in "
            "LibriSpeech/ or in <folder>/LibriSpeech/",
            entries or "an empty folder",
        )
    return found


def read_speakers(path: Path) -> dict[str, str]:
    """``{speaker: "m" | "f"}`` from SPEAKERS.TXT (``ID | SEX | SUBSET | MINUTES | NAME``)."""
    genders = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(";") or "|" not in line:
            continue
        fields = [f.strip() for f in line.split("|")]
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].upper() in ("M", "F"):
            genders[fields[0]] = fields[1].lower()
    return genders


def _read_subset(
    subset: str, folder: Path, genders: dict[str, str], skipped: list[tuple[str, str, str]]
) -> list[dict]:
    records = []
    speakers = sorted(p for p in folder.iterdir() if p.is_dir())
    for speaker_dir in progress_bar(speakers, f"LibriSpeech {subset}", unit="speaker"):
        for chapter_dir in sorted(p for p in speaker_dir.iterdir() if p.is_dir()):
            prefix = f"{speaker_dir.name}-{chapter_dir.name}"
            transcript = chapter_dir / f"{prefix}.trans.txt"
            audio = {p.stem: p for p in chapter_dir.glob("*.flac")}
            texts: dict[str, str] = {}
            empty: set[str] = set()  # ids whose line has no words (skipped once, as that)
            if transcript.is_file():
                for lineno, line in enumerate(
                    transcript.read_text(encoding="utf-8").splitlines(), start=1
                ):
                    utt, _, words = line.strip().partition(" ")
                    if not utt:
                        continue
                    if not UTT_ID.match(utt) or not utt.startswith(prefix + "-"):
                        skipped.append(
                            (subset, utt, f"{transcript}:{lineno}: not an id of {prefix}")
                        )
                    elif not words.strip():
                        skipped.append((subset, utt, f"{transcript}:{lineno}: empty transcript"))
                        empty.add(utt)
                    else:
                        texts[utt] = " ".join(words.split())
            for utt in sorted(set(audio) - set(texts) - empty):
                skipped.append((subset, utt, f"no line in {transcript}"))
            for utt, words in texts.items():
                path = audio.get(utt)
                if path is None:
                    skipped.append((subset, utt, f"audio {chapter_dir / utt}.flac not found"))
                    continue
                try:
                    info = soundfile.info(str(path))
                except Exception as e:  # soundfile raises several types for corrupt files
                    skipped.append((subset, utt, f"{path}: unreadable audio ({e})"))
                    continue
                record = {
                    "id": utt,
                    "audio": str(path.resolve()),
                    "duration": round(info.frames / info.samplerate, 4),
                    "speaker": speaker_dir.name,
                    "chapter": chapter_dir.name,
                    "words": words,
                }
                if speaker_dir.name in genders:
                    record["gender"] = genders[speaker_dir.name]
                records.append(record)
    return records


def prepare_librispeech(
    corpus_dir: str | Path,
    out_dir: str | Path,
    subsets: list[str] | None = None,
    strict: bool = True,
    durations: DurationFilter | None = None,
) -> dict:
    """Write ``<subset>.jsonl`` for ``subsets`` (default: every subset found) into ``out_dir``,
    and the unions train-460 / train-960 whose parts are among them.

    Args:
        strict: require each subset's published utterance and speaker counts; False prepares
            what is there (``--allow-partial``).

    Raises:
        CorpusError: no LibriSpeech under ``corpus_dir``, a requested subset missing, or
            (strict) counts other than published, naming the subset.
    """
    corpus_dir = Path(corpus_dir)
    found = find_subsets(corpus_dir)
    wanted = list(subsets) if subsets else [s for s in SUBSETS if s in found]
    missing = [s for s in wanted if s not in found]
    if missing:
        raise corpus_error(
            "LibriSpeech", corpus_dir, f"subsets {', '.join(missing)}", f"only {', '.join(found)}"
        )
    unions = [u for u, parts in UNIONS.items() if all(p in wanted for p in parts)]
    splits = tuple(wanted + unions)
    out = PreparedCorpus(out_dir, splits, durations)
    params = {
        "corpus": "librispeech",
        "subsets": {s: str(found[s].resolve()) for s in wanted},
        "strict": strict,
    }
    if out.is_complete(params):
        log.info("%s: LibriSpeech manifests complete, nothing to do", out_dir)
        return out.summary()
    records: dict[str, list[dict]] = {}
    skipped: list[tuple[str, str, str]] = []
    for subset in wanted:
        speakers_txt = found[subset].parent / "SPEAKERS.TXT"
        genders = read_speakers(speakers_txt) if speakers_txt.is_file() else {}
        records[subset] = _read_subset(subset, found[subset], genders, skipped)
        if strict:
            info = SUBSETS[subset]
            n_utts = len(records[subset])
            n_speakers = len({r["speaker"] for r in records[subset]})
            if n_utts != info.utterances or (info.speakers and n_speakers != info.speakers):
                n_skipped = sum(1 for s, _, _ in skipped if s == subset)
                raise corpus_error(
                    "LibriSpeech",
                    found[subset],
                    f"{subset} with {info.utterances} utterances"
                    + (f" of {info.speakers} speakers" if info.speakers else ""),
                    f"{n_utts} utterances of {n_speakers} speakers ({n_skipped} skipped: "
                    "missing audio or transcript lines); pass --allow-partial to prepare what "
                    "is there",
                )
    for union in unions:
        records[union] = [r for part in UNIONS[union] for r in records[part]]
    return out.write(params, records, skipped)
