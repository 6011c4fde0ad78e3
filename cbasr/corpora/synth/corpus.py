"""Writing the synth corpus directory, idempotently.

Layout of ``out_dir`` after :func:`make_corpus`::

    wav/<split>/<utt_id>.wav     16 kHz 16-bit PCM mono
    <split>.jsonl                one utterance per line, for split in train, dev, test
    speakers.json                each speaker's split, voice, variant, rate, pitch, pitch range
    phones.txt                   the merged inventory, one label per line
    phones_full.txt              the unmerged (stress-stripped) inventory
    .done                        the generation parameters and utterance counts, written last

A manifest line has exactly these keys::

    {"id": "spk012-00034", "audio": "wav/train/spk012-00034.wav", "duration": 2.61,
     "speaker": "spk012", "words": "the old dog sleeps", "phones": [...],
     "phones_full": [...], "phone_starts": [...]}

``audio`` is relative to the directory holding the manifest; ``phones`` (merged inventory),
``phones_full`` (eSpeak labels without stress) and ``phone_starts`` (seconds,
non-decreasing, within the audio) have the same length. Consecutive starts can be equal:
eSpeak renders a liquid after a vowel ("smiles", Scottish "horse") inside the vowel and
reports it at the next phone's start, so such a phone has no span of its own (about one
utterance in ten has one).

Everything is a function of the :class:`CorpusConfig` (seed included) and the eSpeak wheel's
version, not of the number of workers. Files are written under temporary names and renamed,
and ``.done`` comes last: a rerun with the same parameters and every file present does
nothing, anything else clears the corpus files and generates them again.
"""

import dataclasses
import importlib.metadata
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from cbasr.corpora.synth.directory import (
    MARKER,
    CorpusSummary,
    clear,
    describe,
    find_complete,
    finish,
    run_jobs,
)
from cbasr.corpora.synth.phones import FULL_PHONES, MERGED_PHONES
from cbasr.corpora.synth.speakers import SPLITS, draw_speakers
from cbasr.corpora.synth.synthesis import SpeakerJob, UtterancePlan, synthesize_speaker
from cbasr.corpora.synth.text import SentenceGenerator

__all__ = [
    "FORMAT_VERSION",
    "MARKER",
    "SIZES",
    "CorpusConfig",
    "CorpusSummary",
    "make_corpus",
    "plan_corpus",
]

FORMAT_VERSION = 1
_FILES = ("speakers.json", "phones.txt", "phones_full.txt")
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class CorpusConfig:
    """Corpus size and seed: speakers per split and utterances per speaker in each split."""

    train_speakers: int = 200
    dev_speakers: int = 10
    test_speakers: int = 10
    train_utts_per_speaker: int = 36
    dev_utts_per_speaker: int = 50
    test_utts_per_speaker: int = 50
    seed: int = 0

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name != "seed" and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{field.name} must be a non-negative integer, not {value!r}")

    def speakers(self, split: str) -> int:
        return getattr(self, f"{split}_speakers")

    def utts_per_speaker(self, split: str) -> int:
        return getattr(self, f"{split}_utts_per_speaker")


SIZES: dict[str, CorpusConfig] = {
    # 7200 train utterances from 200 speakers, 500 dev and 500 test from 10 each, about 5 hours:
    # the demo's corpus. Many speakers with few utterances each generalise better to unseen
    # voices than 80 with 90 each (same hours, same training time; recipes/synth/RESULTS.md,
    # "make demo").
    "default": CorpusConfig(),
    # 16 utterances in well under a second: for tests.
    "tiny": CorpusConfig(
        train_speakers=4, dev_speakers=1, test_speakers=1,
        train_utts_per_speaker=3, dev_utts_per_speaker=2, test_utts_per_speaker=2,
    ),
}  # fmt: skip


def plan_corpus(config: CorpusConfig, corpus_dir: str | Path) -> list[SpeakerJob]:
    """Speakers and their sentences, one job per speaker, in speaker order.

    Sentences are unique across the corpus; each utterance gets its own eSpeak noise seed.
    """
    counts = {split: config.speakers(split) for split in SPLITS}
    sentences = SentenceGenerator(config.seed)
    seen: set[str] = set()
    jobs = []
    index = 0
    for speaker in draw_speakers(counts, config.seed):
        plans = []
        for k in range(config.utts_per_speaker(speaker.split)):
            sentence = sentences.sentence()
            while sentence.words in seen:
                sentence = sentences.sentence()
            seen.add(sentence.words)
            utt_seed = (config.seed * 1_000_003 + index) % 2**31
            utt_id = f"{speaker.id}-{k:05d}"
            plans.append(UtterancePlan(utt_id, sentence.words, sentence.text, utt_seed))
            index += 1
        jobs.append(SpeakerJob(speaker, tuple(plans), str(corpus_dir), f"wav/{speaker.split}"))
    return jobs


def make_corpus(
    out_dir: str | Path, config: CorpusConfig | None = None, *, workers: int = 1
) -> CorpusSummary:
    """Generate the corpus in ``out_dir`` unless it is already complete for ``config``.

    Args:
        out_dir: the corpus directory (created if missing).
        config: sizes and seed; ``SIZES["default"]`` when None.
        workers: processes synthesizing in parallel; 1 synthesizes in this process. The
            output does not depend on it.
    """
    config = SIZES["default"] if config is None else config
    out_dir = Path(out_dir)
    params = _parameters(config)
    summary = find_complete(out_dir, params, _FILES)
    if summary is not None:
        _LOG.info(
            "synth corpus in %s is complete for these parameters, nothing to do: %s",
            out_dir,
            describe(summary),
        )
        return summary
    start = time.monotonic()
    clear(out_dir, _FILES)
    jobs = plan_corpus(config, out_dir.resolve())
    entries, skipped = run_jobs(jobs, synthesize_speaker, workers)
    speakers = [dataclasses.asdict(job.speaker) for job in jobs]
    files = {
        "speakers.json": json.dumps(speakers, indent=1) + "\n",
        "phones.txt": "".join(label + "\n" for label in MERGED_PHONES),
        "phones_full.txt": "".join(label + "\n" for label in FULL_PHONES),
    }
    summary = finish(out_dir, params, entries, skipped, files, start)
    _LOG.info("synth corpus: %s", describe(summary))
    return summary


def _parameters(config: CorpusConfig) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "espeakng_loader": importlib.metadata.version("espeakng-loader"),
        **dataclasses.asdict(config),
    }
