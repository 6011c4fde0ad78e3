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
import multiprocessing
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cbasr.corpora.synth.phones import FULL_PHONES, MERGED_PHONES
from cbasr.corpora.synth.speakers import SPLITS, Speaker, draw_speakers
from cbasr.corpora.synth.synthesis import (
    SkippedUtterance,
    SpeakerJob,
    UtterancePlan,
    synthesize_speaker,
)
from cbasr.corpora.synth.text import SentenceGenerator
from cbasr.progress import progress_bar

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
MARKER = ".done"
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
    # voices than 80 with 90 each (same hours, same training time).
    "default": CorpusConfig(),
    # 16 utterances in well under a second: for tests.
    "tiny": CorpusConfig(
        train_speakers=4, dev_speakers=1, test_speakers=1,
        train_utts_per_speaker=3, dev_utts_per_speaker=2, test_utts_per_speaker=2,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class CorpusSummary:
    """What a corpus holds; ``generated`` is False when :func:`make_corpus` found it complete."""

    utterances: dict[str, int]
    hours: dict[str, float]
    skipped: int
    seconds: float
    generated: bool


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
    summary = _complete_summary(out_dir, params)
    if summary is not None:
        _LOG.info(
            "synth corpus in %s is complete for these parameters, nothing to do: %s",
            out_dir,
            _describe(summary),
        )
        return summary
    start = time.monotonic()
    _clear(out_dir)
    jobs = plan_corpus(config, out_dir.resolve())
    entries, skipped = _run_jobs(jobs, workers)
    for item in skipped:
        _LOG.warning("skipped utterance %s: %s", item.id, item.reason)
    speakers = [job.speaker for job in jobs]
    _write_outputs(out_dir, entries, speakers)
    summary = CorpusSummary(
        utterances={split: len(entries[split]) for split in SPLITS},
        hours={
            split: round(sum(e["duration"] for e in entries[split]) / 3600, 4) for split in SPLITS
        },
        skipped=len(skipped),
        seconds=round(time.monotonic() - start, 2),
        generated=True,
    )
    contents = {
        "utterances": summary.utterances,
        "hours": summary.hours,
        "skipped": summary.skipped,
    }
    _write_atomic(out_dir / MARKER, json.dumps({"params": params, **contents}, indent=1) + "\n")
    _LOG.info("synth corpus: %s", _describe(summary))
    return summary


def _parameters(config: CorpusConfig) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "espeakng_loader": importlib.metadata.version("espeakng-loader"),
        **dataclasses.asdict(config),
    }


def _complete_summary(out_dir: Path, params: dict) -> CorpusSummary | None:
    """The recorded summary if ``out_dir`` is complete for ``params``, else None."""
    try:
        marker = json.loads((out_dir / MARKER).read_text())
        if marker["params"] != params or not _files_complete(out_dir, marker["utterances"]):
            return None
        return CorpusSummary(
            marker["utterances"], marker["hours"], marker["skipped"], 0.0, generated=False
        )
    except (OSError, ValueError, KeyError, TypeError):  # missing or damaged files
        return None


def _files_complete(out_dir: Path, utterances: dict[str, int]) -> bool:
    """Every manifest has its recorded number of lines and every audio file it names exists."""
    for split in SPLITS:
        lines = (out_dir / f"{split}.jsonl").read_text().splitlines()
        if len(lines) != utterances[split]:
            return False
        if not all((out_dir / json.loads(line)["audio"]).is_file() for line in lines):
            return False
    return all(
        (out_dir / name).is_file() for name in ("speakers.json", "phones.txt", "phones_full.txt")
    )


def _clear(out_dir: Path) -> None:
    """Remove the marker first, then every file a previous run may have left."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).unlink(missing_ok=True)
    for name in [f"{split}.jsonl" for split in SPLITS] + [
        "speakers.json",
        "phones.txt",
        "phones_full.txt",
    ]:
        (out_dir / name).unlink(missing_ok=True)
    for partial in out_dir.glob("*.partial"):
        partial.unlink()
    shutil.rmtree(out_dir / "wav", ignore_errors=True)


def _run_jobs(
    jobs: list[SpeakerJob], workers: int
) -> tuple[dict[str, list[dict]], list[SkippedUtterance]]:
    """Synthesize every job in order, logging progress about every tenth of the corpus."""
    entries: dict[str, list[dict]] = {split: [] for split in SPLITS}
    skipped: list[SkippedUtterance] = []
    total = sum(len(job.utterances) for job in jobs)
    done, start, next_report = 0, time.monotonic(), 0.1
    results = progress_bar(_results(jobs, workers), "synthesizing", len(jobs), "speaker")
    for job, (job_entries, job_skipped) in zip(jobs, results):
        entries[job.speaker.split] += job_entries
        skipped += job_skipped
        done += len(job.utterances)
        if done >= next_report * total or done == total:
            _LOG.info("synth: %d/%d utterances, %.1f s", done, total, time.monotonic() - start)
            next_report = done / total + 0.1
    return entries, skipped


def _results(
    jobs: list[SpeakerJob], workers: int
) -> Iterator[tuple[list[dict], list[SkippedUtterance]]]:
    """Job results in job order, from this process or from ``workers`` spawned processes."""
    if workers <= 1:
        yield from map(synthesize_speaker, jobs)
        return
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        yield from pool.imap(synthesize_speaker, jobs)


def _write_outputs(out_dir: Path, entries: dict[str, list[dict]], speakers: list[Speaker]) -> None:
    for split in SPLITS:
        lines = "".join(json.dumps(entry, ensure_ascii=False) + "\n" for entry in entries[split])
        _write_atomic(out_dir / f"{split}.jsonl", lines)
    speakers_json = json.dumps([dataclasses.asdict(s) for s in speakers], indent=1)
    _write_atomic(out_dir / "speakers.json", speakers_json + "\n")
    _write_atomic(out_dir / "phones.txt", "".join(label + "\n" for label in MERGED_PHONES))
    _write_atomic(out_dir / "phones_full.txt", "".join(label + "\n" for label in FULL_PHONES))


def _write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _describe(summary: CorpusSummary) -> str:
    splits = ", ".join(
        f"{split} {summary.utterances[split]} utterances ({summary.hours[split]:.2f} h)"
        for split in SPLITS
    )
    hours = f"{sum(summary.hours.values()):.2f} h of audio"
    if summary.generated:
        hours += f" in {summary.seconds:.1f} s"
    return f"{splits}; {hours}; {summary.skipped} skipped"
