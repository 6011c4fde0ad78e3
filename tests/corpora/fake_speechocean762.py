"""A small fake speechocean762 tree in the published layout: the Kaldi tables separate key and
value by a tab, ``wav.scp`` paths are relative to the corpus root (``WAVE/SPEAKER<n>/<utt>.WAV``),
``spk2utt``, ``spk2age`` and ``spk2gender`` beside them, ``resource/lexicon.txt`` with stress
and several pronunciations of a word, ``resource/text-phone`` choosing among them.

Each phone is a tone of its own frequency, so a tiny model can learn a little.
"""

from pathlib import Path

import numpy as np
import soundfile

RATE = 16000
LEXICON = {  # word: pronunciations, stress marked as in the corpus
    "A": ["AH0", "EY0"],
    "BEAR": ["B EH1 R"],
    "CALL": ["K AO1 L"],
    "IT": ["IH1 T"],
    "WE": ["W IY1"],
    "THE": ["DH AH0", "DH IY0"],
    "ONE": ["W AH1 N"],
}
SENTENCES = ["WE CALL IT BEAR", "A BEAR", "THE ONE", "CALL THE BEAR", "WE CALL A ONE"]
# (half, speaker, age, gender, utterances)
SPEAKERS = [
    ("train", "0001", 6, "m", 4),
    ("train", "0005", 9, "f", 4),
    ("train", "1029", 31, "f", 4),
    ("train", "1033", 20, "m", 4),
    ("test", "0003", 7, "m", 3),
    ("test", "1031", 25, "f", 3),
]


def _position(phones: list[str]) -> list[str]:
    """Word-position marks as text-phone writes them."""
    if len(phones) == 1:
        return [phones[0] + "_S"]
    return [phones[0] + "_B"] + [p + "_I" for p in phones[1:-1]] + [phones[-1] + "_E"]


def _tone(phone: str, rng) -> np.ndarray:
    samples = int(rng.integers(1100, 1800))
    freq = 200 + 41 * (sum(map(ord, phone.rstrip("012"))) % 50)
    t = np.arange(samples) / RATE
    return 0.3 * np.sin(2 * np.pi * freq * t) + 0.003 * rng.standard_normal(samples)


def make_fake_speechocean762(root: Path, seed: int = 0) -> dict[str, list[str]]:
    """Write the tree under ``root``; returns each utterance's phones (stress removed)."""
    rng = np.random.default_rng(seed)
    tables: dict[str, dict[str, list[str]]] = {"train": {}, "test": {}}
    text_phone, phones_of = [], {}
    for half, spk, age, gender, count in SPEAKERS:
        lines = tables[half]
        lines.setdefault("spk2age", []).append(f"{spk}\t{age}\n")
        lines.setdefault("spk2gender", []).append(f"{spk}\t{gender}\n")
        utts = []
        for n in range(count):
            utt = f"0{spk}{n:04d}"
            words = SENTENCES[(n + int(spk)) % len(SENTENCES)].split()
            pieces, chosen = [np.zeros(800)], []
            for index, word in enumerate(words):
                prons = LEXICON[word]
                pron = prons[(n + index) % len(prons)].split()
                text_phone.append(f"{utt}.{index}\t{' '.join(_position(pron))}\n")
                chosen += [p.rstrip("012") for p in pron]
                pieces += [_tone(p, rng) for p in pron]
            pieces.append(np.zeros(800))
            path = root / "WAVE" / f"SPEAKER{spk}" / f"{utt}.WAV"
            path.parent.mkdir(parents=True, exist_ok=True)
            soundfile.write(path, np.concatenate(pieces), RATE, subtype="PCM_16")
            phones_of[utt] = chosen
            lines.setdefault("text", []).append(f"{utt}\t{' '.join(words)}\n")
            lines.setdefault("wav.scp", []).append(f"{utt}\t{path.relative_to(root)}\n")
            lines.setdefault("utt2spk", []).append(f"{utt} {spk}\n")  # spaces, as published
            utts.append(utt)
        lines.setdefault("spk2utt", []).append(f"{spk} {' '.join(utts)}\n")
    for half, lines in tables.items():
        (root / half).mkdir(parents=True, exist_ok=True)
        for name, content in lines.items():
            (root / half / name).write_text("".join(sorted(content)))
    (root / "resource").mkdir(parents=True, exist_ok=True)
    (root / "resource" / "lexicon.txt").write_text(
        "".join(f"{w}\t{p}\n" for w, prons in sorted(LEXICON.items()) for p in prons)
    )
    (root / "resource" / "text-phone").write_text("".join(sorted(text_phone)))
    return phones_of
