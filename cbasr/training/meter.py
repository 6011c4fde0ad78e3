"""What training reports besides the loss: throughput, the data pipeline's share, model statistics."""

import time
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

__all__ = ["ProgressMeter", "plot_history", "EMISSION_RATE_LAYOUT"]

# TensorBoard's custom-scalars page: the mean emission probability P(B_t = 1) of a CB model
# beside the label rate L / T it should match (CB paper, section 1), in one chart each.
EMISSION_RATE_LAYOUT = {
    "CB emission rate": {
        "train: mean P(B_t = 1) vs L / T": [
            "Multiline",
            ["train/emission_rate", "train/label_rate"],
        ],
        "valid: mean P(B_t = 1) vs L / T": [
            "Multiline",
            ["epoch/valid_emission_rate", "epoch/valid_label_rate"],
        ],
    }
}


class ProgressMeter:
    """Frames per second and the share of wall time spent waiting for data, per interval and epoch.

    The training loop calls :meth:`data_ready` with the time it waited for each batch and
    :meth:`step_done` after each optimizer step; :meth:`interval` summarises (and restarts)
    the current log interval, :meth:`epoch_totals` the epoch so far.
    """

    def __init__(self):
        self.epoch_start = time.perf_counter()
        self.epoch_frames, self.epoch_data_seconds = 0, 0.0
        self._layout_added = False
        self._restart()

    def _restart(self) -> None:
        self.start = time.perf_counter()
        self.frames, self.data_seconds, self.steps, self.grad_norm = 0, 0.0, 0, 0.0
        self.stats: dict[str, float] = {}

    def data_ready(self, seconds: float) -> None:
        self.data_seconds += seconds
        self.epoch_data_seconds += seconds

    def step_done(self, frames: int, result) -> None:
        """``frames``: input frames (unpadded) of the global batch; ``result``: a step's result."""
        self.frames += frames
        self.epoch_frames += frames
        self.steps += 1
        self.grad_norm += result.grad_norm
        for key, value in result.stats.items():
            self.stats[key] = self.stats.get(key, 0.0) + value

    def interval(self) -> dict:
        """Means over the steps since the last call: grad norm, stats, frames/s, data share."""
        seconds = max(time.perf_counter() - self.start, 1e-9)
        steps = max(self.steps, 1)
        out = {
            "frames_per_second": self.frames / seconds,
            "data_fraction": min(1.0, self.data_seconds / seconds),
            "grad_norm": self.grad_norm / steps,
            "stats": {k: v / steps for k, v in self.stats.items()},
        }
        self._restart()
        return out

    def epoch_totals(self) -> dict:
        seconds = max(time.perf_counter() - self.epoch_start, 1e-9)
        return {
            "seconds": seconds,
            "frames_per_second": self.epoch_frames / seconds,
            "data_fraction": min(1.0, self.epoch_data_seconds / seconds),
        }

    def add_layout_once(self, writer: SummaryWriter, stats: dict) -> None:
        """The emission-rate charts, once per run, when the model reports an emission rate."""
        if not self._layout_added and "emission_rate" in stats:
            writer.add_custom_scalars(EMISSION_RATE_LAYOUT)
            self._layout_added = True


def plot_history(history: list[dict], path: Path) -> None:
    """Training and validation loss and validation error rate (or perplexity) per epoch, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, (ax_loss, ax_err) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax_loss.plot(epochs, [h["train_loss"] for h in history], "o-", label="train")
    ax_loss.plot(epochs, [h["valid_loss"] for h in history], "s-", label="valid")
    ax_loss.set(xlabel="epoch", ylabel="loss per token", yscale="log")
    ax_loss.legend()
    key, label = (
        ("valid_error_rate", "valid error rate (%)")
        if "valid_error_rate" in history[0]
        else ("valid_ppl", "valid perplexity")  # a language model
    )
    ax_err.plot(epochs, [h[key] for h in history], "s-", color="C1")
    ax_err.set(xlabel="epoch", ylabel=label)
    ax_err.grid(alpha=0.3)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
