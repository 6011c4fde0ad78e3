"""Each default is defined once, in the schema: a module's constructor defaults are the schema's."""

import dataclasses
import enum
import inspect

import pytest

from cbasr import builder
from cbasr.config import schema

MODULE_SCHEMAS = [
    (schema.RNNEncoderConfig, builder.ENCODERS),
    (schema.ConformerEncoderConfig, builder.ENCODERS),
    (schema.PointwiseDecoderConfig, builder.DECODERS),
    (schema.AutoregressiveDecoderConfig, builder.DECODERS),
    (schema.MonotonicDecoderConfig, builder.DECODERS),
    (schema.AttentionEmissionDecoderConfig, builder.DECODERS),
    (schema.TransducerDecoderConfig, builder.DECODERS),
]


def disagreements(config: type, cls: type) -> list[str]:
    parameters = inspect.signature(cls.__init__).parameters
    found = []
    for f in dataclasses.fields(config):
        if f.name == "name":
            continue
        if f.name not in parameters:
            found.append(f"{f.name}: not a parameter of {cls.__name__}")
            continue
        want = f.default.value if isinstance(f.default, enum.Enum) else f.default
        if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            want = f.default_factory()
        have = parameters[f.name].default
        if dataclasses.is_dataclass(want) and have is None:
            continue  # a nested group (decoder.label): None stands for its schema's defaults
        if isinstance(want, list) and isinstance(have, tuple):
            have = list(have)
        if have is not inspect.Parameter.empty and have != want:
            found.append(f"{f.name}: {cls.__name__} {have!r}, {config.__name__} {want!r}")
    return found


@pytest.mark.parametrize(
    ("config", "table"), MODULE_SCHEMAS, ids=lambda x: getattr(x, "__name__", "")
)
def test_constructor_defaults_are_the_schemas(config, table):
    assert disagreements(config, table[config.name]) == []


def test_a_disagreement_is_found():
    class Encoder:
        def __init__(self, input_dim, hidden=256, rnn_type="gru"):
            pass

    found = disagreements(schema.RNNEncoderConfig, Encoder)
    assert "hidden: Encoder 256, RNNEncoderConfig 128" in found
    assert "rnn_type: Encoder 'gru', RNNEncoderConfig 'lstm'" in found
    assert "num_layers: not a parameter of Encoder" in found
