"""The schemas' own checks (``__post_init__``): a bad value fails when the config is typed, as
cbasr-train types the composed config, and as the builder types a plain group (a checkpoint's),
naming the key; the value next to it that is allowed passes."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cbasr.builder import group_config
from cbasr.config import CONF_DIR, to_typed
from cbasr.config.lm_schema import LMDataConfig, register_lm_configs
from cbasr.config.schema import (
    CBMonteCarloLossConfig,
    CBReinforceLossConfig,
    ConformerEncoderConfig,
    DataConfig,
    ForcedSuffixLossConfig,
    OptimConfig,
    RNNEncoderConfig,
    SpecAugmentConfig,
    TrainerConfig,
    at_least,
    positive,
    register_configs,
)

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
TRAIN_GROUPS = ["encoder", "decoder", "loss", "data", "optim", "trainer"]

TRANSDUCER_LOSS = [  # (loss group options, what the error says, allowed options beside them)
    ({"max_symbols": 0}, "loss.max_symbols must be >= 1, got 0", {"max_symbols": 1}),
    (
        {"prune_range": 1},
        r"loss.prune_range must be 0 \(no pruning\) or >= 2, got 1",
        {"prune_range": 2},
    ),
    ({"prune_range": -2}, "loss.prune_range must be 0", {"prune_range": 0}),
    (
        {"simple_loss_scale": -0.5},
        "loss.simple_loss_scale must be >= 0",
        {"simple_loss_scale": 0.0},
    ),
    ({"ctc_weight": -1.0}, "loss.ctc_weight must be >= 0, got -1.0", {"ctc_weight": 0.0}),
    ({"name": "tdt", "sigma": -0.1}, "loss.sigma must be >= 0", {"name": "tdt", "sigma": 0.05}),
    (
        {"fastemit_lambda": float("nan")},
        "loss.fastemit_lambda must be >= 0",
        {"fastemit_lambda": 0.1},
    ),
    (
        {"name": "tdt", "fastemit_lambda": 0.1},
        "fastemit_lambda applies to the rnnt and hat",
        {"name": "tdt"},
    ),
    (
        {"name": "tdt", "topology": "monotonic"},
        "loss.topology applies to the rnnt and hat",
        {"name": "rnnt", "topology": "monotonic"},
    ),
    (
        {"distill_weight": 0.5},
        "loss.distill_weight needs dual_mode",
        {"distill_weight": 0.5, "dual_mode": True},
    ),
    (
        {"dual_mode": True, "distill_weight": -1.0},
        "loss.distill_weight must be >= 0",
        {"dual_mode": True},
    ),
    (
        {"name": "tdt", "dual_mode": True},
        "loss.dual_mode trains the rnnt and hat losses, got 'tdt'",
        {"name": "hat", "dual_mode": True},
    ),
    (
        {"name": "hat", "align_restrict_left": -1},
        r"loss.align_restrict_left must be >= 0 \(null: off\)",
        {"name": "hat", "align_restrict_left": 0},
    ),
    (
        {"name": "rnnt", "align_restrict_left": 1},
        "applies to the hat loss on the standard topology .* got loss 'rnnt', topology 'standard'",
        {"name": "hat", "align_restrict_left": 1},
    ),
    (
        {"name": "hat", "topology": "monotonic", "align_restrict_left": 1},
        "topology 'monotonic'",
        {"name": "hat", "topology": "monotonic"},
    ),
]


@pytest.mark.parametrize(("options", "error", "allowed"), TRANSDUCER_LOSS)
def test_a_transducer_loss_value_is_checked_by_its_schema(options, error, allowed):
    with pytest.raises(ValueError, match=error):
        group_config("loss", {"name": "rnnt", **options})
    typed = group_config("loss", {"name": "rnnt", **allowed})
    assert all(getattr(typed, key) == value for key, value in allowed.items())


def test_the_composed_config_is_checked_when_typed():
    register_configs()
    overrides = ["exp_dir=x", "decoder=transducer", "loss=rnnt", "loss.prune_range=1"]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    with pytest.raises(ValueError, match="loss.prune_range must be 0"):
        to_typed(cfg)


def _cases(schema, group, cases):
    """``(schema, group, bad options, error, allowed options)`` rows of one group."""
    return [pytest.param(schema, group, *case, id=f"{group}-{case[1]}") for case in cases]


GROUP_CHECKS = [
    *_cases(
        RNNEncoderConfig,
        "encoder",
        [
            ({"stack": 0}, "encoder.stack must be >= 1, got 0", {"stack": 1}),
            ({"stride": 0}, "encoder.stride must be >= 1, got 0", {"stride": 1}),
        ],
    ),
    *_cases(
        ConformerEncoderConfig,
        "encoder",
        [
            ({"subsampling": "stack", "stack": -1}, "encoder.stack must be >= 1", {"stack": 1}),
            ({"stride": -3}, "encoder.stride must be >= 1, got -3", {"stride": 1}),
            ({"chunk_size": -1}, "encoder.chunk_size must be >= 0, got -1", {"chunk_size": 0}),
            (
                {"dynamic_chunks": -1},
                "encoder.dynamic_chunks must be >= 0, got -1",
                {"dynamic_chunks": 0},
            ),
            (
                {"left_chunks": -2},
                "encoder.left_chunks must be >= -1, got -2",
                {"left_chunks": -1},
            ),
            ({"num_heads": 0}, "encoder.num_heads must be >= 1, got 0", {"num_heads": 1}),
            (
                {"d_model": 10, "num_heads": 4},
                r"encoder.num_heads \(4\) must divide encoder.d_model \(10\)",
                {"d_model": 12, "num_heads": 4},
            ),
            ({"kernel_size": 4}, "encoder.kernel_size must be odd, got 4", {"kernel_size": 3}),
        ],
    ),
    *_cases(
        CBReinforceLossConfig,
        "loss",
        [
            (
                {"num_samples": 0, "baseline": "none"},
                "loss.num_samples must be >= 1, got 0",
                {"num_samples": 1, "baseline": "none"},
            ),
            (
                {"num_samples": 1, "baseline": "loo"},
                r"loss.num_samples must be >= 2 with loss.baseline=loo \(leave one out\), got 1",
                {"num_samples": 2, "baseline": "loo"},
            ),
        ],
    ),
    *_cases(
        ForcedSuffixLossConfig,
        "loss",
        [
            (
                {"num_samples": 0, "baseline": "running_mean"},
                "loss.num_samples must be >= 1, got 0",
                {"num_samples": 1, "baseline": "running_mean"},
            ),
            ({"num_samples": 1}, "loss.num_samples must be >= 2 with", {"num_samples": 2}),
            (
                {"entropy_weight": -0.1},
                "loss.entropy_weight must be >= 0, got -0.1",
                {"entropy_weight": 0.0},
            ),
        ],
    ),
    *_cases(
        CBMonteCarloLossConfig,
        "loss",
        [
            (
                {"num_samples": 1},
                r"loss.num_samples must be >= 2 for cb_mc \(VIMCO leaves one sample out\), got 1",
                {"num_samples": 2},
            ),
        ],
    ),
    *_cases(
        TrainerConfig,
        "trainer",
        [
            ({"max_epochs": -1}, "trainer.max_epochs must be >= 0, got -1", {"max_epochs": 0}),
            ({"num_threads": -1}, "trainer.num_threads must be >= 0, got -1", {"num_threads": 0}),
            (
                {"checkpoint_minutes": -0.5},
                "trainer.checkpoint_minutes must be >= 0, got -0.5",
                {"checkpoint_minutes": 0.0},
            ),
            (
                {"checkpoint_minutes": float("nan")},
                "trainer.checkpoint_minutes must be >= 0, got nan",
                {"checkpoint_minutes": 0.5},
            ),
            (
                {"checkpoint_every_steps": -1},
                "trainer.checkpoint_every_steps must be >= 0, got -1",
                {"checkpoint_every_steps": 0},
            ),
            (
                {"keep_checkpoints": -1},
                "trainer.keep_checkpoints must be >= 0, got -1",
                {"keep_checkpoints": 0},
            ),
            (
                {"valid_beam": -1},
                r"trainer.valid_beam must be 0 \(greedy\) or a beam width, got -1",
                {"valid_beam": 0},
            ),
            (
                {"early_stopping_patience": -1},
                "trainer.early_stopping_patience must be >= 0, got -1",
                {"early_stopping_patience": 0},
            ),
            (
                {"max_bad_steps": 0},
                "trainer.max_bad_steps must be >= 1, got 0",
                {"max_bad_steps": 1},
            ),
            ({"log_every": 0}, "trainer.log_every must be >= 1, got 0", {"log_every": 1}),
        ],
    ),
    *_cases(
        OptimConfig,
        "optim",
        [
            (
                {"warmup_steps": -1},
                "optim.warmup_steps must be >= 0, got -1",
                {"warmup_steps": 0},
            ),
            (
                {"plateau_factor": 0.0},
                r"optim.plateau_factor must be in \(0, 1\], got 0.0",
                {"plateau_factor": 0.01},
            ),
            (
                {"plateau_factor": 1.5},
                r"optim.plateau_factor must be in \(0, 1\], got 1.5",
                {"plateau_factor": 1.0},
            ),
            (
                {"plateau_patience": 0},
                "optim.plateau_patience must be >= 1, got 0",
                {"plateau_patience": 1},
            ),
            (
                {"weight_noise": -0.1},
                "optim.weight_noise must be >= 0, got -0.1",
                {"weight_noise": 0.0},
            ),
        ],
    ),
    *_cases(
        DataConfig,
        "data",
        [
            ({"max_frames": 0}, "data.max_frames must be > 0, got 0", {"max_frames": 1}),
            ({"max_utts": -1}, "data.max_utts must be >= 0, got -1", {"max_utts": 0}),
            ({"num_workers": -1}, "data.num_workers must be >= 0, got -1", {"num_workers": 0}),
            (
                {"speed_perturb": [0.9, 0.0]},
                r"data.speed_perturb factors must be > 0, got \[0.9, 0.0\]",
                {"speed_perturb": [0.01, 1.1]},
            ),
        ],
    ),
    *_cases(
        SpecAugmentConfig,
        "data.spec_augment",
        [
            *(
                ({key: -1}, f"data.spec_augment.{key} must be >= 0, got -1", {key: 0})
                for key in ("freq_masks", "freq_mask_width", "time_masks", "time_mask_width")
            ),
            (
                {"time_mask_ratio": -0.1},
                r"data.spec_augment.time_mask_ratio must be in \[0, 1\], got -0.1",
                {"time_mask_ratio": 0.0},
            ),
            (
                {"time_mask_ratio": 1.5},
                r"data.spec_augment.time_mask_ratio must be in \[0, 1\], got 1.5",
                {"time_mask_ratio": 1.0},
            ),
        ],
    ),
    *_cases(
        LMDataConfig,
        "data",
        [
            ({"max_tokens": 0}, "data.max_tokens must be > 0, got 0", {"max_tokens": 1}),
            ({"shard_tokens": 0}, "data.shard_tokens must be > 0, got 0", {"shard_tokens": 1}),
        ],
    ),
]

# The presets each group's rows compose with: the preset whose schema the row is of.
PRESETS = {
    RNNEncoderConfig: ["encoder=blstm"],
    ConformerEncoderConfig: ["encoder=conformer"],
    CBReinforceLossConfig: ["decoder=pointwise", "loss=cb_reinforce"],
    ForcedSuffixLossConfig: ["decoder=autoregressive", "loss=forced_suffix"],
    CBMonteCarloLossConfig: ["decoder=pointwise", "loss=cb_mc"],
}


def _overrides(group: str, options: dict) -> list[str]:
    def value(v):
        return "[" + ",".join(map(str, v)) + "]" if isinstance(v, list) else str(v)

    return [f"{group}.{key}={value(v)}" for key, v in options.items()]


def _composed(schema, group: str, options: dict):
    """``cbasr-train``'s (``cbasr-train-lm``'s for an LM group) composed config with the
    group's ``options`` as overrides, typed as the command types it."""
    if schema is LMDataConfig:
        register_lm_configs()
        name, required = "train_lm", ["exp_dir=x", "data.train=t", "data.valid=v", "data.vocab=w"]
    else:
        register_configs()
        name, required = "train", ["exp_dir=x", *PRESETS.get(schema, [])]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(name, overrides=[*required, *_overrides(group, options)])
    return to_typed(cfg)


