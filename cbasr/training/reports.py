"""What a training run reports as it goes: log lines, TensorBoard scalars, ``history.json`` and
the training-curve plot. Only the main process writes; the others log nothing here.
"""

import logging
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from cbasr.storage.files import write_json
from cbasr.training.meter import ProgressMeter, plot_history

__all__ = ["TrainingLog"]

log = logging.getLogger("cbasr.training.trainer")


class TrainingLog:
    """The reports of one run in ``exp_dir``.

    Args:
        exp_dir: the experiment directory (``tensorboard/``, ``history.json``,
            ``training_curves.png``).
        is_main: whether this process writes (process 0 of a distributed run).
        unit: what throughput counts, e.g. ``frames`` (acoustic input) or ``tokens`` (text).
    """

    def __init__(self, exp_dir: Path, is_main: bool, unit: str = "frames"):
        self.exp_dir, self.is_main, self.unit = Path(exp_dir), is_main, unit
        self.writer: SummaryWriter | None = None

    def open(self, step: int) -> None:
        """Start (or continue after a resume, dropping events past ``step``) the event file."""
        if self.is_main:
            self.writer = SummaryWriter(self.exp_dir / "tensorboard", purge_step=step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def progress(
        self,
        meter: ProgressMeter,
        *,
        epoch: int,
        batch: int,
        batches: int,
        step: int,
        loss: float,
        lr: float,
        bad_steps: int,
    ) -> None:
        """One progress line and the interval's scalars (``epoch`` counted from 1)."""
        interval = meter.interval()
        if self.writer is not None:
            scalars = {
                "train/loss": loss,
                "train/grad_norm": interval["grad_norm"],
                "train/lr": lr,
                "train/bad_steps": bad_steps,
                f"perf/{self.unit}_per_second": interval["frames_per_second"],
                "perf/data_fraction": interval["data_fraction"],
            }
            scalars.update({f"train/{key}": value for key, value in interval["stats"].items()})
            for key, value in scalars.items():  # stats: e.g. the CB emission rate against L / T
                self.writer.add_scalar(key, value, step)
            meter.add_layout_once(self.writer, interval["stats"])
        log.info(
            "epoch %d batch %d/%d step %d: loss %.4f lr %.2e grad-norm %.2f, %.0f %s/s (data %.0f%%)",
            epoch,
            batch,
            batches,
            step,
            loss,
            lr,
            interval["grad_norm"],
            interval["frames_per_second"],
            self.unit,
            100 * interval["data_fraction"],
        )

    def epoch_done(self, metrics: dict) -> None:
        """The epoch's line and its ``train_*`` / ``valid_*`` scalars."""
        valid = ", ".join(
            f"{key.replace('_', ' ')} {value:.{2 if 'rate' in key else 4}f}{'%' if 'rate' in key else ''}"
            for key, value in metrics.items()
            if key in ("valid_loss", "valid_error_rate", "valid_ppl")
        )
        log.info(
            "epoch %d done in %.0f s (%.0f %s/s, data %.0f%%): train loss %.4f, %s",
            metrics["epoch"],
            metrics["seconds"],
            metrics[f"{self.unit}_per_second"],
            self.unit,
            100 * metrics["data_fraction"],
            metrics["train_loss"],
            valid,
        )
        if self.writer is not None:
            for key, value in metrics.items():
                if key.startswith(("train_", "valid_")) and isinstance(value, (int, float)):
                    self.writer.add_scalar(f"epoch/{key}", value, metrics["epoch"])

    def write_history(self, history: list[dict]) -> None:
        """``history.json`` and ``training_curves.png`` (main process)."""
        if not self.is_main:
            return
        write_json(self.exp_dir / "history.json", history)
        if history:
            plot_history(history, self.exp_dir / "training_curves.png")
