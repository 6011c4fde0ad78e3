"""The training loop: an experiment directory in, checkpoints, history and logs out.

Rerunning :func:`train` on the same experiment directory resumes from ``checkpoints/last.pt``:
model, optimizer, scheduler, every RNG state and the position within the epoch are restored,
and batches are a deterministic function of ``(seed, epoch)``, so nothing is lost or repeated.
"""

import logging
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from cbasr.builder import build_model
from cbasr.data.batching import BucketBatchSampler
from cbasr.data.dataset import AsrDataset, Batch, collate
from cbasr.data.features import load_cmvn
from cbasr.data.vocab import Vocabulary
from cbasr.engines.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from cbasr.engines.scoring import error_counts
from cbasr.fileio import write_json
from cbasr.models import LossOutput

__all__ = ["train", "select_device", "MODEL_KEYS"]

log = logging.getLogger(__name__)

# Config entries that define the model: a resumed run must not change them.
MODEL_KEYS = ("encoder", "decoder", "loss", "data.units")
MAX_BAD_STEPS_IN_A_ROW = 20


@dataclass
class TrainState:
    epoch: int = 0  # current epoch, 0-based
    batch_in_epoch: int = 0  # batches of this epoch already done
    step: int = 0  # optimizer steps done
    epoch_nll: float = 0.0  # summed over this epoch's steps so far
    epoch_tokens: int = 0
    bad_steps: int = 0  # skipped for a non-finite loss or gradient, in total
    best_error_rate: float = math.inf
    best_valid_loss: float = math.inf  # breaks ties between equal error rates
    history: list = field(default_factory=list)


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _lookup(cfg: dict, dotted: str):
    for key in dotted.split("."):
        cfg = cfg[key]
    return cfg


def _lr_lambda(optim: dict, total_steps: int):
    """Linear warmup, then constant or cosine decay to ``final_lr_scale``."""
    warmup, final = optim["warmup_steps"], optim["final_lr_scale"]
    if optim["scheduler"] not in ("constant", "cosine"):
        raise ValueError(f"optim.scheduler must be constant or cosine, got {optim['scheduler']!r}")

    def scale(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if optim["scheduler"] == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * progress))

    return scale


def _make_optimizer(model: torch.nn.Module, optim: dict) -> torch.optim.Optimizer:
    optimizers = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if optim["name"] not in optimizers:
        raise ValueError(f"optim.name must be one of {sorted(optimizers)}, got {optim['name']!r}")
    return optimizers[optim["name"]](model.parameters(), lr=optim["lr"], weight_decay=optim["weight_decay"])


