"""Structured configs of ``cbasr-train-lm``: every YAML file under ``conf/lm/`` and
``conf/train_lm.yaml`` is a preset of one of these dataclasses, checked when the config is
composed (a misspelt key fails at start). The LM task and :func:`cbasr.lm.neural.build_lm` read
their groups as these types (:func:`cbasr.config.typed`).
"""

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from cbasr.config.schema import OptimConfig, TrainerConfig, positive

__all__ = [
    "LSTMLMConfig",
    "LMDataConfig",
    "TrainLMConfig",
    "register_lm_configs",
]


@dataclass
class LSTMLMConfig:
    """:class:`cbasr.modules.language_model.LSTMLanguageModel`."""

    name: str = "lstm"
    embed_dim: int = 64
    hidden: int = 256
    num_layers: int = 2
    dropout: float = 0.1


@dataclass
class LMDataConfig:
    """Training text: ``*.jsonl`` manifests (their ``units`` field) or text files, one sentence
    per line: words spelled in ``units`` for ``chars`` and ``sp:<model>``, else
    whitespace-separated tokens. The training set is read through token-id shards
    (:mod:`cbasr.lm.shards`), the validation set in memory."""

    train: str = MISSING
    valid: str = MISSING
    vocab: str = MISSING  # the recogniser's token list (blank first: the LM's sentence boundary)
    units: str = "phones"  # phones | phones_full | chars | words | sp:<sentencepiece model>
    max_tokens: int = 4000  # padded tokens per batch
    # the training text is tokenised once into shards of this many tokens (<exp_dir>/shards/)
    # and read one shard at a time: memory stays at about one shard, whatever the text's size
    shard_tokens: int = 10_000_000

    def __post_init__(self):
        positive("data.max_tokens", self.max_tokens)
        positive("data.shard_tokens", self.shard_tokens)


@dataclass
class TrainLMConfig:
    lm: Any = MISSING
    data: LMDataConfig = field(default_factory=LMDataConfig)
    # the acoustic trainer's groups: one training loop drives both (conf/train_lm.yaml sets
    # the LM's constant learning rate, clipping and best metric)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    exp_dir: str = MISSING


def register_lm_configs() -> None:
    """Register the schemas with Hydra's ConfigStore (``train_lm_schema``, ``lm/lstm_schema``)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="train_lm_schema", node=TrainLMConfig)
    cs.store(group="lm", name="lstm_schema", node=LSTMLMConfig)
