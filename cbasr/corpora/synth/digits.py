"""The synthetic connected-digits corpus ``digits``: digit strings in noise, with gold word times.

Each utterance is 2 to 7 digits (uniform), every digit drawn uniformly and independently,
so about one digit in ten repeats the one before it (a word in 10.5: "zero" and "oh" are
different words). Zero is spoken as "zero" or "oh", half and half; the 11 words are those of
connected-digit corpora such as TIDIGITS (:data:`DIGIT_WORDS`). A synthetic speaker
(:mod:`.speakers`; dev and test are drawn first, each held-out speaker with an eSpeak variant
of its own) says each word separately, with its rate, pitch and pitch range jittered
around the speaker's for every word and a gain of +-3 dB; the words are joined with 50 to
300 ms gaps (uniform, also before the first word and after the last) and their times are
recorded. Then, per utterance:

- reverberation (half the utterances): a synthetic room of RT60 0.2-0.7 s and
  direct-to-reverberant ratio 0-10 dB (:mod:`.acoustics`);
- additive noise over the whole utterance, gaps included: white, pink or babble (3 to 6
  other eSpeak voices speaking sentences of the synth grammar, summed) in equal shares, at
  an SNR uniform in ``[min_snr_db, max_snr_db]`` measured over the words;
- a peak level from -12 to -1 dBFS.

The ``repeats`` split is a stress test of repeated digits, the words transducers delete on
real connected-digit recordings: the test speakers again (held out from training), each
utterance drawn as the others but with one word after the first, chosen uniformly, made to
repeat the word before it (others may repeat by chance), and every repeated word said
exactly as its predecessor, the same dry samples (``repeat_prosody="same"``), as a person
says a digit twice. The other splits draw every word's prosody anew, so their repeats differ
from their predecessors as much as any two takes of a word do; see :class:`DigitsConfig` for
the options that ablate the split's choices.

Layout of ``out_dir`` after :func:`make_digits_corpus`::

    wav/<split>/<utt_id>.wav     16 kHz 16-bit PCM mono
    <split>.jsonl                one utterance per line, for split in train, dev, test, repeats
    speakers.json                each speaker's split, voice, variant, rate, pitch, pitch range
    words.txt                    the 11 words, one per line
    .done                        the generation parameters and utterance counts, written last

A manifest line has exactly these keys::

    {"id": "spk012-00034", "audio": "wav/train/spk012-00034.wav", "duration": 2.61,
     "speaker": "spk012", "words": "four oh four", "word_starts": [0.21, ...],
     "word_ends": [0.63, ...], "noise": "babble", "snr_db": 12.3, "rt60": 0.41}

``word_starts`` and ``word_ends`` (seconds) have one entry per word: each word's dry speech
(trimmed to its first and last 5 ms frame within 40 dB of its loudest) lies in
``[start, end)``, and the gap before it is ``start`` minus the previous word's end (or
``start`` for the first word). ``noise`` is ``white``, ``pink``, ``babble`` or ``none``
(``snr_db`` then null), ``rt60`` null without reverberation.

Like the sentence corpus (:mod:`~cbasr.corpora.synth.corpus`), everything is a function of the
:class:`DigitsConfig` and the eSpeak wheel's version, not of the number of workers, and a
rerun on a complete directory does nothing (:mod:`.directory`).
"""

import dataclasses
import importlib.metadata
import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

from cbasr.corpora.synth.digit_rendering import (
    DigitsJob,
    DigitsPlan,
    Talker,
    WordPlan,
    synthesize_digits_speaker,
)
from cbasr.corpora.synth.directory import (
    CorpusSummary,
    clear,
    describe,
    find_complete,
    finish,
    run_jobs,
)
from cbasr.corpora.synth.speakers import RATE_WPM, SPLITS, VARIANTS, VOICES, Speaker, draw_speakers
from cbasr.corpora.synth.text import SentenceGenerator

__all__ = [
    "DIGIT_SPLITS",
    "DIGITS_SIZES",
    "DIGIT_WORDS",
    "FORMAT_VERSION",
    "NOISES",
    "REPEAT_PROSODIES",
    "TRAIN_REPEATS",
    "DigitsConfig",
    "digit_words",
    "repeated_digit_words",
    "make_digits_corpus",
    "plan_digits",
]

