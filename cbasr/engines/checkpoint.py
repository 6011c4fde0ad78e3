"""Atomic checkpoints: a run killed while writing one keeps the previous one intact."""

import logging
import os
import random
from pathlib import Path

import numpy as np
import torch

from cbasr.fileio import atomic_write

__all__ = ["save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state"]

log = logging.getLogger(__name__)


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """``torch.save`` into a temporary file, fsync, rename over ``path``."""
    atomic_write(path, lambda f: torch.save(state, f), mode="wb")


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint written by :func:`save_checkpoint`, naming the file on failure."""
    path = Path(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:
        raise RuntimeError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from e


def rng_state() -> dict:
    """Every random number generator a training step touches."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
