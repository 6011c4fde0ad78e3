"""Manifests from lhotse's JSONL manifests (``.jsonl`` or ``.jsonl.gz``), read directly.

Three kinds of file, told apart by their records: recordings (``sources``, ``sampling_rate``,
``duration``), supervisions (``recording_id``, ``start``, ``duration``, ``text``, ``speaker``,
``channel``) and cuts (a ``recording`` and their ``supervisions``, whose ``start`` counts from
the cut's). Every supervision becomes one utterance: its recording's audio file from its start
for its duration (the manifest's ``start`` and ``duration``), its text as ``words``.

A ``command`` source is run once through ``bash -c`` with ``run_pipes`` (its output stored as
``<out>/audio/<split>/<recording>.wav``), else refused; ``url`` and ``memory`` sources, a channel
other than the first of its file, an empty text, and a supervision beyond its recording are
counted skips with the reason.
"""

import gzip
import json
import logging
from pathlib import Path

from cbasr.corpora.kaldi import recording_path
from cbasr.corpora.prepare import CorpusError, DurationFilter, PreparedCorpus

__all__ = ["read_lhotse", "prepare_lhotse"]

log = logging.getLogger(__name__)


def read_lhotse(path: str | Path) -> tuple[str, list[dict]]:
    """``(kind, records)`` of a lhotse JSONL manifest: kind ``recordings``, ``supervisions`` or
    ``cuts``."""
    path = Path(path)
    if not path.is_file():
        why = "is not a file" if path.exists() else "no such file"
        raise CorpusError(f"{path}: {why} (a lhotse manifest was expected)")
    path.open("rb").close()  # unreadable: PermissionError, naming the file
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise CorpusError(f"{path}:{lineno}: not JSON ({e.msg})") from None
    if not records:
        raise CorpusError(f"{path}: an empty lhotse manifest")
    first = records[0]
    if "supervisions" in first and "recording" in first:
        return "cuts", records
    if "recording_id" in first:
        return "supervisions", records
    if "sources" in first:
        return "recordings", records
    raise CorpusError(
        f"{path}: not a lhotse recording, supervision or cut manifest (keys {sorted(first)})"
    )


def _source(recording: dict, channel: int) -> tuple[dict | None, str]:
    """The source holding ``channel`` as its file's first channel, or None and why not."""
    for source in recording.get("sources", []):
        channels = source.get("channels", [0])
        if channel in channels:
            if channels[0] != channel:
                return None, f"channel {channel} is not the first of {source.get('source')}"
            if source.get("type", "file") not in ("file", "command"):
                return None, f"a {source.get('type')!r} audio source cannot be read"
            return source, ""
    return None, f"recording {recording.get('id')} has no source for channel {channel}"


def _utterances(
    pairs: list[tuple[dict, dict, float]],
    split: str,
    audio_dir: Path,
    run_pipes: bool,
) -> tuple[list[dict], list[tuple[str, str, str]]]:
    """Manifest records of ``(supervision, recording, offset)`` triples (offset: the start of
    the cut the supervision's start counts from)."""
    records, skipped, seen = [], [], set()
    for sup, recording, offset in pairs:
        utt = sup["id"]
        if utt in seen:
            skipped.append((split, utt, "duplicate supervision id"))
            continue
        seen.add(utt)
        text = " ".join((sup.get("text") or "").split())
        if not text:
            skipped.append((split, utt, "empty text"))
            continue
        source, why = _source(recording, int(sup.get("channel", 0) or 0))
        if source is None:
            skipped.append((split, utt, why))
            continue
        start = offset + float(sup["start"])
        duration = float(sup["duration"])
        if start < 0 or start + duration > float(recording["duration"]) + 0.01:
            skipped.append(
                (split, utt, f"{start:.2f}+{duration:.2f} s beyond recording {recording['id']}")
            )
            continue
        entry = source["source"] + (" |" if source.get("type") == "command" else "")
        try:
            path = recording_path(recording["id"], entry, Path.cwd(), audio_dir, run_pipes)
        except CorpusError:
            raise
        except Exception as e:  # a failed command
            skipped.append((split, utt, str(e)))
            continue
        if not path.is_file():
            skipped.append((split, utt, f"{path}: no such audio file"))
            continue
        records.append(
            {
                "id": utt,
                "audio": str(path.resolve()),
                "start": start,
                "duration": duration,
                "speaker": sup.get("speaker") or utt,
                "words": text,
            }
        )
    return records, skipped


def _pairs(files: list[Path]) -> list[tuple[dict, dict, float]]:
    """``(supervision, recording, offset)`` of a split's manifests."""
    kinds: dict[str, list[dict]] = {"recordings": [], "supervisions": [], "cuts": []}
    for path in files:
        kind, records = read_lhotse(path)
        kinds[kind] += records
    pairs = []
    for cut in kinds["cuts"]:
        pairs += [(s, cut["recording"], float(cut.get("start", 0.0))) for s in cut["supervisions"]]
    if kinds["supervisions"]:
        recordings = {r["id"]: r for r in kinds["recordings"]}
        missing = sorted({s["recording_id"] for s in kinds["supervisions"]} - set(recordings))
        if missing:
            raise CorpusError(
                f"supervisions name recordings missing from the recording manifests given, "
                f"e.g. {missing[:3]} (give their recordings .jsonl.gz too)"
            )
        pairs += [(s, recordings[s["recording_id"]], 0.0) for s in kinds["supervisions"]]
    if not pairs:
        raise CorpusError(
            f"{[str(f) for f in files]}: no supervisions (give cuts, or supervisions with their "
            "recordings)"
        )
    return pairs


def prepare_lhotse(
    manifests: dict[str, list[str | Path]],
    out_dir: str | Path,
    run_pipes: bool = False,
    durations: DurationFilter | None = None,
) -> dict:
    """Write ``<split>.jsonl`` into ``out_dir`` from each split's lhotse manifests.

    Returns:
        The summary also written to ``out_dir/.done``.
    """
    splits = tuple(manifests)
    out = PreparedCorpus(out_dir, splits, durations)
    params = {
        "corpus": "lhotse",
        "manifests": {s: [str(Path(f).resolve()) for f in files] for s, files in manifests.items()},
        "run_pipes": run_pipes,
    }
    if out.is_complete(params):
        log.info("%s: manifests complete, nothing to do", out_dir)
        return out.summary()
    records, skipped = {}, []
    for split, files in manifests.items():
        records[split], split_skipped = _utterances(
            _pairs([Path(f) for f in files]), split, Path(out_dir) / "audio" / split, run_pipes
        )
        skipped += split_skipped
    return out.write(params, records, skipped)
