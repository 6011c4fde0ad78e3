"""Multi-process training with PyTorch's DistributedDataParallel, as launched by ``torchrun``.

``torchrun --nproc_per_node=N $(which cbasr-train) ...`` sets ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE``; :func:`from_environment` reads them, so the same command trains on one
process or on several. Every process builds the same global batches and trains on its shard
(:func:`cbasr.data.batching.shard`); the loss is scaled so that DDP's gradient average equals
the single-process gradient of the global batch. Process 0 writes checkpoints and logs.

Backends: NCCL on CUDA, gloo on CPU.
"""

import hashlib
import logging
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = [
    "DistContext",
    "from_environment",
    "init_process_group",
    "all_reduce_sum",
    "all_gather_objects",
    "barrier",
    "replica_digest",
    "shutdown",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    """This process's place among the training processes."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_environment(env: dict | None = None) -> DistContext:
    """The context that ``torchrun`` describes in ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` (none: one process)."""
    env = os.environ if env is None else env
    try:
        world_size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local_rank = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError as e:
        raise ValueError(
            f"WORLD_SIZE, RANK and LOCAL_RANK must be integers (set by torchrun): {e}"
        ) from e
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} is not a process of WORLD_SIZE={world_size}")
    return DistContext(rank, world_size, local_rank)


def init_process_group(
    ctx: DistContext, device: torch.device, timeout_minutes: float = 60.0
) -> None:
    """Join the process group (NCCL for CUDA, gloo for CPU); nothing for a single process."""
    if not ctx.enabled or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=timedelta(minutes=timeout_minutes),
        **kwargs,
    )
    log.info("process %d of %d joined the %s process group", ctx.rank, ctx.world_size, backend)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: list[float], ctx: DistContext, device: torch.device) -> list[float]:
    """Element-wise sum of ``values`` over the processes (float64); ``values`` itself for one process."""
    if not ctx.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_gather_objects(obj, ctx: DistContext) -> list:
    """Every process's ``obj`` (picklable), in rank order."""
    if not ctx.enabled:
        return [obj]
    out = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def replica_digest(state_dict: dict[str, torch.Tensor]) -> str:
    """SHA-256 of every entry's bytes of a model's state dict: equal digests mean bit-identical replicas."""
    h = hashlib.sha256()
    for name, tensor in sorted(state_dict.items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
