"""Structured configs: every YAML file in ``conf/`` is a preset of one of these dataclasses.

Hydra checks overrides against them when the config is composed, so a misspelt key, a value
of the wrong type or a choice outside its set (an ``Enum`` field: ``loss.estimator=idbb`` fails
naming ``auto, global, idb, bb, mbb``) fails at start, not an hour into training; a value its
type allows but the option does not (``loss.align_restrict_left=-1``) fails in the schema's
``__post_init__`` when the composed config is typed, naming the option. The entry points hand
the composed config on with each choice as its plain string value.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import MISSING

__all__ = [
    "choice",
    "at_least",
    "positive",
    "TDT_DURATIONS",
    "RNNEncoderConfig",
    "ConformerEncoderConfig",
    "PointwiseDecoderConfig",
    "LabelContextConfig",
    "AutoregressiveDecoderConfig",
    "MonotonicDecoderConfig",
    "AttentionEmissionDecoderConfig",
    "TransducerDecoderConfig",
    "CTCLossConfig",
    "CBMarginalLossConfig",
    "CBReinforceLossConfig",
    "CBMonteCarloLossConfig",
    "ForcedSuffixLossConfig",
    "TransducerLossConfig",
    "SpecAugmentConfig",
    "DataConfig",
    "OptimConfig",
    "TrainerConfig",
    "TrainConfig",
    "register_configs",
]


class _Choice(str, Enum):
    """A string-valued choice that prints as its value (``f"{Precision.fp16}"`` is ``fp16``)."""

    def __str__(self) -> str:
        return str(self.value)


def choice(name: str, *values: str) -> type[Enum]:
    """An ``Enum`` whose member names are its values: OmegaConf matches an override by name, so
    ``optim.name=adamw`` selects ``adamw`` and anything else fails with the list of names. Its
    members are strings (``Precision.fp16 == "fp16"``), so code that reads a typed config
    and code that reads its plain form (``config.json``) compare them alike."""
    return _Choice(name, [(value, value) for value in values], module=__name__, qualname=name)


def at_least(key: str, value: float, low: float) -> None:
    """Raise ``ValueError`` naming ``key`` unless ``value >= low`` (NaN fails)."""
    if not value >= low:
        raise ValueError(f"{key} must be >= {low}, got {value}")


def positive(key: str, value: float) -> None:
    """Raise ``ValueError`` naming ``key`` unless ``value > 0`` (NaN fails)."""
    if not value > 0:
        raise ValueError(f"{key} must be > 0, got {value}")


def _check_front_end(config) -> None:
    """An encoder config's frame stacking: ``stack`` and ``stride`` at least 1 (whatever the
    subsampling: ``subsampling=stack`` reads them)."""
    at_least("encoder.stack", config.stack, 1)
    at_least("encoder.stride", config.stride, 1)


def _check_samples(config) -> None:
    """A sampled loss's ``num_samples``: at least 1, and 2 with the leave-one-out baseline (the
    other samples' mean is each sample's baseline)."""
    at_least("loss.num_samples", config.num_samples, 1)
    if config.baseline == "loo" and config.num_samples < 2:
        raise ValueError(
            f"loss.num_samples must be >= 2 with loss.baseline=loo (leave one out), got "
            f"{config.num_samples}"
        )


RnnType = choice("RnnType", "lstm", "gru")
Subsampling = choice("Subsampling", "none", "stack", "conv", "embed")
ChunkConv = choice("ChunkConv", "causal", "chunk")
Emission = choice("Emission", "encoder", "decoder")
Joint = choice("Joint", "rnnt", "hat", "tdt")
BlankJoint = choice("BlankJoint", "tanh", "linear")
Topology = choice("Topology", "standard", "monotonic")
GreedyRule = choice("GreedyRule", "label", "emission")
Estimator = choice("Estimator", "auto", "global", "idb", "bb", "mbb")
Baseline = choice("Baseline", "none", "loo", "running_mean")
Features = choice("Features", "cached", "on_the_fly")
MeanNorm = choice("MeanNorm", "train", "utterance")
Optimizer = choice("Optimizer", "adam", "adamw", "sgd")
Scheduler = choice("Scheduler", "constant", "cosine", "linear", "noam")
Precision = choice("Precision", "fp32", "bf16", "fp16")
Metric = choice("Metric", "valid_error_rate", "valid_loss")
Resume = choice("Resume", "auto", "never")


@dataclass
class RNNEncoderConfig:
    """:class:`cbasr.modules.encoders.RNNEncoder`."""

    name: str = "rnn"
    hidden: int = 128
    num_layers: int = 2
    bidirectional: bool = True  # false: a unidirectional (online) encoder
    rnn_type: RnnType = RnnType.lstm
    dropout: float = 0.1
    subsampling: Subsampling = Subsampling.stack  # embed: token ids (text input)
    stack: int = 3
    stride: int = 3
    embedding_dim: int = 256  # subsampling=embed only

    def __post_init__(self):
        _check_front_end(self)


@dataclass
class ConformerEncoderConfig:
    """:class:`cbasr.modules.encoders.ConformerEncoder` (torchaudio's Conformer layers)."""

    name: str = "conformer"
    d_model: int = 144
    num_heads: int = 4
    ffn_dim: int = 576
    num_layers: int = 4
    kernel_size: int = 15
    dropout: float = 0.1
    subsampling: Subsampling = Subsampling.conv
    stack: int = 3
    stride: int = 3
    embedding_dim: int = 256
    # streaming: self-attention within chunks of ``chunk_size`` frames and ``left_chunks``
    # chunks before them (-1: all), causal convolutions; 0: full context
    chunk_size: int = 0
    left_chunks: int = -1
    # dynamic chunk training: each training batch draws its chunk size from 1..dynamic_chunks
    # frames, or the full context (half the batches); 0: always ``chunk_size``
    dynamic_chunks: int = 0
    # the depthwise convolutions of a chunked encoder: ``causal`` (kernel_size - 1 earlier
    # frames, none later) or ``chunk`` (the full-context kernel, its right half cut at the
    # chunk's end: the look-ahead of the attention, never past the chunk)
    chunk_conv: ChunkConv = ChunkConv.causal

    def __post_init__(self):
        _check_front_end(self)
        at_least("encoder.num_heads", self.num_heads, 1)
        if self.d_model % self.num_heads:
            raise ValueError(
                f"encoder.num_heads ({self.num_heads}) must divide encoder.d_model ({self.d_model})"
            )
        if self.kernel_size % 2 == 0:
            raise ValueError(f"encoder.kernel_size must be odd, got {self.kernel_size}")
        at_least("encoder.chunk_size", self.chunk_size, 0)
        at_least("encoder.dynamic_chunks", self.dynamic_chunks, 0)
        at_least("encoder.left_chunks", self.left_chunks, -1)


@dataclass
class PointwiseDecoderConfig:
    """:class:`cbasr.modules.decoders.PointwiseDecoder` (CTC and CB)."""

    name: str = "pointwise"
    hidden: int = 0
    dropout: float = 0.0


@dataclass
class LabelContextConfig:
    """The label-history network of a decoder (``decoder.label``): a
    :class:`cbasr.modules.label_context.LabelContext`, or the autoregressive decoder's LSTM."""

    embed_dim: int = 64  # label embedding width
    hidden: int = 128  # width of the history vector g_u (LSTM units, or the window's projection)
    num_layers: int = 1  # LSTM layers (context -1)
    # -1: an LSTM over the whole history; c >= 0: the last c labels only (HAT Table 2)
    context: int = -1

    def __post_init__(self):
        if self.context < -1:
            raise ValueError(
                "decoder.label.context must be -1 (an LSTM over the whole history) or >= 0 "
                f"labels, got {self.context}"
            )


def check_full_history(label: LabelContextConfig, decoder: str) -> None:
    """A CB decoder's label history is an LSTM over every earlier label (the CB paper's
    decoders; the autoregressive one's reads the emissions too): ``label.context`` -1. The
    last-``c``-labels network is the transducers' (HAT Table 2)."""
    if label.context != -1:
        raise ValueError(
            f"decoder.label.context must be -1 for the {decoder} decoder (its LSTM reads "
            f"every earlier label), got {label.context}"
        )


@dataclass
class AttentionEmissionDecoderConfig:
    """:class:`cbasr.modules.decoders.AttentionEmissionDecoder` (Wu et al.)."""

    name: str = "attention_emission"
    label: LabelContextConfig = field(default_factory=LabelContextConfig)
    joint_dim: int = 128
    emission_hidden: int = 0
    dropout: float = 0.1  # on the label embeddings and in the joint

    def __post_init__(self):
        check_full_history(self.label, self.name)


def check_window(window: int) -> None:
    """A monotonic decoder's window: at least one frame; else a ValueError."""
    if window < 1:
        raise ValueError(f"decoder.window must be >= 1 frame, got {window}")


@dataclass
class MonotonicDecoderConfig:
    """:class:`cbasr.modules.decoders.MonotonicAttentionDecoder` (MoChA-like windows)."""

    name: str = "monotonic"
    window: int = 4  # fixed window size, or the largest gap t_l - t_(l-1) when variable
    variable: bool = False  # window from the previous emission (second-order CB)
    attention_dim: int = 64
    label: LabelContextConfig = field(default_factory=LabelContextConfig)
    joint_dim: int = 128
    emission_hidden: int = 0
    dropout: float = 0.1  # on the label embeddings and before the output layer

    def __post_init__(self):
        check_window(self.window)
        check_full_history(self.label, self.name)


@dataclass
class AutoregressiveDecoderConfig:
    """:class:`cbasr.modules.decoders.AutoregressiveDecoder` (Raffel et al.; Luo et al.):
    ``label`` is its LSTM over the emission frame's encoder state and the previous label."""

    name: str = "autoregressive"
    label: LabelContextConfig = field(default_factory=LabelContextConfig)
    emission: Emission = Emission.encoder  # decoder: Luo et al.'s autoregressive emissions
    emission_hidden: int = 64
    dropout: float = 0.1  # on the label embeddings and before the output layer

    def __post_init__(self):
        check_full_history(self.label, self.name)


TDT_DURATIONS = (0, 1, 2, 3, 4)  # as NeMo's Parakeet-TDT models


def check_durations(durations, key: str = "decoder.durations") -> tuple[int, ...]:
    """``durations`` as a tuple, or a ValueError naming ``key``: distinct non-negative integers
    in increasing order that include 1 (so that blanks can reach every frame)."""
    values = tuple(durations)
    if not values or any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in values):
        raise ValueError(f"{key} must be non-negative integers, got {list(values)}")
    if list(values) != sorted(set(values)):
        raise ValueError(f"{key} must be distinct and increasing, got {list(values)}")
    if 1 not in values:
        raise ValueError(f"{key} must include 1, got {list(values)}")
    return values


