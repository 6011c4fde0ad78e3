"""The training loop: an experiment directory in, checkpoints, history and logs out.

Rerunning :func:`train` on the same experiment directory resumes from ``checkpoints/last.pt``:
model, optimizer, learning-rate schedule, gradient scaler, every RNG state (of every process)
and the position within the epoch are restored. Batches are a deterministic function of
``(seed, epoch)`` and augmentation of ``(seed, epoch, utterance)``, so nothing is lost or
repeated and on CPU a resumed run ends with the parameters of an uninterrupted one, bit for bit.

Launched by ``torchrun``, every process trains on its shard of each global batch under
DistributedDataParallel (:mod:`cbasr.engines.distributed`); process 0 writes the files.
"""

import logging
import math
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from cbasr.builder import build_model
from cbasr.data.batching import BucketBatchSampler, shard
from cbasr.data.dataset import AsrDataset, Batch, collate
from cbasr.data.features import FEATURE_SETTINGS, load_cmvn, write_feature_settings
from cbasr.data.source_tokens import SOURCE_VOCAB, experiment_input
from cbasr.data.vocab import Vocabulary
from cbasr.engines import distributed
from cbasr.engines.fine_tuning import load_initial_weights
from cbasr.engines.progress import ProgressMeter, plot_history
from cbasr.engines.schedules import LearningRateSchedule
from cbasr.engines.scoring import error_counts
from cbasr.engines.training_options import (
    METRICS,
    PRECISIONS,
    augmentation_of,
    check_options,
    fbank_options_of,
    make_optimizer,
    select_device,
)
from cbasr.engines.weight_noise import noisy_parameters, weight_noise
from cbasr.storage import faults
from cbasr.storage.checkpoint import (
    CheckpointDir,
    rng_state,
    seed_everything,
    set_rng_state,
)
from cbasr.storage.files import write_json
from cbasr.storage.lock import lock_experiment

__all__ = ["train", "Trainer", "TrainState", "StepResult", "MODEL_KEYS", "BATCH_KEYS"]

log = logging.getLogger(__name__)

# Config entries that define the model: a resumed run must not change them.
MODEL_KEYS = ("encoder", "decoder", "loss", "data.units")
# Config entries that define the batches: changing them moves the position within the epoch.
BATCH_KEYS = ("data.max_frames", "data.max_utts", "data.train_split", "trainer.seed")


@dataclass
class TrainState:
    epoch: int = 0  # current epoch, 0-based
    batch_in_epoch: int = 0  # global batches of this epoch already done
    step: int = 0  # optimizer steps done
    epoch_nll: float = 0.0  # summed over this epoch's steps so far (all processes)
    epoch_tokens: int = 0
    bad_steps: int = 0  # skipped for a non-finite loss or gradient, in total
    bad_in_a_row: int = 0
    best_error_rate: float = math.inf  # validation metrics of the best epoch
    best_valid_loss: float = math.inf
    best_score: list | None = None  # trainer.best_metric, then the other metric (tie-break)
    best_epoch: int = 0
    epochs_since_best: int = 0
    stopped_early: bool = False
    history: list = field(default_factory=list)


@dataclass
class StepResult:
    """One training step: ``nll`` summed over the global batch, None when the step was skipped."""

    nll: float | None
    grad_norm: float
    stats: dict
    save: bool  # a process asked for a checkpoint (time-based)


def _lookup(cfg: dict, dotted: str):
    for key in dotted.split("."):
        cfg = cfg.get(key) if isinstance(cfg, dict) else None
    return cfg


def _step_seed(seed: int, step: int) -> int:
    """Seed of step ``step``'s weight noise: the same in every process and after a resume."""
    return int(
        np.random.SeedSequence([seed, step, 0x5EED]).generate_state(1, dtype=np.uint64)[0] >> 1
    )


