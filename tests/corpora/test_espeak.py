"""The ctypes binding to eSpeak NG: audio, phoneme events and their alignment with the audio."""

import numpy as np
import pytest

from cbasr.corpora.synth.espeak import EspeakError, espeak_engine

# eSpeak NG 1.52 (espeakng-loader 0.2.x), voice en-us, default rate and pitch.
FOX = "the quick brown fox jumps over the lazy dog."
FOX_PHONES = (
    "D @2 k w 'I k b r 'aU n f '0 k s dZ 'V m p s ,oU v 3 D @2 l 'eI z i d '0 g _: _".split()
)


@pytest.fixture
def engine():
    engine = espeak_engine()
    engine.reset()
    engine.set_voice("en-us")
    engine.set_prosody(175, 50, 50)
    return engine


def test_known_sentence(engine):
    synthesis = engine.synthesize(FOX)
    assert synthesis.sample_rate == 22050
    assert synthesis.audio.dtype == np.int16
    assert 2.0 < len(synthesis.audio) / synthesis.sample_rate < 3.5
    assert np.abs(synthesis.audio).max() > 5000
    assert list(synthesis.phones) == FOX_PHONES
    samples = np.array(synthesis.phone_samples)
    assert np.all(np.diff(samples) > 0)
    assert samples[0] >= 0 and samples[-1] <= len(synthesis.audio)
    # The events span the utterance: the final pause starts within 50 ms of the end.
    assert len(synthesis.audio) - samples[-2] < 0.05 * synthesis.sample_rate


def _silent_runs(audio: np.ndarray, sample_rate: int, min_seconds: float) -> list[tuple[int, int]]:
    """(start, end) samples of runs of 5 ms frames whose RMS is below 1% of full scale."""
    frame = sample_rate // 200
    frames = audio[: len(audio) // frame * frame].astype(np.float64).reshape(-1, frame)
    silent = np.sqrt((frames**2).mean(axis=1)) < 327
    runs, start = [], None
    for i, quiet in enumerate(np.append(silent, False)):
        if quiet and start is None:
            start = i
        elif not quiet and start is not None:
            if (i - start) * frame >= min_seconds * sample_rate:
                runs.append((start * frame, i * frame))
            start = None
    return runs


def test_pause_events_mark_the_silences(engine):
    """Each comma pause event starts where the audio falls silent (catches wrong event fields)."""
    synthesis = engine.synthesize("one, seven, nine, eleven.")
    rate = synthesis.sample_rate
    runs = _silent_runs(synthesis.audio, rate, min_seconds=0.08)
    pauses = [s for label, s in zip(synthesis.phones, synthesis.phone_samples) if label == "_:"][
        :-1
    ]
    assert len(pauses) == 3 and len(runs) >= 3
    for pause in pauses:
        assert min(abs(start - pause) for start, _ in runs) < 0.02 * rate
    speech = [
        s
        for label, s in zip(synthesis.phones, synthesis.phone_samples)
        if not label.startswith("_")
    ]
    for start, end in runs:
        inside = [s for s in speech if start + 0.02 * rate < s < end - 0.02 * rate]
        assert not inside, f"phones start inside the silence {start}..{end}: {inside}"


def test_same_output_after_reset(engine):
    engine.set_voice("en", "m1")
    first = engine.synthesize(FOX, seed=3)
    engine.synthesize("something else entirely, to change the state.", seed=4)
    engine.reset()
    engine.set_voice("en", "m1")
    engine.set_prosody(175, 50, 50)
    again = engine.synthesize(FOX, seed=3)
    assert first.audio.tobytes() == again.audio.tobytes()
    assert first.phone_samples == again.phone_samples


def test_rate_changes_duration(engine):
    engine.set_prosody(130, 50, 50)
    slow = engine.synthesize(FOX)
    engine.set_prosody(200, 50, 50)
    fast = engine.synthesize(FOX)
    assert len(fast.audio) < 0.8 * len(slow.audio)
    assert slow.phones == fast.phones


def test_unknown_voice_fails(engine):
    with pytest.raises(EspeakError, match="en-gb"):
        engine.set_voice("en-gb")  # eSpeak names British English "en"
