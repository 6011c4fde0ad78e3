"""The training loop shared by every kind of training: an experiment directory in,
checkpoints, history and logs out.

What the loop owns is the same for an acoustic model and a language model: the device and the
processes, the optimizer and its schedule, mixed precision, weight noise, gradient clipping and
non-finite steps, checkpoints and resume (:mod:`cbasr.training.checkpointing`), the best epoch
and early stopping, and the reports (:mod:`cbasr.training.reports`). What differs, the
data, the model, a batch's loss and the validation metrics, is a task
(:class:`cbasr.training.task.TrainingTask`): :class:`~cbasr.training.asr_task.AsrTask` for
``cbasr-train``, :class:`~cbasr.training.lm_task.LmTask` for ``cbasr-train-lm``.

Rerunning on the same experiment directory resumes from ``checkpoints/last.pt``: model,
optimizer, learning-rate schedule, gradient scaler, every RNG state (of every process) and the
position within the epoch are restored. A task's batches are a deterministic function of
``(seed, epoch)``, so nothing is lost or repeated and on CPU a resumed run ends with the
parameters of an uninterrupted one, bit for bit.

Launched by ``torchrun``, every process trains on its shard of each global batch under
DistributedDataParallel (:mod:`cbasr.training.distributed`); process 0 writes the files.
"""

import logging
import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from cbasr.checks import read
from cbasr.config.schema import OptimConfig, TrainerConfig
from cbasr.devices import select_device
from cbasr.progress import counter_bar
from cbasr.storage import faults
from cbasr.storage.checkpoint import rng_state, seed_everything, set_rng_state
from cbasr.storage.lock import lock_experiment
from cbasr.training import distributed
from cbasr.training.checkpointing import RunCheckpoints
from cbasr.training.graphs import GraphedSteps
from cbasr.training.meter import ProgressMeter
from cbasr.training.options import PRECISIONS, check_options, make_optimizer
from cbasr.training.reports import TrainingLog
from cbasr.training.schedules import LearningRateSchedule
from cbasr.training.task import TrainingTask
from cbasr.training.weight_noise import noisy_parameters, weight_noise

__all__ = ["Trainer", "TrainState", "StepResult", "run"]

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    epoch: int = 0  # current epoch, 0-based
    batch_in_epoch: int = 0  # global batches of this epoch already done
    step: int = 0  # optimizer steps done
    epoch_nll: float = 0.0  # summed over this epoch's steps so far (all processes)
    epoch_tokens: int = 0
    bad_steps: int = 0  # skipped for a non-finite loss or gradient, in total
    bad_in_a_row: int = 0
    best_metrics: dict = field(default_factory=dict)  # the task's validation metrics, best epoch
    best_score: list | None = None  # trainer.best_metric, then the other metric (tie-break)
    best_epoch: int = 0
    epochs_since_best: int = 0
    stopped_early: bool = False
    history: list = field(default_factory=list)


def _train_state(saved: dict) -> TrainState:
    """A checkpoint's training state; one written before ``best_metrics`` kept the best epoch's
    error rate and loss in fields of their own (infinite: none yet)."""
    saved = dict(saved)
    old = {
        "valid_error_rate": saved.pop("best_error_rate", math.inf),
        "valid_loss": saved.pop("best_valid_loss", math.inf),
    }
    if "best_metrics" not in saved:
        saved["best_metrics"] = {k: v for k, v in old.items() if math.isfinite(v)}
    return TrainState(**saved)


@dataclass
class StepResult:
    """One training step: ``nll`` summed over the global batch, None when the step was skipped."""

    nll: float | None
    grad_norm: float
    stats: dict
    save: bool  # a process asked for a checkpoint (time-based)


