"""Atomic file writes: a killed process never leaves a half-written file that looks complete.

Files come out with the mode a plain ``open`` gives (``0o666`` less the umask), not the
``0o600`` of the temporary file they are written through, so results and checkpoints are
readable by the group and others as the umask says.
"""

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_write", "atomic_copy", "plain_mode", "write_json", "write_jsonl", "write_text"]


def plain_mode() -> int:
    """The mode ``open(path, "w")`` would create a file with: ``0o666`` less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _fsync_dir(path: Path) -> None:
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write(path: str | os.PathLike, write: Callable[[IO], None], mode: str = "w") -> None:
    """Write ``path`` through ``write(file)`` into a temporary file, fsync it, then rename it.

    The rename is atomic on POSIX file systems, so readers see either the old file or the
    complete new one. The directory entry is fsynced too, so the rename survives a crash.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), plain_mode())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(error, OSError) and error.filename is None and error.errno is not None:
            # e.g. a full disk: say which file could not be written
            raise OSError(error.errno, error.strerror, str(path)) from error
        raise
    _fsync_dir(path.parent)


def atomic_copy(source: str | os.PathLike, path: str | os.PathLike) -> None:
    """Copy ``source`` to ``path`` atomically: an independent file (not a link), so damaging
    one never damages the other."""

    def copy(f):
        with open(source, "rb") as src:
            shutil.copyfileobj(src, f, 1 << 20)

    atomic_write(path, copy, mode="wb")


def write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n"))


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> None:
    def _write(f):
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")

    atomic_write(path, _write)
