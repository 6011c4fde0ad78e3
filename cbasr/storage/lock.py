"""An exclusive lock on an experiment directory, so two runs never write into one.

``fcntl.flock`` on ``<exp>/.lock``: the operating system releases it when the holding process
ends, however it ends, so a killed run never leaves a stale lock behind. The file records the
holder (``pid host``) for the refusal message; its content is information only, never the lock.
"""

import fcntl
import os
import socket
from pathlib import Path

__all__ = ["ExperimentLocked", "lock_experiment", "LOCK_FILE"]

LOCK_FILE = ".lock"
_held: dict[Path, int] = {}  # directory -> open descriptor holding its lock, in this process


class ExperimentLocked(RuntimeError):
    """Another process holds the experiment directory's lock."""


def lock_experiment(exp_dir: str | os.PathLike) -> None:
    """Take ``exp_dir``'s lock for the rest of this process (again in the same process: no-op).

    Raises:
        ExperimentLocked: another live process holds it; the message names the directory and
            the holder's pid and host.
    """
    exp_dir = Path(exp_dir).resolve()
    if exp_dir in _held:
        return
    exp_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(exp_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        pid, _, host = holder.partition(" ")
        raise ExperimentLocked(
            f"{exp_dir} is in use by another run (pid {pid} on {host or 'unknown host'}); "
            "wait for it to finish or stop it, or choose another exp_dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    _held[exp_dir] = fd
