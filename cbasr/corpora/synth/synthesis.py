"""Rendering utterances: eSpeak audio at 16 kHz with checked phone labels and start times.

:func:`render_utterance` turns one planned sentence into 16 kHz int16 audio, the
stress-stripped phone labels and each phone's start time; :func:`synthesize_speaker` does
that for all of one speaker's utterances, writes their WAV files and returns their manifest
entries. It runs in worker processes as well as in the main one.

eSpeak's phoneme events give each phone's first sample at 22050 Hz; resampling keeps time,
so a phone starting at sample ``s`` starts at ``s / 22050`` seconds in the 16 kHz audio too.
The times are eSpeak's own: a liquid that eSpeak renders inside the preceding vowel keeps
the start of the phone after it (equal consecutive starts), and is not moved.

An utterance with an empty sentence, a synthesis failure, no audio, no phone events, or
phone start times that decrease or fall outside the audio is skipped with its id and the
reason (:class:`SkippedUtterance`). A phone label outside the documented inventory stops
generation (:class:`~cbasr.corpora.synth.phones.UnknownPhoneError`).
"""

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile
import torch
import torchaudio

from cbasr.corpora.synth.espeak import EspeakEngine, EspeakError, espeak_engine
from cbasr.corpora.synth.phones import is_pause, merge_phones, strip_stress
from cbasr.corpora.synth.speakers import Speaker

__all__ = [
    "SAMPLE_RATE",
    "RenderedUtterance",
    "SkippedUtterance",
    "SpeakerJob",
    "UnusableUtterance",
    "UtterancePlan",
    "render_utterance",
    "resample_to_16k",
    "synthesize_speaker",
    "write_wav",
]

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class UtterancePlan:
    """What to synthesize: ``text`` is ``words`` with final punctuation; ``seed`` seeds eSpeak."""

    id: str
    words: str
    text: str
    seed: int


@dataclass(frozen=True)
class SpeakerJob:
    """One speaker's utterances; WAV files go to ``corpus_dir / audio_dir``."""

    speaker: Speaker
    utterances: tuple[UtterancePlan, ...]
    corpus_dir: str
    audio_dir: str

    @property
    def split(self) -> str:
        return self.speaker.split


@dataclass(frozen=True)
class RenderedUtterance:
    """One utterance ready for the corpus.

    Attributes:
        audio: ``(N,)`` int16 samples at 16 kHz.
        phones: merged labels (``MERGED_PHONES``).
        phones_full: eSpeak labels without stress marks (``FULL_PHONES``), same length.
        phone_starts: each phone's start in seconds, non-decreasing and within the audio.
    """

    audio: np.ndarray
    phones: list[str]
    phones_full: list[str]
    phone_starts: list[float]

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE


@dataclass(frozen=True)
class SkippedUtterance:
    """An utterance left out of the corpus, and why."""

    id: str
    reason: str


class UnusableUtterance(Exception):
    """An utterance that cannot go into the corpus; the message says why."""


def resample_to_16k(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Resample int16 ``(N,)`` audio to 16 kHz int16 ``(ceil(N * 16000 / sample_rate),)``.

    For eSpeak's 22050 Hz this is the ratio 320/441 (torchaudio reduces it by the gcd).
    """
    waveform = torch.from_numpy(audio.astype(np.float32) / 32768.0)
    resampled = _resampler(sample_rate)(waveform)
    scaled = torch.clamp(torch.round(resampled * 32768.0), -32768, 32767)
    return scaled.to(torch.int16).numpy()


@functools.cache
def _resampler(sample_rate: int) -> torchaudio.transforms.Resample:
    """A resampler to 16 kHz; it computes its windowed-sinc kernel once."""
    return torchaudio.transforms.Resample(sample_rate, SAMPLE_RATE)


def render_utterance(engine: EspeakEngine, plan: UtterancePlan) -> RenderedUtterance:
    """Synthesize ``plan`` with the engine's current voice.

    Raises:
        UnusableUtterance: the utterance must be left out (the message says why).
        UnknownPhoneError: eSpeak produced a label outside the inventory.
    """
    if not plan.words.strip():
        raise UnusableUtterance("empty sentence")
    try:
        synthesis = engine.synthesize(plan.text, plan.seed)
    except EspeakError as error:
        raise UnusableUtterance(f"synthesis failed: {error}") from error
    if synthesis.audio.size == 0:
        raise UnusableUtterance("eSpeak returned no audio")
    events = zip(synthesis.phones, synthesis.phone_samples)
    kept = [(strip_stress(label), sample) for label, sample in events if not is_pause(label)]
    if not kept:
        raise UnusableUtterance("eSpeak reported no phone events")
    phones_full = [label for label, _ in kept]
    phones = merge_phones(phones_full, plan.id)  # fails loudly on a label outside the inventory
    audio = resample_to_16k(synthesis.audio, synthesis.sample_rate)
    starts = [round(sample / synthesis.sample_rate, 5) for _, sample in kept]
    _check_phone_starts(starts, len(audio) / SAMPLE_RATE)
    return RenderedUtterance(audio, phones, phones_full, starts)


def _check_phone_starts(starts: list[float], duration: float) -> None:
    if any(later < earlier for earlier, later in zip(starts, starts[1:])):
        raise UnusableUtterance(f"phone start times decrease: {starts}")
    if starts[0] < 0 or starts[-1] >= duration:
        raise UnusableUtterance(
            f"phone start times {starts[0]}..{starts[-1]} s fall outside the {duration} s audio"
        )


def synthesize_speaker(job: SpeakerJob) -> tuple[list[dict], list[SkippedUtterance]]:
    """Synthesize and write one speaker's utterances; return manifest entries and skips.

    The engine is reset first, so the audio depends only on this job, whichever process
    runs it and whatever it ran before.
    """
    engine = espeak_engine()
    engine.reset()
    speaker = job.speaker
    engine.set_voice(speaker.voice, speaker.variant)
    engine.set_prosody(speaker.rate, speaker.pitch, speaker.pitch_range)
    out_dir = Path(job.corpus_dir) / job.audio_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    entries, skipped = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same sums, hence the same samples, everywhere
    try:
        for plan in job.utterances:
            try:
                rendered = render_utterance(engine, plan)
            except UnusableUtterance as skip:
                skipped.append(SkippedUtterance(plan.id, str(skip)))
                continue
            audio_path = f"{job.audio_dir}/{plan.id}.wav"
            write_wav(Path(job.corpus_dir) / audio_path, rendered.audio)
            entries.append(_manifest_entry(plan, speaker, audio_path, rendered))
    finally:
        torch.set_num_threads(threads)
    return entries, skipped


def _manifest_entry(
    plan: UtterancePlan, speaker: Speaker, audio_path: str, rendered: RenderedUtterance
) -> dict:
    return {
        "id": plan.id,
        "audio": audio_path,
        "duration": rendered.duration,
        "speaker": speaker.id,
        "words": plan.words,
        "phones": rendered.phones,
        "phones_full": rendered.phones_full,
        "phone_starts": rendered.phone_starts,
    }


def write_wav(path: Path, audio: np.ndarray) -> None:
    """Write 16-bit PCM mono through a temporary file, so a killed run leaves no partial WAV."""
    partial = path.with_name(path.name + ".partial")
    soundfile.write(partial, audio, SAMPLE_RATE, subtype="PCM_16", format="WAV")
    os.replace(partial, path)
