"""``trainer.cuda_graphs``: the training step replayed from CUDA graphs, one per batch shape.

On a GPU a small model's step is mostly the host queueing kernels, at a cost each whatever their
size (docs/performance.md, "Where the time goes on a GPU"), and waiting whenever it reads a
device value. A CUDA graph holds a whole step (the task's forward, the backward, gradient
clipping and the optimizer's update) and replays it with one launch, reading and writing the
same ("static") tensors every time. A graph is for one set of shapes, so each batch is padded to
a bucket shape (:meth:`GraphedSteps.shape_of`): utterances to a multiple of ``multiples[0]``
(the extra rows copy the first and weigh nothing in the loss), frames to one of ``multiples[1]``
(zeros, beyond every utterance's length) and labels to one of ``multiples[2]`` (likewise). The
first batch of a shape runs eagerly on the static tensors (it warms the kernels, and the losses'
value checks read it), then the step is captured for the shape's later batches; the host reads
the device once per step, after it, for the losses' finiteness, their sum, the gradient norm and
the model's statistics (as the eager step does).

What a captured step does differently from :meth:`~cbasr.training.trainer.Trainer.train_step`:

- the update is fused, capturable Adam or AdamW (``make_optimizer(graphs=...)``) with its
  learning rate a device tensor; a step with a non-finite loss or gradient norm is skipped on
  the device (``found_inf``: parameters, moments and step count left as they were), where the
  eager step skips it on the host;
- every trainable parameter keeps a gradient tensor (zeroed at the start of each step), so one
  that a batch leaves without a gradient is still updated (Adam's moments, weight decay);
- batch normalisation (the Conformer's convolution module) counts the padding in its statistics;
- the losses' value checks (:func:`cbasr.checks.one_read`) run on a shape's first batch only;
- what the model draws on the host, it draws once, at capture (refused where the config says
  so: dynamic chunk sizes).

With ``graphs=False`` (on any device) the same static step runs eagerly every time: the
padding, the weights and the fused update, without CUDA; the CPU tests check it against the
eager trainer, and a GPU run checks the graphs against it.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cbasr.checks import graph_step
from cbasr.data.dataset import Batch

__all__ = ["GraphedSteps", "StepValues"]

log = logging.getLogger(__name__)


@dataclass
class StepValues:
    """What the host reads after a step: per real utterance whether its loss is finite, the
    real utterances' summed NLL, the gradient norm (before clipping) and the model's statistics;
    the update was skipped where a loss or the norm is not finite."""

    finite: list[bool]
    nll: float
    grad_norm: float
    stats: dict[str, float]


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class _Shape:
    """One bucket shape: its static tensors (on the device), their host mirrors (the padded
    batch is built there, then copied with one copy per tensor), its graph and the graph's
    outputs."""

    def __init__(self, key: tuple[int, int, int], like: Batch, device: torch.device):
        B, T, L = key
        F = like.feats.shape[2]
        pin = device.type == "cuda"

        def host(*size, dtype, fill=0.0):
            return torch.full(size, fill, dtype=dtype, pin_memory=pin)

        ends = None if like.label_ends is None else host(B, L, dtype=like.label_ends.dtype)
        self.host = Batch(
            [],
            host(B, T, F, dtype=like.feats.dtype),
            host(B, dtype=like.feat_lens.dtype),
            host(B, L, dtype=like.targets.dtype),
            host(B, dtype=like.target_lens.dtype),
            ends,
        )
        self.host_weights = host(B, dtype=torch.float32)
        self.host_tokens = host(dtype=torch.float32)
        self.batch = self.host.to(device)
        self.weights = self.host_weights.to(device)
        self.tokens = self.host_tokens.to(device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple | None = None  # the captured step's (values, stat keys, float stats)

    def load(self, batch: Batch, tokens: int) -> None:
        """Pad ``batch`` into the static tensors: built in the host mirrors and copied with one
        copy per tensor for a batch on the host (the data loader's, for a CUDA step), in place
        for one already on the step's device."""
        on_host = batch.feats.device != self.batch.feats.device  # (a CPU step: never)
        h = self.host if on_host else self.batch
        h.ids = self.batch.ids = batch.ids  # (the padded rows have none)
        B, T = batch.feats.shape[:2]
        L = batch.targets.shape[1]
        h.feats.zero_()
        h.feats[:B, :T] = batch.feats
        h.feats[B:, :T] = batch.feats[:1]
        h.targets.zero_()
        h.targets[:B, :L] = batch.targets
        h.targets[B:, :L] = batch.targets[:1]
        for pad, real in ((h.feat_lens, batch.feat_lens), (h.target_lens, batch.target_lens)):
            pad[:B] = real
            pad[B:] = real[:1]
        if h.label_ends is not None:
            if batch.label_ends is None:
                raise ValueError(
                    "trainer.cuda_graphs: a batch without the label times of its shape"
                )
            h.label_ends.fill_(math.nan)
            h.label_ends[:B, :L] = batch.label_ends
            h.label_ends[B:, :L] = batch.label_ends[:1]
        weights, count = (
            (self.host_weights, self.host_tokens) if on_host else (self.weights, self.tokens)
        )
        weights.zero_()
        weights[:B] = 1.0
        count.fill_(float(tokens))
        if not on_host:
            return
        pairs = [
            (self.batch.feats, h.feats),
            (self.batch.feat_lens, h.feat_lens),
            (self.batch.targets, h.targets),
            (self.batch.target_lens, h.target_lens),
            (self.weights, self.host_weights),
            (self.tokens, self.host_tokens),
        ]
        if h.label_ends is not None:
            pairs.append((self.batch.label_ends, h.label_ends))
        for static, mirror in pairs:
            static.copy_(mirror, non_blocking=True)


class GraphedSteps:
    """The training step of ``trainer.cuda_graphs``, called once per batch (see the module).

    Args:
        forward: ``forward(model, batch)``, the task's (its ``.loss``, ``.nll`` per utterance
            and ``.stats``), run under ``autocast()``.
        model, optimizer: the optimizer from ``make_optimizer(model, optim, graphs=device)``.
        clip: the gradient norm's bound (0: none).
        device: where the step runs.
        graphs: capture and replay (CUDA); False: the same static step, eagerly, every batch.
        multiples: the bucket of a batch: utterances, frames and labels rounded up to these.
        max_shapes: the shapes kept (graphs and static tensors); the least recently used
            beyond it is dropped and captured again if it comes back.
    """

    def __init__(
        self,
        forward: Callable,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        clip: float,
        device: torch.device,
        graphs: bool = True,
        multiples: tuple[int, int, int] = (4, 64, 8),
        max_shapes: int = 64,
    ):
        if graphs and device.type != "cuda":
            raise ValueError(f"trainer.cuda_graphs=true needs a CUDA device, not {device}")
        self.forward, self.model, self.optimizer = forward, model, optimizer
        self.clip = clip if clip > 0 else math.inf
        self.device, self.graphs = device, graphs
        self.multiples, self.max_shapes = multiples, max_shapes
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:  # the gradients the graphs write: never set to None again
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.grads = [p.grad for p in self.params]
        self.found_inf = torch.zeros((), device=device)
        optimizer.found_inf = self.found_inf  # read by the fused update: 1 skips the step
        self.shapes: OrderedDict[tuple[int, int, int], _Shape] = OrderedDict()
        self.pool = None
        self.captures = 0  # graphs captured, evicted shapes' recaptures included

    def shape_of(self, batch: Batch) -> tuple[int, int, int]:
        """``(utterances, frames, labels)`` of ``batch``'s bucket."""
        B, T = batch.feats.shape[:2]
        L = batch.targets.shape[1]
        return tuple(_round_up(n, m) for n, m in zip((B, T, max(L, 1)), self.multiples))

    def __call__(self, batch: Batch, tokens: int, autocast: Callable) -> StepValues:
        """One step on ``batch`` (on the host), the loss divided by ``tokens``."""
        key = self.shape_of(batch)
        shape = self.shapes.get(key)
        new = shape is None
        if new:
            shape = self.shapes[key] = _Shape(key, batch, self.device)
            if len(self.shapes) > self.max_shapes:
                self.shapes.popitem(last=False)
        self.shapes.move_to_end(key)
        shape.load(batch, tokens)
        n = len(batch.ids)
        if not self.graphs:
            return self._read(self._run(shape, autocast), n)
        if new:
            return self._first(key, shape, autocast, n)
        shape.graph.replay()
        return self._read(shape.outputs, n)

    def _run(self, shape: _Shape, autocast: Callable) -> tuple:
        """The step on ``shape``'s static tensors: its outputs, as :meth:`_read` takes them."""
        torch._foreach_zero_(self.grads)
        with autocast(), graph_step():
            out = self.forward(self.model, shape.batch)
        real = shape.weights > 0
        loss = (out.loss * shape.weights).sum() / shape.tokens
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip, foreach=True)
        finite = torch.isfinite(out.loss.detach())
        bad = (~finite & real).any() | ~torch.isfinite(norm)
        self.found_inf.copy_(bad)
        self.optimizer.step()
        keys = [k for k, v in out.stats.items() if isinstance(v, torch.Tensor)]
        floats = {k: float(v) for k, v in out.stats.items() if k not in keys}
        nll = torch.where(real, out.nll.detach(), 0.0).sum()
        scalars = [nll, norm.detach(), *(out.stats[k].detach() for k in keys)]
        values = torch.cat([finite.double(), torch.stack([s.double() for s in scalars])])
        return values, keys, floats

    def _first(self, key, shape: _Shape, autocast: Callable, n: int) -> StepValues:
        """A shape's first batch: the step eagerly on a side stream (as CUDA asks before a
        capture), then its capture (which runs nothing) for the next batches."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            values = self._read(self._run(shape, autocast), n)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self.pool is None:  # one pool: the graphs never run at once, and what persists
            self.pool = torch.cuda.graph_pool_handle()  # between them is static tensors
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: the data loader's pinning thread may call CUDA meanwhile
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                shape.outputs = self._run(shape, autocast)
        except RuntimeError as error:
            raise RuntimeError(
                f"trainer.cuda_graphs: this model's training step cannot be captured ({error}); "
                "something in it reads the device on the host. Train it with "
                "trainer.cuda_graphs=false"
            ) from error
        shape.graph = graph
        self.captures += 1
        log.info(
            "cuda_graphs: captured the step for batches of shape %s (%d shapes held, %d captures)",
            key,
            len(self.shapes),
            self.captures,
        )
        return values

    @staticmethod
    def _read(outputs: tuple, n: int) -> StepValues:
        values, keys, floats = outputs
        values = values.tolist()  # the one read of the device
        B = len(values) - 2 - len(keys)
        finite = [bool(v) for v in values[:n]]
        nll, norm, *stats = values[B:]
        return StepValues(finite, nll, norm, {**floats, **dict(zip(keys, stats))})
