"""A decoder group written before ``decoder.label`` (its label-history keys at its top level)
is read with them moved into ``label``, saying so in one log line."""

import logging

import pytest

from cbasr import builder
from cbasr.config import plain
from cbasr.config.schema import (
    AutoregressiveDecoderConfig,
    LabelContextConfig,
    PointwiseDecoderConfig,
    TransducerDecoderConfig,
)
from cbasr.config.upgrade import LABEL_KEYS, REMOVED_KEYS, drop_removed_keys, nest_label_keys
from cbasr.training.asr_task import asr_trainer
from tests.training.test_trainer import make_cfg

OLD_HAT = {
    "name": "transducer",
    "joint": "hat",
    "embed_dim": 4,
    "hidden": 8,
    "num_layers": 2,
    "context": -1,
    "joint_dim": 8,
    "dropout": 0.0,
}


def moved_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "cbasr.config.upgrade"]


def test_the_label_keys_are_the_label_group_s():
    assert LABEL_KEYS == ("embed_dim", "hidden", "num_layers", "context")


def test_an_old_decoder_group_is_typed_as_today_s_saying_so_once(caplog):
    with caplog.at_level(logging.INFO, logger="cbasr.config.upgrade"):
        typed = builder.group_config("decoder", dict(OLD_HAT))
    assert typed == TransducerDecoderConfig(
        joint="hat",
        label=LabelContextConfig(embed_dim=4, hidden=8, num_layers=2, context=-1),
        joint_dim=8,
        dropout=0.0,
    )
    assert moved_lines(caplog) == [
        "decoder: a config written before decoder.label; decoder.embed_dim, decoder.hidden, "
        "decoder.num_layers, decoder.context read as decoder.label.embed_dim, "
        "decoder.label.hidden, decoder.label.num_layers, decoder.label.context"
    ]


def test_the_moved_group_is_a_new_dict_with_the_other_keys_kept_in_place():
    old = {"name": "autoregressive", "hidden": 8, "emission_hidden": 4}
    new = nest_label_keys(AutoregressiveDecoderConfig, old)
    assert new == {"name": "autoregressive", "emission_hidden": 4, "label": {"hidden": 8}}
    assert old == {"name": "autoregressive", "hidden": 8, "emission_hidden": 4}  # unchanged


def test_a_group_of_today_or_without_a_label_group_is_left_as_it_is(caplog):
    today = {"name": "transducer", "label": {"hidden": 8}}
    pointwise = {"name": "pointwise", "hidden": 5, "dropout": 0.1}  # its own hidden layer
    with caplog.at_level(logging.INFO, logger="cbasr.config.upgrade"):
        assert nest_label_keys(TransducerDecoderConfig, today) is today
        assert nest_label_keys(PointwiseDecoderConfig, pointwise) is pointwise
        assert nest_label_keys(None, {"name": "rnn", "hidden": 3}) == {"name": "rnn", "hidden": 3}
        assert builder.group_config("decoder", pointwise).hidden == 5
    assert moved_lines(caplog) == []
    with pytest.raises(ValueError, match="unknown decoder 'rnn'"):
        builder.group_config("decoder", {"name": "rnn", "hidden": 3})


def test_a_half_moved_group_keeps_its_label_entries_and_refuses_a_key_given_twice():
    both = {"name": "transducer", "hidden": 8, "label": {"context": 2}}
    assert builder.group_config("decoder", both).label == LabelContextConfig(hidden=8, context=2)
    twice = {"name": "transducer", "hidden": 8, "label": {"hidden": 16}}
    with pytest.raises(
        ValueError,
        match="decoder.hidden and decoder.label.hidden are both given: decoder.label.hidden is "
        "today's key",
    ):
        builder.group_config("decoder", twice)


def test_an_old_value_is_checked_where_it_lands():
    with pytest.raises(ValueError, match="decoder.label.context must be -1"):
        builder.group_config("decoder", {**OLD_HAT, "context": -2})


def test_removed_options_are_read_away_only_where_they_change_nothing(caplog):
    """A config holding options since removed (``REMOVED_KEYS``): dropped with one line where
    every value read as today's behaviour; a value that would not, refused by name."""
    cfg = {
        "trainer": {"max_epochs": 3, "emit_bias_init": "label_rate", "max_long_gap_share": 0.2},
        "optim": {"lr": 0.1, "weight_noise_start": 0},
    }
    with caplog.at_level(logging.INFO, logger="cbasr.config.upgrade"):
        assert drop_removed_keys(cfg) is cfg
    assert cfg == {"trainer": {"max_epochs": 3}, "optim": {"lr": 0.1}}
    assert moved_lines(caplog) == [
        "a config written before trainer.emit_bias_init, trainer.max_long_gap_share, "
        "optim.weight_noise_start was removed: read without it"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cbasr.config.upgrade"):
        assert drop_removed_keys({"trainer": {"max_epochs": 3}}) == {"trainer": {"max_epochs": 3}}
    assert moved_lines(caplog) == []
    late = {"optim": {"weight_noise_start": 500}}
    with pytest.raises(ValueError, match=r"optim.weight_noise_start = 500: the option was removed"):
        drop_removed_keys(late)
    assert set(REMOVED_KEYS) == {
        "trainer.emit_bias_init",
        "trainer.max_long_gap_share",
        "optim.weight_noise_start",
    }


def test_a_plain_config_with_removed_options_still_builds_its_trainer(tone_data, tmp_path):
    cfg = plain(make_cfg(tone_data, tmp_path / "exp", "trainer.max_epochs=1"))
    cfg["trainer"]["max_long_gap_share"], cfg["optim"]["weight_noise_start"] = 1.0, 0
    trainer = asr_trainer(cfg, tmp_path / "exp")
    assert trainer.options.max_epochs == 1
