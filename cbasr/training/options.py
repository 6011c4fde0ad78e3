"""The ``trainer``, ``optim`` and ``data`` config groups turned into objects, checked at start.

What the schemas cannot check alone, as it depends on the device or the task (fp16 without a
GPU, a best metric the task does not report), fails here, before any data is read, with a
message that names the option; each value's own bounds are the schemas' (``__post_init__``).
"""

import logging
from pathlib import Path

import torch

from cbasr.config.schema import DataConfig, OptimConfig, TrainerConfig
from cbasr.data.augment import Augmentation
from cbasr.data.features import FbankOptions, extraction_options

__all__ = [
    "METRICS",
    "PRECISIONS",
    "check_options",
    "make_optimizer",
    "augmentation_of",
    "fbank_options_of",
]

log = logging.getLogger(__name__)

METRICS = ("valid_error_rate", "valid_loss")  # trainer.best_metric
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # trainer.precision


def check_options(
    trainer: TrainerConfig,
    optim: OptimConfig,
    device: torch.device,
    metrics: tuple[str, ...] = METRICS,
) -> None:
    """Fail at start, naming the option, for values of the ``trainer`` and ``optim`` groups that
    this ``device`` or the task cannot take; ``metrics``: those the task reports, which
    ``trainer.best_metric`` must name."""
    if trainer.precision == "fp16" and device.type != "cuda":
        raise ValueError(
            "trainer.precision=fp16 needs a CUDA device (a gradient scaler guards fp16 gradients); "
            "use trainer.precision=bf16 or fp32 on CPU"
        )
    if trainer.cuda_graphs:
        _check_graphs(trainer, optim, device)
    if trainer.best_metric not in metrics:
        raise ValueError(
            f"trainer.best_metric must be one of {metrics}, got {trainer.best_metric!s}"
        )


def _check_graphs(trainer: TrainerConfig, optim: OptimConfig, device: torch.device) -> None:
    """``trainer.cuda_graphs``: what a captured step cannot do, each refused in one line."""
    if device.type != "cuda":
        raise ValueError(
            f"trainer.cuda_graphs=true needs a CUDA device (trainer.device={trainer.device} "
            f"is {device})"
        )
    if trainer.precision == "fp16":
        raise ValueError(
            "trainer.cuda_graphs=true takes trainer.precision=fp32 or bf16 (fp16's gradient "
            "scaler reads the device every step)"
        )
    if optim.name not in ("adam", "adamw"):
        raise ValueError(
            f"trainer.cuda_graphs=true needs optim.name=adam or adamw (a fused update that "
            f"skips a non-finite step on the device), got {optim.name!s}"
        )
    if optim.weight_noise > 0:
        raise ValueError(
            "trainer.cuda_graphs=true and optim.weight_noise > 0: weight noise is drawn per "
            "step on the host"
        )


def make_optimizer(
    model: torch.nn.Module, optim: OptimConfig, graphs: torch.device | None = None
) -> torch.optim.Optimizer:
    """``optim.name``: Adam, AdamW or SGD with momentum (Graves et al.'s TIMIT optimizer).

    ``graphs``: for a step in a CUDA graph (:mod:`cbasr.training.graphs`), on that device:
    Adam or AdamW fused and capturable, the learning rate a tensor there (the schedule writes
    it in place, the graphs read it), a non-finite step skipped through ``found_inf``.
    """
    params, lr, decay = model.parameters(), optim.lr, optim.weight_decay
    kinds = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    kind = next((k for name, k in kinds.items() if optim.name == name), None)
    if graphs is not None and kind is not None:
        lr = torch.tensor(float(lr), device=graphs)
        return kind(params, lr=lr, weight_decay=decay, fused=True, capturable=True)
    if kind is not None:
        return kind(params, lr=lr, weight_decay=decay)
    return torch.optim.SGD(params, lr=lr, momentum=optim.momentum, weight_decay=decay)


def augmentation_of(data: DataConfig) -> Augmentation | None:
    """The training data's augmentation from ``data.speed_perturb`` and ``data.spec_augment``; None: off."""
    spec = data.spec_augment
    aug = Augmentation(
        tuple(data.speed_perturb),
        spec.freq_masks,
        spec.freq_mask_width,
        spec.time_masks,
        spec.time_mask_width,
        spec.time_mask_ratio,
    )
    return aug if aug.masks or aug.speed_factors else None


def fbank_options_of(split_dir: str | Path, dim: int) -> FbankOptions:
    """The filterbank options a cached split was extracted with (its ``.done``), for on-the-fly features.

    Features computed on the fly must match the CMVN statistics of the cached train split.
    Without a ``.done`` file: the default options with ``num_mel_bins = dim``.
    """
    done = Path(split_dir) / ".done"
    if not done.is_file():
        log.warning(
            "%s not found: on-the-fly features use the default options with %d mel bins", done, dim
        )
        return FbankOptions(num_mel_bins=dim)
    return extraction_options(split_dir)
