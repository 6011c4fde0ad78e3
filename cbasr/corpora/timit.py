"""TIMIT (LDC93S1): manifests for the standard train / dev / core-test splits.

Layout: ``<root>/<TRAIN|TEST>/<DR1..DR8>/<SPEAKER>/<UTT>.<WAV|PHN|WRD|TXT>``, all upper or all
lower case. The SA sentences are left out everywhere (SI and SX only); converted copies next
to the originals (``SX49.WAV.wav``) are ignored.

- train: every TRAIN speaker (462 x 8 = 3696 utterances);
- dev: the 50 TEST speakers of the usual dev set (400);
- test: the 24 core-test speakers (192).

Phones (``.PHN``, samples at 16 kHz) map 61 -> 48 -> 39 (Lee and Hon, 1989; Kaldi's
``phones.60-48-39.map``); ``q`` is deleted from the 48 and 39 sets. Training uses 61 or 48
labels (``phone_set``); scoring always maps to 39 (:data:`MAP_TO_39`). Manifest lines carry
``phones`` (training set), ``phones_61`` (as transcribed), ``phones_39`` and the ``phone_starts``
of ``phones`` (seconds, the gold boundaries for alignment error).
"""

import logging
import re
from pathlib import Path

from cbasr.corpora.prepare import DurationFilter, PreparedCorpus, corpus_error
from cbasr.data.audio import AudioError, read_audio
from cbasr.data.sphere import SphereError, expected_pcm_bytes, read_header

__all__ = [
    "PHONES_61",
    "PHONES_48",
    "MAP_61_48",
    "MAP_48_39",
    "MAP_TO_39",
    "DEV_SPEAKERS",
    "CORE_TEST_SPEAKERS",
    "EXPECTED",
    "EXPECTED_SPEAKERS",
    "EXPECTED_RELEASE",
    "prepare_timit",
    "map_phones",
]

log = logging.getLogger(__name__)

PHONES_61 = tuple(
    (
        "aa ae ah ao aw ax ax-h axr ay b bcl ch d dcl dh dx eh el em en eng epi er ey f g gcl h# hh hv ih "
        "ix iy jh k kcl l m n ng nx ow oy p pau pcl q r s sh t tcl th uh uw ux v w y z zh"
    ).split()
)
# 61 -> 48 (None: deleted); phones not listed map to themselves.
MAP_61_48 = {
    "ax-h": "ax",
    "axr": "er",
    "bcl": "vcl",
    "dcl": "vcl",
    "gcl": "vcl",
    "em": "m",
    "eng": "ng",
    "hv": "hh",
    "kcl": "cl",
    "pcl": "cl",
    "tcl": "cl",
    "nx": "n",
    "pau": "sil",
    "ux": "uw",
    "h#": "sil",
    "q": None,
}
# 48 -> 39; phones not listed map to themselves.
MAP_48_39 = {
    "ao": "aa",
    "ax": "ah",
    "ix": "ih",
    "cl": "sil",
    "vcl": "sil",
    "el": "l",
    "en": "n",
    "zh": "sh",
    "epi": "sil",
}
PHONES_48 = tuple(sorted({MAP_61_48.get(p, p) for p in PHONES_61} - {None}))


def _to_39(phone: str) -> str | None:
    """A 61- or 48-set label's 39-phone scoring label (None: deleted)."""
    p48 = MAP_61_48.get(phone, phone) if phone in PHONES_61 else phone
    return None if p48 is None else MAP_48_39.get(p48, p48)


# Any training label (61 or 48 set) -> its 39-phone scoring label (None: deleted).
MAP_TO_39 = {p: _to_39(p) for p in PHONES_61 + PHONES_48}

DEV_SPEAKERS = frozenset(
    "faks0 fdac1 fjem0 mgwt0 mjar0 mmdb1 mmdm2 mpdf0 fcmh0 fkms0 mbdg0 mbwm0 mcsh0 fadg0 fdms0 fedw0 "
    "mgjf0 mglb0 mrtk0 mtaa0 mtdt0 mthc0 mwjg0 fnmr0 frew0 fsem0 mbns0 mmjr0 mdls0 mdlf0 mdvc0 mers0 "
    "fmah0 fdrw0 mrcs0 mrjm4 fcal1 mmwh0 fjsj0 majc0 mjsw0 mreb0 fgjd0 fjmg0 mroa0 mteb0 mjfc0 mrjr0 "
    "fmml0 mrws1".split()
)
CORE_TEST_SPEAKERS = frozenset(
    "mdab0 mwbt0 felc0 mtas1 mwew0 fpas0 mjmp0 mlnt0 fpkt0 mlll0 mtls0 fjlm0 mbpm0 mklt0 fnlp0 mcmj0 "
    "mjdh0 fmgd0 mgrt0 mnjm0 fdhc0 mjln0 mpam0 fmld0".split()
)
EXPECTED = {"train": 3696, "dev": 400, "test": 192}  # SI and SX utterances per recipe split
EXPECTED_SPEAKERS = {"train": 462, "dev": 50, "test": 24}  # the core test set: 24 speakers
# The whole release (SA sentences and every TEST speaker included): utterances, speakers.
EXPECTED_RELEASE = {"train": (4620, 462), "test": (1680, 168)}
SAMPLE_RATE = 16000
PHONE_SETS = ("61", "48")