def _read_step(norm: torch.Tensor, loss: torch.Tensor, nll: torch.Tensor, stats: dict):
    """After the backward, with one read of the device: the gradient norm, the losses' sum
    (finite exactly when every utterance's loss is, short of overflow), the NLL sum, and the
    step's statistics (floats, or 0-d tensors on the norm's device) as floats."""
    keys = [k for k, v in stats.items() if isinstance(v, torch.Tensor)]
    values = read(
        norm.detach(),
        loss.detach().sum(),
        nll.detach().sum(),
        *(stats[k].detach().to(norm.device) for k in keys),
    )
    norm, loss_sum, nll_sum, *rest = values
    return norm, loss_sum, nll_sum, {**stats, **dict(zip(keys, rest))}


def _failing(ids: list[str], finite: list) -> list[str]:
    """The utterances whose loss is not finite."""
    return [utt for utt, ok in zip(ids, finite) if not ok]


def _plain_lr(state: dict) -> dict:
    """An optimizer's state with each group's learning rate a float (``trainer.cuda_graphs``
    keeps it as a device tensor: its checkpoints are the eager step's, and resume either way)."""
    for group in state["param_groups"]:
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = float(group["lr"])
    return state


def _step_seed(seed: int, step: int) -> int:
    """Seed of step ``step``'s weight noise: the same in every process and after a resume."""
    return int(
        np.random.SeedSequence([seed, step, 0x5EED]).generate_state(1, dtype=np.uint64)[0] >> 1
    )


