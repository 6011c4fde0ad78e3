"""Manifests from Kaldi data directories (one per split), read as Kaldi reads them.

A Kaldi data directory holds ``wav.scp`` (``<recording> <path>``, or ``<recording> <command> |``
whose standard output is the audio), ``text`` (``<utterance> <transcript>``), ``utt2spk``
(``<utterance> <speaker>``), ``spk2utt`` and, when utterances are parts of recordings,
``segments`` (``<utterance> <recording> <start> <end>``, seconds; end -1: to the end of the
recording). Without ``segments`` each recording is one utterance of the same id.

As in Kaldi's table readers, any run of spaces or tabs separates a key from its value. A relative
``wav.scp`` path is resolved against the working directory, as Kaldi's scripts resolve it (they
run in the recipe directory), or against ``audio_root`` (``--audio-root``); a file found at
neither is a counted skip whose reason names the places tried.

The checks of Kaldi's ``utils/validate_data_dir.sh``:

- a key twice in one file, or ``spk2utt`` that is not the inverse of ``utt2spk``: an error;
- a file out of sorted order (``LC_ALL=C sort``): a logged warning with the count, imported as
  it is (order does not matter here), listed under ``warnings`` in ``.done``;
- an utterance in ``text`` but not in ``segments`` (or ``wav.scp``), in those but not in
  ``text``, missing from ``utt2spk`` (when the directory has one) or whose recording is not in
  ``wav.scp``: a counted skip with the reason.

Commands (``... |`` entries, e.g. ``sph2pipe -f wav file.sph |``) are refused unless
``run_pipes`` is set; then each is run once through ``bash -c`` and its output stored as
``<out>/audio/<split>/<recording>.wav`` (read by content: WAV, SPHERE or FLAC), since every
later stage reads audio by path. Archive entries (``path.ark:offset``) are refused.

Utterances with an empty transcript, unreadable audio or a segment beyond its recording are
counted skips too. The transcript becomes the manifest's ``words``: train on it with
``data.units=words``, ``chars`` or ``sp:<model>``. Each ``spk2<field>`` file besides ``spk2utt``
(``spk2gender``, a corpus's ``spk2age``) adds ``<field>`` to its speakers' records.
"""

import logging
import subprocess
from pathlib import Path

import soundfile

from cbasr.corpora.prepare import CorpusError, DurationFilter, PreparedCorpus
from cbasr.data.audio import AudioError, read_audio

__all__ = ["read_table", "sort_warning", "recording_path", "read_data_dir", "prepare_kaldi"]

log = logging.getLogger(__name__)


def read_table(path: Path, columns: int | None = None) -> dict[str, list[str]]:
    """``{key: [fields...]}`` of a Kaldi table file, in the file's order; ``columns``: exact field
    count after the key (None: the rest of the line as one field, e.g. a transcript or a
    command). Any run of whitespace separates the key from the rest, as in Kaldi.

    Raises:
        CorpusError: a line of the wrong field count, or a key twice, naming the file and line.
    """
    table: dict[str, list[str]] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        key, *rest = line.split(maxsplit=1)
        rest = rest[0].strip() if rest else ""
        fields = rest.split() if columns is not None else [rest]
        if columns is not None and len(fields) != columns:
            raise CorpusError(
                f"{path}:{lineno}: expected a key and {columns} fields, found {line.strip()!r}"
            )
        if key in table:
            raise CorpusError(f"{path}:{lineno}: duplicate key {key!r}")
        table[key] = fields
    return table


def sort_warning(path: Path, table: dict) -> str | None:
    """What is out of Kaldi's sorted order (``LC_ALL=C sort``: by bytes) in ``table``, read from
    ``path``, or None when it is sorted."""
    keys = [key.encode() for key in table]
    late = [(a, b) for a, b in zip(keys, keys[1:]) if b < a]
    if not late:
        return None
    a, b = late[0]
    return (
        f"{path}: {len(late)} key{'s' if len(late) > 1 else ''} out of sorted order (LC_ALL=C sort), the first "
        f"{b.decode()!r} after {a.decode()!r}; imported as they are"
    )


def _duration(path: Path) -> float:
    """Seconds of audio in ``path`` (libsndfile's header, else a full read)."""
    try:
        info = soundfile.info(str(path))
        if info.frames > 0:
            return info.frames / info.samplerate
    except Exception:  # SPHERE with Shorten, or damaged: read it through read_audio
        pass
    samples, rate = read_audio(path)
    return len(samples) / rate


