"""speechocean762 (Zhang et al. 2021, "speechocean762: An Open-Source Non-native English Speech
Corpus for Pronunciation Assessment", Interspeech, arXiv:2104.01378; OpenSLR resource 101,
Apache 2.0): read English of 250 Mandarin-speaking children and adults, 5000 utterances at
16 kHz, its train and test halves of 125 speakers each with no speaker in both.

The corpus is read from its own Kaldi data directories as published (tab-separated tables,
``wav.scp`` paths relative to the corpus root) by :func:`cbasr.corpora.kaldi.read_data_dir`,
with the root as the audio root::

    <root>/train/ and <root>/test/: text, wav.scp, utt2spk, spk2utt, spk2age, spk2gender
    <root>/WAVE/SPEAKER<nnnn>/<utterance>.WAV
    <root>/resource/lexicon.txt    WORD<TAB>phones with stress (AH0 B IH1 ...)
    <root>/resource/text-phone     <utterance>.<word index><TAB>the word's phones with stress
                                   and word-position marks (K_B AO0_I L_E)

``text-phone`` says which of the lexicon's pronunciations each word of each utterance takes (it
must be one of them); the manifests' ``phones`` are those with stress and position removed, the
39 phones of CMUdict (:data:`PHONES`). The published train half is split by speaker: ``dev``
holds :data:`DEV_SPEAKERS` of its speakers, spread over its ages (sorted by age, every
``125 / 12``-th), ``train`` the rest; ``test`` is the published test half. Every record has the
speaker's ``age``, ``gender`` and ``age_group`` (:data:`AGE_GROUPS`).
"""

import logging
import re
from pathlib import Path

from cbasr.corpora.download import Remote, extract_tar, fetch
from cbasr.corpora.kaldi import read_data_dir, read_table
from cbasr.corpora.prepare import CorpusError, DurationFilter, PreparedCorpus, corpus_error

__all__ = [
    "PHONES",
    "DEV_SPEAKERS",
    "AGE_GROUPS",
    "age_group",
    "read_lexicon",
    "word_phones",
    "dev_speakers",
    "archive_remote",
    "download_speechocean762",
    "prepare_speechocean762",
]

log = logging.getLogger(__name__)

PHONES = (
    "AA AE AH AO AW AY B CH D DH EH ER EY F G HH IH IY JH K L M N NG OW OY P R S SH T TH UH UW "
    "V W Y Z ZH"
).split()
DEV_SPEAKERS = 12
UTTERANCES = 2500  # in each published half
AGE_GROUPS = (("6-12", 0, 12), ("13-18", 13, 18), ("19+", 19, 200))  # (name, first, last age)
OPENSLR = "https://www.openslr.org/resources"
LAYOUT = "train/ and test/ Kaldi data directories, WAVE/ and resource/lexicon.txt"
_MARKS = re.compile(r"(_[BIES])?$")


def age_group(age: int) -> str:
    """The :data:`AGE_GROUPS` name of ``age`` (years)."""
    for name, first, last in AGE_GROUPS:
        if first <= age <= last:
            return name
    raise ValueError(f"age {age} is in no group of {AGE_GROUPS}")


def _phone(mark: str) -> str:
    """``AO0_I`` -> ``AO``: stress and word position removed."""
    return _MARKS.sub("", mark, count=1).rstrip("012")


def read_lexicon(path: Path) -> dict[str, list[tuple[str, ...]]]:
    """``{word: [pronunciations, stress removed]}`` of ``lexicon.txt``."""
    lexicon: dict[str, list[tuple[str, ...]]] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        word, *phones = line.split()
        pron = tuple(_phone(p) for p in phones)
        unknown = sorted(set(pron) - set(PHONES))
        if not phones or unknown:
            raise corpus_error(
                "speechocean762", path, f"line {lineno}: a word and CMUdict phones", line
            )
        lexicon.setdefault(word, []).append(pron)
    return lexicon


def word_phones(path: Path) -> dict[str, dict[int, tuple[str, ...]]]:
    """``{utterance: {word index: phones}}`` of ``text-phone`` (stress and position removed)."""
    table: dict[str, dict[int, tuple[str, ...]]] = {}
    for key, (phones,) in read_table(path).items():
        utt, _, index = key.rpartition(".")
        if not utt or not index.isdigit():
            raise corpus_error("speechocean762", path, "<utterance>.<word index> keys", key)
        table.setdefault(utt, {})[int(index)] = tuple(_phone(p) for p in phones.split())
    return table


def _phones(
    record: dict, lexicon: dict, chosen: dict[int, tuple[str, ...]] | None
) -> tuple[list[str] | None, str]:
    """The phones of ``record``'s words: each word's ``text-phone`` entry, which must be one of
    its lexicon pronunciations, else its only pronunciation; None and why when neither."""
    phones: list[str] = []
    for index, word in enumerate(record["words"].split()):
        prons = lexicon.get(word)
        if not prons:
            return None, f"word {word!r} not in the lexicon"
        pron = (chosen or {}).get(index)
        if pron is None:
            if len(prons) > 1:
                return None, f"word {index} ({word}) has no text-phone entry and {len(prons)} prons"
            pron = prons[0]
        elif pron not in prons:
            return None, f"text-phone's {' '.join(pron)} for word {index} ({word}) not in lexicon"
        phones += pron
    return phones, ""


