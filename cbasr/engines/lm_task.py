"""Token language model training (``cbasr-train-lm``) as a task of the shared loop.

Layout of an LM experiment directory: the shared loop's (``config.json``, ``checkpoints/``
with ``epoch-<N>.pt``, ``last.pt`` and ``best.pt``, ``history.json``, ``training_curves.png``,
``tensorboard/``), plus ``vocab.txt`` and ``skipped.tsv`` (sentences with unknown tokens).
The loss is the negative log probability per predicted token, the end of sentence counted
(:func:`cbasr.lm.neural.perplexity`); ``best.pt`` is the epoch of the lowest validation
perplexity. Rerunning the same command resumes, mid-epoch included; a different model config
or vocabulary in the same directory is refused.
"""

import logging
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from cbasr.config import typed
from cbasr.config.lm_schema import LMDataConfig, LSTMLMConfig
from cbasr.config.schema import TrainerConfig
from cbasr.data.batching import shard
from cbasr.data.vocab import Vocabulary
from cbasr.engines import distributed
from cbasr.engines.task import TaskOutput
from cbasr.engines.trainer import Trainer
from cbasr.lm.corpus import read_sentences
from cbasr.lm.neural import build_lm, lm_config, pad_sentences, perplexity, token_batches
from cbasr.storage.files import write_json, write_text

__all__ = ["LmTask", "train_lm"]

log = logging.getLogger(__name__)


class LmTask:
    """An LSTM token LM (``cfg['lm']``) on the sentences of ``cfg['data']``.

    Args:
        cfg: the resolved ``cbasr-train-lm`` config (plain dict).
        exp_dir: the experiment directory.
    """

    metrics = ("valid_loss",)
    unit = "tokens"

    def __init__(self, cfg: dict, exp_dir: str | Path):
        self.cfg, self.exp_dir = cfg, Path(exp_dir)
        # Typed at the door: a bad entry fails here, naming it, before any text is read.
        self.lm: LSTMLMConfig = lm_config(cfg["lm"])
        self.data: LMDataConfig = typed(LMDataConfig, cfg["data"], "data")
        self.seed = typed(TrainerConfig, cfg["trainer"], "trainer").seed
        data = self.data
        self.vocab = Vocabulary.load(data.vocab)
        self.train_set, skipped = read_sentences(data.train, self.vocab, data.units)
        self.valid_set, skipped_valid = read_sentences(data.valid, self.vocab, data.units)
        self.skipped = skipped + skipped_valid
        if not self.train_set:
            raise ValueError(
                f"{data.train}: no usable sentence (see {self.exp_dir / 'skipped.tsv'})"
            )
        if not self.valid_set:
            raise ValueError(f"{data.valid}: no usable sentence")
        if skipped or skipped_valid:
            log.warning(
                "skipped %d training and %d validation sentences (see %s)",
                len(skipped),
                len(skipped_valid),
                self.exp_dir / "skipped.tsv",
            )
        self.device = torch.device("cpu")

    def prepare(self, exp_dir: Path) -> None:
        write_text(exp_dir / "skipped.tsv", "".join(line + "\n" for line in self.skipped))
        write_json(exp_dir / "config.json", self.cfg)
        self.vocab.save(exp_dir / "vocab.txt")

    def build_model(self, device: torch.device) -> torch.nn.Module:
        self.device = device
        return build_lm(self.lm, len(self.vocab)).to(device)

    def build_data(self, dist: distributed.DistContext) -> None:
        if dist.enabled:
            raise ValueError("cbasr-train-lm trains in one process: run it without torchrun")
        self._steps = len(token_batches(self.train_set, self.data.max_tokens))

    @property
    def steps_per_epoch(self) -> int:
        return self._steps

    def describe(self) -> str:
        return f"{len(self.train_set)} training and {len(self.valid_set)} validation sentences"

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        seed = self.seed * 1000 + epoch + 1  # the seeds of the first LM trainer
        return token_batches(self.train_set, self.data.max_tokens, seed=seed)

    def batch_size(self, batch: Sequence[int]) -> tuple[int, int]:
        predicted = sum(len(self.train_set[i]) + 1 for i in batch)  # the end of sentence too
        return predicted, predicted

    def loader(
        self, batches: list[list[int]], dist: distributed.DistContext, generator: torch.Generator
    ) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
        for batch in batches:
            indices = shard(batch, dist.rank, dist.world_size)
            targets, lens = pad_sentences([self.train_set[i] for i in indices], self.device)
            yield indices, targets, lens

    def forward(self, model: torch.nn.Module, batch) -> TaskOutput:
        indices, targets, lens = batch
        nll = -model.sequence_log_probs(targets, lens)  # (B,)
        return TaskOutput(nll, nll.detach(), [f"sentence {i + 1}" for i in indices])

    def validate(self, model: torch.nn.Module, autocast) -> dict:
        with autocast():
            ppl = perplexity(model, self.valid_set, self.data.max_tokens, self.device)
        return {"valid_loss": math.log(ppl), "valid_ppl": ppl}

    def epoch_metrics(self, metrics: dict) -> dict:
        return {"train_ppl": math.exp(metrics["train_loss"])}

    def checkpoint_extras(self) -> dict:
        """What :func:`cbasr.lm.neural.load_lm_checkpoint` builds the LM from."""
        return {"lm_config": self.cfg["lm"], "tokens": self.vocab.tokens}

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
                best_valid_loss=math.log(best["valid_ppl"]),
                best_score=[math.log(best["valid_ppl"])],
            )
        return {**ckpt, "state": state, "scheduler": None}

    def check_resumed(self, ckpt: dict) -> None:
        if lm_config(ckpt["lm_config"]) != self.lm:
            raise ValueError(
                f"{self.exp_dir} holds a language model with config {ckpt['lm_config']}, "
                f"not {self.cfg['lm']}: use another exp_dir"
            )
        if ckpt["tokens"] != self.vocab.tokens:
            raise ValueError(
                f"{self.exp_dir} was trained with another vocabulary than {self.data.vocab}"
            )

    def start_new_run(self, model: torch.nn.Module) -> None:
        pass


def train_lm(cfg: dict, exp_dir: str | Path) -> list[dict]:
    """Train (or resume) the LM of ``cfg`` (a resolved ``conf/train_lm.yaml``) in ``exp_dir``.

    Returns:
        The history: per epoch the shared loop's entries (``train_loss``, ``valid_loss`` in
        nats per token, ...) and ``train_ppl``, ``valid_ppl``.
    """
    trainer = Trainer(cfg, exp_dir, task=LmTask(cfg, exp_dir))
    trainer.fit()
    return trainer.state.history