def recording_path(
    rec: str,
    entry: str,
    table: Path,
    audio_dir: Path,
    run_pipes: bool,
    audio_root: Path | None = None,
    hint_dirs: tuple[Path, ...] = (),
) -> Path:
    """The audio file of ``entry``, recording ``rec``'s line of ``table`` (a ``wav.scp``, or a
    manifest): a path, relative ones against ``audio_root`` (None: the working directory), or
    a command ending in ``|``, run when ``run_pipes`` allows, its output stored in ``audio_dir``.

    Raises:
        CorpusError: a command without ``run_pipes``, or an entry that is neither.
        AudioError: a failed command, or no such file: the message names the places tried and
            any of ``hint_dirs`` the relative path exists under.
    """
    if entry.endswith("|"):
        command = entry[:-1].strip()
        if not run_pipes:
            raise CorpusError(
                f"{table}: recording {rec} is a command ({command!r}): pass "
                "--run-pipes to run each command once and store its audio, or convert the "
                "audio to files first"
            )
        audio_dir.mkdir(parents=True, exist_ok=True)
        out = audio_dir / f"{rec}.wav"
        if not out.is_file():
            run = subprocess.run(["bash", "-c", command], capture_output=True)
            if run.returncode != 0 or not run.stdout:
                raise AudioError(
                    f"wav.scp command for {rec} failed (exit {run.returncode}): "
                    f"{run.stderr.decode(errors='replace').strip()[-200:]}"
                )
            tmp = out.with_suffix(".tmp")
            tmp.write_bytes(run.stdout)
            tmp.replace(out)
        return out
    if ".ark:" in entry or len(entry.split()) > 1:
        raise CorpusError(
            f"{table}: recording {rec}: {entry!r} is neither a file path nor a command ending in |"
        )
    path = Path(entry)
    if path.is_absolute():
        if not path.is_file():
            raise AudioError(f"{path}: no such audio file")
        return path
    root = Path.cwd() if audio_root is None else audio_root
    found = (root / path).resolve()
    if found.is_file():
        return found
    where = "the working directory" if audio_root is None else "--audio-root"
    others = [d.resolve() for d in hint_dirs if (d / path).is_file()]
    hint = f"; it is under {others[0]}: pass --audio-root {others[0]}" if others else ""
    raise AudioError(f"{entry}: no such audio file (tried {found}, relative to {where}{hint})")


def _speaker_fields(data_dir: Path) -> dict[str, dict[str, str]]:
    """``{field: {speaker: value}}`` of each ``spk2<field>`` file but ``spk2utt``."""
    fields = {}
    for path in sorted(data_dir.glob("spk2*")):
        if path.name != "spk2utt" and path.is_file():
            fields[path.name[len("spk2") :]] = {k: v[0] for k, v in read_table(path).items()}
    return fields


def _check_speakers(data_dir: Path, utt2spk: dict[str, list[str]]) -> None:
    """``spk2utt`` (when present) is the inverse of ``utt2spk``, as Kaldi's validation checks."""
    path = data_dir / "spk2utt"
    if not path.is_file():
        return
    expected: dict[str, set[str]] = {}
    for utt, (spk,) in utt2spk.items():
        expected.setdefault(spk, set()).add(utt)
    found = {spk: set(utts[0].split()) for spk, utts in read_table(path).items()}
    for spk in sorted(set(expected) | set(found)):
        want, have = expected.get(spk, set()), found.get(spk, set())
        if want != have:
            extra, lacking = sorted(have - want), sorted(want - have)
            raise CorpusError(
                f"{path} disagrees with utt2spk for speaker {spk!r}: "
                + (f"spk2utt lists {extra[:3]} that utt2spk does not give it" if extra else "")
                + ("; " if extra and lacking else "")
                + (f"utt2spk gives it {lacking[:3]} that spk2utt lacks" if lacking else "")
                + " (Kaldi's utils/utt2spk_to_spk2utt.pl remakes spk2utt)"
            )


