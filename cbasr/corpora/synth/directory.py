"""An eSpeak corpus directory written idempotently: the machinery both corpora share.

The sentence corpus (:mod:`~cbasr.corpora.synth.corpus`) and the connected-digits corpus
(:mod:`.digits`) plan one job per speaker, run the jobs in this process or in spawned worker
processes (the output does not depend on which), and write ``<split>.jsonl`` manifests, a few
small text files and, last, the ``.done`` marker holding the generation parameters and the
utterance counts. :func:`find_complete` reads the marker back: a directory is complete when its
parameters match and every manifest line's audio file exists; :func:`clear` removes what an
earlier run left before a corpus is generated again. Every file is written under a temporary
name and renamed, so a killed run never leaves a file that looks finished.
"""

import json
import logging
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cbasr.corpora.synth.speakers import SPLITS
from cbasr.corpora.synth.synthesis import SkippedUtterance
from cbasr.progress import progress_bar

__all__ = [
    "MARKER",
    "CorpusSummary",
    "clear",
    "describe",
    "find_complete",
    "finish",
    "run_jobs",
    "write_atomic",
]

MARKER = ".done"
_LOG = logging.getLogger(__name__)

# One speaker's manifest entries and skipped utterances.
JobResult = tuple[list[dict], list[SkippedUtterance]]


@dataclass(frozen=True)
class CorpusSummary:
    """What a corpus holds; ``generated`` is False when the directory was found complete."""

    utterances: dict[str, int]
    hours: dict[str, float]
    skipped: int
    seconds: float
    generated: bool


def find_complete(
    out_dir: Path, params: dict, files: Sequence[str], splits: Sequence[str] = SPLITS
) -> CorpusSummary | None:
    """The recorded summary if ``out_dir`` is complete for ``params``, else None.

    Complete: the marker records ``params``, the manifest of each of ``splits`` has its
    recorded number of lines, every audio file they name exists, and so does each of ``files``.
    """
    try:
        marker = json.loads((out_dir / MARKER).read_text())
        complete = _files_complete(out_dir, marker["utterances"], files, splits)
        if marker["params"] != params or not complete:
            return None
        return CorpusSummary(
            marker["utterances"], marker["hours"], marker["skipped"], 0.0, generated=False
        )
    except (OSError, ValueError, KeyError, TypeError):  # missing or damaged files
        return None


def _files_complete(
    out_dir: Path, utterances: dict[str, int], files: Sequence[str], splits: Sequence[str]
) -> bool:
    for split in splits:
        lines = (out_dir / f"{split}.jsonl").read_text().splitlines()
        if len(lines) != utterances[split]:
            return False
        if not all((out_dir / json.loads(line)["audio"]).is_file() for line in lines):
            return False
    return all((out_dir / name).is_file() for name in files)


def clear(out_dir: Path, files: Sequence[str], splits: Sequence[str] = SPLITS) -> None:
    """Remove the marker first, then the manifests of ``splits``, ``files``, partial files and
    ``wav/``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).unlink(missing_ok=True)
    for name in [f"{split}.jsonl" for split in splits] + list(files):
        (out_dir / name).unlink(missing_ok=True)
    for partial in out_dir.glob("*.partial"):
        partial.unlink()
    shutil.rmtree(out_dir / "wav", ignore_errors=True)


def run_jobs(
    jobs: Sequence[Any],
    work: Callable[[Any], JobResult],
    workers: int,
    splits: Sequence[str] = SPLITS,
) -> tuple[dict[str, list[dict]], list[SkippedUtterance]]:
    """Run ``work`` on every job in order, logging progress about every tenth of the corpus.

    Args:
        jobs: one per speaker and split, each with ``split`` (one of ``splits``) and
            ``utterances``.
        work: a module-level function (it is pickled for the worker processes).
        workers: processes; 1 or fewer runs the jobs in this process.

    Returns:
        The manifest entries of each split in job order, and the skipped utterances.
    """
    entries: dict[str, list[dict]] = {split: [] for split in splits}
    skipped: list[SkippedUtterance] = []
    total = sum(len(job.utterances) for job in jobs)
    done, start, next_report = 0, time.monotonic(), 0.1
    results = progress_bar(_results(jobs, work, workers), "synthesizing", len(jobs), "speaker")
    for job, (job_entries, job_skipped) in zip(jobs, results):
        entries[job.split] += job_entries
        skipped += job_skipped
        done += len(job.utterances)
        if done >= next_report * total or done == total:
            _LOG.info("synth: %d/%d utterances, %.1f s", done, total, time.monotonic() - start)
            next_report = done / total + 0.1
    for item in skipped:
        _LOG.warning("skipped utterance %s: %s", item.id, item.reason)
    return entries, skipped


def _results(
    jobs: Sequence[Any], work: Callable[[Any], JobResult], workers: int
) -> Iterator[JobResult]:
    """Job results in job order, from this process or from ``workers`` spawned processes."""
    if workers <= 1:
        yield from map(work, jobs)
        return
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        yield from pool.imap(work, jobs)


def finish(
    out_dir: Path,
    params: dict,
    entries: dict[str, list[dict]],
    skipped: list[SkippedUtterance],
    files: dict[str, str],
    start: float,
) -> CorpusSummary:
    """Write the manifest of each split of ``entries``, ``files`` (name -> text) and, last, the
    marker; summarise.

    ``start`` is the ``time.monotonic()`` at which generation began.
    """
    for split in entries:
        lines = "".join(json.dumps(entry, ensure_ascii=False) + "\n" for entry in entries[split])
        write_atomic(out_dir / f"{split}.jsonl", lines)
    for name, text in files.items():
        write_atomic(out_dir / name, text)
    summary = CorpusSummary(
        utterances={split: len(entries[split]) for split in entries},
        hours={
            split: round(sum(e["duration"] for e in entries[split]) / 3600, 4) for split in entries
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
    write_atomic(out_dir / MARKER, json.dumps({"params": params, **contents}, indent=1) + "\n")
    return summary


def write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def describe(summary: CorpusSummary) -> str:
    """``train 12 utterances (0.01 h), ...; 0.02 h of audio in 1.2 s; 0 skipped``."""
    splits = ", ".join(
        f"{split} {summary.utterances[split]} utterances ({summary.hours[split]:.2f} h)"
        for split in summary.utterances
    )
    hours = f"{sum(summary.hours.values()):.2f} h of audio"
    if summary.generated:
        hours += f" in {summary.seconds:.1f} s"
    return f"{splits}; {hours}; {summary.skipped} skipped"