def check_history_shares(history_noise: float, history_repeat: float) -> None:
    """A transducer decoder's history_noise and history_repeat: each in [0, 1); else a
    ValueError naming it."""
    for key, share in (("history_noise", history_noise), ("history_repeat", history_repeat)):
        if not 0.0 <= share < 1.0:
            raise ValueError(f"decoder.{key} must be in [0, 1), got {share}")


@dataclass
class TransducerDecoderConfig:
    """:class:`cbasr.modules.decoders.TransducerDecoder` (RNN-T, HAT or TDT joint)."""

    name: str = "transducer"
    joint: Joint = Joint.rnnt
    label: LabelContextConfig = field(default_factory=LabelContextConfig)  # prediction network
    joint_dim: int = 128
    dropout: float = 0.1  # on the label embeddings and in the joint
    # HAT's blank logit: tanh (one more unit of the joint) | linear (eq. 5 read literally)
    blank_joint: BlankJoint = BlankJoint.tanh
    # training: each label the prediction network reads is replaced by a uniformly drawn label
    # with this probability, so that the joint cannot delete a repeated word by its history
    history_noise: float = 0.0
    # training: each label the prediction network reads is replaced by the label after it
    # with this probability, so that the joint reads words followed by themselves
    history_repeat: float = 0.0
    # TDT: the durations (frames) a token may cover, predicted beside it (Xu et al. 2023)
    durations: list[int] = field(default_factory=lambda: list(TDT_DURATIONS))

    def __post_init__(self):
        check_history_shares(self.history_noise, self.history_repeat)
        check_durations(self.durations)


