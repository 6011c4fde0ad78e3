"""What every corpus preparation shares: checked inputs and idempotent, atomic outputs.

A prepared directory holds ``<split>.jsonl`` manifests (see :mod:`cbasr.data.manifest`), any
extra files of the corpus (phone lists, maps), ``skipped.tsv`` (``split<TAB>id<TAB>reason``
for utterances that could not be used: truncated audio, a missing transcription) and
``.done``, written last, with the preparation's parameters and counts. A rerun with the same
parameters on a complete directory does nothing; an interrupted one (no ``.done``, or files
missing) is redone from scratch, never trusted. A split with no usable utterance is an
:class:`EmptySplitError` (``cbasr-prepare`` exits 1), naming the most common reason, and
leaves no ``.done``.
"""

import json
import logging
import math
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cbasr.storage.files import write_json, write_jsonl, write_text

__all__ = [
    "CorpusError",
    "EmptySplitError",
    "corpus_error",
    "PreparedCorpus",
    "DurationFilter",
    "walk_files",
]

log = logging.getLogger(__name__)
MARKER = ".done"


class CorpusError(ValueError):
    """A corpus directory that is not the corpus asked for; says what was expected and found."""


class EmptySplitError(CorpusError):
    """A split of which no utterance could be used."""


def _reason_kind(reason: str) -> str:
    """``reason`` without what differs between utterances (paths, numbers, quoted names)."""
    kind = re.sub(r"\S*/\S*", "<path>", reason)
    kind = re.sub(r"'[^']*'", "<name>", kind)
    return re.sub(r"\d+(\.\d+)?", "<n>", kind)


def empty_split_error(split: str, skipped: list[tuple[str, str, str]]) -> EmptySplitError:
    """The error for ``split`` with nothing usable: its skip count and most common reason."""
    own = [(utt, reason) for s, utt, reason in skipped if s == split]
    if not own:
        return EmptySplitError(f"split {split}: no utterances found")
    kinds = Counter(_reason_kind(reason) for _, reason in own)
    kind, count = kinds.most_common(1)[0]
    utt, reason = next((u, r) for u, r in own if _reason_kind(r) == kind)
    return EmptySplitError(
        f"split {split}: no usable utterance, {len(own)} skipped; the most common reason "
        f"({count} of {len(own)}), e.g. {utt}: {reason}"
    )


def corpus_error(corpus: str, path: Path, expected: str, found) -> CorpusError:
    return CorpusError(f"{path} does not look like {corpus}: expected {expected}; found {found}")


def walk_files(root: str | Path) -> Iterator[Path]:
    """Every file below ``root`` in sorted order, following directory symlinks (copies assembled
    from several drives) and visiting each real directory once (a link cycle ends there)."""
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        status = os.stat(dirpath)
        if (status.st_dev, status.st_ino) in seen:
            dirnames[:] = []
            continue
        seen.add((status.st_dev, status.st_ino))
        dirnames.sort()
        for name in sorted(filenames):
            yield Path(dirpath) / name


@dataclass(frozen=True)
class DurationFilter:
    """Keep utterances of ``min_seconds <= duration <= max_seconds`` (``--min-duration``,
    ``--max-duration``); the others are counted skips with the reason."""

    min_seconds: float = 0.0
    max_seconds: float = math.inf

    def __post_init__(self):
        if self.min_seconds < 0 or self.max_seconds <= self.min_seconds:
            raise ValueError(
                f"--min-duration {self.min_seconds} and --max-duration {self.max_seconds}: "
                "need 0 <= min < max"
            )

    @property
    def active(self) -> bool:
        return self.min_seconds > 0 or math.isfinite(self.max_seconds)

    def params(self) -> dict:
        """What ``.done`` records of the filter (nothing when it keeps everything)."""
        if not self.active:
            return {}
        return {"min_duration": self.min_seconds, "max_duration": str(self.max_seconds)}

    def reason(self, record: dict) -> str | None:
        """Why ``record`` is left out, or None (text records have no duration: kept)."""
        duration = record.get("duration")
        if duration is None:
            return None
        if duration < self.min_seconds:
            return f"duration {duration:.2f} s below --min-duration {self.min_seconds:g}"
        if duration > self.max_seconds:
            return f"duration {duration:.2f} s above --max-duration {self.max_seconds:g}"
        return None


class PreparedCorpus:
    """The output directory of a corpus preparation; ``durations`` filters what it writes."""

    def __init__(
        self,
        out_dir: str | Path,
        splits: tuple[str, ...],
        durations: DurationFilter | None = None,
    ):
        self.out_dir, self.splits = Path(out_dir), splits
        self.durations = durations or DurationFilter()

    def summary(self) -> dict:
        return json.loads((self.out_dir / MARKER).read_text())

    def is_complete(self, params: dict) -> bool:
        """``.done`` records ``params`` and every file it lists exists with its line count."""
        try:
            summary = self.summary()
        except (OSError, ValueError):
            return False
        if summary.get("params") != {**params, **self.durations.params()}:
            return False
        for name, lines in summary.get("files", {}).items():
            path = self.out_dir / name
            if not path.is_file() or len(path.read_text(encoding="utf-8").splitlines()) != lines:
                return False
        return True

    def write(
        self,
        params: dict,
        records: dict[str, list[dict]],
        skipped: list[tuple[str, str, str]],
        extra: dict[str, str] | None = None,
        warnings: list[str] | None = None,
    ) -> dict:
        """Write manifests, extra files, ``skipped.tsv``, then ``.done``; returns the summary.
        Records outside the duration filter join ``skipped``; ``warnings`` (problems that left
        every utterance usable) are kept in the summary.

        Raises:
            EmptySplitError: a split with no record, after ``skipped.tsv`` is written.
        """
        (self.out_dir / MARKER).unlink(missing_ok=True)
        params = {**params, **self.durations.params()}
        if self.durations.active:
            skipped = list(skipped)
            kept = {}
            for split, split_records in records.items():
                kept[split] = []
                for r in split_records:
                    why = self.durations.reason(r)
                    if why:
                        skipped.append((split, r["id"], why))
                    else:
                        kept[split].append(r)
            records = kept
        write_text(self.out_dir / "skipped.tsv", "".join(f"{s}\t{u}\t{r}\n" for s, u, r in skipped))
        empty = [split for split in self.splits if not records.get(split)]
        if empty:
            raise empty_split_error(empty[0], skipped)
        files = {}
        for split in self.splits:
            write_jsonl(self.out_dir / f"{split}.jsonl", records.get(split, []))
            files[f"{split}.jsonl"] = len(records.get(split, []))
        for name, text in (extra or {}).items():
            write_text(self.out_dir / name, text)
            files[name] = len(text.splitlines())
        for split, utt, reason in skipped[:20]:
            log.warning("skipping %s (%s): %s", utt, split, reason)
        if skipped:
            log.warning(
                "%s: skipped %d utterances (listed in %s)",
                self.out_dir,
                len(skipped),
                self.out_dir / "skipped.tsv",
            )
        counts = {split: len(records.get(split, [])) for split in self.splits}
        summary = {"params": params, "utterances": counts, "skipped": len(skipped), "files": files}
        if warnings:
            summary["warnings"] = list(warnings)
        write_json(self.out_dir / MARKER, summary)
        log.info(
            "%s: %s, %d skipped",
            self.out_dir,
            ", ".join(f"{k} {v}" for k, v in counts.items()),
            len(skipped),
        )
        return summary
