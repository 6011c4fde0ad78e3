"""Manifests from lhotse's JSONL manifests (``.jsonl`` or ``.jsonl.gz``), read directly.

Three kinds of file, told apart by their records: recordings (``sources``, ``sampling_rate``,
``duration``), supervisions (``recording_id``, ``start``, ``duration``, ``text``, ``speaker``,
``channel``) and cuts (a ``recording`` and their ``supervisions``, whose ``start`` counts from
the cut's). Every supervision becomes one utterance: its recording's audio file from its start
for its duration (the manifest's ``start`` and ``duration``), the supervision's channel of that
file (the manifest's ``channel``, when not the first), its text as ``words``. A relative source
path is relative to the working directory, as lhotse reads it, or to ``audio_root``.

A ``command`` source is run once through ``bash -c`` with ``run_pipes`` (its output stored as
``<out>/audio/<split>/<recording>.wav``), else refused; ``url`` and ``memory`` sources, a
supervision over several channels, a recording with audio transforms (resampling, speed
perturbation: not applied here), an empty text, and a supervision beyond its recording are
counted skips with the reason.
"""

import gzip
import json
import logging
from pathlib import Path

from cbasr.corpora.kaldi import recording_path
from cbasr.corpora.prepare import CorpusError, DurationFilter, PreparedCorpus
from cbasr.data.audio import AudioError

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


def _source(recording: dict, channel) -> tuple[dict | None, int, str]:
    """The source holding ``channel`` and the channel's index in its file, or None and why."""
    if isinstance(channel, list):
        if len(channel) != 1:
            return None, 0, f"a supervision over channels {channel}: one channel is read"
        channel = channel[0]
    if recording.get("transforms"):
        kinds = [t.get("name", "?") for t in recording["transforms"]]
        return None, 0, f"recording {recording.get('id')} has audio transforms {kinds}"
    for source in recording.get("sources", []):
        channels = source.get("channels", [0])
        if channel in channels:
            if source.get("type", "file") not in ("file", "command"):
                return None, 0, f"a {source.get('type')!r} audio source cannot be read"
            return source, channels.index(channel), ""
    return None, 0, f"recording {recording.get('id')} has no source for channel {channel}"


def _utterances(
    pairs: list[tuple[dict, dict, float, Path]],
    split: str,
    audio_dir: Path,
    run_pipes: bool,
    audio_root: Path | None,
) -> tuple[list[dict], list[tuple[str, str, str]]]:
    """Manifest records of ``(supervision, recording, offset, manifest)`` (offset: the start of
    the cut the supervision's start counts from)."""
    records, skipped, seen = [], [], set()
    for sup, recording, offset, manifest in pairs:
        utt = sup["id"]
        if utt in seen:
            skipped.append((split, utt, "duplicate supervision id"))
            continue
        seen.add(utt)
        text = " ".join((sup.get("text") or "").split())
        if not text:
            skipped.append((split, utt, "empty text"))
            continue
        source, index, why = _source(recording, sup.get("channel", 0) or 0)
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
            path = recording_path(
                recording["id"], entry, manifest, audio_dir, run_pipes, audio_root
            )
        except AudioError as e:  # a failed command, or no such file
            skipped.append((split, utt, str(e)))
            continue
        record = {
            "id": utt,
            "audio": str(path.resolve()),
            "start": start,
            "duration": duration,
            "speaker": sup.get("speaker") or utt,
            "words": text,
        }
        if index:
            record["channel"] = index
        records.append(record)
    return records, skipped


def _pairs(files: list[Path]) -> list[tuple[dict, dict, float, Path]]:
    """``(supervision, recording, offset, the manifest naming the audio)`` of a split's
    manifests."""
    kinds: dict[str, list[tuple[dict, Path]]] = {"recordings": [], "supervisions": [], "cuts": []}
    for path in files:
        kind, records = read_lhotse(path)
        kinds[kind] += [(r, path) for r in records]
    pairs = []
    for cut, path in kinds["cuts"]:
        offset = float(cut.get("start", 0.0))
        pairs += [(s, cut["recording"], offset, path) for s in cut["supervisions"]]
    if kinds["supervisions"]:
        recordings = {r["id"]: (r, path) for r, path in kinds["recordings"]}
        missing = sorted({s["recording_id"] for s, _ in kinds["supervisions"]} - set(recordings))
        if missing:
            raise CorpusError(
                f"supervisions name recordings missing from the recording manifests given, "
                f"e.g. {missing[:3]} (give their recordings .jsonl.gz too)"
            )
        for s, _ in kinds["supervisions"]:
            recording, path = recordings[s["recording_id"]]
            pairs.append((s, recording, 0.0, path))
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
    audio_root: str | Path | None = None,
) -> dict:
    """Write ``<split>.jsonl`` into ``out_dir`` from each split's lhotse manifests.

    Args:
        audio_root: what relative source paths are relative to (None: the working directory).

    Returns:
        The summary also written to ``out_dir/.done``.

    Raises:
        CorpusError: an unreadable manifest, or one that is not lhotse's; an
            :class:`EmptySplitError` for a split with no usable utterance.
    """
    splits = tuple(manifests)
    root = None if audio_root is None else Path(audio_root).resolve()
    if root is not None and not root.is_dir():
        raise CorpusError(f"--audio-root {audio_root}: no such directory")
    out = PreparedCorpus(out_dir, splits, durations)
    params = {
        "corpus": "lhotse",
        "manifests": {s: [str(Path(f).resolve()) for f in files] for s, files in manifests.items()},
        "run_pipes": run_pipes,
        "audio_root": str(root or Path.cwd().resolve()),
    }
    if out.is_complete(params):
        log.info("%s: manifests complete, nothing to do", out_dir)
        return out.summary()
    records, skipped = {}, []
    for split, files in manifests.items():
        records[split], split_skipped = _utterances(
            _pairs([Path(f) for f in files]),
            split,
            Path(out_dir) / "audio" / split,
            run_pipes,
            root,
        )
        skipped += split_skipped
    return out.write(params, records, skipped)
