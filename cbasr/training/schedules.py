"""Learning-rate schedules: warmup then decay per step, reduce-on-plateau per epoch.

The learning rate after ``s`` optimizer steps is ``lr * warmup_decay(s) * plateau_scale``:
``warmup_decay`` is a pure function of the step (:func:`warmup_decay`), ``plateau_scale``
starts at 1 and is multiplied by ``plateau_factor`` whenever the validation metric has not
improved for ``plateau_patience`` epochs. Both parts are checkpointed, so a resumed run sets
exactly the learning rates of an uninterrupted one.
"""

import math

import torch

__all__ = ["DECAYS", "warmup_decay", "LearningRateSchedule"]

DECAYS = ("constant", "cosine", "linear", "noam")


def warmup_decay(
    step: int, decay: str, warmup_steps: int, total_steps: int, final_lr_scale: float
) -> float:
    """Scale of the peak learning rate for the update after ``step`` optimizer steps.

    Linear warmup from ``1 / warmup_steps`` to 1 over ``warmup_steps`` updates, then:

    - ``constant``: 1;
    - ``cosine``: half a cosine from 1 down to ``final_lr_scale`` at ``total_steps``;
    - ``linear``: a straight line from 1 down to ``final_lr_scale`` at ``total_steps``;
    - ``noam``: ``sqrt(warmup_steps / (step + 1))``, the inverse square root decay of
      Vaswani et al. (2017), eq. (3), scaled so that its peak is 1.
    """
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "constant":
        return 1.0
    if decay == "noam":
        return math.sqrt(max(warmup_steps, 1) / (step + 1))
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if decay == "linear":
        return 1.0 - (1.0 - final_lr_scale) * progress
    if decay == "cosine":
        return final_lr_scale + (1 - final_lr_scale) * 0.5 * (1 + math.cos(math.pi * progress))
    raise ValueError(f"optim.scheduler must be one of {DECAYS}, got {decay!r}")


class LearningRateSchedule:
    """Sets every parameter group's learning rate; :meth:`step` after each optimizer update.

    Args:
        optimizer: its groups' current ``lr`` is taken as the peak learning rate.
        decay, warmup_steps, total_steps, final_lr_scale: see :func:`warmup_decay`.
        plateau_factor: multiply the learning rate by this, in ``(0, 1]``, after
            ``plateau_patience`` (>= 1) epochs without improvement (:meth:`end_epoch`); 1 turns
            reduce-on-plateau off.
        min_lr_scale: reduce-on-plateau never takes the scale below this.

    The bounds are :class:`~cbasr.config.schema.OptimConfig`'s, checked when the ``optim``
    group is typed; the schedule takes them as given.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        decay: str = "constant",
        warmup_steps: int = 0,
        total_steps: int = 1,
        final_lr_scale: float = 0.0,
        plateau_factor: float = 1.0,
        plateau_patience: int = 1,
        min_lr_scale: float = 0.0,
    ):
        if decay not in DECAYS:
            raise ValueError(f"optim.scheduler must be one of {DECAYS}, got {decay!r}")
        self.optimizer = optimizer
        self.peak_lrs = [float(group["lr"]) for group in optimizer.param_groups]
        # a group whose lr is a tensor (a fused optimizer in a CUDA graph: trainer.cuda_graphs)
        # keeps that tensor, rewritten in place, as the graphs hold it
        self._lr_tensors = [
            group["lr"] if isinstance(group["lr"], torch.Tensor) else None
            for group in optimizer.param_groups
        ]
        self.decay, self.warmup_steps, self.total_steps = decay, warmup_steps, total_steps
        self.final_lr_scale, self.min_lr_scale = final_lr_scale, min_lr_scale
        self.plateau_factor, self.plateau_patience = plateau_factor, plateau_patience
        self.steps = 0  # optimizer updates done
        self.plateau_scale = 1.0
        self.epochs_without_improvement = 0  # since the last improvement or reduction
        self._apply()

    def scale(self) -> float:
        """Current learning rate over the peak one."""
        return (
            warmup_decay(
                self.steps, self.decay, self.warmup_steps, self.total_steps, self.final_lr_scale
            )
            * self.plateau_scale
        )

    def _apply(self) -> None:
        scale = self.scale()
        groups = self.optimizer.param_groups
        for group, peak, tensor in zip(groups, self.peak_lrs, self._lr_tensors):
            if tensor is None:
                group["lr"] = peak * scale
            else:  # (also after a checkpoint's load_state_dict put a float there)
                group["lr"] = tensor.fill_(peak * scale)

    def step(self) -> None:
        """After an optimizer update."""
        self.steps += 1
        self._apply()

    def end_epoch(self, improved: bool) -> bool:
        """Reduce-on-plateau after a validation; True when it lowered the learning rate."""
        self.epochs_without_improvement = 0 if improved else self.epochs_without_improvement + 1
        if self.plateau_factor == 1.0 or self.epochs_without_improvement < self.plateau_patience:
            return False
        self.epochs_without_improvement = 0
        reduced = max(self.plateau_scale * self.plateau_factor, self.min_lr_scale)
        changed = reduced < self.plateau_scale
        self.plateau_scale = reduced
        self._apply()
        return changed

    def get_last_lr(self) -> list[float]:
        """Each group's learning rate (computed: a tensor's is not read from the device)."""
        scale = self.scale()
        return [peak * scale for peak in self.peak_lrs]

    def state_dict(self) -> dict:
        return {
            "steps": self.steps,
            "plateau_scale": self.plateau_scale,
            "epochs_without_improvement": self.epochs_without_improvement,
        }

    def load_state_dict(self, state: dict) -> None:
        if "last_epoch" in state:  # a torch LambdaLR's state, from checkpoints of earlier versions
            state = {
                "steps": state["last_epoch"],
                "plateau_scale": 1.0,
                "epochs_without_improvement": 0,
            }
        self.steps = state["steps"]
        self.plateau_scale = state["plateau_scale"]
        self.epochs_without_improvement = state["epochs_without_improvement"]
        self._apply()
