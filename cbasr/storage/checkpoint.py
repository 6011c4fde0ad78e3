"""Atomic checkpoints and an experiment's checkpoint directory.

A run killed while writing a checkpoint keeps the previous one intact: every file is written
to a temporary name, fsynced and renamed. Layout of ``<exp>/checkpoints/``:

- ``last.pt``: the latest state, mid-epoch or at an epoch's end; what a rerun resumes from;
- ``epoch-<N>.pt``: the state at the end of epoch N; the ``keep`` most recent and the
  ``keep`` best (by the validation metric) are kept, for averaging (``cbasr-average``);
- ``best.pt``: the end-of-epoch state with the best validation metric;
- ``averaged.pt`` (or another name): averaged weights written by ``cbasr-average``.

``best.pt`` and ``last.pt`` are copies of the epoch file (written atomically), not links: each
file is independent, so truncating or editing one damages no other.
"""

import io
import logging
import os
import random
import re
from pathlib import Path

import numpy as np
import torch

from cbasr.storage import faults
from cbasr.storage.files import atomic_copy, atomic_write

__all__ = [
    "checkpoint_of",
    "save_checkpoint",
    "load_checkpoint",
    "seed_everything",
    "rng_state",
    "set_rng_state",
    "CheckpointDir",
]

log = logging.getLogger(__name__)


def _write_halfway_then_die(state: dict, f, n: int) -> None:
    """``kill-in-checkpoint`` fault injection: half the bytes, flushed, then SIGKILL."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    f.write(data[: len(data) // 2])
    f.flush()
    faults.kill_if_armed("kill-in-checkpoint", n)


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """``torch.save`` into a temporary file, fsync, rename over ``path``."""
    n = faults.next_count("kill-in-checkpoint")

    def write(f):
        if faults.armed("kill-in-checkpoint", n):
            _write_halfway_then_die(state, f, n)
        torch.save(state, f)

    atomic_write(path, write, mode="wb")


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint written by :func:`save_checkpoint`, naming the file on failure."""
    path = Path(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:
        raise RuntimeError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from e


def checkpoint_of(path: str | os.PathLike, option: str, hint: str = "") -> Path:
    """The checkpoint a path names: a ``.pt`` file, or an experiment directory's
    ``checkpoints/best.pt``.

    Raises:
        FileNotFoundError: naming the missing file and ``option`` (and ``hint`` for a
            directory without a best checkpoint).
    """
    path = Path(path)
    if path.is_dir():
        checkpoint = path / "checkpoints" / "best.pt"
        if not checkpoint.is_file():
            raise FileNotFoundError(f"{checkpoint} not found ({option}{hint})")
        return checkpoint
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found ({option})")
    return path


def seed_everything(seed: int) -> None:
    """Seed every generator :func:`rng_state` saves: Python's, NumPy's and torch's (CUDA too)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Every random number generator a training step touches."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict | torch.Tensor) -> None:
    """Restore :func:`rng_state`'s generators (a bare tensor: torch's only, as older
    checkpoints of the LM trainer stored it).

    The states are CPU byte tensors wherever the checkpoint was loaded to: a resume on CUDA
    maps the whole checkpoint to the GPU, and torch's setters take only CPU tensors.
    """
    if isinstance(state, torch.Tensor):
        torch.set_rng_state(state.cpu())
        return
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


_EPOCH_FILE = re.compile(r"epoch-(\d+)\.pt")


class CheckpointDir:
    """The ``checkpoints/`` directory of an experiment (see the module docstring).

    Args:
        path: the directory (created if missing).
        keep: epoch checkpoints to keep, >= 0 (``trainer.keep_checkpoints``, checked by its
            schema): the ``keep`` most recent and the ``keep`` best; 0 keeps all.
    """

    def __init__(self, path: str | os.PathLike, keep: int = 5):
        self.path = Path(path)
        self.keep = keep

    def file(self, name: str) -> Path:
        return self.path / f"{name}.pt"

    def remove_temporaries(self) -> list[Path]:
        """Delete the temporary files of writes that a killed run never finished."""
        stale = sorted(self.path.glob(".*.tmp"))
        for tmp in stale:
            log.warning("removing %s, an unfinished checkpoint write of an interrupted run", tmp)
            tmp.unlink(missing_ok=True)
        return stale

    def save(self, name: str, state: dict) -> Path:
        path = self.file(name)
        save_checkpoint(path, state)
        return path

    def copy(self, src: str, dst: str) -> None:
        """Make ``dst`` a copy of checkpoint ``src``, atomically: an independent file, so that
        truncating or editing one never damages the other (hard links would share the bytes)."""
        atomic_copy(self.file(src), self.file(dst))

    def newest_loadable(
        self, device: str | torch.device = "cpu"
    ) -> tuple[Path | None, dict | None, list[str]]:
        """``(path, checkpoint, skipped)``: the newest checkpoint that loads (``last.pt``, the
        epoch files newest first, ``best.pt``), and why those that exist but do not load were
        skipped; ``(None, None, skipped)`` when none loads."""
        names = ["last", *(f"epoch-{e}" for e in reversed(self.epochs())), "best"]
        skipped = []
        for name in names:
            path = self.file(name)
            if not path.is_file():
                continue
            try:
                return path, load_checkpoint(path, device), skipped
            except RuntimeError as error:
                skipped.append(f"{path.name} ({error.__cause__ or error})")
        return None, None, skipped

    def epochs(self) -> list[int]:
        """Epochs with an ``epoch-<N>.pt`` file, ascending."""
        return sorted(
            int(m.group(1))
            for p in self.path.glob("epoch-*.pt")
            if (m := _EPOCH_FILE.fullmatch(p.name))
        )

    def prune(self, scores: dict[int, tuple]) -> list[int]:
        """Delete the epoch files that are neither among the ``keep`` latest nor the ``keep`` best.

        Args:
            scores: ``{epoch: score}`` (lower is better) of the validated epochs.

        Returns:
            The epochs whose files were deleted.
        """
        if self.keep == 0:
            return []
        epochs = self.epochs()
        latest = set(epochs[-self.keep :])
        ranked = sorted((e for e in epochs if e in scores), key=lambda e: (tuple(scores[e]), e))
        kept = latest | set(ranked[: self.keep])
        removed = [e for e in epochs if e not in kept]
        for epoch in removed:
            self.file(f"epoch-{epoch}").unlink(missing_ok=True)
        return removed