@dataclass
class CTCLossConfig:
    name: str = "ctc"


@dataclass
class CBMarginalLossConfig:
    """Exact CB marginal, eq. (38) (second-order windowed form for a variable window)."""

    name: str = "cb_marginal"


@dataclass
class CBReinforceLossConfig:
    """REINFORCE with exact CB samples, CB paper section 2.2."""

    name: str = "cb_reinforce"
    # global (eq. 21) | idb (eq. 23) | bb (eq. 28) | mbb (eq. 29) | auto: mbb if memoryless, else idb
    estimator: Estimator = Estimator.auto
    num_samples: int = 4  # samples per utterance
    baseline: Baseline = Baseline.loo  # loo: leave one out

    def __post_init__(self):
        _check_samples(self)


@dataclass
class CBMonteCarloLossConfig:
    """The Monte Carlo marginal log P(L) + log mean_m P(y | b_m), b_m ~ P(b | L), VIMCO gradient."""

    name: str = "cb_mc"
    num_samples: int = 16  # samples per utterance, >= 2

    def __post_init__(self):
        if self.num_samples < 2:
            raise ValueError(
                "loss.num_samples must be >= 2 for cb_mc (VIMCO leaves one sample out), got "
                f"{self.num_samples}"
            )


@dataclass
class ForcedSuffixLossConfig:
    """Luo et al.'s REINFORCE with forced-suffix samples (CB paper eq. 1)."""

    name: str = "forced_suffix"
    num_samples: int = 4
    baseline: Baseline = Baseline.loo
    entropy_weight: float = 0.0  # bonus on the emission entropy

    def __post_init__(self):
        _check_samples(self)
        at_least("loss.entropy_weight", self.entropy_weight, 0)