FORMAT_VERSION = 1
DIGIT_SPLITS = ("train", "dev", "test", "repeats")
REPEAT_PROSODIES = ("same", "drawn")
TRAIN_REPEATS = ("natural", "none")
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "oh")
NOISES = ("white", "pink", "babble")
_FILES = ("speakers.json", "words.txt")
_LOG = logging.getLogger(__name__)

# Per-word prosody jitter around the speaker's, and the other uniform draws.
_RATE_JITTER = 0.15  # rate times 1 +- this
_PITCH_JITTER = 8  # pitch +- this, on eSpeak's 0..99 scale
_RANGE_JITTER = 10  # pitch range +- this
_GAIN_DB = 3.0  # word gain +- this
_RT60 = (0.2, 0.7)  # seconds
_DRR_DB = (0.0, 10.0)
_TALKERS = (3, 6)  # babble voices
_PEAK_DBFS = (-12.0, -1.0)


@dataclass(frozen=True)
class DigitsConfig:
    """Corpus size, seed and difficulty.

    Attributes:
        min_words, max_words: digits per utterance, drawn uniformly.
        min_gap_ms, max_gap_ms: silence or noise between words and at both ends.
        min_snr_db, max_snr_db: the SNR of the additive noise, drawn uniformly.
        noise_share, reverb_share: the shares of utterances with noise and with reverberation.
        repeats_utts_per_speaker: utterances of the ``repeats`` split per test speaker, each
            with at least one word that repeats the one before it.
        repeat_prosody: in the ``repeats`` split, ``"same"``: a repeated word is said exactly
            as its predecessor (:attr:`WordPlan.again`); ``"drawn"``: with prosody of its own,
            as in the other splits.
        min_repeat_gap_ms, max_repeat_gap_ms: in the ``repeats`` split, the gap before a
            repeated word.
        train_repeats: ``"natural"``: the train split's digits are drawn independently, so
            about one word in ten repeats the one before it; ``"none"``: no train word repeats
            its predecessor (each such word is drawn again), which teaches a transducer's
            prediction network that a word never follows itself. Only the train split's draws
            change (the later splits' draws follow them in the same stream, so their
            utterances differ too, drawn the same way).
    """

    train_speakers: int = 250
    dev_speakers: int = 20
    test_speakers: int = 20
    train_utts_per_speaker: int = 12
    dev_utts_per_speaker: int = 15
    test_utts_per_speaker: int = 15
    seed: int = 0
    min_words: int = 2
    max_words: int = 7
    min_gap_ms: int = 50
    max_gap_ms: int = 300
    min_snr_db: float = 15.0  # see DIGITS_SIZES
    max_snr_db: float = 30.0
    noise_share: float = 1.0
    reverb_share: float = 0.5
    repeats_utts_per_speaker: int = 15
    repeat_prosody: str = "same"
    min_repeat_gap_ms: int = 50
    max_repeat_gap_ms: int = 300
    train_repeats: str = "natural"

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type is int and field.name != "seed":
                if not isinstance(value, int) or value < 0:
                    raise ValueError(f"{field.name} must be a non-negative integer, not {value!r}")
        if not 1 <= self.min_words <= self.max_words:
            raise ValueError(
                f"need 1 <= min_words <= max_words, not {self.min_words}, {self.max_words}"
            )
        if not self.min_gap_ms <= self.max_gap_ms:
            raise ValueError(f"min_gap_ms {self.min_gap_ms} exceeds max_gap_ms {self.max_gap_ms}")
        if not self.min_repeat_gap_ms <= self.max_repeat_gap_ms:
            raise ValueError(
                f"min_repeat_gap_ms {self.min_repeat_gap_ms} exceeds max_repeat_gap_ms "
                f"{self.max_repeat_gap_ms}"
            )
        if self.repeat_prosody not in REPEAT_PROSODIES:
            raise ValueError(
                f"repeat_prosody must be one of {REPEAT_PROSODIES}, not {self.repeat_prosody!r}"
            )
        if self.train_repeats not in TRAIN_REPEATS:
            raise ValueError(
                f"train_repeats must be one of {TRAIN_REPEATS}, not {self.train_repeats!r}"
            )
        if self.repeats_utts_per_speaker and self.max_words < 2:
            raise ValueError("the repeats split needs max_words >= 2")
        if not self.min_snr_db <= self.max_snr_db:
            raise ValueError(f"min_snr_db {self.min_snr_db} exceeds max_snr_db {self.max_snr_db}")
        for name in ("noise_share", "reverb_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], not {getattr(self, name)!r}")

    def speakers(self, split: str) -> int:
        return getattr(self, f"{'test' if split == 'repeats' else split}_speakers")

    def utts_per_speaker(self, split: str) -> int:
        return getattr(self, f"{split}_utts_per_speaker")


