"""Counting the reads of device values to the host, on the CPU, where a CUDA run would wait."""

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class DeviceReads(TorchDispatchMode):
    """Counts the operators run inside it that read a tensor's values to the host (``item``,
    ``int(t)``, ``nonzero``); with ``besides_checks``, not the copies that
    :mod:`cbasr.checks` makes for its blocks and reads (a test counts those on its own)."""

    def __init__(self, besides_checks: bool = False):
        super().__init__()
        self.besides_checks = besides_checks
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.nonzero, torch.ops.aten._local_scalar_dense):
            if not (
                self.besides_checks and any(f.name == "_read" for f in traceback.extract_stack())
            ):
                self.count += 1
        return func(*args, **(kwargs or {}))
