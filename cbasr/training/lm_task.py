"""Token language model training (``cbasr-train-lm``) as a task of the shared loop.

Layout of an LM experiment directory: the shared loop's (``config.json``, ``checkpoints/``
with ``epoch-<N>.pt``, ``last.pt`` and ``best.pt``, ``history.json``, ``training_curves.png``,
``tensorboard/``), plus ``vocab.txt``, ``skipped.tsv`` (sentences with unknown tokens) and
``shards/``: the training text's token ids, built once and read one shard at a time
(:mod:`cbasr.lm.shards`), so that a text larger than memory trains in about one shard's
memory.
The loss is the negative log probability per predicted token, the end of sentence counted
(:func:`cbasr.lm.neural.perplexity`); ``best.pt`` is the epoch of the lowest validation
perplexity. Rerunning the same command resumes, mid-epoch included; a different model config
or vocabulary in the same directory is refused.
"""

import logging
import math
from collections.abc import Iterator
from pathlib import Path

import torch

from cbasr.config import plain, typed
from cbasr.config.lm_schema import LMDataConfig, LSTMLMConfig, TrainLMConfig
from cbasr.config.upgrade import today_s_keys
from cbasr.data.vocab import Vocabulary
from cbasr.lm.corpus import read_sentences
from cbasr.lm.neural import build_lm, lm_config, pad_sentences, perplexity
from cbasr.lm.shards import EpochPlan, ShardBatch, build_shards, sentences_of
from cbasr.storage.files import atomic_write, write_json
from cbasr.training import distributed
from cbasr.training.task import TaskOutput
from cbasr.training.trainer import Trainer

__all__ = ["LmTask", "lm_trainer", "train_lm"]

log = logging.getLogger(__name__)


