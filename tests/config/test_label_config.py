"""``decoder.label``: the label-history network's options, one nested group of the four
decoders that have one, set from the command line and from YAML as one."""

import dataclasses

import pytest
from hydra.errors import ConfigCompositionException

from cbasr.config import to_plain, to_typed
from cbasr.config.schema import (
    AttentionEmissionDecoderConfig,
    AutoregressiveDecoderConfig,
    LabelContextConfig,
    MonotonicDecoderConfig,
    TransducerDecoderConfig,
)
from tests.config.test_checks import compose_train

LABEL_DECODERS = [
    AttentionEmissionDecoderConfig,
    MonotonicDecoderConfig,
    AutoregressiveDecoderConfig,
    TransducerDecoderConfig,
]
PRESETS = ["attention_emission", "monotonic", "autoregressive", "transducer", "hat", "tdt"]


def test_the_label_network_s_defaults_are_those_the_flat_keys_had():
    """An older config that left a key out was built with these: it still is."""
    label = LabelContextConfig()
    assert (label.embed_dim, label.hidden, label.num_layers, label.context) == (64, 128, 1, -1)


@pytest.mark.parametrize("schema", LABEL_DECODERS, ids=lambda s: s.__name__)
def test_each_label_decoder_nests_the_one_group_and_keeps_its_other_options(schema):
    names = [f.name for f in dataclasses.fields(schema)]
    assert schema().label == LabelContextConfig()
    assert not {"embed_dim", "hidden", "num_layers", "context"} & set(names)
    assert "dropout" in names  # the decoder's: it drops out in the joint too
    assert schema().label is not schema().label  # each config its own


def test_the_other_decoder_options_keep_their_defaults():
    assert AttentionEmissionDecoderConfig().emission_hidden == 0
    assert MonotonicDecoderConfig().emission_hidden == 0
    assert AutoregressiveDecoderConfig().emission_hidden == 64
    assert {s().joint_dim for s in (AttentionEmissionDecoderConfig, TransducerDecoderConfig)} == {
        128
    }
    assert {s().dropout for s in LABEL_DECODERS} == {0.1}


@pytest.mark.parametrize("preset", PRESETS)
def test_a_command_line_override_reaches_the_typed_label_group(preset):
    overrides = [f"decoder={preset}", "decoder.label.hidden=256", "decoder.label.embed_dim=32"]
    cfg = compose_train(overrides)
    assert to_plain(cfg)["decoder"]["label"] == {
        "embed_dim": 32,
        "hidden": 256,
        "num_layers": 1,
        "context": -1,
    }
    label = to_typed(cfg).decoder.label
    assert isinstance(label, LabelContextConfig) and (label.hidden, label.embed_dim) == (256, 32)


def test_the_flat_keys_of_before_fail_at_composition_naming_the_key():
    with pytest.raises(ConfigCompositionException) as error:
        compose_train(["decoder=hat", "decoder.hidden=256"])
    assert "decoder.hidden" in str(error.value)


def test_a_label_key_misspelt_fails_at_composition():
    with pytest.raises(ConfigCompositionException) as error:
        compose_train(["decoder=hat", "decoder.label.hiden=256"])
    assert "hiden" in str(error.value)
