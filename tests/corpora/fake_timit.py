"""A small fake TIMIT tree, shaped like the real one (real speaker and utterance names, SPHERE
headers in both byte orders, ``.PHN``/``.WRD``/``.TXT`` files, SA sentences, converted
``.WAV.wav`` copies), for the preparation tests and the recipe's tiny end-to-end run.

Each phone is a short tone at a frequency of its own, so a tiny model can learn a little.
"""

from pathlib import Path

import numpy as np

from cbasr.data.sphere import write_sphere_header

RATE = 16000
# (part, dialect region, speaker, utterances): real names; dev speaker faks0, core-test mdab0.
SPEAKERS = [
    ("train", "dr1", "fcjf0", ["sa1", "sa2", "si1027", "si1657", "sx37", "sx127"]),
    ("train", "dr2", "mrjm0", ["sa1", "si1095", "si1228", "sx68", "sx158"]),
    ("test", "dr1", "faks0", ["sa1", "si943", "sx43", "sx133"]),  # dev
    ("test", "dr1", "mdab0", ["sa1", "si1039", "si1669", "sx49", "sx139"]),  # core test
    ("test", "dr2", "fpkt0", ["si1538", "sx8"]),  # core test
    ("test", "dr3", "mbwp0", ["si1531", "sx91"]),  # neither dev nor core test: left out
]
SENTENCE = [
    ("h#", None),
    ("sh", "she"),
    ("ix", "she"),
    ("hv", "had"),
    ("eh", "had"),
    ("dcl", "had"),
    ("q", "your"),
    ("y", "your"),
    ("axr", "your"),
    ("pau", None),
    ("ao", "dark"),
    ("tcl", "dark"),
    ("t", "dark"),
    ("h#", None),
]


def _tone(phone: str, samples: int, rng) -> np.ndarray:
    freq = 200 + 37 * (sum(map(ord, phone)) % 60)
    t = np.arange(samples) / RATE
    return 0.3 * np.sin(2 * np.pi * freq * t) + 0.003 * rng.standard_normal(samples)


def _utterance(
    rng, shift: int
) -> tuple[np.ndarray, list[tuple[int, int, str]], list[tuple[int, int, str]]]:
    """Audio, ``.PHN`` and ``.WRD`` lines of one utterance (the sentence, rotated by ``shift``)."""
    body = SENTENCE[1:-1]
    body = body[shift % len(body) :] + body[: shift % len(body)]
    phones, start, pieces, words = [], 0, [], []
    for phone, word in [SENTENCE[0]] + body + [SENTENCE[-1]]:
        length = int(rng.integers(800, 1600))
        pieces.append(_tone(phone, length, rng))
        phones.append((start, start + length, phone))
        if word is not None:
            if words and words[-1][2] == word:
                words[-1] = (words[-1][0], start + length, word)
            else:
                words.append((start, start + length, word))
        start += length
    return np.concatenate(pieces), phones, words


def _write_sphere(path: Path, audio: np.ndarray, big_endian: bool) -> None:
    pcm = np.clip(audio * 32767, -32768, 32767).astype(">i2" if big_endian else "<i2")
    path.write_bytes(
        write_sphere_header(len(pcm), RATE, "10" if big_endian else "01") + pcm.tobytes()
    )


def make_fake_timit(
    root: Path, upper: bool = True, truncate: str | None = "mrjm0/sx158", seed: int = 0
) -> Path:
    """Write the tree under ``root`` (``TIMIT/TRAIN/DR1/FCJF0/SA1.WAV`` or its lower-case form).

    ``truncate``: ``speaker/utterance`` whose audio is cut short of its header's sample count.
    """
    rng = np.random.default_rng(seed)
    case = str.upper if upper else str.lower
    for n, (part, region, speaker, utts) in enumerate(SPEAKERS):
        folder = root / case("timit") / case(part) / case(region) / case(speaker)
        folder.mkdir(parents=True, exist_ok=True)
        for k, utt in enumerate(utts):
            audio, phones, words = _utterance(rng, n + k)
            stem = folder / case(utt)
            wav = stem.with_name(stem.name + case(".wav"))
            _write_sphere(wav, audio, big_endian=(k % 2 == 1))
            if k == 0:  # a converted RIFF copy next to the original, which must not count twice
                wav.with_name(wav.name + ".wav").write_bytes(b"RIFF")
            if f"{speaker}/{utt}" == truncate:
                wav.write_bytes(wav.read_bytes()[: 1024 + 2000])
            stem.with_name(stem.name + case(".phn")).write_text(
                "".join(f"{b} {e} {p}\n" for b, e, p in phones)
            )
            stem.with_name(stem.name + case(".wrd")).write_text(
                "".join(f"{b} {e} {w}\n" for b, e, w in words)
            )
            text = " ".join(w for _, _, w in words).capitalize() + "."
            stem.with_name(stem.name + case(".txt")).write_text(f"0 {phones[-1][1]} {text}\n")
    return root / case("timit")
