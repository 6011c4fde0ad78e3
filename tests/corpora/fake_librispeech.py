"""A small fake LibriSpeech, shaped like the real one: ``LibriSpeech/<subset>/<speaker>/<chapter>/``
with tone FLAC files and ``<speaker>-<chapter>.trans.txt``, and SPEAKERS.TXT; in the layouts
users keep it (:func:`make_fake_librispeech`), and as the archives OpenSLR serves
(:func:`fake_archive`)."""

import io
import tarfile
from pathlib import Path

import numpy as np
import soundfile

WORDS = (
    "THE HOUSE STOOD ON A HILL ABOVE THE RIVER AND HER FATHER'S BOAT WAS MOORED BELOW IT "
    "SHE WALKED DOWN EVERY MORNING TO WATCH THE FISHERMEN COME BACK WITH THEIR NETS"
).split()
# speaker -> sex, one line of SPEAKERS.TXT each
SPEAKERS = {"19": "F", "26": "M", "103": "F", "1034": "M", "2412": "F", "3081": "M"}
SUBSET_SPEAKERS = {
    "train-clean-5": ("19", "26"),
    "dev-clean-2": ("103",),
    "train-clean-100": ("19", "26"),
    "train-clean-360": ("1034",),
    "dev-clean": ("2412",),
    "test-clean": ("3081",),
}


def _flac(path: Path, seconds: float, frequency: float) -> None:
    t = np.arange(int(16000 * seconds)) / 16000
    samples = 0.3 * np.sin(2 * np.pi * frequency * t) + 0.01 * np.random.default_rng(
        0
    ).standard_normal(t.size)
    soundfile.write(path, samples.astype(np.float32), 16000, format="FLAC", subtype="PCM_16")


def write_subset(root: Path, subset: str, utts_per_chapter: int = 3) -> list[str]:
    """``root/<subset>/...`` with two chapters per speaker; returns the utterance ids."""
    ids = []
    for s, speaker in enumerate(SUBSET_SPEAKERS[subset]):
        for c, chapter in enumerate(("121", "1460")):
            folder = root / subset / speaker / chapter
            folder.mkdir(parents=True)
            lines = []
            for u in range(utts_per_chapter):
                utt = f"{speaker}-{chapter}-{u:04d}"
                start = (7 * s + 5 * c + 3 * u) % len(WORDS)
                words = [WORDS[(start + k) % len(WORDS)] for k in range(3 + u)]
                _flac(folder / f"{utt}.flac", 0.5 + 0.25 * u, 200 + 50 * (s + c + u))
                lines.append(f"{utt} {' '.join(words)}")
                ids.append(utt)
            (folder / f"{speaker}-{chapter}.trans.txt").write_text("\n".join(lines) + "\n")
    return ids


def speakers_txt() -> str:
    lines = ["; Some comments", ";ID  |SEX| SUBSET           |MINUTES| NAME"]
    for speaker, sex in SPEAKERS.items():
        lines.append(f"{speaker:<5}| {sex} | train-clean-100  | 25.19 | Reader {speaker}")
    return "\n".join(lines) + "\n"


def make_fake_librispeech(
    root: Path, subsets: tuple[str, ...] = ("train-clean-5", "dev-clean-2"), layout: str = "deeper"
) -> Path:
    """A fake copy under ``root``; returns the folder to pass as ``--corpus-dir``.

    Layouts: ``in_place`` (``root`` is ``LibriSpeech/``), ``deeper`` (``root/LibriSpeech/``, the
    archives unpacked into one folder), ``per_archive`` (``root/<subset>/LibriSpeech/<subset>``:
    each archive unpacked into a folder of its own).
    """
    for subset in subsets:
        if layout == "in_place":
            base = root
        elif layout == "deeper":
            base = root / "LibriSpeech"
        elif layout == "per_archive":
            base = root / subset / "LibriSpeech"
        else:
            raise ValueError(layout)
        write_subset(base, subset)
        (base / "SPEAKERS.TXT").write_text(speakers_txt())
    return root


def fake_archive(tmp: Path, subset: str) -> bytes:
    """The bytes of ``<subset>.tar.gz`` as OpenSLR serves it: ``LibriSpeech/<subset>/...`` and
    the top-level text files."""
    tree = tmp / f"archive-{subset}"
    write_subset(tree / "LibriSpeech", subset)
    (tree / "LibriSpeech" / "SPEAKERS.TXT").write_text(speakers_txt())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(tree / "LibriSpeech", arcname="LibriSpeech")
    return buffer.getvalue()