@pytest.mark.parametrize(("schema", "group", "options", "error", "allowed"), GROUP_CHECKS)
def test_a_bad_value_fails_when_the_composed_config_is_typed(
    schema, group, options, error, allowed
):
    with pytest.raises(ValueError, match=error):
        _composed(schema, group, options)
    typed = _composed(schema, group, allowed)
    for part in group.split("."):
        typed = getattr(typed, part)
    assert isinstance(typed, schema)
    assert all(getattr(typed, key) == value for key, value in allowed.items())


@pytest.mark.parametrize(("schema", "group", "options", "error", "allowed"), GROUP_CHECKS)
def test_a_bad_value_fails_when_its_schema_is_made_in_python(
    schema, group, options, error, allowed
):
    """The path of a Python caller (and of ``OmegaConf.structured`` on an instance)."""
    with pytest.raises(ValueError, match=error):
        OmegaConf.structured(schema(**options))
    assert OmegaConf.structured(schema(**allowed))


def test_every_schema_default_passes_its_checks():
    for schema in (
        RNNEncoderConfig,
        ConformerEncoderConfig,
        CBReinforceLossConfig,
        ForcedSuffixLossConfig,
        CBMonteCarloLossConfig,
        SpecAugmentConfig,
        DataConfig,
        OptimConfig,
        TrainerConfig,
        LMDataConfig,
    ):
        schema()