def map_phones(phones: list[str], phone_set: str) -> list[tuple[int, str]]:
    """Indices kept and labels in ``phone_set`` ("61", "48" or "39") of 61-phone ``phones``."""
    if phone_set == "61":
        return [(i, p) for i, p in enumerate(phones)]
    table = MAP_61_48 if phone_set == "48" else MAP_TO_39
    return [(i, table.get(p, p)) for i, p in enumerate(phones) if table.get(p, p) is not None]


def _train_test(directory: Path) -> tuple[str, str] | None:
    """The names of ``directory``'s TRAIN and TEST directories (either case), or None."""
    for train, test in (("TRAIN", "TEST"), ("train", "test")):
        if (directory / train).is_dir() and (directory / test).is_dir():
            return train, test
    return None


def _subdirectories(directory: Path) -> list[Path]:
    """Sorted subdirectories; none for one that cannot be listed (``lost+found`` on a disk)."""
    try:
        return sorted(c for c in directory.iterdir() if c.is_dir())
    except OSError:
        return []


def _find_root(corpus_dir: Path) -> tuple[Path, str, str]:
    """``(root, TRAIN dir name, TEST dir name)``: the directory holding TRAIN/ and TEST/.

    Accepts that directory, any directory up to three levels above it (``LDC93S1/timit/TIMIT``,
    ``TIMIT/data``: the first found in sorted order), or its ``TRAIN``/``TEST`` directory.
    """
    level = [corpus_dir]
    if corpus_dir.name.lower() in ("train", "test"):
        level.append(corpus_dir.parent)
    for depth in range(4):  # a level is searched only when the ones above it hold no TIMIT
        for root in level:
            names = _train_test(root)
            if names:
                return (root, *names)
        if depth < 3:
            level = [c for d in level for c in _subdirectories(d)]
    found = (
        sorted(p.name for p in corpus_dir.iterdir())
        if corpus_dir.is_dir()
        else "nothing (no such directory)"
    )
    raise corpus_error(
        "TIMIT",
        corpus_dir,
        "TRAIN/ and TEST/ (or train/ and test/) directories in it or up to three levels below",
        found,
    )


