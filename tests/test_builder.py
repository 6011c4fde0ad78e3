import re
from pathlib import Path

import pytest
import torch

from cbasr import builder
from cbasr.config.schema import (
    CTCLossConfig,
    LabelContextConfig,
    PointwiseDecoderConfig,
    RNNEncoderConfig,
    TransducerDecoderConfig,
    TransducerLossConfig,
)
from cbasr.models import CTCModel, TransducerModel


def test_builds_from_typed_configs():
    model = builder.build_model(
        RNNEncoderConfig(hidden=6, num_layers=1, rnn_type="gru"),
        TransducerDecoderConfig(
            joint="hat", label=LabelContextConfig(embed_dim=4, hidden=5), joint_dim=3
        ),
        TransducerLossConfig(name="hat", max_symbols=2),
        input_dim=8,
        vocab_size=7,
    )
    assert isinstance(model, TransducerModel) and model.criterion == "hat"
    assert isinstance(model.encoder.rnn, torch.nn.GRU) and model.encoder.output_dim == 12
    assert model.decoder.joint.name == "hat" and model.decoder.joint.encoder_proj.out_features == 3
    prediction = model.decoder.prediction  # decoder.label
    assert (prediction.embedding.embedding_dim, prediction.output_dim) == (4, 5)
    assert model.max_symbols == 2


def test_model_configs_types_each_group_and_fills_the_schema_defaults():
    encoder, decoder, loss = builder.model_configs(
        {
            "encoder": {"name": "rnn", "hidden": 6},
            "decoder": {"name": "pointwise"},
            "loss": {"name": "ctc"},
        }
    )
    assert encoder == RNNEncoderConfig(hidden=6)
    assert (decoder, loss) == (PointwiseDecoderConfig(), CTCLossConfig())
    assert encoder.rnn_type == "lstm" and encoder.rnn_type.name == "lstm"  # an Enum member


def test_builds_from_plain_dicts():
    model = builder.build_model(
        {"name": "rnn", "hidden": 6, "num_layers": 1},
        {"name": "pointwise", "hidden": 5},
        {"name": "ctc"},
        input_dim=8,
        vocab_size=7,
    )
    assert isinstance(model, CTCModel)
    assert model.encoder.output_dim == 12 and model.decoder.net[-1].out_features == 7


def test_unknown_names_and_incompatible_pairs_fail_with_the_choices():
    with pytest.raises(
        ValueError, match=r"unknown encoder 'cnn'; choose one of \['conformer', 'rnn'\]"
    ):
        builder.build_model({"name": "cnn"}, {"name": "pointwise"}, {"name": "ctc"}, 8, 7)
    with pytest.raises(ValueError, match=r"unknown decoder 'rnn'"):
        builder.build_model({"name": "rnn"}, {"name": "rnn"}, {"name": "ctc"}, 8, 7)
    with pytest.raises(
        ValueError,
        match=r"loss 'ctc' cannot train decoder 'transducer' \(joint=hat\): .*"
        r"This decoder trains with losses \['hat'\]",
    ):
        builder.build_model(
            {"name": "rnn"}, {"name": "transducer", "joint": "hat"}, {"name": "ctc"}, 8, 7
        )
    with pytest.raises(
        ValueError, match=r"loss 'ctc' cannot train decoder 'transducer' \(label.hidden=8\)"
    ):
        builder.build_model(
            {"name": "rnn"}, {"name": "transducer", "label": {"hidden": 8}}, {"name": "ctc"}, 8, 7
        )
    with pytest.raises(ValueError, match=r"encoder\.hiden: Key 'hiden' not in 'RNNEncoderConfig'"):
        builder.build_model(
            {"name": "rnn", "hiden": 3}, {"name": "pointwise"}, {"name": "ctc"}, 8, 7
        )
    with pytest.raises(ValueError, match=r"decoder\.joint: .*'hta'.*\[rnnt, hat, tdt\]"):
        builder.build_model(
            {"name": "rnn"}, {"name": "transducer", "joint": "hta"}, {"name": "hat"}, 8, 7
        )
    with pytest.raises(ValueError, match=r"loss\.num_samples: .*'four'"):
        builder.model_configs(
            {
                "encoder": {"name": "rnn"},
                "decoder": {"name": "pointwise"},
                "loss": {"name": "cb_mc", "num_samples": "four"},
            }
        )


def test_the_docs_builder_example_runs():
    """The Python example of docs/configuration.md."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    code = re.search(r"<!-- builder example -->\n```python\n(.*?)```", page, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/configuration.md", "exec"), namespace)
    model = namespace["model"]
    assert isinstance(model, TransducerModel) and model.criterion == "hat"
    assert model.encoder.output_dim == 320 and model.decoder.joint.name == "hat"


@pytest.mark.parametrize("group", ["encoder", "decoder", "loss"])
def test_the_constructors_defaults_are_the_schemas(group):
    """A model built in Python without an option gets the default a config gets (where the
    class's configs agree on it: CBModel's num_samples is 4 for REINFORCE, 16 for cb_mc)."""
    import dataclasses
    import inspect

    from cbasr.builder import DECODERS, ENCODERS, LOSSES, SCHEMAS

    classes = {"encoder": ENCODERS, "decoder": DECODERS}.get(group)
    by_class = {}  # class -> field -> the defaults its configs give
    for name, schema in SCHEMAS[group].items():
        cls = classes[name] if classes else LOSSES[name][0]
        for field in dataclasses.fields(schema):
            if field.default is not dataclasses.MISSING:
                by_class.setdefault(cls, {}).setdefault(field.name, set()).add(field.default)
    checked = 0
    for cls, fields in by_class.items():
        params = inspect.signature(cls.__init__).parameters
        for field, defaults in fields.items():
            if field in params and len(defaults) == 1:
                got, want = params[field].default, next(iter(defaults))
                assert got == want, (group, cls.__name__, field, got, want)
                checked += 1
    assert checked >= 5