@pytest.mark.parametrize(
    ("check", "value", "passes"),
    [
        (at_least, 2, True),
        (at_least, 1.999, False),
        (at_least, float("nan"), False),
        (positive, 1e-9, True),
        (positive, 0, False),
        (positive, float("nan"), False),
    ],
)
def test_the_bound_checks_name_the_key_and_refuse_nan(check, value, passes):
    low = (2,) if check is at_least else ()
    if passes:
        check("group.key", value, *low)
        return
    with pytest.raises(ValueError, match=f"^group.key must be {'>= 2' if low else '> 0'}, got "):
        check("group.key", value, *low)


def test_every_preset_and_recipe_config_passes_the_checks():
    """Every group preset of ``conf/`` and every recipe's pinned config, composed and typed as
    the commands type them (the recipe tests read them plain, without the checks)."""
    register_configs()
    register_lm_configs()
    required = {"train": ["exp_dir=x"], "train_lm": ["exp_dir=x", "data.train=t"]}
    required["train_lm"] += ["data.valid=v", "data.vocab=w"]
    runs = [
        (CONF_DIR, entry, [*required[entry], f"{preset.parent.name}={preset.stem}"])
        for entry, groups in (("train", TRAIN_GROUPS), ("train_lm", ["lm"]))
        for group in groups
        for preset in sorted((CONF_DIR / group).glob("*.yaml"))
    ]
    searchpath = f"hydra.searchpath=[file://{CONF_DIR}]"
    runs += [(p.parent, p.stem, [searchpath]) for p in sorted(RECIPES.glob("*/conf/*.yaml"))]
    refused = []
    for directory, name, overrides in runs:
        with initialize_config_dir(str(directory), version_base="1.3"):
            cfg = compose(name, overrides=overrides)
        try:
            to_typed(cfg)
        except ValueError as e:
            refused.append(f"{directory.name}/{name} {overrides}: {e}")
    assert len(runs) > 60 and refused == []


