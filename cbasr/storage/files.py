"""Atomic file writes: a killed process never leaves a half-written file that looks complete."""

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_write", "write_json", "write_jsonl", "write_text"]


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
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n"))


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> None:
    def _write(f):
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")

    atomic_write(path, _write)
