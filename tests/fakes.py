"""Tiny fake corpora for pipeline tests: tone sequences that a small model can learn in seconds.

Each "phone" is a pure tone at its own frequency lasting 60-120 ms, so the label sequence is
recoverable from the audio and gold phone start times are exact.
"""

import json
import random
from pathlib import Path

import numpy as np
import soundfile

TONES = {"a": 300.0, "b": 650.0, "c": 1100.0, "d": 1700.0, "e": 2500.0}
SAMPLE_RATE = 16000


def make_tone_corpus(root: Path, sizes: dict[str, int], seed: int = 0) -> Path:
    """Write ``root/<split>.jsonl`` and ``root/wav/<split>/*.wav``; returns ``root``."""
    rng = random.Random(seed)
    for split, count in sizes.items():
        (root / "wav" / split).mkdir(parents=True, exist_ok=True)
        records = []
        for n in range(count):
            utt_id = f"{split}-{n:04d}"
            phones = [rng.choice(sorted(TONES)) for _ in range(rng.randint(2, 6))]
            pieces, starts, t = [np.zeros(int(0.05 * SAMPLE_RATE))], [], 0.05
            for p in phones:
                dur = rng.uniform(0.06, 0.12)
                starts.append(round(t, 4))
                time = np.arange(int(dur * SAMPLE_RATE)) / SAMPLE_RATE
                pieces += [
                    0.3 * np.sin(2 * np.pi * TONES[p] * time),
                    np.zeros(int(0.02 * SAMPLE_RATE)),
                ]
                t += dur + 0.02
            audio = np.concatenate(pieces + [np.zeros(int(0.05 * SAMPLE_RATE))]).astype(np.float32)
            audio += 0.003 * np.random.default_rng(seed * 1000 + n).standard_normal(
                audio.size
            ).astype(np.float32)
            path = root / "wav" / split / f"{utt_id}.wav"
            soundfile.write(path, audio, SAMPLE_RATE, subtype="PCM_16")
            records.append(
                {
                    "id": utt_id,
                    "audio": str(path.relative_to(root)),
                    "duration": audio.size / SAMPLE_RATE,
                    "speaker": f"{split}-spk{n % 2}",
                    "words": " ".join(phones),
                    "phones": phones,
                    "phones_full": phones,
                    "phone_starts": starts,
                }
            )
        with open(root / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return root
