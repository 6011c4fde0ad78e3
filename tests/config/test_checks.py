"""The schemas' own checks (``__post_init__``): a bad value fails when the config is typed, as
cbasr-train types the composed config, and as the builder types a plain group (a checkpoint's),
naming the key; the value next to it that is allowed passes."""

import pytest
from hydra import compose, initialize_config_dir

from cbasr.builder import group_config
from cbasr.config import CONF_DIR, to_typed
from cbasr.config.schema import register_configs

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
        {"name": "attention_emission", "label": {"context": 0}},
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
