"""Which implementation runs a recursion for a tensor (package-internal): ``torch``, ``numba``
or ``triton``.

Every lattice and count recursion of the toolkit has a pure-PyTorch reference, which runs on
any device, supports double backward and is what the tests hold the other two to:

- ``numba``: loops compiled for the CPU (:mod:`cbasr._compiled`), for CPU tensors;
- ``triton``: GPU kernels (Tillet, Kung and Cox, 2019, "Triton: an intermediate language and
  compiler for tiled neural network computations"), for CUDA tensors. They also run on CPU
  tensors under Triton's interpreter (the environment variable ``TRITON_INTERPRET=1``, set
  before the first kernel module is imported), which is how the tests check them without a GPU.

Each operation asks :func:`backend` once, at its one dispatch point, and runs the answer where
it has that implementation; an operation without it (or a dtype a kernel does not take) runs
``torch``. By default CPU tensors get ``numba`` and CUDA tensors ``triton`` when it can be
imported. :func:`use_backend` forces one within a ``with`` block (tests, benchmarks).
"""

import contextlib
import functools
import importlib.util
import os

import torch

__all__: list[str] = []  # package-internal

BACKENDS = ("torch", "numba", "triton")

_forced: str | None = None


@functools.cache
def triton_available() -> bool:
    """Whether Triton can be imported (it comes with the CUDA builds of torch)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreted() -> bool:
    """Whether Triton kernels run in its interpreter, on CPU tensors (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def backend(tensor: torch.Tensor) -> str:
    """The backend that serves ``tensor``'s device: ``"torch"``, ``"numba"`` or ``"triton"``.

    Under :func:`use_backend`, the forced one where it can serve the device (``numba``: CPU;
    ``triton``: CUDA, or CPU under ``TRITON_INTERPRET=1``), else ``torch``. Otherwise ``numba``
    on CPU, ``triton`` on CUDA where Triton is installed, ``torch`` elsewhere.
    """
    kind = tensor.device.type
    if _forced is not None:
        if _forced == "numba" and kind == "cpu":
            return "numba"
        if _forced == "triton" and (kind == "cuda" or (kind == "cpu" and triton_interpreted())):
            return "triton"
        return "torch"
    if kind == "cpu":
        return "numba"
    if kind == "cuda" and triton_available():
        return "triton"
    return "torch"


@contextlib.contextmanager
def use_backend(name: str):
    """Force backend ``name`` (``torch``, ``numba`` or ``triton``) within a ``with`` block.

    Forcing ``triton`` for CPU tensors needs ``TRITON_INTERPRET=1`` set before the first kernel
    module is imported (a ``RuntimeError`` says so), since Triton decides at import time whether
    its kernels are compiled or interpreted.
    """
    global _forced
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {name!r}")
    if name == "triton" and not triton_available():
        raise RuntimeError("backend 'triton': the triton package is not installed")
    before, _forced = _forced, name
    try:
        yield
    finally:
        _forced = before