@dataclass
class TransducerLossConfig:
    """RNN-T (torchaudio) or HAT (eq. 4); the decoder's joint must match."""

    name: str = "rnnt"  # rnnt | hat | tdt
    # standard: the RNN-T lattice, any number of labels per frame; monotonic: one label per
    # frame, a label edge advancing the frame too (Tripathi et al. 2019), so that a repeated
    # label is not confused with staying on the first one
    topology: Topology = Topology.standard
    max_symbols: int = 4  # greedy search: most labels per frame (1 for the monotonic topology)
    # greedy search: label emits the best label where it beats the blank; emission emits the
    # best label where P(not blank) > P(blank)
    greedy: GreedyRule = GreedyRule.label
    ctc_weight: float = 0.0  # an auxiliary CTC loss on the encoder with this weight (0: none)
    # 0: the whole lattice; S >= 2: train with the pruned loss (Kuang et al. 2022), the joint
    # on S label positions per frame chosen by a trivial joint; validation stays exact
    prune_range: int = 0
    simple_loss_scale: float = 0.5  # the trivial joint's loss weight when pruning
    # TDT: the logit under-normalisation sigma of Xu et al. 2023 (eqs. 15-16), in training only
    sigma: float = 0.0
    # RNN-T and HAT: FastEmit's lambda (Yu et al. 2021): the label edges' gradient scaled by
    # 1 + lambda, for earlier emissions (0: off; with prune_range, inside the windows)
    fastemit_lambda: float = 0.0
    # RNN-T and HAT over a chunked Conformer: dual-mode training (Yu et al. 2021), every batch
    # through the streaming and the full-context encoder (shared weights), both losses added;
    # distill_weight: the streaming joint distilled from the full-context one in place
    dual_mode: bool = False
    distill_weight: float = 0.0
    # HAT, the standard topology: alignment-restricted training's left buffer (Mahadeokar et
    # al. 2021), in encoder frames, >= 0: in training, no label is emitted before the frame of
    # its gold end (the manifest's phone or word times) minus this many (null: off; measured:
    # recipes/synth/RESULTS.md, "Alignment-restricted training")
    align_restrict_left: int | None = None

    def __post_init__(self):
        """The checks each value needs alone and with the others of the group, naming the key."""
        at_least("loss.max_symbols", self.max_symbols, 1)
        if self.prune_range == 1 or self.prune_range < 0:
            raise ValueError(
                f"loss.prune_range must be 0 (no pruning) or >= 2, got {self.prune_range}"
            )
        for key in (
            "simple_loss_scale",
            "ctc_weight",
            "sigma",
            "fastemit_lambda",
            "distill_weight",
        ):
            at_least(f"loss.{key}", getattr(self, key), 0)
        if self.name == "tdt" and self.fastemit_lambda:
            raise ValueError("loss.fastemit_lambda applies to the rnnt and hat losses, not to tdt")
        if self.name == "tdt" and self.topology != "standard":
            raise ValueError(
                "loss.topology applies to the rnnt and hat losses; TDT's lattice has its own "
                "durations"
            )
        if self.distill_weight and not self.dual_mode:
            raise ValueError("loss.distill_weight needs dual_mode (the full-context mode teaches)")
        if self.dual_mode and self.name not in ("rnnt", "hat"):
            raise ValueError(f"loss.dual_mode trains the rnnt and hat losses, got {self.name!r}")
        if self.align_restrict_left is not None:
            if self.align_restrict_left < 0:
                raise ValueError(
                    "loss.align_restrict_left must be >= 0 (null: off), got "
                    f"{self.align_restrict_left}"
                )
            if self.name != "hat" or self.topology != "standard":
                raise ValueError(
                    "loss.align_restrict_left applies to the hat loss on the standard topology "
                    "(HAT's blank keeps its probability when a label edge goes), got loss "
                    f"{self.name!r}, topology {str(self.topology)!r}"
                )


