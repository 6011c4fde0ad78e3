import re
from pathlib import Path

import pytest
import torch

from cbasr import builder
from cbasr.config.schema import (
    CTCLossConfig,
    PointwiseDecoderConfig,
    RNNEncoderConfig,
    TransducerDecoderConfig,
    TransducerLossConfig,
)
from cbasr.models import CTCModel, TransducerModel


def test_builds_from_typed_configs():
    model = builder.build_model(
        RNNEncoderConfig(hidden=6, num_layers=1, rnn_type="gru"),
        TransducerDecoderConfig(joint="hat", embed_dim=4, hidden=5, joint_dim=3),
        TransducerLossConfig(name="hat", max_symbols=2),
        input_dim=8,
        vocab_size=7,
    )
    assert isinstance(model, TransducerModel) and model.criterion == "hat"
    assert isinstance(model.encoder.rnn, torch.nn.GRU) and model.encoder.output_dim == 12
    assert model.decoder.joint.name == "hat" and model.decoder.joint.encoder_proj.out_features == 3
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


def test_the_readme_builder_example_runs():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = re.search(r"<!-- builder example -->\n```python\n(.*?)```", readme, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    model = namespace["model"]
    assert isinstance(model, TransducerModel) and model.criterion == "hat"
    assert model.encoder.output_dim == 320 and model.decoder.joint.name == "hat"
