"""Structured configs: every YAML file in ``conf/`` is a preset of one of these dataclasses.

Hydra checks overrides against them when the config is composed, so a misspelt key or a
value of the wrong type fails at start, not an hour into training. Only entry points
import this module; modules take plain keyword arguments.
"""

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

__all__ = [
    "RNNEncoderConfig", "PointwiseDecoderConfig", "CTCLossConfig", "DataConfig",
    "OptimConfig", "TrainerConfig", "TrainConfig", "register_configs",
]


@dataclass
class RNNEncoderConfig:
    """:class:`cbasr.modules.encoders.RNNEncoder`."""

    name: str = "rnn"
    hidden: int = 128
    num_layers: int = 2
    bidirectional: bool = True
    rnn_type: str = "lstm"  # lstm | gru
    dropout: float = 0.1
    subsampling: str = "stack"  # none | stack | conv
    stack: int = 3
    stride: int = 3


@dataclass
class PointwiseDecoderConfig:
    """:class:`cbasr.modules.decoders.PointwiseDecoder`."""

    name: str = "pointwise"
    hidden: int = 0
    dropout: float = 0.0


@dataclass
class CTCLossConfig:
    name: str = "ctc"


@dataclass
class DataConfig:
    """Where a corpus's prepared data lives (paths relative to the working directory)."""

    manifest_dir: str = MISSING  # holds <split>.jsonl
    feature_dir: str = MISSING  # holds <split>/ feature directories and cmvn.json
    vocab: str = MISSING  # token list, blank first
    units: str = "phones"  # manifest field used as targets: phones | phones_full | chars | words
    train_split: str = "train"
    valid_split: str = "dev"
    max_frames: int = 6000  # padded input frames per batch
    max_utts: int = 0  # utterances per batch (0: no limit)
    num_workers: int = 0  # data loader worker processes


@dataclass
class OptimConfig:
    name: str = "adam"  # adam | adamw
    lr: float = 1e-3
    weight_decay: float = 0.0
    grad_clip: float = 5.0  # max gradient norm (0: no clipping)
    scheduler: str = "cosine"  # constant | cosine
    warmup_steps: int = 0
    final_lr_scale: float = 0.02  # cosine decays to lr * final_lr_scale


@dataclass
class TrainerConfig:
    max_epochs: int = 10
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    num_threads: int = 0  # torch intra-op threads on CPU (0: torch's default)
    checkpoint_minutes: float = 5.0  # also checkpoint mid-epoch this often
    log_every: int = 50  # steps between progress log lines
    progress_bar: bool = True  # tqdm bar when stderr is a terminal


@dataclass
class TrainConfig:
    encoder: Any = MISSING
    decoder: Any = MISSING
    loss: Any = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    trainer: TrainerConfig = MISSING
    exp_dir: str = MISSING


def register_configs() -> None:
    """Register every schema with Hydra's ConfigStore under ``<group>/<name>_schema``."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(group="encoder", name="rnn_schema", node=RNNEncoderConfig)
    cs.store(group="decoder", name="pointwise_schema", node=PointwiseDecoderConfig)
    cs.store(group="loss", name="ctc_schema", node=CTCLossConfig)
    cs.store(group="data", name="data_schema", node=DataConfig)
    cs.store(group="optim", name="optim_schema", node=OptimConfig)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)