@dataclass
class SpecAugmentConfig:
    """SpecAugment (Park et al., 2019) on training features; no masks (the default) is off."""

    freq_masks: int = 0  # masks per utterance across mel bins
    freq_mask_width: int = 27  # each mask's width is drawn from [0, freq_mask_width]
    time_masks: int = 0  # masks per utterance across frames
    time_mask_width: int = 40  # each mask's width is drawn from [0, time_mask_width] ...
    time_mask_ratio: float = 0.2  # ... and at most this fraction of the utterance's frames

    def __post_init__(self):
        for key in ("freq_masks", "freq_mask_width", "time_masks", "time_mask_width"):
            at_least(f"data.spec_augment.{key}", getattr(self, key), 0)
        if not 0.0 <= self.time_mask_ratio <= 1.0:
            raise ValueError(
                f"data.spec_augment.time_mask_ratio must be in [0, 1], got {self.time_mask_ratio}"
            )


@dataclass
class DataConfig:
    """Where a corpus's prepared data lives (paths relative to the working directory)."""

    manifest_dir: str = MISSING  # holds <split>.jsonl
    feature_dir: str = MISSING  # holds <split>/ feature directories and cmvn.json
    vocab: str = MISSING  # token list, blank first
    units: str = "phones"  # manifest field used as targets: phones | phones_full | chars | words
    train_split: str = "train"
    valid_split: str = "dev"
    max_frames: int = 6000  # padded input frames per (global, all ranks together) batch
    max_utts: int = 0  # utterances per batch (0: no limit)
    num_workers: int = 0  # data loader worker processes
    features: Features = Features.cached  # cached: feature_dir; on_the_fly: fbank from the audio
    speed_perturb: list[float] = field(default_factory=list)  # e.g. [0.9, 1.0, 1.1]; empty: off
    # the mean subtracted from the features: the train split's (cmvn.json), or after it each
    # utterance's own; the variance is the train split's either way
    mean_norm: MeanNorm = MeanNorm.train
    spec_augment: SpecAugmentConfig = field(default_factory=SpecAugmentConfig)

    def __post_init__(self):
        positive("data.max_frames", self.max_frames)
        at_least("data.max_utts", self.max_utts, 0)
        at_least("data.num_workers", self.num_workers, 0)
        if not all(factor > 0 for factor in self.speed_perturb):
            raise ValueError(
                f"data.speed_perturb factors must be > 0, got {list(self.speed_perturb)}"
            )


@dataclass
class OptimConfig:
    name: Optimizer = Optimizer.adam
    lr: float = 1e-3  # peak learning rate (reached at the end of warmup)
    momentum: float = 0.9  # sgd only
    weight_decay: float = 0.0
    grad_clip: float = 5.0  # max gradient norm (0: no clipping)
    scheduler: Scheduler = Scheduler.cosine  # the decay after warmup
    warmup_steps: int = 0
    final_lr_scale: float = 0.02  # cosine and linear decay to lr * final_lr_scale
    plateau_factor: float = 1.0  # reduce-on-plateau: multiply the lr by this (1: off) ...
    plateau_patience: int = 1  # ... after this many epochs without a better trainer.best_metric
    min_lr_scale: float = 0.0  # reduce-on-plateau never goes below lr * min_lr_scale
    weight_noise: float = 0.0  # std of Gaussian noise added to the weight matrices each step

    def __post_init__(self):
        at_least("optim.warmup_steps", self.warmup_steps, 0)
        if not 0.0 < self.plateau_factor <= 1.0:
            raise ValueError(f"optim.plateau_factor must be in (0, 1], got {self.plateau_factor}")
        at_least("optim.plateau_patience", self.plateau_patience, 1)
        at_least("optim.weight_noise", self.weight_noise, 0)


