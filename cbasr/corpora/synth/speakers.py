"""Synthetic speakers: an eSpeak NG voice (accent) and variant (timbre) with a rate and pitch.

Each speaker is a distinct (voice, variant) pair, so a dev or test speaker never shares its
timbre-and-accent combination with a training speaker, although every voice and variant
occurs in training. Within each split the voices take turns in a shuffled order, so every
split covers the accents evenly. Prosody is drawn uniformly per speaker:

- rate: ``RATE_WPM`` words per minute (eSpeak's default is 175);
- pitch: ``PITCH`` on eSpeak's 0..99 scale (50 is the variant's own base pitch);
- pitch range: ``PITCH_RANGE`` on the same scale (50 is the variant's own range; 0 is a
  monotone).

The draw is deterministic given the seed.
"""

import random
from dataclasses import dataclass

__all__ = [
    "PITCH",
    "PITCH_RANGE",
    "RATE_WPM",
    "SPLITS",
    "Speaker",
    "VARIANTS",
    "VOICES",
    "draw_speakers",
]

SPLITS = ("train", "dev", "test")

# English voices shipped in espeak-ng-data/lang/gmw (en-gb is named "en" there).
VOICES = (
    "en",  # British English
    "en-us",  # American
    "en-us-nyc",  # New York City
    "en-gb-scotland",  # Scottish
    "en-gb-x-rp",  # Received Pronunciation
    "en-029",  # Caribbean
    "en-gb-x-gbclan",  # Lancaster
    "en-gb-x-gbcwmd",  # West Midlands
)

# Variants from espeak-ng-data/voices/!v that sound like ordinary adult speakers: no robots,
# whispers, heavy echo, creak, or children's pitch.
VARIANTS = (
    # male
    "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "Alex", "Andy", "Denis", "Gene", "Lee",
    "Mike", "Michael", "adam", "benjamin", "david", "edward", "klatt", "klatt3", "max", "paul",
    "quincy", "robert", "travis", "victor",
    # female
    "f1", "f2", "f3", "f4", "f5", "Alicia", "Andrea", "Annie", "anika", "aunty", "belinda",
    "linda", "shelby", "steph",
)  # fmt: skip

RATE_WPM = (130, 200)
PITCH = (20, 80)
PITCH_RANGE = (20, 80)


@dataclass(frozen=True)
class Speaker:
    """One synthetic speaker; ``id`` is ``spkNNN``, unique across the corpus."""

    id: str
    split: str
    voice: str
    variant: str
    rate: int
    pitch: int
    pitch_range: int


def draw_speakers(counts: dict[str, int], seed: int, held_out_first: bool = False) -> list[Speaker]:
    """Draw ``counts[split]`` speakers for each split in ``SPLITS``; ids run over all splits.

    Args:
        held_out_first: draw dev and test before train, each held-out speaker with a
            variant no other held-out speaker has (while there are enough). When training
            takes most of the (voice, variant) pairs, drawing it first leaves the held-out
            splits the variants it happened to take least of (four of twenty test speakers
            with one variant in a draw of 250 + 20 + 20): their error rates then measure that
            variant. Ids and the returned order follow ``SPLITS`` either way.

    Raises:
        ValueError: more speakers are asked for than there are (voice, variant) pairs.
    """
    total = sum(counts.get(split, 0) for split in SPLITS)
    if total > len(VOICES) * len(VARIANTS):
        raise ValueError(
            f"{total} speakers asked for; at most {len(VOICES) * len(VARIANTS)} are distinct"
        )
    rng = random.Random(seed)
    unused = {voice: list(VARIANTS) for voice in VOICES}
    drawn: dict[str, list[tuple]] = {}
    held_out_variants: set[str] = set()
    for split in (SPLITS[1:] + SPLITS[:1]) if held_out_first else SPLITS:
        voice_order = list(VOICES)
        rng.shuffle(voice_order)
        drawn[split] = []
        for i in range(counts.get(split, 0)):
            voice = _next_voice(voice_order, i, unused)
            candidates = unused[voice]
            if held_out_first and split != "train":
                candidates = [v for v in candidates if v not in held_out_variants] or candidates
            variant = candidates[rng.randrange(len(candidates))]
            unused[voice].remove(variant)
            if split != "train":
                held_out_variants.add(variant)
            prosody = (rng.randint(*RATE_WPM), rng.randint(*PITCH), rng.randint(*PITCH_RANGE))
            drawn[split].append((voice, variant, *prosody))
    speakers = []
    for split in SPLITS:
        for voice, variant, rate, pitch, pitch_range in drawn[split]:
            speakers.append(
                Speaker(f"spk{len(speakers):03d}", split, voice, variant, rate, pitch, pitch_range)
            )
    return speakers


def _next_voice(voice_order: list[str], i: int, unused: dict[str, list[str]]) -> str:
    """The ``i``-th voice in turn, skipping voices whose variants are all taken."""
    for offset in range(len(voice_order)):
        voice = voice_order[(i + offset) % len(voice_order)]
        if unused[voice]:
            return voice
    raise ValueError("no (voice, variant) pair left")