DECODERS = [  # (decoder group options, what the error says, allowed options beside them)
    (
        {"name": "transducer", "label": {"context": -2}},
        r"decoder.label.context must be -1 \(an LSTM over the whole history\) or >= 0 labels, "
        "got -2",
        {"name": "transducer", "label": {"context": -1}},
    ),
    (
        {"name": "attention_emission", "label": {"context": -3}},
        "decoder.label.context must be -1",
        {"name": "attention_emission", "label": {"context": -1, "hidden": 8}},
    ),
    (
        {"name": "attention_emission", "label": {"context": 2}},
        "decoder.label.context must be -1 for the attention_emission decoder .* got 2",
        {"name": "transducer", "label": {"context": 2}},
    ),
    (
        {"name": "monotonic", "label": {"context": 0}},
        "decoder.label.context must be -1 for the monotonic decoder .* got 0",
        {"name": "monotonic", "label": {"context": -1}},
    ),
    (
        {"name": "autoregressive", "label": {"context": 0}},
        "decoder.label.context must be -1 for the autoregressive decoder .* got 0",
        {"name": "autoregressive", "label": {"context": -1, "hidden": 8}},
    ),
    (
        {"name": "monotonic", "window": 0},
        "decoder.window must be >= 1 frame, got 0",
        {"name": "monotonic", "window": 1},
    ),
    (
        {"name": "transducer", "history_noise": 1.0},
        r"decoder.history_noise must be in \[0, 1\), got 1.0",
        {"name": "transducer", "history_noise": 0.99},
    ),
    (
        {"name": "transducer", "history_noise": -0.1},
        r"decoder.history_noise must be in \[0, 1\)",
        {"name": "transducer", "history_noise": 0.0},
    ),
    (
        {"name": "transducer", "history_repeat": 1.0},
        r"decoder.history_repeat must be in \[0, 1\), got 1.0",
        {"name": "transducer", "history_repeat": 0.5},
    ),
    (
        {"name": "transducer", "history_repeat": float("nan")},
        "decoder.history_repeat must be in",
        {"name": "transducer", "history_repeat": 0.0},
    ),
    (
        {"name": "transducer", "joint": "tdt", "durations": [0, 2]},
        r"decoder.durations must include 1, got \[0, 2\]",
        {"name": "transducer", "joint": "tdt", "durations": [1]},
    ),
    (
        {"name": "transducer", "joint": "tdt", "durations": [0, 2, 1]},
        "decoder.durations must be distinct and increasing",
        {"name": "transducer", "joint": "tdt", "durations": [0, 1, 2]},
    ),
    (
        {"name": "transducer", "joint": "tdt", "durations": [1, 1]},
        "decoder.durations must be distinct and increasing",
        {"name": "transducer", "joint": "tdt", "durations": [1, 4]},
    ),
    (
        {"name": "transducer", "joint": "tdt", "durations": [-1, 1]},
        "decoder.durations must be non-negative integers",
        {"name": "transducer", "joint": "tdt", "durations": [0, 1]},
    ),
    (
        {"name": "transducer", "joint": "tdt", "durations": []},
        "decoder.durations must be non-negative integers, got",
        {"name": "transducer", "joint": "tdt", "durations": [1, 2]},
    ),
]