class Trainer:
    """One experiment, in one of the processes that train it.

    Args:
        task: what is trained (:class:`~cbasr.training.task.TrainingTask`: the acoustic
            model, :func:`cbasr.training.asr_task.asr_trainer`, or a language model); the loop
            knows nothing else of it.
        options, optim: the loop's own config groups, typed.
        exp_dir: the experiment directory.
        dist_ctx: this process's place among several (default: from ``torchrun``'s environment).
        static_step: the step of ``trainer.cuda_graphs`` (padded to bucket shapes, the fused
            update) run eagerly, on any device: how the CPU tests check that step's logic.
    """

    def __init__(
        self,
        task: TrainingTask,
        options: TrainerConfig,
        optim: OptimConfig,
        exp_dir: str | Path,
        dist_ctx: distributed.DistContext | None = None,
        static_step: bool = False,
    ):
        self.exp_dir = Path(exp_dir)
        self.dist = distributed.from_environment() if dist_ctx is None else dist_ctx
        self.options, self.optim = options, optim
        trainer = options
        if trainer.num_threads > 0:
            torch.set_num_threads(trainer.num_threads)
        self.device = select_device(trainer.device, self.dist.local_rank, "trainer.device")
        self.task = task
        check_options(trainer, optim, self.device, self.task.metrics)
        distributed.init_process_group(self.dist, self.device)
        self.checkpoints = RunCheckpoints(self.exp_dir, self.dist, trainer.keep_checkpoints)
        if self.dist.is_main:
            lock_experiment(self.exp_dir)  # held already when the command started us
            self.checkpoints.prepare()
            self.task.prepare(self.exp_dir)
        distributed.barrier(self.dist)
        seed_everything(trainer.seed)  # the same initial model in every process
        self.model = self.task.build_model(self.device)
        if self.dist.rank > 0:
            seed_everything(trainer.seed + self.dist.rank)  # dropout: a stream per process
        self.task.build_data(self.dist)
        self.steps_per_epoch = self.task.steps_per_epoch
        graphed = trainer.cuda_graphs or static_step
        self.optimizer = make_optimizer(self.model, optim, self.device if graphed else None)
        self.schedule = LearningRateSchedule(
            self.optimizer,
            optim.scheduler,
            optim.warmup_steps,
            self.steps_per_epoch * trainer.max_epochs,
            optim.final_lr_scale,
            optim.plateau_factor,
            optim.plateau_patience,
            optim.min_lr_scale,
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=trainer.precision == "fp16")
        self.ddp = self.model
        if self.dist.enabled:
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                self.model,
                device_ids=[self.device] if self.device.type == "cuda" else None,
                find_unused_parameters=trainer.find_unused_parameters,
            )
        self.graphed = None
        if graphed:
            self._check_graphable()
            self.graphed = GraphedSteps(
                self.task.forward,
                self.model,
                self.optimizer,
                optim.grad_clip,
                self.device,
                graphs=trainer.cuda_graphs,
            )
        self.noise_generator = torch.Generator(device=self.device)
        self.state = TrainState()
        self.num_params = sum(p.numel() for p in self.model.parameters())
        self.reports = TrainingLog(self.exp_dir, self.dist.is_main, self.task.unit)
        self._last_save = time.monotonic()

    def _check_graphable(self) -> None:
        """What ``trainer.cuda_graphs`` refuses that only the built run knows."""
        if self.dist.enabled:
            raise ValueError(
                "trainer.cuda_graphs=true trains in one process (DistributedDataParallel's "
                "gradient exchange is not captured)"
            )
        if getattr(getattr(self.model, "encoder", None), "dynamic_chunks", 0):
            raise ValueError(
                "trainer.cuda_graphs=true and encoder.dynamic_chunks > 0: each batch draws its "
                "chunk size on the host, and a graph would replay its capture's"
            )

    # --- checkpoints -------------------------------------------------------------------
    def _checkpoint(self) -> dict:
        """The full training state; gathers every process's RNG state (all processes call it)."""
        rngs = distributed.all_gather_objects(rng_state(), self.dist)
        ckpt = {
            "model": self.model.state_dict(),
            "optimizer": _plain_lr(self.optimizer.state_dict()),
            "scheduler": self.schedule.state_dict(),
            "scaler": self.scaler.state_dict(),
            "state": asdict(self.state),
            "rng": rngs[0],
            "world_size": self.dist.world_size,
            **self.task.checkpoint_extras(),
        }
        if self.dist.enabled:
            ckpt["rng_per_rank"] = rngs
        return ckpt

    def save(self, name: str = "last") -> None:
        """Write ``checkpoints/<name>.pt`` (process 0; every process must call it)."""
        self.checkpoints.save(name, self._checkpoint())
        self._last_save = time.monotonic()

    def resume(self) -> bool:
        """Restore the newest checkpoint that loads (:meth:`RunCheckpoints.newest`); the task
        refuses one it cannot continue (a changed model config)."""
        mode = self.options.resume
        found = self.checkpoints.newest(mode, self.device)
        if found is None:
            return False
        path, ckpt = found
        ckpt = self.task.upgrade(ckpt)
        self.task.check_resumed(ckpt)
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt.get("scheduler"):
            self.schedule.load_state_dict(ckpt["scheduler"])
        if self.scaler.is_enabled() and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.state = _train_state(ckpt["state"])
        if self.state.best_score is None and self.state.best_metrics:  # older checkpoints
            self.state.best_score = list(self._score(self.state.best_metrics))
        rngs = ckpt.get("rng_per_rank") or [ckpt["rng"]]
        if len(rngs) == self.dist.world_size:
            set_rng_state(rngs[self.dist.rank])
        else:
            log.warning(
                "the checkpoint was written by %d processes, this run has %d: data position, model and "
                "optimizer are restored, the random streams of dropout and sampling start afresh",
                len(rngs),
                self.dist.world_size,
            )
        log.info(
            "resumed from %s at epoch %d, batch %d, step %d",
            path,
            self.state.epoch + 1,
            self.state.batch_in_epoch,
            self.state.step,
        )
        return True

    def initialise(self) -> None:
        """Resume (:meth:`resume`), or start a new run as the task starts one (e.g. from
        ``trainer.init_from``'s weights when it names a model to fine-tune)."""
        trainer = self.options
        if self.resume():
            self.reports.write_history(self.state.history)
            if trainer.init_from:
                log.info("resuming: trainer.init_from=%s is not used", trainer.init_from)
        else:
            self.task.start_new_run(self.model)

    # --- steps -------------------------------------------------------------------------
    def _autocast(self):
        dtype = PRECISIONS[self.options.precision]
        return nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    def _noise(self):
        """Weight noise for this step (``optim.weight_noise``), the same in every process."""
        optim = self.optim
        if optim.weight_noise <= 0:
            return nullcontext()
        self.noise_generator.manual_seed(_step_seed(self.options.seed, self.state.step))
        return weight_noise(noisy_parameters(self.model), optim.weight_noise, self.noise_generator)

    def train_step(self, batch, global_tokens: int, want_save: bool = False) -> StepResult:
        """One optimizer step on this process's shard of a global batch of ``global_tokens`` labels.

        A non-finite loss in any process, or a non-finite gradient, skips the step in every
        process. The loss is ``sum(shard losses) / global_tokens * world_size``, so DDP's
        gradient average is the gradient of the global batch's per-label loss. One process
        reads the device once a step besides the loss's own checks, after the backward (a
        non-finite loss gives a non-finite gradient, and the step is skipped then); several
        read once more before it, to agree on skipping before DDP's backward.
        """
        self.ddp.train()
        if self.graphed is not None:
            return self._graphed_step(batch, global_tokens, want_save)
        world = self.dist.world_size
        with self._noise():
            with self._autocast():
                out = self.task.forward(self.ddp, batch)
            agreed = None
            if out is None or world > 1:
                agreed = self._agree_before_backward(out, want_save)
                if agreed.nll is None:
                    return agreed
            loss = out.loss.sum() / global_tokens
            if world > 1:
                loss = loss * world
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        clip = self.optim.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), clip if clip > 0 else math.inf
        )
        norm, loss_sum, nll, stats = _read_step(norm, out.loss, out.nll, out.stats)  # one read
        faults.kill_if_armed("kill-in-step", self.state.step + 1, self.dist.rank)
        save = want_save if agreed is None else agreed.save
        nll = nll if agreed is None else agreed.nll
        if agreed is None and not math.isfinite(loss_sum):  # (several: agreed before it)
            finite = torch.isfinite(out.loss).tolist()
            self._warn_non_finite_loss(_failing(out.ids, finite) or out.ids)  # (or: overflow)
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler.is_enabled():  # fp16: the same loss scale (no gradient overflowed)
                self.scaler.update(self.scaler.get_scale())
            return StepResult(None, math.nan, {}, save)
        if not math.isfinite(norm):
            scale = (
                f" (fp16 loss scale {self.scaler.get_scale():g})"
                if self.scaler.is_enabled()
                else ""
            )
            log.warning(
                "step %d: non-finite gradient%s for %s; skipping the step",
                self.state.step,
                scale,
                out.ids,
            )
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update()  # fp16: lowers the loss scale
            return StepResult(None, math.nan, {}, save)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.schedule.step()
        return StepResult(nll, norm, stats, save)

    def _agree_before_backward(self, out, want_save: bool) -> StepResult:
        """Several processes (or a shard with no readable utterance): whether any process's
        shard has a non-finite loss or none, agreed before DDP's backward, with one read of the
        losses' finiteness and sum. ``nll`` is None when the step is skipped, else the global
        batch's NLL sum."""
        bad_ids, local_nll = [], 0.0
        if out is not None:
            *finite, local_nll = torch.cat(
                [torch.isfinite(out.loss).double(), out.nll.sum().double()[None]]
            ).tolist()
            bad_ids = _failing(out.ids, finite)
            local_nll = 0.0 if bad_ids else local_nll
        bad, nll, save = distributed.all_reduce_sum(
            [float(out is None or bool(bad_ids)), local_nll, float(want_save)],
            self.dist,
            self.device,
        )
        if not bad:
            return StepResult(nll, math.nan, {}, save > 0)
        if bad_ids:
            self._warn_non_finite_loss(bad_ids)
        elif out is None:
            log.warning(
                "step %d: no readable utterance in this shard; skipping the step",
                self.state.step,
            )
        return StepResult(None, math.nan, {}, save > 0)

    def _warn_non_finite_loss(self, ids: list[str]) -> None:
        log.warning("step %d: non-finite loss for %s; skipping the step", self.state.step, ids)

    def _graphed_step(self, batch, global_tokens: int, want_save: bool) -> StepResult:
        """:meth:`train_step` by :class:`~cbasr.training.graphs.GraphedSteps` (one process)."""
        if not batch.ids:
            log.warning(
                "step %d: no readable utterance in this batch; skipping the step", self.state.step
            )
            return StepResult(None, math.nan, {}, want_save)
        dtype = PRECISIONS[self.options.precision]
        autocast = (  # no cast cache: a graph's casts are replayed, not kept
            nullcontext
            if dtype is None
            else lambda: torch.autocast(self.device.type, dtype=dtype, cache_enabled=False)
        )
        values = self.graphed(batch, global_tokens, autocast)
        faults.kill_if_armed("kill-in-step", self.state.step + 1, self.dist.rank)
        bad_ids = _failing(batch.ids, values.finite)
        if bad_ids or not math.isfinite(values.grad_norm):
            what = "loss" if bad_ids else "gradient"
            log.warning(
                "step %d: non-finite %s for %s; the update was skipped",
                self.state.step,
                what,
                bad_ids or batch.ids,
            )
            return StepResult(None, math.nan, {}, want_save)
        self.schedule.step()
        return StepResult(values.nll, values.grad_norm, values.stats, want_save)

    def validate(self) -> dict:
        """The task's validation metrics for the current model."""
        return self.task.validate(self.model, self._autocast)

    # --- the loop ----------------------------------------------------------------------
    def fit(self) -> None:
        trainer = self.options
        self.initialise()
        if self.state.epoch >= trainer.max_epochs or self.state.stopped_early:
            log.info(
                "training complete (%d epochs%s); nothing to do",
                self.state.epoch,
                ", stopped early" if self.state.stopped_early else "",
            )
            return
        log.info(
            "model: %.2fM parameters; %s in %d batches per epoch; device %s%s",
            self.num_params / 1e6,
            self.task.describe(),
            self.steps_per_epoch,
            self.device,
            f"; {self.dist.world_size} processes" if self.dist.enabled else "",
        )
        self.reports.open(self.state.step)
        try:
            while self.state.epoch < trainer.max_epochs and not self.state.stopped_early:
                self._run_epoch()
        finally:
            self.reports.close()
        order = [
            trainer.best_metric,
            *(m for m in self.task.metrics if m != trainer.best_metric),
        ]
        log.info(
            "training complete: best epoch %d (%s)",
            self.state.best_epoch,
            ", ".join(f"{m} {v:.4g}" for m, v in zip(order, self.state.best_score or [])),
        )

    def loader(self, batches: list[list[int]]):
        """This process's shards of ``batches``, loaded by the task."""
        # A generator of its own: iterating a DataLoader draws a base seed, which must not come
        # from the global RNG, or a resumed epoch would draw once more than the original did.
        generator = torch.Generator().manual_seed(self.options.seed * 1000 + self.state.epoch)
        return self.task.loader(batches, self.dist, generator)

    def _run_epoch(self) -> None:
        trainer, state = self.options, self.state
        batches = self.task.epoch_batches(state.epoch)[state.batch_in_epoch :]
        bar = counter_bar(
            f"epoch {state.epoch + 1}",
            self.steps_per_epoch,
            state.batch_in_epoch,
            unit="batch",
            enabled=trainer.progress_bar and self.dist.is_main,
        )
        meter = ProgressMeter()
        every = trainer.checkpoint_every_steps
        waited = time.perf_counter()
        for batch, global_batch in zip(self.loader(batches), batches):
            meter.data_ready(time.perf_counter() - waited)
            tokens, units = self.task.batch_size(global_batch)
            want_save = (
                self.dist.is_main
                and time.monotonic() - self._last_save > 60 * trainer.checkpoint_minutes
            )
            result = self.train_step(batch, tokens, want_save)
            state.batch_in_epoch += 1
            bar.update()
            if result.nll is None:
                state.bad_steps += 1
                state.bad_in_a_row += 1
                if state.bad_in_a_row >= trainer.max_bad_steps:
                    self.save()
                    raise RuntimeError(
                        f"{state.bad_in_a_row} steps in a row had a non-finite loss or gradient "
                        f"(trainer.max_bad_steps={trainer.max_bad_steps}); stopping "
                        f"(last checkpoint: {self.checkpoints.file('last')})"
                    )
            else:
                state.bad_in_a_row = 0
                state.step += 1
                state.epoch_nll += result.nll
                state.epoch_tokens += tokens
                meter.step_done(units, result)
                if state.step % trainer.log_every == 0:
                    self.reports.progress(
                        meter,
                        epoch=state.epoch + 1,
                        batch=state.batch_in_epoch,
                        batches=self.steps_per_epoch,
                        step=state.step,
                        loss=state.epoch_nll / max(state.epoch_tokens, 1),
                        lr=self.schedule.get_last_lr()[0],
                        bad_steps=state.bad_steps,
                    )
            if result.save or (every and result.nll is not None and state.step % every == 0):
                self.save()
            waited = time.perf_counter()
        bar.close()
        self._end_epoch(meter)

    def _score(self, metrics: dict) -> tuple[float, ...]:
        """``trainer.best_metric``, then the task's other metrics to break ties (lower is better)."""
        first = self.options.best_metric
        return (metrics[first], *(metrics[m] for m in self.task.metrics if m != first))

    def _end_epoch(self, meter: ProgressMeter) -> None:
        state, trainer = self.state, self.options
        totals = meter.epoch_totals()
        metrics = {
            "epoch": state.epoch + 1,
            "step": state.step,
            "train_loss": state.epoch_nll / max(state.epoch_tokens, 1),
            "lr": self.schedule.get_last_lr()[0],
            "seconds": round(totals["seconds"], 1),
            f"{self.task.unit}_per_second": round(totals["frames_per_second"]),
            "data_fraction": round(totals["data_fraction"], 4),
            **self.validate(),
        }
        metrics.update(self.task.epoch_metrics(metrics))
        if self.dist.enabled:
            digests = distributed.all_gather_objects(
                distributed.replica_digest(self.model.state_dict()), self.dist
            )
            if len(set(digests)) > 1:
                raise RuntimeError(
                    f"the model replicas of the {self.dist.world_size} processes differ "
                    f"after epoch {state.epoch + 1}: {digests}"
                )
            metrics["replica_digests"] = digests
        improved = state.best_score is None or self._score(metrics) < tuple(state.best_score)
        if improved:
            state.best_score, state.best_epoch, state.epochs_since_best = (
                list(self._score(metrics)),
                state.epoch + 1,
                0,
            )
            state.best_metrics = {m: metrics[m] for m in self.task.metrics if m in metrics}
        else:
            state.epochs_since_best += 1
        if self.schedule.end_epoch(improved):
            log.info(
                "%s has not improved for %d epochs: learning rate down to %.2e",
                trainer.best_metric,
                self.optim.plateau_patience,
                self.schedule.get_last_lr()[0],
            )
        patience = trainer.early_stopping_patience
        if patience and state.epochs_since_best >= patience:
            state.stopped_early = True
            log.info(
                "early stopping: %s has not improved for %d epochs (best: epoch %d)",
                trainer.best_metric,
                patience,
                state.best_epoch,
            )
        self.reports.epoch_done(metrics)
        state.history.append(metrics)
        state.epoch += 1
        state.batch_in_epoch, state.epoch_nll, state.epoch_tokens = 0, 0.0, 0
        self._save_epoch(improved)

    def _save_epoch(self, improved: bool) -> None:
        """``epoch-<N>.pt``, then ``best.pt`` and ``last.pt``: a kill between them loses nothing."""
        scores = {h["epoch"]: self._score(h) for h in self.state.history}
        self.checkpoints.save_epoch(self.state.epoch, self._checkpoint(), improved, scores)
        self._last_save = time.monotonic()
        self.reports.write_history(self.state.history)


def run(trainer: Trainer) -> Trainer:
    """Train (or resume) to the end, every process leaving together."""
    try:
        trainer.fit()
        # Leave together: a process that tears down its gloo connections while process 0 is
        # still writing the last files aborts (SIGABRT) and torchrun then kills process 0.
        distributed.barrier(trainer.dist)
    finally:
        distributed.shutdown()
    return trainer
