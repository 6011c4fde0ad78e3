"""What every corpus preparation shares: checked inputs and idempotent, atomic outputs.

A prepared directory holds ``<split>.jsonl`` manifests (see :mod:`cbasr.data.manifest`), any
extra files of the corpus (phone lists, maps), ``skipped.tsv`` (``split<TAB>id<TAB>reason``
for utterances that could not be used: truncated audio, a missing transcription) and
``.done``, written last, with the preparation's parameters and counts. A rerun with the same
parameters on a complete directory does nothing; an interrupted one (no ``.done``, or files
missing) is redone from scratch, never trusted.
"""

import json
import logging
from pathlib import Path

from cbasr.storage.files import write_json, write_jsonl, write_text

__all__ = ["CorpusError", "corpus_error", "PreparedCorpus"]

log = logging.getLogger(__name__)
MARKER = ".done"


class CorpusError(ValueError):
    """A corpus directory that is not the corpus asked for; says what was expected and found."""


def corpus_error(corpus: str, path: Path, expected: str, found) -> CorpusError:
    return CorpusError(f"{path} does not look like {corpus}: expected {expected}; found {found}")


class PreparedCorpus:
    """The output directory of a corpus preparation."""

    def __init__(self, out_dir: str | Path, splits: tuple[str, ...]):
        self.out_dir, self.splits = Path(out_dir), splits

    def summary(self) -> dict:
        return json.loads((self.out_dir / MARKER).read_text())

    def is_complete(self, params: dict) -> bool:
        """``.done`` records ``params`` and every file it lists exists with its line count."""
        try:
            summary = self.summary()
        except (OSError, ValueError):
            return False
        if summary.get("params") != params:
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
    ) -> dict:
        """Write manifests, extra files, ``skipped.tsv``, then ``.done``; returns the summary."""
        (self.out_dir / MARKER).unlink(missing_ok=True)
        files = {}
        for split in self.splits:
            write_jsonl(self.out_dir / f"{split}.jsonl", records.get(split, []))
            files[f"{split}.jsonl"] = len(records.get(split, []))
        for name, text in (extra or {}).items():
            write_text(self.out_dir / name, text)
            files[name] = len(text.splitlines())
        write_text(self.out_dir / "skipped.tsv", "".join(f"{s}\t{u}\t{r}\n" for s, u, r in skipped))
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
        write_json(self.out_dir / MARKER, summary)
        log.info(
            "%s: %s, %d skipped",
            self.out_dir,
            ", ".join(f"{k} {v}" for k, v in counts.items()),
            len(skipped),
        )
        return summary
