"""Rendering connected-digit utterances: words spoken one at a time, joined, reverberated, noised.

:func:`render_digits` turns one planned utterance (:class:`DigitsPlan`, drawn by
:func:`cbasr.corpora.synth.digits.plan_digits`) into 16 kHz int16 audio with each word's
start and end; :func:`synthesize_digits_speaker` does that for all of one speaker's
utterances, writes their WAV files and returns their manifest entries. It runs in worker
processes as well as in the main one.

Each word is synthesized alone with its own prosody, resampled to 16 kHz and trimmed to its
first and last 5 ms frame within 40 dB of its loudest frame (eSpeak leaves up to 60 ms of
near-silence at a word's end); the gaps are then laid between the trimmed words in samples,
so the word times are exact for the dry signal. Reverberation and noise come after
(:mod:`.acoustics`); the reverberant tail of a word runs into the gap after it.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cbasr.corpora.synth.acoustics import (
    mix_at_snr,
    pink_noise,
    reverberate,
    room_impulse_response,
    white_noise,
)
from cbasr.corpora.synth.espeak import EspeakEngine, EspeakError, espeak_engine
from cbasr.corpora.synth.speakers import Speaker
from cbasr.corpora.synth.synthesis import (
    SAMPLE_RATE,
    SkippedUtterance,
    UnusableUtterance,
    resample_to_16k,
    write_wav,
)

__all__ = [
    "DigitsJob",
    "DigitsPlan",
    "RenderedDigits",
    "Talker",
    "WordPlan",
    "render_digits",
    "synthesize_digits_speaker",
    "trim_word",
]

_FRAME = 80  # 5 ms at 16 kHz
_TRIM_DB = 40.0


@dataclass(frozen=True)
class WordPlan:
    """One word and the prosody it is spoken with (eSpeak's scales: words per minute, 0..99).

    ``again``: the word is the one before it said once more, the same dry samples (the same
    prosody and eSpeak noise), as a person repeats a digit; the other fields then equal the
    previous word's.
    """

    word: str
    rate: int
    pitch: int
    pitch_range: int
    gain_db: float
    again: bool = False


@dataclass(frozen=True)
class Talker:
    """One voice of babble noise, speaking ``text``."""

    voice: str
    variant: str
    rate: int
    text: str


@dataclass(frozen=True)
class DigitsPlan:
    """One utterance.

    Attributes:
        gaps: samples at 16 kHz before each word and after the last (``len(words) + 1``).
        noise: ``white``, ``pink``, ``babble`` (spoken by ``talkers``) or ``none``.
        snr_db: the noise's SNR over the words; None without noise.
        rt60, drr_db: the room (:func:`~.acoustics.room_impulse_response`); rt60 None: dry.
        peak_dbfs: the peak level of the written audio.
        seed: seeds eSpeak and the noise and room samples.
    """

    id: str
    words: tuple[WordPlan, ...]
    gaps: tuple[int, ...]
    noise: str
    snr_db: float | None
    talkers: tuple[Talker, ...]
    rt60: float | None
    drr_db: float
    peak_dbfs: float
    seed: int

    @property
    def transcript(self) -> str:
        return " ".join(word.word for word in self.words)


@dataclass(frozen=True)
class DigitsJob:
    """One speaker's utterances of ``split``; WAV files go to ``corpus_dir / audio_dir``."""

    speaker: Speaker
    utterances: tuple[DigitsPlan, ...]
    corpus_dir: str
    audio_dir: str
    split: str


@dataclass(frozen=True)
class RenderedDigits:
    """``audio``: ``(N,)`` int16 at 16 kHz; each word's dry span ``[start, end)`` in seconds."""

    audio: np.ndarray
    word_starts: list[float]
    word_ends: list[float]

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def trim_word(audio: np.ndarray) -> tuple[int, int]:
    """``(start, end)`` samples of ``audio`` ``(N,)`` from its first to its last 5 ms frame
    whose RMS is within 40 dB of the loudest frame's; ``(0, 0)`` for silence."""
    frames = np.zeros(-(-len(audio) // _FRAME) * _FRAME)
    frames[: len(audio)] = audio
    rms = np.sqrt((frames.reshape(-1, _FRAME) ** 2).mean(axis=1))  # (N / 80,)
    if rms.max() <= 0:
        return 0, 0
    loud = np.flatnonzero(rms >= rms.max() * 10 ** (-_TRIM_DB / 20))
    return int(loud[0]) * _FRAME, min(len(audio), (int(loud[-1]) + 1) * _FRAME)


def _speak(engine: EspeakEngine, text: str, seed: int) -> np.ndarray:
    """eSpeak's audio for ``text`` with the current voice, float64 ``(N,)`` at 16 kHz."""
    try:
        synthesis = engine.synthesize(text, seed % 2**31)
    except EspeakError as error:
        raise UnusableUtterance(f"synthesis failed: {error}") from error
    if synthesis.audio.size == 0:
        raise UnusableUtterance(f"eSpeak returned no audio for {text!r}")
    return resample_to_16k(synthesis.audio, synthesis.sample_rate) / 32768.0


def _babble(engine: EspeakEngine, plan: DigitsPlan, length: int, rng: np.random.Generator):
    """The talkers' speech, each at unit power, looped from a random offset, summed: ``(length,)``."""
    babble = np.zeros(length)
    for k, talker in enumerate(plan.talkers):
        engine.set_voice(talker.voice, talker.variant)
        engine.set_prosody(talker.rate, 50, 50)
        speech = _speak(engine, talker.text, plan.seed + 1000 + k)
        speech = speech / max(np.sqrt(np.mean(speech**2)), 1e-9)
        looped = np.tile(speech, -(-length // len(speech)) + 1)
        offset = int(rng.integers(len(speech)))
        babble += looped[offset : offset + length]
    return babble


def render_digits(engine: EspeakEngine, speaker: Speaker, plan: DigitsPlan) -> RenderedDigits:
    """Speak ``plan``'s words in ``speaker``'s voice, join them and add the room and noise.

    Raises:
        UnusableUtterance: a word gave no audio (the message says which).
        ValueError: the first word is planned as said ``again``.
    """
    if plan.words and plan.words[0].again:
        raise ValueError(f"{plan.id}: the first word cannot repeat a word before it")
    engine.set_voice(speaker.voice, speaker.variant)
    pieces, starts, ends, position = [np.zeros(plan.gaps[0])], [], [], plan.gaps[0]
    for i, (word, gap) in enumerate(zip(plan.words, plan.gaps[1:])):
        if word.again:  # the previous word's samples once more
            said = pieces[-2]
        else:
            engine.set_prosody(word.rate, word.pitch, word.pitch_range)
            audio = _speak(engine, word.word, plan.seed + i)
            start, end = trim_word(audio)
            if end <= start:
                raise UnusableUtterance(f"eSpeak returned silence for {word.word!r}")
            said = audio[start:end] * 10 ** (word.gain_db / 20)
        pieces += [said, np.zeros(gap)]
        starts.append(position)
        ends.append(position + len(said))
        position = ends[-1] + gap
    dry = np.concatenate(pieces)  # (N,)
    active = np.zeros(len(dry), dtype=bool)
    for start, end in zip(starts, ends):
        active[start:end] = True
    rng = np.random.default_rng(plan.seed)
    signal = dry
    if plan.rt60 is not None:
        signal = reverberate(dry, room_impulse_response(rng, plan.rt60, plan.drr_db))
    if plan.noise != "none":
        if plan.noise == "white":
            noise = white_noise(rng, len(signal))
        elif plan.noise == "pink":
            noise = pink_noise(rng, len(signal))
        else:
            noise = _babble(engine, plan, len(signal), rng)
        signal = mix_at_snr(signal, noise, plan.snr_db, active)
    peak = 10 ** (plan.peak_dbfs / 20) / np.abs(signal).max()
    audio = np.round(signal * peak * 32767).astype(np.int16)
    return RenderedDigits(
        audio,
        [s / SAMPLE_RATE for s in starts],
        [e / SAMPLE_RATE for e in ends],
    )


def synthesize_digits_speaker(job: DigitsJob) -> tuple[list[dict], list[SkippedUtterance]]:
    """Synthesize and write one speaker's utterances; return manifest entries and skips.

    The engine is reset first, so the audio depends only on this job, whichever process
    runs it and whatever it ran before.
    """
    engine = espeak_engine()
    engine.reset()
    out_dir = Path(job.corpus_dir) / job.audio_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    entries, skipped = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same sums, hence the same samples, everywhere
    try:
        for plan in job.utterances:
            try:
                rendered = render_digits(engine, job.speaker, plan)
            except UnusableUtterance as skip:
                skipped.append(SkippedUtterance(plan.id, str(skip)))
                continue
            audio_path = f"{job.audio_dir}/{plan.id}.wav"
            write_wav(Path(job.corpus_dir) / audio_path, rendered.audio)
            entries.append(
                {
                    "id": plan.id,
                    "audio": audio_path,
                    "duration": rendered.duration,
                    "speaker": job.speaker.id,
                    "words": plan.transcript,
                    "word_starts": rendered.word_starts,
                    "word_ends": rendered.word_ends,
                    "noise": plan.noise,
                    "snr_db": plan.snr_db,
                    "rt60": plan.rt60,
                }
            )
    finally:
        torch.set_num_threads(threads)
    return entries, skipped
