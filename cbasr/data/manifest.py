"""JSONL manifests: one utterance per line.

Every corpus preparation writes, per split, ``<split>.jsonl`` with at least::

    {"id": str, "audio": str, "duration": float, "speaker": str, "words": str}

``audio`` is relative to the manifest's directory (or absolute); an optional ``start``
(seconds) makes the utterance the ``duration`` seconds of the file from there (Kaldi's
``segments``), and an optional ``channel`` (from 0; default 0) the channel of the file it is. Phone-level corpora add
``phones`` (list of labels) and ``phone_starts`` (seconds); other fields pass through.
Text-input corpora (Gigaword) have ``source`` (the input text) instead of ``audio`` and
``duration``.
"""

import json
from pathlib import Path

__all__ = ["REQUIRED_KEYS", "TEXT_REQUIRED_KEYS", "ManifestError", "read_manifest", "audio_path"]

REQUIRED_KEYS = ("id", "audio", "duration", "speaker", "words")
TEXT_REQUIRED_KEYS = ("id", "source", "words")


class ManifestError(ValueError):
    """A manifest line that cannot be used; the message names the file and line."""


def read_manifest(path: str | Path) -> list[dict]:
    """Read and check a JSONL manifest.

    Raises:
        ManifestError: for unparsable lines, missing keys or duplicate ids, naming the
            file, line number and utterance id.
    """
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{path}: manifest not found")
    records, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ManifestError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
            required = (
                TEXT_REQUIRED_KEYS
                if isinstance(record, dict) and "source" in record
                else REQUIRED_KEYS
            )
            missing = [k for k in required if k not in record]
            if missing:
                rid = record.get("id", "?")
                raise ManifestError(f"{path}:{lineno}: utterance {rid!r} lacks keys {missing}")
            if record["id"] in seen:
                raise ManifestError(f"{path}:{lineno}: duplicate utterance id {record['id']!r}")
            seen.add(record["id"])
            records.append(record)
    return records


def audio_path(record: dict, manifest_path: str | Path) -> Path:
    """The absolute audio path of ``record``, resolving relative paths against the manifest."""
    audio = Path(record["audio"])
    if audio.is_absolute():
        return audio
    return Path(manifest_path).resolve().parent / audio