class Trainer:
    """One experiment, in one of the processes that train it.

    Args:
        cfg: the resolved config (plain dict).
        exp_dir: the experiment directory.
        dist_ctx: this process's place among several (default: from ``torchrun``'s environment).
    """

    def __init__(
        self, cfg: dict, exp_dir: str | Path, dist_ctx: distributed.DistContext | None = None
    ):
        self.cfg = cfg
        self.exp_dir = Path(exp_dir)
        self.dist = distributed.from_environment() if dist_ctx is None else dist_ctx
        trainer, data, optim = cfg["trainer"], cfg["data"], cfg["optim"]
        if trainer["num_threads"] > 0:
            torch.set_num_threads(trainer["num_threads"])
        self.device = select_device(trainer["device"], self.dist.local_rank)
        check_options(cfg, self.device)
        distributed.init_process_group(self.dist, self.device)
        self.checkpoints = CheckpointDir(self.exp_dir / "checkpoints", trainer["keep_checkpoints"])
        if self.dist.is_main:
            lock_experiment(self.exp_dir)  # held already when cbasr-train started us
            self._prepare_exp_dir()
        distributed.barrier(self.dist)
        seed_everything(trainer["seed"])  # the same initial model in every process
        self.vocab = Vocabulary.load(self.exp_dir / "vocab.txt")
        input_dim, cmvn = experiment_input(
            self.exp_dir
        )  # filterbanks, or source tokens for text input
        self.model = build_model(
            cfg["encoder"],
            cfg["decoder"],
            cfg["loss"],
            input_dim=input_dim,
            vocab_size=len(self.vocab),
        ).to(self.device)
        if self.dist.rank > 0:
            seed_everything(trainer["seed"] + self.dist.rank)  # dropout: a stream per process
        fbank = None
        if data["features"] == "on_the_fly":
            fbank = fbank_options_of(Path(data["feature_dir"]) / data["train_split"], input_dim)
        self.train_set, self.valid_set = (
            AsrDataset(
                Path(data["manifest_dir"]) / f"{split}.jsonl",
                Path(data["feature_dir"]) / split,
                self.vocab,
                data["units"],
                cmvn,
                check=self.model.check_utterance,
                fbank=fbank,
                augmentation=augmentation,
                seed=trainer["seed"],
            )
            for split, augmentation in (
                (data["train_split"], augmentation_of(data)),
                (data["valid_split"], None),
            )
        )
        if len(self.train_set) == 0:
            raise RuntimeError(
                f"no usable training utterances in {data['manifest_dir']} (data.manifest_dir)"
            )
        if len(self.valid_set) == 0:
            log.warning(
                "no usable %s utterances (data.valid_split): validation metrics are meaningless and "
                "best.pt, reduce-on-plateau and early stopping follow them",
                data["valid_split"],
            )
        self.sampler = BucketBatchSampler(
            self.train_set.num_frames,
            data["max_frames"],
            data["max_utts"],
            shuffle=True,
            seed=trainer["seed"],
            min_utts=self.dist.world_size,
        )
        self.steps_per_epoch = len(self.sampler)
        self.optimizer = make_optimizer(self.model, optim)
        self.schedule = LearningRateSchedule(
            self.optimizer,
            optim["scheduler"],
            optim["warmup_steps"],
            self.steps_per_epoch * trainer["max_epochs"],
            optim["final_lr_scale"],
            optim["plateau_factor"],
            optim["plateau_patience"],
            optim["min_lr_scale"],
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=trainer["precision"] == "fp16")
        self.ddp = self.model
        if self.dist.enabled:
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                self.model,
                device_ids=[self.device] if self.device.type == "cuda" else None,
                find_unused_parameters=trainer["find_unused_parameters"],
            )
        self.noise_generator = torch.Generator(device=self.device)
        self.state = TrainState()
        self.num_params = sum(p.numel() for p in self.model.parameters())
        self._last_save = time.monotonic()

    def _prepare_exp_dir(self) -> None:
        """Copy the vocabulary and the input description (CMVN statistics, or the source
        vocabulary of a text corpus) in, so the directory stands alone."""
        data = self.cfg["data"]
        self.checkpoints.path.mkdir(parents=True, exist_ok=True)
        self.checkpoints.remove_temporaries()
        features = Path(data["feature_dir"])
        described = SOURCE_VOCAB if (features / SOURCE_VOCAB).is_file() else "cmvn.json"
        for src, dst in ((data["vocab"], "vocab.txt"), (features / described, described)):
            if not (self.exp_dir / dst).exists():
                if not Path(src).is_file():
                    raise FileNotFoundError(
                        f"{src} not found (data.{'vocab' if dst == 'vocab.txt' else 'feature_dir'})"
                    )
                shutil.copyfile(src, self.exp_dir / dst)
        if described == "cmvn.json" and not (self.exp_dir / FEATURE_SETTINGS).is_file():
            split_dir = features / data["train_split"]
            dim = load_cmvn(self.exp_dir / "cmvn.json")[0].numel()
            write_feature_settings(
                self.exp_dir, fbank_options_of(split_dir, dim), data["features"] == "cached"
            )
        write_json(self.exp_dir / "config.json", self.cfg)

    # --- checkpoints -------------------------------------------------------------------
    def _checkpoint(self) -> dict:
        """The full training state; gathers every process's RNG state (all processes call it)."""
        rngs = distributed.all_gather_objects(rng_state(), self.dist)
        ckpt = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "scaler": self.scaler.state_dict(),
            "state": asdict(self.state),
            "rng": rngs[0],
            "world_size": self.dist.world_size,
            "config": self.cfg,
        }
        if self.dist.enabled:
            ckpt["rng_per_rank"] = rngs
        return ckpt

    def save(self, name: str = "last") -> None:
        """Write ``checkpoints/<name>.pt`` (process 0; every process must call it)."""
        ckpt = self._checkpoint()
        if self.dist.is_main:
            self.checkpoints.save(name, ckpt)
        self._last_save = time.monotonic()

    def _start_afresh(self, skipped: list[str]) -> None:
        """No checkpoint loads: start from scratch if the directory holds no earlier results,
        or if ``trainer.resume=never`` asks for it (the earlier results are removed)."""
        earlier = (
            sorted(self.checkpoints.path.glob("*.pt")) if self.checkpoints.path.is_dir() else []
        )
        earlier += [p for p in [self.exp_dir / "history.json"] if p.is_file()]
        if not earlier:
            return
        names = ", ".join(p.name for p in earlier)
        if self.cfg["trainer"].get("resume", "auto") != "never":
            why = (
                f"none of its checkpoints loads ({'; '.join(skipped)})"
                if skipped
                else "no checkpoint"
            )
            raise RuntimeError(
                f"{self.exp_dir} holds an earlier run ({names}) but {why}: rerun with "
                "trainer.resume=never to start from scratch over it, or choose another exp_dir"
            )
        log.warning(
            "trainer.resume=never: removing the earlier run's %s and starting afresh", names
        )
        if self.dist.is_main:
            for path in earlier:
                path.unlink()
        distributed.barrier(self.dist)

    def resume(self) -> bool:
        """Restore the newest checkpoint that loads (``last.pt``, else the newest epoch file,
        else ``best.pt``), warning about the unreadable ones; refuse a changed model config, and
        a fresh start over an earlier run's results unless ``trainer.resume=never``."""
        mode = self.cfg["trainer"].get("resume", "auto")  # older configs lack it
        if mode not in ("auto", "never"):
            raise ValueError(f"trainer.resume must be auto or never, got {mode!r}")
        path, ckpt, skipped = (
            (None, None, []) if mode == "never" else self.checkpoints.newest_loadable(self.device)
        )
        if path is None:
            self._start_afresh(skipped)
            return False
        if skipped:
            log.warning(
                "skipped checkpoints that do not load: %s; resuming from %s",
                "; ".join(skipped),
                path.name,
            )
        changed = [k for k in MODEL_KEYS if _lookup(ckpt["config"], k) != _lookup(self.cfg, k)]
        if changed:
            raise ValueError(
                f"{self.exp_dir} holds a run with different {changed}; "
                "use a new exp_dir or restore those settings"
            )
        moved = [k for k in BATCH_KEYS if _lookup(ckpt["config"], k) != _lookup(self.cfg, k)]
        if moved:
            log.warning(
                "%s changed since the checkpoint: the rest of this epoch uses different batches",
                moved,
            )
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.schedule.load_state_dict(ckpt["scheduler"])
        if self.scaler.is_enabled() and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.state = TrainState(**ckpt["state"])
        if self.state.best_score is None and math.isfinite(
            self.state.best_error_rate
        ):  # older checkpoints
            self.state.best_score = list(
                self._score(
                    {
                        "valid_error_rate": self.state.best_error_rate,
                        "valid_loss": self.state.best_valid_loss,
                    }
                )
            )
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
        """Resume (:meth:`resume`), or start a new run, from ``trainer.init_from``'s weights
        when it names a model to fine-tune."""
        trainer = self.cfg["trainer"]
        if self.resume():
            if self.dist.is_main:
                write_json(self.exp_dir / "history.json", self.state.history)
            if trainer.get("init_from"):
                log.info("resuming: trainer.init_from=%s is not used", trainer["init_from"])
        elif trainer.get("init_from"):
            load_initial_weights(
                self.model, trainer["init_from"], list(trainer.get("init_skip") or []), self.vocab
            )

    # --- steps -------------------------------------------------------------------------
    def _autocast(self):
        dtype = PRECISIONS[self.cfg["trainer"]["precision"]]
        return nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    def _noise(self):
        """Weight noise for this step (from ``optim.weight_noise_start``), the same in every process."""
        optim = self.cfg["optim"]
        if optim["weight_noise"] <= 0 or self.state.step < optim["weight_noise_start"]:
            return nullcontext()
        self.noise_generator.manual_seed(_step_seed(self.cfg["trainer"]["seed"], self.state.step))
        return weight_noise(
            noisy_parameters(self.model), optim["weight_noise"], self.noise_generator
        )

    def train_step(self, batch: Batch, global_tokens: int, want_save: bool = False) -> StepResult:
        """One optimizer step on this process's shard of a global batch of ``global_tokens`` labels.

        A non-finite loss in any process, or a non-finite gradient, skips the step in every
        process. The loss is ``sum(shard losses) / global_tokens * world_size``, so DDP's
        gradient average is the gradient of the global batch's per-label loss.
        """
        self.ddp.train()
        world = self.dist.world_size
        with self._noise():
            out, bad_ids = None, []
            if batch.ids:
                with self._autocast():
                    out = self.ddp(batch.feats, batch.feat_lens, batch.targets, batch.target_lens)
                finite = torch.isfinite(out.loss).tolist()
                bad_ids = [utt for utt, ok in zip(batch.ids, finite) if not ok]
            local_nll = float(out.nll.sum()) if out is not None and not bad_ids else 0.0
            bad, nll, save = distributed.all_reduce_sum(
                [float(out is None or bool(bad_ids)), local_nll, float(want_save)],
                self.dist,
                self.device,
            )
            if bad:
                if bad_ids:
                    log.warning(
                        "step %d: non-finite loss for %s; skipping the step",
                        self.state.step,
                        bad_ids,
                    )
                elif out is None:
                    log.warning(
                        "step %d: no readable utterance in this shard; skipping the step",
                        self.state.step,
                    )
                return StepResult(None, math.nan, {}, save > 0)
            loss = out.loss.sum() / global_tokens
            if world > 1:
                loss = loss * world
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        clip = self.cfg["optim"]["grad_clip"]
        norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), clip if clip > 0 else math.inf
        )
        faults.kill_if_armed("kill-in-step", self.state.step + 1, self.dist.rank)
        if not torch.isfinite(norm):
            scale = (
                f" (fp16 loss scale {self.scaler.get_scale():g})"
                if self.scaler.is_enabled()
                else ""
            )
            log.warning(
                "step %d: non-finite gradient%s for %s; skipping the step",
                self.state.step,
                scale,
                batch.ids,
            )
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update()  # fp16: lowers the loss scale
            return StepResult(None, math.nan, {}, save > 0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.schedule.step()
        return StepResult(nll, float(norm), out.stats, save > 0)

    @torch.no_grad()
    def validate(self) -> dict:
        """Per-token loss and greedy error rate on the validation split (shared among processes)."""
        self.model.eval()
        sampler = BucketBatchSampler(
            self.valid_set.num_frames, self.cfg["data"]["max_frames"], shuffle=False
        )
        totals = {"nll": 0.0, "tokens": 0, "errors": 0, "ref_tokens": 0}
        stats, batches = {}, 0
        for indices in sampler.batches()[self.dist.rank :: self.dist.world_size]:
            batch = collate([self.valid_set[i] for i in indices]).to(self.device)
            if not batch.ids:
                continue
            with self._autocast():
                out = self.model(batch.feats, batch.feat_lens, batch.targets, batch.target_lens)
                hyps = self.model.greedy_decode(batch.feats, batch.feat_lens)
            refs = [y[:n].tolist() for y, n in zip(batch.targets, batch.target_lens.tolist())]
            counts = error_counts(
                [self.vocab.decode(r) for r in refs], [self.vocab.decode(h) for h in hyps]
            )
            totals["nll"] += float(out.nll.sum())
            totals["tokens"] += int(batch.target_lens.sum())
            totals["errors"] += counts["errors"]
            totals["ref_tokens"] += counts["ref_tokens"]
            for key, value in out.stats.items():
                stats[key] = stats.get(key, 0.0) + value
            batches += 1
        nll, tokens, errors, ref_tokens = distributed.all_reduce_sum(
            list(totals.values()), self.dist, self.device
        )
        metrics = {
            "valid_loss": nll / max(tokens, 1),
            "valid_error_rate": 100.0 * errors / max(ref_tokens, 1),
        }
        metrics.update(
            {f"valid_{key}": value / batches for key, value in stats.items()}
        )  # this process's
        return metrics

    # --- the loop ----------------------------------------------------------------------
    def fit(self) -> None:
        trainer = self.cfg["trainer"]
        self.initialise()
        if self.state.epoch >= trainer["max_epochs"] or self.state.stopped_early:
            log.info(
                "training complete (%d epochs%s); nothing to do",
                self.state.epoch,
                ", stopped early" if self.state.stopped_early else "",
            )
            return
        log.info(
            "model: %.2fM parameters; %d training utterances in %d batches per epoch; device %s%s",
            self.num_params / 1e6,
            len(self.train_set),
            self.steps_per_epoch,
            self.device,
            f"; {self.dist.world_size} processes" if self.dist.enabled else "",
        )
        writer = (
            SummaryWriter(self.exp_dir / "tensorboard", purge_step=self.state.step)
            if self.dist.is_main
            else None
        )
        try:
            while self.state.epoch < trainer["max_epochs"] and not self.state.stopped_early:
                self._run_epoch(writer)
        finally:
            if writer is not None:
                writer.close()
        log.info(
            "training complete: best validation error rate %.2f%% (epoch %d)",
            self.state.best_error_rate,
            self.state.best_epoch,
        )

    def loader(self, batches: list[list[int]]) -> torch.utils.data.DataLoader:
        """This process's shards of ``batches``, loaded in ``data.num_workers`` worker processes."""
        workers = self.cfg["data"]["num_workers"]
        # A generator of its own: iterating a DataLoader draws a base seed, which must not come
        # from the global RNG, or a resumed epoch would draw once more than the original did.
        loader_rng = torch.Generator().manual_seed(
            self.cfg["trainer"]["seed"] * 1000 + self.state.epoch
        )
        return torch.utils.data.DataLoader(
            self.train_set,
            batch_sampler=[shard(b, self.dist.rank, self.dist.world_size) for b in batches],
            collate_fn=collate,
            num_workers=workers,
            generator=loader_rng,
            pin_memory=self.device.type == "cuda",
            prefetch_factor=4 if workers else None,
        )

    def _run_epoch(self, writer: SummaryWriter | None) -> None:
        trainer, state = self.cfg["trainer"], self.state
        self.sampler.set_epoch(state.epoch)
        self.train_set.set_epoch(state.epoch)
        batches = self.sampler.batches()[state.batch_in_epoch :]
        bar = tqdm(
            total=self.steps_per_epoch,
            initial=state.batch_in_epoch,
            desc=f"epoch {state.epoch + 1}",
            disable=not (trainer["progress_bar"] and sys.stderr.isatty() and self.dist.is_main),
            leave=False,
        )
        meter = ProgressMeter()
        every = trainer["checkpoint_every_steps"]
        waited = time.perf_counter()
        for batch, global_batch in zip(self.loader(batches), batches):
            meter.data_ready(time.perf_counter() - waited)
            tokens = sum(self.train_set.target_lens[i] for i in global_batch)
            want_save = (
                self.dist.is_main
                and time.monotonic() - self._last_save > 60 * trainer["checkpoint_minutes"]
            )
            result = self.train_step(batch.to(self.device, non_blocking=True), tokens, want_save)
            state.batch_in_epoch += 1
            bar.update()
            if result.nll is None:
                state.bad_steps += 1
                state.bad_in_a_row += 1
                if state.bad_in_a_row >= trainer["max_bad_steps"]:
                    self.save()
                    raise RuntimeError(
                        f"{state.bad_in_a_row} steps in a row had a non-finite loss or gradient "
                        f"(trainer.max_bad_steps={trainer['max_bad_steps']}); stopping "
                        f"(last checkpoint: {self.checkpoints.file('last')})"
                    )
            else:
                state.bad_in_a_row = 0
                state.step += 1
                state.epoch_nll += result.nll
                state.epoch_tokens += tokens
                meter.step_done(sum(self.train_set.num_frames[i] for i in global_batch), result)
                if state.step % trainer["log_every"] == 0:
                    self._log_progress(writer, meter)
            if result.save or (every and result.nll is not None and state.step % every == 0):
                self.save()
            waited = time.perf_counter()
        bar.close()
        self._end_epoch(writer, meter)

    def _log_progress(self, writer: SummaryWriter | None, meter: ProgressMeter) -> None:
        state = self.state
        loss = state.epoch_nll / max(state.epoch_tokens, 1)
        lr = self.schedule.get_last_lr()[0]
        interval = meter.interval()
        if writer is not None:
            scalars = {
                "train/loss": loss,
                "train/grad_norm": interval["grad_norm"],
                "train/lr": lr,
                "train/bad_steps": state.bad_steps,
                "perf/frames_per_second": interval["frames_per_second"],
                "perf/data_fraction": interval["data_fraction"],
            }
            scalars.update({f"train/{key}": value for key, value in interval["stats"].items()})
            for key, value in scalars.items():  # stats: e.g. the CB emission rate against L / T
                writer.add_scalar(key, value, state.step)
            meter.add_layout_once(writer, interval["stats"])
        log.info(
            "epoch %d batch %d/%d step %d: loss %.4f lr %.2e grad-norm %.2f, %.0f frames/s (data %.0f%%)",
            state.epoch + 1,
            state.batch_in_epoch,
            self.steps_per_epoch,
            state.step,
            loss,
            lr,
            interval["grad_norm"],
            interval["frames_per_second"],
            100 * interval["data_fraction"],
        )

    def _score(self, metrics: dict) -> tuple[float, float]:
        """``trainer.best_metric``, then the other metric to break ties (lower is better)."""
        first = self.cfg["trainer"]["best_metric"]
        return metrics[first], metrics[METRICS[1] if first == METRICS[0] else METRICS[0]]

    def _end_epoch(self, writer: SummaryWriter | None, meter: ProgressMeter) -> None:
        state, trainer = self.state, self.cfg["trainer"]
        totals = meter.epoch_totals()
        metrics = {
            "epoch": state.epoch + 1,
            "step": state.step,
            "train_loss": state.epoch_nll / max(state.epoch_tokens, 1),
            "lr": self.schedule.get_last_lr()[0],
            "seconds": round(totals["seconds"], 1),
            "frames_per_second": round(totals["frames_per_second"]),
            "data_fraction": round(totals["data_fraction"], 4),
            **self.validate(),
        }
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
            state.best_error_rate, state.best_valid_loss = (
                metrics["valid_error_rate"],
                metrics["valid_loss"],
            )
        else:
            state.epochs_since_best += 1
        if self.schedule.end_epoch(improved):
            log.info(
                "%s has not improved for %d epochs: learning rate down to %.2e",
                trainer["best_metric"],
                self.cfg["optim"]["plateau_patience"],
                self.schedule.get_last_lr()[0],
            )
        patience = trainer["early_stopping_patience"]
        if patience and state.epochs_since_best >= patience:
            state.stopped_early = True
            log.info(
                "early stopping: %s has not improved for %d epochs (best: epoch %d)",
                trainer["best_metric"],
                patience,
                state.best_epoch,
            )
        log.info(
            "epoch %d done in %.0f s (%.0f frames/s, data %.0f%%): train loss %.4f, valid loss %.4f, "
            "valid error rate %.2f%%",
            state.epoch + 1,
            totals["seconds"],
            totals["frames_per_second"],
            100 * totals["data_fraction"],
            metrics["train_loss"],
            metrics["valid_loss"],
            metrics["valid_error_rate"],
        )
        if writer is not None:
            for key, value in metrics.items():
                if key.startswith(("train_", "valid_")):
                    writer.add_scalar(f"epoch/{key}", value, state.epoch + 1)
        state.history.append(metrics)
        state.epoch += 1
        state.batch_in_epoch, state.epoch_nll, state.epoch_tokens = 0, 0.0, 0
        self._save_epoch(improved)

    def _save_epoch(self, improved: bool) -> None:
        """``epoch-<N>.pt``, then ``best.pt`` and ``last.pt`` (links): a kill between them loses nothing."""
        name = f"epoch-{self.state.epoch}"
        self.save(name)
        if not self.dist.is_main:
            return
        if improved:
            self.checkpoints.copy(name, "best")
        self.checkpoints.copy(name, "last")
        scores = {h["epoch"]: self._score(h) for h in self.state.history}
        for epoch in self.checkpoints.prune(scores):
            log.info(
                "removed checkpoint epoch-%d.pt (trainer.keep_checkpoints=%d)",
                epoch,
                self.checkpoints.keep,
            )
        write_json(self.exp_dir / "history.json", self.state.history)
        plot_history(self.state.history, self.exp_dir / "training_curves.png")


def train(cfg: dict, exp_dir: str | Path) -> Trainer:
    """Train (or resume) the experiment in ``exp_dir`` described by ``cfg``."""
    trainer = Trainer(cfg, exp_dir)
    try:
        trainer.fit()
        # Leave together: a process that tears down its gloo connections while process 0 is
        # still writing the last files aborts (SIGABRT) and torchrun then kills process 0.
        distributed.barrier(trainer.dist)
    finally:
        distributed.shutdown()
    return trainer
