"""What one kind of training brings to the shared loop (:class:`cbasr.training.trainer.Trainer`).

The loop owns what every run needs: the device and processes, the optimizer and its schedule,
mixed precision, weight noise, gradient clipping and non-finite steps, checkpoints and resume,
the best epoch and early stopping, logs and history. A task owns the rest: its data and how
it is batched, its model, the loss of a batch, and its validation metrics. Two tasks exist:
:class:`cbasr.training.asr_task.AsrTask` (``cbasr-train``) and
:class:`cbasr.training.lm_task.LmTask` (``cbasr-train-lm``).
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from cbasr.training import distributed

__all__ = ["TaskOutput", "TrainingTask"]


@dataclass
class TaskOutput:
    """A batch's result: ``loss`` and ``nll`` per sequence (``(B,)``; the loss is what is
    minimised, the nll what is reported), per-batch statistics, and the sequences' names
    (they name a non-finite loss in the log)."""

    loss: torch.Tensor
    nll: torch.Tensor
    ids: list[str]
    stats: dict = field(default_factory=dict)


class TrainingTask(Protocol):
    """The task-specific half of a training run (see the module docstring).

    ``metrics``: the validation metrics that may pick the best epoch (``trainer.best_metric``),
    each lower-is-better; ``unit``: what throughput counts (``frames``, ``tokens``).
    """

    metrics: tuple[str, ...]
    unit: str

    def prepare(self, exp_dir: Path) -> None:
        """Write the directory's inputs (config, vocabulary, ...) before the run (process 0)."""

    def build_model(self, device: torch.device) -> torch.nn.Module:
        """The model, on ``device`` (the loop has seeded the RNGs)."""

    def build_data(self, dist: distributed.DistContext) -> None:
        """Read the data and plan the batches."""

    @property
    def steps_per_epoch(self) -> int: ...

    def describe(self) -> str:
        """The data in a few words, for the start-of-run log line."""

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """Every global batch of ``epoch`` (0-based) in order: a function of the seed and the
        epoch only, so that a resumed epoch continues with the same batches."""

    def batch_size(self, batch: Sequence[int]) -> tuple[int, int]:
        """``(labels the loss is normalised by, units of throughput)`` of a global batch."""

    def loader(
        self, batches: list[list[int]], dist: distributed.DistContext, generator: torch.Generator
    ) -> Iterable[Any]:
        """This process's shards of ``batches``, loaded."""

    def forward(self, model: torch.nn.Module, batch: Any) -> TaskOutput | None:
        """The batch's losses (None: the shard holds nothing to train on)."""

    def validate(self, model: torch.nn.Module, autocast: Callable) -> dict:
        """Validation metrics (``valid_loss`` among them), summed over the processes;
        ``autocast()`` is the run's mixed-precision context."""

    def epoch_metrics(self, metrics: dict) -> dict:
        """Entries derived from an epoch's metrics for its history row (e.g. perplexity)."""

    def checkpoint_extras(self) -> dict:
        """Entries every checkpoint carries besides the training state: ``config``, the run's
        config in plain form (:func:`cbasr.config.plain`), which inference, averaging and
        fine-tuning read back, and whatever else the task needs to rebuild its model."""

    def upgrade(self, ckpt: dict) -> dict:
        """A checkpoint of an older layout in the current one (or as it is)."""

    def check_resumed(self, ckpt: dict) -> None:
        """Refuse a checkpoint this run cannot continue (a changed model, another vocabulary)."""

    def start_new_run(self, model: torch.nn.Module) -> None:
        """A run that does not resume starts here (e.g. from another model's weights)."""
