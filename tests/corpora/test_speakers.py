"""Speaker draws: disjoint splits, distinct voices, determinism."""

from collections import Counter

import pytest

from cbasr.corpora.synth.speakers import PITCH, RATE_WPM, VARIANTS, VOICES, draw_speakers

COUNTS = {"train": 80, "dev": 10, "test": 10}


def test_distinct_speakers_and_splits():
    speakers = draw_speakers(COUNTS, seed=0)
    assert Counter(s.split for s in speakers) == COUNTS
    assert len({s.id for s in speakers}) == len(speakers)
    assert len({(s.voice, s.variant) for s in speakers}) == len(speakers)
    for s in speakers:
        assert s.voice in VOICES and s.variant in VARIANTS
        assert RATE_WPM[0] <= s.rate <= RATE_WPM[1] and PITCH[0] <= s.pitch <= PITCH[1]


def test_every_split_covers_the_accents():
    speakers = draw_speakers(COUNTS, seed=1)
    for split in ("dev", "test"):
        voices = Counter(s.voice for s in speakers if s.split == split)
        assert set(voices) == set(VOICES) and max(voices.values()) <= 2
    assert len({s.variant for s in speakers if s.split == "train"}) > 0.8 * len(VARIANTS)


def test_deterministic_given_seed():
    assert draw_speakers(COUNTS, seed=2) == draw_speakers(COUNTS, seed=2)
    assert draw_speakers(COUNTS, seed=2) != draw_speakers(COUNTS, seed=3)


def test_too_many_speakers():
    with pytest.raises(ValueError, match="distinct"):
        draw_speakers({"train": len(VOICES) * len(VARIANTS) + 1}, seed=0)


def test_held_out_first_gives_each_held_out_speaker_its_own_variant():
    counts = {"train": 250, "dev": 20, "test": 20}
    speakers = draw_speakers(counts, seed=1, held_out_first=True)
    assert [s.split for s in speakers] == ["train"] * 250 + ["dev"] * 20 + ["test"] * 20
    assert [s.id for s in speakers] == [f"spk{i:03d}" for i in range(290)]
    assert len({(s.voice, s.variant) for s in speakers}) == 290
    held_out = [s.variant for s in speakers if s.split != "train"]
    assert len(set(held_out)) == 40
    for split in ("dev", "test"):
        voices = Counter(s.voice for s in speakers if s.split == split)
        assert set(voices) == set(VOICES) and max(voices.values()) <= 3
    # drawn first, the held-out speakers do not depend on the size of the training split
    fewer = draw_speakers({**counts, "train": 10}, seed=1, held_out_first=True)
    assert [(s.voice, s.variant) for s in fewer[10:]] == [
        (s.voice, s.variant) for s in speakers[250:]
    ]