class Trainer:
    """One experiment: built from a resolved config (plain dict) and its directory."""

    def __init__(self, cfg: dict, exp_dir: str | Path):
        self.cfg = cfg
        self.exp_dir = Path(exp_dir)
        trainer = cfg["trainer"]
        if trainer["num_threads"] > 0:
            torch.set_num_threads(trainer["num_threads"])
        torch.manual_seed(trainer["seed"])
        self.device = select_device(trainer["device"])
        self._prepare_exp_dir()
        self.vocab = Vocabulary.load(self.exp_dir / "vocab.txt")
        cmvn = load_cmvn(self.exp_dir / "cmvn.json")
        self.model = build_model(cfg["encoder"], cfg["decoder"], cfg["loss"],
                                 input_dim=cmvn[0].numel(), vocab_size=len(self.vocab)).to(self.device)
        data = cfg["data"]
        self.train_set, self.valid_set = (
            AsrDataset(Path(data["manifest_dir"]) / f"{split}.jsonl", Path(data["feature_dir"]) / split,
                       self.vocab, data["units"], cmvn, check=self.model.check_utterance)
            for split in (data["train_split"], data["valid_split"]))
        if len(self.train_set) == 0:
            raise RuntimeError(f"no usable training utterances in {data['manifest_dir']}")
        self.sampler = BucketBatchSampler(self.train_set.num_frames, data["max_frames"], data["max_utts"],
                                          shuffle=True, seed=trainer["seed"])
        self.steps_per_epoch = len(self.sampler)
        self.optimizer = _make_optimizer(self.model, cfg["optim"])
        total = self.steps_per_epoch * trainer["max_epochs"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(cfg["optim"], total))
        self.state = TrainState()
        self.num_params = sum(p.numel() for p in self.model.parameters())

    def _prepare_exp_dir(self) -> None:
        """Copy the vocabulary and CMVN statistics in, so the directory stands alone."""
        data = self.cfg["data"]
        (self.exp_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        for src, dst in ((data["vocab"], "vocab.txt"), (Path(data["feature_dir"]) / "cmvn.json", "cmvn.json")):
            if not (self.exp_dir / dst).exists():
                if not Path(src).is_file():
                    raise FileNotFoundError(f"{src} not found (data.{'vocab' if dst == 'vocab.txt' else 'feature_dir'})")
                shutil.copyfile(src, self.exp_dir / dst)
        write_json(self.exp_dir / "config.json", self.cfg)

    # --- checkpoints -------------------------------------------------------------------
    def _checkpoint(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "state": asdict(self.state),
                "rng": rng_state(), "config": self.cfg}

    def save(self, name: str = "last") -> None:
        save_checkpoint(self.exp_dir / "checkpoints" / f"{name}.pt", self._checkpoint())

    def resume(self) -> bool:
        """Restore ``checkpoints/last.pt`` if present; refuse a changed model config."""
        path = self.exp_dir / "checkpoints" / "last.pt"
        if not path.is_file():
            return False
        ckpt = load_checkpoint(path, self.device)
        changed = [k for k in MODEL_KEYS if _lookup(ckpt["config"], k) != _lookup(self.cfg, k)]
        if changed:
            raise ValueError(f"{self.exp_dir} holds a run with different {changed}; "
                             "use a new exp_dir or restore those settings")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.state = TrainState(**ckpt["state"])
        set_rng_state(ckpt["rng"])
        log.info("resumed from %s at epoch %d, batch %d, step %d", path, self.state.epoch + 1,
                 self.state.batch_in_epoch, self.state.step)
        return True

    # --- steps -------------------------------------------------------------------------
    def _loss(self, batch: Batch) -> LossOutput:
        return self.model.loss(batch.feats, batch.feat_lens, batch.targets, batch.target_lens)

    def _step(self, batch: Batch) -> tuple[float, float, dict] | None:
        """One optimizer step; ``(summed nll, grad norm, stats)``, or None when it was skipped."""
        self.model.train()
        out = self._loss(batch)
        bad = ~torch.isfinite(out.loss)
        if bad.any():
            ids = [i for i, b in zip(batch.ids, bad.tolist()) if b]
            log.warning("step %d: non-finite loss for %s; skipping the step", self.state.step, ids)
            return None
        loss = out.loss.sum() / batch.target_lens.sum()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip = self.cfg["optim"]["grad_clip"]
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else math.inf)
        if not torch.isfinite(norm):
            log.warning("step %d: non-finite gradient (batch %s...); skipping the step",
                        self.state.step, batch.ids[:3])
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.optimizer.step()
        self.scheduler.step()
        return float(out.nll.sum()), float(norm), out.stats

    @torch.no_grad()
    def validate(self) -> dict:
        """Per-token loss and greedy error rate on the validation split."""
        self.model.eval()
        nll, tokens, refs, hyps = 0.0, 0, [], []
        sampler = BucketBatchSampler(self.valid_set.num_frames, self.cfg["data"]["max_frames"], shuffle=False)
        for indices in sampler:
            batch = collate([self.valid_set[i] for i in indices]).to(self.device)
            nll += float(self._loss(batch).nll.sum())
            tokens += int(batch.target_lens.sum())
            hyps += self.model.greedy_decode(batch.feats, batch.feat_lens)
            refs += [y[:n].tolist() for y, n in zip(batch.targets, batch.target_lens.tolist())]
        counts = error_counts([self.vocab.decode(r) for r in refs], [self.vocab.decode(h) for h in hyps])
        return {"valid_loss": nll / max(tokens, 1), "valid_error_rate": counts["error_rate"]}

    # --- the loop ----------------------------------------------------------------------
    def fit(self) -> None:
        trainer = self.cfg["trainer"]
        self.resume()
        if self.state.epoch >= trainer["max_epochs"]:
            log.info("training complete (%d epochs); nothing to do", self.state.epoch)
            return
        log.info("model: %.2fM parameters; %d training utterances in %d batches per epoch; device %s",
                 self.num_params / 1e6, len(self.train_set), self.steps_per_epoch, self.device)
        writer = SummaryWriter(self.exp_dir / "tensorboard", purge_step=self.state.step)
        try:
            while self.state.epoch < trainer["max_epochs"]:
                self._run_epoch(writer)
        finally:
            writer.close()
        log.info("training complete: best validation error rate %.2f%%", self.state.best_error_rate)

    def _run_epoch(self, writer: SummaryWriter) -> None:
        trainer, state = self.cfg["trainer"], self.state
        self.sampler.set_epoch(state.epoch)
        batches = self.sampler.batches()[state.batch_in_epoch:]
        # A generator of its own: iterating a DataLoader draws a base seed, which must not come
        # from the global RNG, or a resumed epoch would draw once more than the original did.
        loader_rng = torch.Generator().manual_seed(self.cfg["trainer"]["seed"] * 1000 + state.epoch)
        loader = torch.utils.data.DataLoader(self.train_set, batch_sampler=batches, collate_fn=collate,
                                             num_workers=self.cfg["data"]["num_workers"], generator=loader_rng)
        bar = tqdm(total=self.steps_per_epoch, initial=state.batch_in_epoch, desc=f"epoch {state.epoch + 1}",
                   disable=not (trainer["progress_bar"] and sys.stderr.isatty()), leave=False)
        start = last_save = time.monotonic()
        bad_in_a_row = 0
        for batch in loader:
            result = self._step(batch.to(self.device))
            state.batch_in_epoch += 1
            bar.update()
            if result is None:
                state.bad_steps += 1
                bad_in_a_row += 1
                if bad_in_a_row >= MAX_BAD_STEPS_IN_A_ROW:
                    self.save()
                    raise RuntimeError(f"{bad_in_a_row} steps in a row had a non-finite loss or gradient; "
                                       f"stopping (last checkpoint: {self.exp_dir / 'checkpoints/last.pt'})")
                continue
            bad_in_a_row = 0
            state.step += 1
            state.epoch_nll += result[0]
            state.epoch_tokens += int(batch.target_lens.sum())
            if state.step % trainer["log_every"] == 0:
                self._log_progress(writer, result, start)
            if time.monotonic() - last_save > 60 * trainer["checkpoint_minutes"]:
                self.save()
                last_save = time.monotonic()
        bar.close()
        self._end_epoch(writer, time.monotonic() - start)

    def _log_progress(self, writer: SummaryWriter, result: tuple[float, float, dict], start: float) -> None:
        state = self.state
        loss = state.epoch_nll / max(state.epoch_tokens, 1)
        lr = self.scheduler.get_last_lr()[0]
        writer.add_scalar("train/loss", loss, state.step)
        writer.add_scalar("train/grad_norm", result[1], state.step)
        writer.add_scalar("train/lr", lr, state.step)
        for key, value in result[2].items():  # e.g. the CB emission rate against L / T
            writer.add_scalar(f"train/{key}", value, state.step)
        log.info("epoch %d batch %d/%d step %d: loss %.4f lr %.2e grad-norm %.2f (%.0f s)", state.epoch + 1,
                 state.batch_in_epoch, self.steps_per_epoch, state.step, loss, lr, result[1],
                 time.monotonic() - start)

    def _end_epoch(self, writer: SummaryWriter, seconds: float) -> None:
        state = self.state
        metrics = {"epoch": state.epoch + 1, "step": state.step,
                   "train_loss": state.epoch_nll / max(state.epoch_tokens, 1),
                   "lr": self.scheduler.get_last_lr()[0], "seconds": round(seconds, 1), **self.validate()}
        for key in ("train_loss", "valid_loss", "valid_error_rate"):
            writer.add_scalar(f"epoch/{key}", metrics[key], state.epoch + 1)
        log.info("epoch %d done in %.0f s: train loss %.4f, valid loss %.4f, valid error rate %.2f%%",
                 state.epoch + 1, seconds, metrics["train_loss"], metrics["valid_loss"],
                 metrics["valid_error_rate"])
        improved = (metrics["valid_error_rate"], metrics["valid_loss"]) < (state.best_error_rate,
                                                                            state.best_valid_loss)
        if improved:
            state.best_error_rate, state.best_valid_loss = metrics["valid_error_rate"], metrics["valid_loss"]
        state.history.append(metrics)
        state.epoch += 1
        state.batch_in_epoch, state.epoch_nll, state.epoch_tokens = 0, 0.0, 0
        self.save()
        if improved:
            self.save("best")
        write_json(self.exp_dir / "history.json", state.history)
        plot_history(state.history, self.exp_dir / "training_curves.png")


def plot_history(history: list[dict], path: Path) -> None:
    """Training and validation loss and validation error rate per epoch, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, (ax_loss, ax_err) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax_loss.plot(epochs, [h["train_loss"] for h in history], "o-", label="train")
    ax_loss.plot(epochs, [h["valid_loss"] for h in history], "s-", label="valid")
    ax_loss.set(xlabel="epoch", ylabel="loss per token", yscale="log")
    ax_loss.legend()
    ax_err.plot(epochs, [h["valid_error_rate"] for h in history], "s-", color="C1")
    ax_err.set(xlabel="epoch", ylabel="valid error rate (%)")
    ax_err.grid(alpha=0.3)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)


def train(cfg: dict, exp_dir: str | Path) -> Trainer:
    """Train (or resume) the experiment in ``exp_dir`` described by ``cfg``."""
    trainer = Trainer(cfg, exp_dir)
    trainer.fit()
    return trainer