DIGITS_SIZES: dict[str, DigitsConfig] = {
    # 3000 train utterances from 250 speakers (2.3 h), 300 dev and 300 test from 20 each (about
    # 1350 words each, as many as the held-out real connected-digit test set). Many speakers
    # with few utterances each, so that no one unusual voice moves the test WER much; SNR
    # 15-30 dB. Against the other sizes and SNRs tried: recipes/digits/RESULTS.md, "Choosing
    # the difficulty".
    "default": DigitsConfig(),
    # 16 utterances in about a second: for tests.
    "tiny": DigitsConfig(
        train_speakers=4, dev_speakers=1, test_speakers=1,
        train_utts_per_speaker=3, dev_utts_per_speaker=2, test_utts_per_speaker=2,
        repeats_utts_per_speaker=2,
    ),
}  # fmt: skip


def plan_digits(config: DigitsConfig, corpus_dir: str | Path) -> list[DigitsJob]:
    """Speakers and their utterances, one job per speaker and split, in speaker order, the
    ``repeats`` split's jobs (the test speakers again) last.

    One ``random.Random(seed)`` draws every utterance in turn (digits, prosody, gaps, noise,
    room, level); each utterance gets its own seed for eSpeak and the noise samples. The
    ``repeats`` split is drawn after the others, so it leaves them as they were without it.
    """
    rng = random.Random(config.seed)
    sentences = SentenceGenerator(config.seed)
    counts = {split: config.speakers(split) for split in SPLITS}
    jobs, index = [], 0
    speakers = draw_speakers(counts, config.seed, held_out_first=True)
    test_speakers = [speaker for speaker in speakers if speaker.split == "test"]
    for split, speaker in [(s.split, s) for s in speakers] + [
        ("repeats", s) for s in test_speakers
    ]:
        plans = []
        for k in range(config.utts_per_speaker(split)):
            utt_seed = (config.seed * 1_000_003 + index) % 2**31
            utt_id = f"{speaker.id}-{'r' if split == 'repeats' else ''}{k:05d}"
            plan = _plan_utterance(rng, sentences, config, speaker, utt_id, utt_seed, split)
            plans.append(plan)
            index += 1
        jobs.append(DigitsJob(speaker, tuple(plans), str(corpus_dir), f"wav/{split}", split))
    return jobs


def digit_words(rng: random.Random, config: DigitsConfig, repeats: bool = True) -> list[str]:
    """One digit string's words: uniform length, uniform digits, zero as "zero" or "oh";
    without ``repeats``, a word equal to the one before it is drawn again until it differs."""
    words = [_digit_word(rng) for _ in range(rng.randint(config.min_words, config.max_words))]
    if not repeats:
        for i in range(1, len(words)):
            while words[i] == words[i - 1]:
                words[i] = _digit_word(rng)
    return words


def _digit_word(rng: random.Random) -> str:
    digit = rng.randrange(10)
    return DIGIT_WORDS[digit] if digit or rng.random() < 0.5 else "oh"


def repeated_digit_words(rng: random.Random, config: DigitsConfig) -> list[str]:
    """A digit string (:func:`digit_words`, at least two words) in which one word, chosen
    uniformly after the first, is made to repeat the word before it; the others may repeat
    by chance."""
    while len(words := digit_words(rng, config)) < 2:
        pass
    i = rng.randrange(1, len(words))
    words[i] = words[i - 1]
    return words


