import pytest

from cbasr import builder
from cbasr.models import CTCModel


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
    with pytest.raises(TypeError, match="hiden"):
        builder.build_model(
            {"name": "rnn", "hiden": 3}, {"name": "pointwise"}, {"name": "ctc"}, 8, 7
        )