@dataclass
class TrainerConfig:
    max_epochs: int = 10
    seed: int = 1
    # auto: from the newest checkpoint that loads, never over an earlier run's results without
    # one; never: start from scratch, removing an earlier run's checkpoints and history
    resume: Resume = Resume.auto
    device: str = "auto"  # auto | cpu | cuda | cuda:N (under torchrun: cuda:LOCAL_RANK)
    num_threads: int = 0  # torch intra-op threads on CPU (0: torch's default)
    precision: Precision = Precision.fp32  # fp16: CUDA only, with a gradient scaler
    # CUDA only: each step (forward, backward, clipping, the update) replayed from a CUDA graph
    # captured once per padded batch shape (cbasr.training.graphs); off until measured
    cuda_graphs: bool = False
    checkpoint_minutes: float = 5.0  # also checkpoint mid-epoch this often
    checkpoint_every_steps: int = 0  # and every this many optimizer steps (0: never)
    keep_checkpoints: int = 5  # epoch checkpoints kept: the last N and the best N (0: all)
    best_metric: Metric = Metric.valid_error_rate  # picks best.pt, the plateau, the early stop
    valid_beam: int = 0  # the validation error rate's search: 0 the greedy search, N a beam of N
    early_stopping_patience: int = 0  # stop after this many epochs without a better metric (0: off)
    max_bad_steps: int = 20  # non-finite steps in a row that stop the run
    find_unused_parameters: bool = False  # DistributedDataParallel: models with unused parameters
    log_every: int = 50  # steps between progress log lines
    progress_bar: bool = True  # tqdm bar when stderr is a terminal
    # fine-tuning: a new run starts from the model weights of a checkpoint (.pt) or an
    # experiment directory (its best.pt), with a fresh optimizer and schedule
    init_from: str | None = None
    init_skip: list[str] = field(default_factory=list)  # parameter names (globs) left as new

    def __post_init__(self):
        at_least("trainer.max_epochs", self.max_epochs, 0)
        at_least("trainer.checkpoint_minutes", self.checkpoint_minutes, 0)
        at_least("trainer.checkpoint_every_steps", self.checkpoint_every_steps, 0)
        at_least("trainer.keep_checkpoints", self.keep_checkpoints, 0)
        if self.valid_beam < 0:
            raise ValueError(
                f"trainer.valid_beam must be 0 (greedy) or a beam width, got {self.valid_beam}"
            )
        at_least("trainer.early_stopping_patience", self.early_stopping_patience, 0)
        at_least("trainer.max_bad_steps", self.max_bad_steps, 1)
        at_least("trainer.log_every", self.log_every, 1)
        at_least("trainer.num_threads", self.num_threads, 0)


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
    cs.store(group="encoder", name="conformer_schema", node=ConformerEncoderConfig)
    cs.store(group="decoder", name="pointwise_schema", node=PointwiseDecoderConfig)
    cs.store(group="decoder", name="autoregressive_schema", node=AutoregressiveDecoderConfig)
    cs.store(group="decoder", name="monotonic_schema", node=MonotonicDecoderConfig)
    cs.store(group="decoder", name="attention_emission_schema", node=AttentionEmissionDecoderConfig)
    cs.store(group="decoder", name="transducer_schema", node=TransducerDecoderConfig)
    cs.store(group="loss", name="ctc_schema", node=CTCLossConfig)
    cs.store(group="loss", name="cb_marginal_schema", node=CBMarginalLossConfig)
    cs.store(group="loss", name="cb_reinforce_schema", node=CBReinforceLossConfig)
    cs.store(group="loss", name="cb_mc_schema", node=CBMonteCarloLossConfig)
    cs.store(group="loss", name="forced_suffix_schema", node=ForcedSuffixLossConfig)
    cs.store(group="loss", name="transducer_schema", node=TransducerLossConfig)
    cs.store(group="data", name="data_schema", node=DataConfig)
    cs.store(group="optim", name="optim_schema", node=OptimConfig)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)