def read_data_dir(
    data_dir: Path,
    split: str,
    audio_dir: Path,
    run_pipes: bool,
    audio_root: Path | None,
    warnings: list[str],
) -> tuple[list[dict], list[tuple[str, str, str]]]:
    """The manifest records of Kaldi data directory ``data_dir`` as split ``split``, and its
    skips ``(split, utterance, reason)``; what was out of order is added to ``warnings``.
    ``audio_dir``, ``run_pipes`` and ``audio_root`` are :func:`recording_path`'s."""
    for name in ("wav.scp", "text"):
        if not (data_dir / name).is_file():
            raise CorpusError(f"{data_dir} is not a Kaldi data directory: no {name}")
    tables = {"wav.scp": read_table(data_dir / "wav.scp"), "text": read_table(data_dir / "text")}
    if (data_dir / "utt2spk").is_file():
        tables["utt2spk"] = read_table(data_dir / "utt2spk", 1)
        _check_speakers(data_dir, tables["utt2spk"])
    else:
        log.warning("%s: no utt2spk: each utterance is its own speaker", data_dir)
    if (data_dir / "segments").is_file():
        tables["segments"] = read_table(data_dir / "segments", 3)
    for name, table in tables.items():
        if why := sort_warning(data_dir / name, table):
            log.warning("%s", why)
            warnings.append(why)
    wav_scp, text, utt2spk = tables["wav.scp"], tables["text"], tables.get("utt2spk")
    if "segments" in tables:
        segments = {
            utt: (rec, float(start), float(end))
            for utt, (rec, start, end) in tables["segments"].items()
        }
        listed = "segments"
    else:
        segments = {rec: (rec, None, None) for rec in wav_scp}
        listed = "wav.scp"
    speaker_fields = _speaker_fields(data_dir)
    hint_dirs = (data_dir, data_dir.parent)
    records, skipped = [], []
    recordings: dict[str, tuple[Path, float] | str] = {}  # path and duration, or why not
    for utt in sorted(set(segments) | set(text) | set(utt2spk or ())):
        if utt not in segments:
            where = "text" if utt in text else "utt2spk only"
            skipped.append((split, utt, f"in {where} but not in {listed}"))
            continue
        if utt not in text:
            skipped.append((split, utt, f"in {listed} but not in text"))
            continue
        words = " ".join(text[utt][0].split())
        if not words:
            skipped.append((split, utt, "empty transcript"))
            continue
        if utt2spk is not None and utt not in utt2spk:
            skipped.append((split, utt, "not in utt2spk"))
            continue
        rec, start, end = segments[utt]
        if rec not in wav_scp:
            skipped.append((split, utt, f"recording {rec} not in wav.scp"))
            continue
        if rec not in recordings:
            try:
                path = recording_path(
                    rec,
                    wav_scp[rec][0],
                    data_dir / "wav.scp",
                    audio_dir,
                    run_pipes,
                    audio_root,
                    hint_dirs,
                )
                recordings[rec] = (path, _duration(path))
            except AudioError as e:
                recordings[rec] = str(e)
            except OSError as e:
                recordings[rec] = f"{e.strerror}: {e.filename}"
        found = recordings[rec]
        if isinstance(found, str):
            skipped.append((split, utt, found))
            continue
        path, length = found
        record = {"id": utt, "audio": str(path.resolve())}
        if start is not None:
            stop = length if end < 0 else end
            if start < 0 or stop <= start or stop > length + 0.01:
                skipped.append(
                    (
                        split,
                        utt,
                        f"segment {start}-{end} s outside recording {rec} ({length:.2f} s)",
                    )
                )
                continue
            record.update(start=start, duration=stop - start)
        else:
            record["duration"] = round(length, 4)
        speaker = utt2spk[utt][0] if utt2spk is not None else utt
        record["speaker"] = speaker
        record["words"] = words
        for field, values in speaker_fields.items():
            if speaker in values:
                record.setdefault(field, values[speaker])
        records.append(record)
    return records, skipped


def prepare_kaldi(
    data_dirs: list[str | Path],
    out_dir: str | Path,
    splits: list[str] | None = None,
    run_pipes: bool = False,
    durations: DurationFilter | None = None,
    audio_root: str | Path | None = None,
) -> dict:
    """Write ``<split>.jsonl`` into ``out_dir`` for each Kaldi data directory.

    Args:
        splits: the split names (default: each data directory's name).
        run_pipes: run ``wav.scp`` commands (see the module docstring).
        audio_root: what relative ``wav.scp`` paths are relative to (None: the working
            directory, as in Kaldi).

    Returns:
        The summary also written to ``out_dir/.done``.

    Raises:
        CorpusError: as the module docstring says; :class:`EmptySplitError` for a split with no
            usable utterance.
    """
    data_dirs = [Path(d) for d in data_dirs]
    names = list(splits) if splits else [d.name for d in data_dirs]
    if len(names) != len(data_dirs) or len(set(names)) != len(names):
        raise CorpusError(
            f"one distinct split name per data directory is needed; got {names} for "
            f"{[str(d) for d in data_dirs]} (name them with --splits)"
        )
    for d in data_dirs:
        if not d.is_dir():
            raise CorpusError(f"{d}: no such Kaldi data directory")
    root = None if audio_root is None else Path(audio_root).resolve()
    if root is not None and not root.is_dir():
        raise CorpusError(f"--audio-root {audio_root}: no such directory")
    out = PreparedCorpus(out_dir, tuple(names), durations)
    params = {
        "corpus": "kaldi",
        "data_dirs": [str(d.resolve()) for d in data_dirs],
        "splits": names,
        "run_pipes": run_pipes,
        "audio_root": str(root or Path.cwd().resolve()),
    }
    if out.is_complete(params):
        log.info("%s: manifests complete, nothing to do", out_dir)
        return out.summary()
    records, skipped, warnings = {}, [], []
    for d, split in zip(data_dirs, names):
        records[split], split_skipped = read_data_dir(
            d, split, Path(out_dir) / "audio" / split, run_pipes, root, warnings
        )
        skipped += split_skipped
    return out.write(params, records, skipped, warnings=warnings)