def _read_labels(path: Path) -> list[tuple[int, int, str]]:
    lines = []
    for lineno, line in enumerate(path.read_text(encoding="latin-1").splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 3:
            raise ValueError(f"{path}:{lineno}: expected '<begin> <end> <label>', got {line!r}")
        lines.append((int(parts[0]), int(parts[1]), parts[2].lower()))
    return lines


def _txt_words(path: Path) -> list[str]:
    """The words of a ``.TXT`` transcription (``<begin> <end> text.``): lower-cased, punctuation
    removed as in the ``.WRD`` files (apostrophes and word-internal hyphens kept)."""
    text = " ".join(path.read_text(encoding="latin-1").split()[2:]).lower()
    return [w.strip("-'") for w in re.sub(r"[^a-z0-9'\- ]", " ", text).split() if w.strip("-'")]


def _utterance(wav: Path, speaker: str, phone_set: str) -> dict:
    """The manifest record of one utterance; raises ValueError / AudioError naming the file."""
    utt = wav.name.split(".")[0].lower()
    sibling = {s.suffix.lower(): s for s in wav.parent.glob(wav.name.split(".")[0] + ".*")}
    if ".phn" not in sibling:
        raise ValueError(f"{wav}: no .PHN transcription next to it")
    with open(wav, "rb") as f:
        sphere = f.read(7) == b"NIST_1A"
    if sphere:
        try:
            header = read_header(wav)
        except SphereError as e:
            raise AudioError(str(e)) from e
        expected = expected_pcm_bytes(header)
        if expected is not None and wav.stat().st_size < expected:
            raise AudioError(
                f"{wav}: truncated: the SPHERE header promises {header['sample_count']} samples "
                f"({expected} bytes), the file has {wav.stat().st_size} bytes"
            )
        duration = header["sample_count"] / header.get("sample_rate", SAMPLE_RATE)
    else:  # converted in place (RIFF, FLAC): read by content, truncation checked
        samples, rate = read_audio(wav)
        duration = len(samples) / rate
    phn = _read_labels(sibling[".phn"])
    if not phn:
        raise ValueError(f"{sibling['.phn']}: an empty transcription")
    unknown = sorted({p for _, _, p in phn} - set(PHONES_61))
    if unknown:
        raise ValueError(f"{sibling['.phn']}: labels outside the 61-phone set: {unknown}")
    labels61 = [p for _, _, p in phn]
    kept = map_phones(labels61, phone_set)
    words = (
        [w for _, _, w in _read_labels(sibling[".wrd"])]
        if ".wrd" in sibling
        else _txt_words(sibling[".txt"])
        if ".txt" in sibling
        else []
    )
    return {
        "id": f"{speaker}_{utt}",
        "audio": str(wav.resolve()),
        "duration": round(duration, 4),
        "speaker": speaker,
        "words": " ".join(words).lower(),
        "phones": [p for _, p in kept],
        "phone_starts": [round(phn[i][0] / SAMPLE_RATE, 4) for i, _ in kept],
        "phones_61": labels61,
        "phones_39": [p for _, p in map_phones(labels61, "39")],
    }


def _split_of(part: str, speaker: str) -> str | None:
    if part == "train":
        return "train"
    if speaker in DEV_SPEAKERS:
        return "dev"
    if speaker in CORE_TEST_SPEAKERS:
        return "test"
    return None  # the other TEST speakers belong to no standard split


def _check_counts(corpus_dir, records, skipped, release) -> None:
    """Strict mode: the kept utterances and their speakers per split, and the release's
    utterance files and speakers per part, against the standard counts; one error naming
    every difference."""
    problems = []
    for split, split_records in records.items():
        speakers = len({r["speaker"] for r in split_records})
        if (len(split_records), speakers) != (EXPECTED[split], EXPECTED_SPEAKERS[split]):
            problems.append(
                f"{split}: {len(split_records)} usable SI/SX utterances of "
                f"{speakers} speakers (expected {EXPECTED[split]} of {EXPECTED_SPEAKERS[split]})"
            )
    for part, (utterances, speakers) in release.items():
        if (utterances, speakers) != EXPECTED_RELEASE[part]:
            want_utterances, want_speakers = EXPECTED_RELEASE[part]
            problems.append(
                f"{part.upper()}/: {utterances} utterance files of {speakers} speakers "
                f"(expected {want_utterances} of {want_speakers})"
            )
    if problems:
        raise corpus_error(
            "TIMIT",
            corpus_dir,
            "the complete release",
            "; ".join(problems)
            + f" ({len(skipped)} skipped: see the warnings); pass --allow-partial to prepare "
            "a subset",
        )


def prepare_timit(
    corpus_dir: str | Path,
    out_dir: str | Path,
    phone_set: str = "48",
    strict: bool = True,
    durations: DurationFilter | None = None,
) -> dict:
    """Write ``train/dev/test.jsonl`` and the phone lists into ``out_dir``.

    Args:
        phone_set: training labels, ``"61"`` or ``"48"``.
        strict: require the standard counts (:data:`EXPECTED` SI/SX utterances of
            :data:`EXPECTED_SPEAKERS` speakers per split, :data:`EXPECTED_RELEASE` on disc);
            False accepts a subset (tests, partial copies), still listing what is skipped.

    Returns:
        The summary also written to ``out_dir/.done``.

    Raises:
        CorpusError: not a TIMIT tree, or (strict) split counts other than the standard ones.
    """
    if phone_set not in PHONE_SETS:
        raise ValueError(f"phone_set must be one of {PHONE_SETS}, got {phone_set!r}")
    corpus_dir, out = Path(corpus_dir), PreparedCorpus(out_dir, ("train", "dev", "test"), durations)
    params = {
        "corpus": "timit",
        "corpus_dir": str(corpus_dir.resolve()),
        "phone_set": phone_set,
        "strict": strict,
    }
    if out.is_complete(params):
        log.info("%s: TIMIT manifests complete, nothing to do", out_dir)
        return out.summary()
    root, train_dir, test_dir = _find_root(corpus_dir)
    records: dict[str, list[dict]] = {"train": [], "dev": [], "test": []}
    skipped: list[tuple[str, str, str]] = []  # (split, id, reason)
    release: dict[str, tuple[int, int]] = {}  # part -> (utterances, speakers) on disc
    for part, name in (("train", train_dir), ("test", test_dir)):
        wavs = sorted(
            p
            for p in (root / name).glob("*/*/*")
            if p.suffix.lower() == ".wav" and p.name.count(".") == 1
        )
        release[part] = (len(wavs), len({w.parent.name.lower() for w in wavs}))
        for wav in wavs:
            speaker = wav.parent.name.lower()
            split = _split_of(part, speaker)
            if split is None or wav.stem.lower().startswith("sa"):
                continue
            try:
                records[split].append(_utterance(wav, speaker, phone_set))
            except (AudioError, ValueError) as e:
                skipped.append((split, f"{speaker}_{wav.stem.lower()}", str(e)))
    for split_records in records.values():
        split_records.sort(key=lambda r: r["id"])
    if strict:
        _check_counts(corpus_dir, records, skipped, release)
    inventory = PHONES_61 if phone_set == "61" else PHONES_48
    extra = {
        "phones.txt": "".join(p + "\n" for p in inventory),
        "map_39.txt": "".join(f"{p}\t{MAP_TO_39[p] or ''}\n" for p in inventory),
    }
    return out.write(params, records, skipped, extra)