class LmTask:
    """An LSTM token LM (``cfg.lm``) on the sentences of ``cfg.data``.

    Args:
        cfg: the ``cbasr-train-lm`` config, typed.
        exp_dir: the experiment directory.
    """

    metrics = ("valid_loss",)
    unit = "tokens"

    def __init__(self, cfg: TrainLMConfig, exp_dir: str | Path):
        self.cfg, self.exp_dir = cfg, Path(exp_dir)
        self.lm: LSTMLMConfig = lm_config(cfg.lm)
        self.data: LMDataConfig = cfg.data
        self.seed = cfg.trainer.seed
        data = self.data
        self.vocab = Vocabulary.load(data.vocab)
        self.train_set = build_shards(
            data.train, self.vocab, data.units, self.exp_dir / "shards", data.shard_tokens
        )
        self.valid_set, self.skipped_valid = read_sentences(data.valid, self.vocab, data.units)
        if not len(self.train_set):
            raise ValueError(
                f"{data.train}: no usable sentence (see {self.exp_dir / 'shards/skipped.tsv'})"
            )
        if not self.valid_set:
            raise ValueError(f"{data.valid}: no usable sentence")
        if self.train_set.skipped or self.skipped_valid:
            log.warning(
                "skipped %d training and %d validation sentences (see %s)",
                self.train_set.skipped,
                len(self.skipped_valid),
                self.exp_dir / "skipped.tsv",
            )
        self.device = torch.device("cpu")

    def prepare(self, exp_dir: Path) -> None:
        def write_skipped(f):  # the training text's (streamed from the shards'), then dev's
            with open(self.train_set.directory / "skipped.tsv", encoding="utf-8") as train:
                for line in train:
                    f.write(line)
            f.writelines(line + "\n" for line in self.skipped_valid)

        atomic_write(exp_dir / "skipped.tsv", write_skipped)
        write_json(exp_dir / "config.json", plain(self.cfg))
        self.vocab.save(exp_dir / "vocab.txt")

    def build_model(self, device: torch.device) -> torch.nn.Module:
        self.device = device
        return build_lm(self.lm, len(self.vocab)).to(device)

    def build_data(self, dist: distributed.DistContext) -> None:
        if dist.enabled:
            raise ValueError("cbasr-train-lm trains in one process: run it without torchrun")
        self._counts = self.train_set.batch_counts(self.data.max_tokens)
        self._steps = sum(self._counts)

    @property
    def steps_per_epoch(self) -> int:
        return self._steps

    def describe(self) -> str:
        return f"{len(self.train_set)} training and {len(self.valid_set)} validation sentences"

    def epoch_batches(self, epoch: int) -> EpochPlan:
        """Shards in an order drawn from the seed, batches shuffled within each shard."""
        seed = self.seed * 1000 + epoch + 1
        return EpochPlan(self.train_set, self.data.max_tokens, seed, self._counts)

    def batch_size(self, batch: ShardBatch) -> tuple[int, int]:
        return batch.tokens, batch.tokens  # the end of each sentence predicted too

    def loader(
        self, batches: EpochPlan, dist: distributed.DistContext, generator: torch.Generator
    ) -> Iterator[tuple[list[str], torch.Tensor, torch.Tensor]]:
        for batch, sentences in zip(batches, sentences_of(self.train_set, batches)):
            targets, lens = pad_sentences(sentences, self.device)
            names = [f"shard {batch.shard} sentence {i + 1}" for i in batch.indices]
            yield names, targets, lens

    def forward(self, model: torch.nn.Module, batch) -> TaskOutput:
        names, targets, lens = batch
        nll = -model.sequence_log_probs(targets, lens)  # (B,)
        return TaskOutput(nll, nll.detach(), names)

    def validate(self, model: torch.nn.Module, autocast) -> dict:
        with autocast():
            ppl = perplexity(model, self.valid_set, self.data.max_tokens, self.device)
        return {"valid_loss": math.log(ppl), "valid_ppl": ppl}

    def epoch_metrics(self, metrics: dict) -> dict:
        return {"train_ppl": math.exp(metrics["train_loss"])}

    def checkpoint_extras(self) -> dict:
        """What :func:`cbasr.lm.neural.load_lm_checkpoint` builds the LM from."""
        config = plain(self.cfg)
        return {"config": config, "lm_config": config["lm"], "tokens": self.vocab.tokens}

    def upgrade(self, ckpt: dict) -> dict:
        """A checkpoint of the first LM trainer (epoch and history, no loop state): resume
        after its epoch, with the schedule's state afresh (its learning rate was constant)."""
        if "state" in ckpt:
            return ckpt
        history = [  # its rows gain the losses the loop reports (log perplexities)
            {**h, "train_loss": math.log(h["train_ppl"]), "valid_loss": math.log(h["valid_ppl"])}
            for h in ckpt["history"]
        ]
        state = {"epoch": ckpt["epoch"], "history": history}
        if history:
            best = min(history, key=lambda h: h["valid_ppl"])
            state.update(
                best_epoch=best["epoch"],
                best_metrics={"valid_loss": math.log(best["valid_ppl"])},
                best_score=[math.log(best["valid_ppl"])],
            )
        return {**ckpt, "state": state, "scheduler": None}

    def check_resumed(self, ckpt: dict) -> None:
        if lm_config(ckpt["lm_config"]) != self.lm:
            raise ValueError(
                f"{self.exp_dir} holds a language model with config {ckpt['lm_config']}, "
                f"not {plain(self.cfg)['lm']}: use another exp_dir"
            )
        if ckpt["tokens"] != self.vocab.tokens:
            raise ValueError(
                f"{self.exp_dir} was trained with another vocabulary than {self.data.vocab}"
            )

    def start_new_run(self, model: torch.nn.Module) -> None:
        pass


def lm_trainer(cfg: TrainLMConfig | dict, exp_dir: str | Path | None = None) -> Trainer:
    """The loop on the language model of ``cfg`` in ``exp_dir`` (default ``cfg.exp_dir``);
    a plain ``cfg`` (from Python, or an old ``config.json``) is typed here."""
    if not isinstance(cfg, TrainLMConfig):
        cfg = typed(TrainLMConfig, today_s_keys(cfg), "")
    exp_dir = Path(exp_dir if exp_dir is not None else cfg.exp_dir)
    return Trainer(LmTask(cfg, exp_dir), cfg.trainer, cfg.optim, exp_dir)


def train_lm(cfg: TrainLMConfig | dict, exp_dir: str | Path | None = None) -> list[dict]:
    """Train (or resume) the LM of ``cfg`` (``conf/train_lm.yaml`` composed and typed) in
    ``exp_dir`` (default ``cfg.exp_dir``).

    Returns:
        The history: per epoch the shared loop's entries (``train_loss``, ``valid_loss`` in
        nats per token, ...) and ``train_ppl``, ``valid_ppl``.
    """
    trainer = lm_trainer(cfg, exp_dir)
    trainer.fit()
    return trainer.state.history