@pytest.mark.parametrize(("options", "error", "allowed"), DECODERS)
def test_a_decoder_value_is_checked_by_its_schema(options, error, allowed):
    with pytest.raises(ValueError, match=error):
        group_config("decoder", options)
    typed = group_config("decoder", allowed)
    for key, value in allowed.items():
        got = getattr(typed, key)
        if isinstance(value, dict):  # decoder.label
            assert all(getattr(got, k) == v for k, v in value.items())
        else:
            assert got == value


def compose_train(overrides: list[str]):
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=["exp_dir=x", *overrides])


@pytest.mark.parametrize(
    ("preset", "override", "error"),
    [
        ("hat", "decoder.label.context=-2", "decoder.label.context must be -1"),
        ("autoregressive", "decoder.label.context=2", "for the autoregressive decoder"),
        ("monotonic", "decoder.window=0", "decoder.window must be >= 1"),
        ("transducer", "decoder.history_repeat=1.5", "decoder.history_repeat must be in"),
        ("tdt", "decoder.durations=[0,2]", "decoder.durations must include 1"),
    ],
)
def test_a_composed_decoder_is_checked_when_typed(preset, override, error):
    cfg = compose_train([f"decoder={preset}", override])
    with pytest.raises(ValueError, match=error):
        to_typed(cfg)
