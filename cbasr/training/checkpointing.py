"""The checkpoints of one training run: where they go, which one a rerun resumes from, and
which ones are kept.

``checkpoints/epoch-<N>.pt`` after each epoch, then ``best.pt`` and ``last.pt`` as copies of
it (each written atomically: a kill between them loses nothing); ``last.pt`` also mid-epoch.
A rerun resumes from the newest file that loads (``last.pt``, else the newest epoch file,
else ``best.pt``), naming the ones that do not; with none, it refuses to start over an
earlier run's results unless ``trainer.resume=never`` asks it to remove them.
"""

import logging
from pathlib import Path

import torch

from cbasr.storage.checkpoint import CheckpointDir
from cbasr.training import distributed

__all__ = ["RunCheckpoints"]

log = logging.getLogger("cbasr.training.trainer")


class RunCheckpoints:
    """The checkpoint directory of a run in ``exp_dir``, seen from one of its processes.

    Args:
        exp_dir: the experiment directory (``checkpoints/`` and ``history.json`` in it).
        dist: this process's place among the run's processes; only process 0 writes.
        keep: epoch checkpoints kept, the last ``keep`` and the best ``keep`` (0: all).
    """

    def __init__(self, exp_dir: Path, dist: distributed.DistContext, keep: int):
        self.exp_dir, self.dist = Path(exp_dir), dist
        self.dir = CheckpointDir(self.exp_dir / "checkpoints", keep)

    def file(self, name: str) -> Path:
        return self.dir.file(name)

    def prepare(self) -> None:
        """Create the directory and remove what a killed write left (process 0)."""
        self.dir.path.mkdir(parents=True, exist_ok=True)
        self.dir.remove_temporaries()

    def save(self, name: str, ckpt: dict) -> None:
        """``checkpoints/<name>.pt`` (process 0)."""
        if self.dist.is_main:
            self.dir.save(name, ckpt)

    def save_epoch(self, epoch: int, ckpt: dict, improved: bool, scores: dict) -> None:
        """``epoch-<epoch>.pt``, then ``best.pt`` when ``improved`` and ``last.pt``; then the
        epoch files beyond ``keep`` go (``scores``: epoch -> score tuple, lower is better)."""
        if not self.dist.is_main:
            return
        name = f"epoch-{epoch}"
        self.dir.save(name, ckpt)
        if improved:
            self.dir.copy(name, "best")
        self.dir.copy(name, "last")
        for pruned in self.dir.prune(scores):
            log.info(
                "removed checkpoint epoch-%d.pt (trainer.keep_checkpoints=%d)",
                pruned,
                self.dir.keep,
            )

    def newest(self, resume: str, device: torch.device) -> tuple[Path, dict] | None:
        """The checkpoint to resume from, or None for a fresh start.

        ``resume``: ``auto`` (the newest that loads) or ``never`` (start afresh, removing the
        earlier run's checkpoints and history). With ``auto`` and no checkpoint that loads, an
        earlier run's results are never overwritten silently: that is an error naming them.
        """
        if resume not in ("auto", "never"):
            raise ValueError(f"trainer.resume must be auto or never, got {resume!r}")
        path, ckpt, skipped = (
            (None, None, []) if resume == "never" else self.dir.newest_loadable(device)
        )
        if path is None:
            self._start_afresh(resume, skipped)
            return None
        if skipped:
            log.warning(
                "skipped checkpoints that do not load: %s; resuming from %s",
                "; ".join(skipped),
                path.name,
            )
        return path, ckpt

    def _start_afresh(self, resume: str, skipped: list[str]) -> None:
        earlier = sorted(self.dir.path.glob("*.pt")) if self.dir.path.is_dir() else []
        earlier += [p for p in [self.exp_dir / "history.json"] if p.is_file()]
        if not earlier:
            return
        names = ", ".join(p.name for p in earlier)
        if resume != "never":
            why = (
                f"none of its checkpoints loads ({'; '.join(skipped)})"
                if skipped
                else "no checkpoint"
            )
            raise RuntimeError(
                f"{self.exp_dir} holds an earlier run ({names}) but {why}: rerun with "
                "trainer.resume=never to start from scratch over it, or choose another exp_dir"
            )
        log.warning(
            "trainer.resume=never: removing the earlier run's %s and starting afresh", names
        )
        if self.dist.is_main:
            for path in earlier:
                path.unlink()
        distributed.barrier(self.dist)
