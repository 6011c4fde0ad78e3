"""Directories that tests share: built once per test run, by whichever pytest-xdist worker asks
first, and read only."""

import contextlib
import shutil
from pathlib import Path

from filelock import FileLock


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@contextlib.contextmanager
def built_once(tmp_path_factory, worker_id: str, name: str, build):
    """A directory ``build(path)`` fills, built once per test run: pytest-xdist's workers share
    it (the first to ask builds it under a lock; a ``.built`` file marks it complete). Tests
    only read it (one that changes it copies it first): on leaving, the files must be as built,
    else the test run fails naming them."""
    if worker_id == "master":  # no xdist: this process's own temporary directory
        root = tmp_path_factory.mktemp(name)
        build(root)
    else:
        root = tmp_path_factory.getbasetemp().parent / name
        with FileLock(f"{root}.lock"):
            if not (root / ".built").is_file():
                shutil.rmtree(root, ignore_errors=True)
                root.mkdir()
                build(root)
                (root / ".built").touch()
    before = _listing(root)
    yield root
    after = _listing(root)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"a test changed the shared {name} directory {root}: {changed[:10]}"
