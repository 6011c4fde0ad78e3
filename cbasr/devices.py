"""The torch device for a ``trainer.device`` or ``--device`` value, shared by training and
inference."""

import torch

__all__ = ["select_device"]


def select_device(name: str, local_rank: int = 0, option: str = "--device") -> torch.device:
    """``auto`` is CUDA when visible; a bare ``cuda`` is ``cuda:<local_rank>`` (one GPU per
    process). A CUDA device without CUDA is an error naming ``option``."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{option}={name} but no CUDA device is visible")
        torch.cuda.set_device(device)
    return device
