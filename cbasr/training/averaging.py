"""Checkpoint averaging: the mean weights of the last or the best N epoch checkpoints.

Averaging the weights of the last few epochs (Vaswani et al., 2017, section 6.1; ESPnet's
and icefall's ``--avg``) or of the best few by validation usually decodes better than any
one of them. The result is a checkpoint that ``cbasr-decode --checkpoint <name>`` reads; it
holds no optimizer state, so it cannot be resumed from.
"""

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from cbasr.storage.checkpoint import CheckpointDir, load_checkpoint, save_checkpoint

__all__ = ["average_state_dicts", "select_epochs", "average_checkpoints", "read_history", "METRICS"]

log = logging.getLogger(__name__)

METRICS = ("valid_error_rate", "valid_loss")
RESERVED = ("last", "best")


def average_state_dicts(state_dicts: Sequence[dict]) -> dict:
    """Element-wise mean of model state dicts.

    Floating-point tensors are summed in float64 and cast back to their dtype; other entries
    (integer counters such as ``num_batches_tracked``) are taken from the last state dict.
    """
    if not state_dicts:
        raise ValueError("nothing to average")
    keys = list(state_dicts[-1])
    for i, sd in enumerate(state_dicts):
        if list(sd) != keys:
            raise ValueError(f"state dict {i} has different entries: {sorted(set(sd) ^ set(keys))}")
    out = {}
    for key in keys:
        last = state_dicts[-1][key]
        if torch.is_tensor(last) and last.is_floating_point():
            total = torch.zeros(last.shape, dtype=torch.float64, device=last.device)
            for sd in state_dicts:
                total += sd[key].to(torch.float64)
            out[key] = (total / len(state_dicts)).to(last.dtype)
        else:
            out[key] = last
    return out


def select_epochs(
    checkpoints: CheckpointDir,
    history: list[dict],
    last: int | None = None,
    best: int | None = None,
    metric: str = "valid_error_rate",
) -> list[int]:
    """The ``last`` most recent, or the ``best`` best by ``metric``, epochs with a checkpoint file.

    Ties of ``metric`` are broken by the other metric, then by the later epoch.

    Raises:
        ValueError: when fewer epoch checkpoints exist than asked for, naming the directory.
    """
    if (last is None) == (best is None):
        raise ValueError("give exactly one of last or best")
    n = last if last is not None else best
    if n < 1:
        raise ValueError(f"the number of checkpoints to average must be >= 1, got {n}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    available = checkpoints.epochs()
    if last is not None:
        chosen = available[-n:]
    else:
        other = METRICS[1] if metric == METRICS[0] else METRICS[0]
        scores = {h["epoch"]: (h[metric], h[other], -h["epoch"]) for h in history}
        chosen = sorted(sorted((e for e in available if e in scores), key=lambda e: scores[e])[:n])
    if len(chosen) < n:
        raise ValueError(
            f"{checkpoints.path} holds {len(chosen)} usable epoch checkpoints {chosen}, fewer than {n} "
            "(trainer.keep_checkpoints keeps the last and the best N)"
        )
    return chosen


def average_checkpoints(exp_dir: str | Path, epochs: Sequence[int], name: str = "averaged") -> Path:
    """Write ``<exp_dir>/checkpoints/<name>.pt`` with the mean model of ``epoch-<N>.pt`` for ``epochs``."""
    if name in RESERVED or name.startswith("epoch-"):
        raise ValueError(
            f"--name {name!r} would replace a training checkpoint; choose another name"
        )
    checkpoints = CheckpointDir(Path(exp_dir) / "checkpoints")
    models, newest = [], None
    for epoch in epochs:
        ckpt = load_checkpoint(checkpoints.file(f"epoch-{epoch}"))
        models.append(ckpt["model"])
        newest = ckpt
    files = [f"epoch-{e}.pt" for e in epochs]
    averaged = {
        "model": average_state_dicts(models),
        "config": newest["config"],
        "state": newest["state"],
        "averaged_from": files,
    }
    path = checkpoints.file(name)
    save_checkpoint(path, averaged)
    log.info("averaged %s into %s", ", ".join(files), path)
    return path


def read_history(exp_dir: str | Path) -> list[dict]:
    path = Path(exp_dir) / "history.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: has {exp_dir} finished an epoch?")
    return json.loads(path.read_text())