def _plan_utterance(
    rng: random.Random,
    sentences: SentenceGenerator,
    config: DigitsConfig,
    speaker: Speaker,
    utt_id: str,
    seed: int,
    split: str,
) -> DigitsPlan:
    stress = split == "repeats"
    if stress:
        texts = repeated_digit_words(rng, config)
    else:
        no_repeats = split == "train" and config.train_repeats == "none"
        texts = digit_words(rng, config, repeats=not no_repeats)
    words: list[WordPlan] = []
    for i, word in enumerate(texts):
        if stress and i and word == texts[i - 1] and config.repeat_prosody == "same":
            words.append(dataclasses.replace(words[-1], again=True))
            continue
        words.append(
            WordPlan(
                word,
                rate=round(speaker.rate * rng.uniform(1 - _RATE_JITTER, 1 + _RATE_JITTER)),
                pitch=min(99, max(0, speaker.pitch + rng.randint(-_PITCH_JITTER, _PITCH_JITTER))),
                pitch_range=min(
                    99, max(0, speaker.pitch_range + rng.randint(-_RANGE_JITTER, _RANGE_JITTER))
                ),
                gain_db=round(rng.uniform(-_GAIN_DB, _GAIN_DB), 2),
            )
        )
    # gaps in samples at 16 kHz: before each word and after the last
    gaps = tuple(
        rng.randint(config.min_repeat_gap_ms * 16, config.max_repeat_gap_ms * 16)
        if stress and 0 < i < len(texts) and texts[i] == texts[i - 1]
        else rng.randint(config.min_gap_ms * 16, config.max_gap_ms * 16)
        for i in range(len(texts) + 1)
    )
    noise, snr_db, talkers = "none", None, ()
    if rng.random() < config.noise_share:
        noise = rng.choice(NOISES)
        snr_db = round(rng.uniform(config.min_snr_db, config.max_snr_db), 2)
        if noise == "babble":
            talkers = tuple(
                Talker(
                    rng.choice(VOICES),
                    rng.choice(VARIANTS),
                    rng.randint(*RATE_WPM),
                    sentences.sentence().text,
                )
                for _ in range(rng.randint(*_TALKERS))
            )
    rt60, drr_db = None, 0.0
    if rng.random() < config.reverb_share:
        rt60 = round(rng.uniform(*_RT60), 3)
        drr_db = round(rng.uniform(*_DRR_DB), 2)
    peak_dbfs = round(rng.uniform(*_PEAK_DBFS), 2)
    return DigitsPlan(
        utt_id, tuple(words), gaps, noise, snr_db, talkers, rt60, drr_db, peak_dbfs, seed
    )


def make_digits_corpus(
    out_dir: str | Path, config: DigitsConfig | None = None, *, workers: int = 1
) -> CorpusSummary:
    """Generate the digits corpus in ``out_dir`` unless it is already complete for ``config``.

    Args:
        out_dir: the corpus directory (created if missing).
        config: sizes, seed and difficulty; ``DIGITS_SIZES["default"]`` when None.
        workers: processes synthesizing in parallel; 1 synthesizes in this process. The
            output does not depend on it.
    """
    config = DIGITS_SIZES["default"] if config is None else config
    out_dir = Path(out_dir)
    params = {
        "format_version": FORMAT_VERSION,
        "espeakng_loader": importlib.metadata.version("espeakng-loader"),
        **dataclasses.asdict(config),
    }
    if config.train_repeats == "natural":  # (as before the option: those corpora stay complete)
        del params["train_repeats"]
    summary = find_complete(out_dir, params, _FILES, DIGIT_SPLITS)
    if summary is not None:
        _LOG.info(
            "digits corpus in %s is complete for these parameters, nothing to do: %s",
            out_dir,
            describe(summary),
        )
        return summary
    start = time.monotonic()
    clear(out_dir, _FILES, DIGIT_SPLITS)
    jobs = plan_digits(config, out_dir.resolve())
    entries, skipped = run_jobs(jobs, synthesize_digits_speaker, workers, DIGIT_SPLITS)
    speakers = [dataclasses.asdict(job.speaker) for job in jobs if job.split != "repeats"]
    files = {
        "speakers.json": json.dumps(speakers, indent=1) + "\n",
        "words.txt": "".join(word + "\n" for word in DIGIT_WORDS),
    }
    summary = finish(out_dir, params, entries, skipped, files, start)
    _LOG.info("digits corpus: %s", describe(summary))
    return summary