def dev_speakers(ages: dict[str, int], count: int = DEV_SPEAKERS) -> list[str]:
    """``count`` speakers of ``ages`` (speaker -> age) spread over the ages: sorted by age then
    id, the middle one of each of ``count`` equal runs."""
    ordered = sorted(ages, key=lambda spk: (ages[spk], spk))
    if count > len(ordered):
        raise ValueError(f"{count} dev speakers asked of {len(ordered)}")
    return sorted(ordered[int((n + 0.5) * len(ordered) / count)] for n in range(count))


def archive_remote(mirror: str | None = None) -> Remote:
    """The OpenSLR archive. OpenSLR publishes no checksum for it: the download is checked as a
    clean gzip stream."""
    return Remote(f"{(mirror or OPENSLR).rstrip('/')}/101/speechocean762.tar.gz")


def download_speechocean762(directory: str | Path, mirror: str | None = None) -> Path:
    """Download (resuming) and unpack the archive in ``directory``; returns the corpus root
    ``directory/speechocean762``."""
    directory = Path(directory)
    root = directory / "speechocean762"
    remote = archive_remote(mirror)
    if (directory / f".{remote.name}.extracted").is_file():
        log.info("speechocean762: already extracted in %s", root)
        return root
    extract_tar(fetch(remote, directory), directory)
    if not (root / "train" / "text").is_file():
        raise corpus_error("speechocean762", directory / remote.name, LAYOUT, "other files")
    return root


def prepare_speechocean762(
    corpus_dir: str | Path,
    out_dir: str | Path,
    num_dev_speakers: int = DEV_SPEAKERS,
    durations: DurationFilter | None = None,
    strict: bool = True,
) -> dict:
    """Write ``train``, ``dev`` and ``test`` manifests and ``phones.txt`` into ``out_dir``.

    Args:
        strict: require the published 2500 utterances in each half's ``text``.

    Returns:
        The summary also written to ``out_dir/.done``.

    Raises:
        CorpusError: a tree that is not the corpus (what was expected and found); an
            :class:`~cbasr.corpora.prepare.EmptySplitError` for a split left empty.
    """
    root = Path(corpus_dir).resolve()
    lexicon_path = root / "resource" / "lexicon.txt"
    missing = [
        name
        for name in ("train/text", "train/wav.scp", "test/text", "test/wav.scp", "WAVE")
        if not (root / name).exists()
    ]
    missing += [] if lexicon_path.is_file() else ["resource/lexicon.txt"]
    if missing:
        raise corpus_error("speechocean762", root, LAYOUT, f"no {', '.join(missing)}")
    out = PreparedCorpus(out_dir, ("train", "dev", "test"), durations)
    if strict:
        for half in ("train", "test"):
            found = len(read_table(root / half / "text"))
            if found != UTTERANCES:
                raise corpus_error(
                    "speechocean762",
                    root / half / "text",
                    f"{UTTERANCES} utterances (the published half)",
                    f"{found}; pass --allow-partial to prepare what is there",
                )
    params = {"corpus": "speechocean762", "corpus_dir": str(root), "dev_speakers": num_dev_speakers}
    if out.is_complete(params):
        log.info("%s: manifests complete, nothing to do", out_dir)
        return out.summary()
    lexicon = read_lexicon(lexicon_path)
    text_phone = root / "resource" / "text-phone"
    chosen = word_phones(text_phone) if text_phone.is_file() else {}
    records, skipped, warnings = {}, [], []
    for half in ("train", "test"):
        found, half_skipped = read_data_dir(
            root / half, half, Path(out_dir) / "audio", False, root, warnings
        )
        skipped += half_skipped
        records[half] = []
        for record in found:
            phones, why = _phones(record, lexicon, chosen.get(record["id"]))
            if phones is None:
                skipped.append((half, record["id"], why))
                continue
            if "age" not in record:
                skipped.append((half, record["id"], f"speaker {record['speaker']} not in spk2age"))
                continue
            record["phones"] = phones
            record["age_group"] = age_group(int(record["age"]))
            records[half].append(record)
    ages = {r["speaker"]: int(r["age"]) for r in records["train"]}
    if num_dev_speakers >= len(ages) and ages:
        raise CorpusError(
            f"--dev-speakers {num_dev_speakers}: the train half has {len(ages)} usable speakers"
        )
    held_out = set(dev_speakers(ages, num_dev_speakers)) if ages else set()
    train = records.pop("train")
    records["train"] = [r for r in train if r["speaker"] not in held_out]
    records["dev"] = [r for r in train if r["speaker"] in held_out]
    extra = {
        "phones.txt": "".join(p + "\n" for p in PHONES),
        "dev_speakers.txt": "".join(s + "\n" for s in sorted(held_out)),
    }
    return out.write(params, records, skipped, extra, warnings)
