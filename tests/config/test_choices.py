"""Choices are checked when the config is composed, naming the allowed values, and reach the
code as plain strings."""

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from cbasr.config import CONF_DIR, to_plain
from cbasr.config.schema import register_configs

CHOICES = [  # (preset overrides, option, a legal value other than the default)
    ([], "encoder.rnn_type", "gru"),
    ([], "encoder.subsampling", "conv"),
    (["decoder=autoregressive", "loss=cb_reinforce"], "decoder.emission", "decoder"),
    (["decoder=hat", "loss=hat"], "decoder.blank_joint", "linear"),
    (["decoder=hat", "loss=hat"], "decoder.joint", "rnnt"),
    (["loss=cb_reinforce"], "loss.estimator", "idb"),
    (["loss=cb_reinforce"], "loss.baseline", "running_mean"),
    (["loss=forced_suffix"], "loss.baseline", "none"),
    ([], "data.features", "on_the_fly"),
    ([], "data.mean_norm", "utterance"),
    ([], "optim.name", "adamw"),
    ([], "optim.scheduler", "noam"),
    ([], "trainer.precision", "bf16"),
    ([], "trainer.best_metric", "valid_loss"),
    ([], "trainer.resume", "never"),
]


def composed(overrides: list[str]) -> dict:
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return to_plain(compose("train", overrides=["exp_dir=x", *overrides]))


@pytest.mark.parametrize(("presets", "option", "value"), CHOICES)
def test_a_choice_arrives_as_its_string(presets, option, value):
    group, key = option.split(".")
    cfg = composed([*presets, f"{option}={value}"])
    assert cfg[group][key] == value
    assert type(cfg[group][key]) is str


@pytest.mark.parametrize(("presets", "option", "value"), CHOICES)
def test_a_misspelt_choice_fails_at_composition_naming_the_values(presets, option, value):
    with pytest.raises(ConfigCompositionException) as error:
        composed([*presets, f"{option}={value}x"])
    message = str(error.value.__cause__)
    assert f"Invalid value '{value}x', expected one of [" in message
    assert value in message.split("expected one of")[1]


def test_a_plain_group_becomes_its_typed_config():
    """typed(): the loop's view of a plain group (a composed config, or an older config.json):
    the schema's defaults fill what it lacks, choices are members that compare and print as
    their strings, and a bad entry names itself."""
    from cbasr.config import typed
    from cbasr.config.schema import Precision, TrainerConfig

    options = typed(TrainerConfig, {"max_epochs": 3, "precision": "bf16"}, "trainer")
    assert isinstance(options, TrainerConfig) and options.max_epochs == 3
    assert options.resume == TrainerConfig.resume and options.log_every == TrainerConfig.log_every
    assert options.precision is Precision.bf16 and options.precision == "bf16"
    assert f"{options.precision}" == "bf16" and {"bf16": 1}[options.precision] == 1
    with pytest.raises(ValueError, match=r"trainer.resume: Invalid value 'sometimes'"):
        typed(TrainerConfig, {"resume": "sometimes"}, "trainer")
