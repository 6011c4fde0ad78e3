"""The LibriSpeech recipe's systems compose, build, and share one encoder, data and budget."""

import pytest

from cbasr.builder import build_model
from tests.recipes.test_digits_configs import RECIPES, _compose

SYSTEMS = ["conformer_cb", "conformer_ctc", "conformer_hat"]


def test_the_systems():
    assert sorted(p.stem for p in (RECIPES / "librispeech/conf").glob("*.yaml")) == SYSTEMS


@pytest.mark.parametrize("name", SYSTEMS)
def test_system_composes_builds_and_shares_the_ctc_systems_encoder_and_data(name):
    cfg, ctc = _compose("librispeech", name), _compose("librispeech", "conformer_ctc")
    assert cfg["exp_dir"] == f"exp/{name}"
    for group in ("encoder", "data", "optim", "trainer" if name != "conformer_hat" else "encoder"):
        assert cfg[group] == ctc[group], group
    assert (cfg["encoder"]["name"], cfg["encoder"]["num_layers"], cfg["encoder"]["d_model"]) == (
        "conformer",
        12,
        256,
    )
    assert cfg["data"]["units"] == "sp:data/lang/sp500.model"
    assert cfg["loss"]["name"] == {"conformer_ctc": "ctc", "conformer_cb": "cb_marginal"}.get(
        name, "hat"
    )
    if name == "conformer_hat":
        assert (cfg["loss"]["topology"], cfg["loss"]["prune_range"]) == ("monotonic", 5)
        assert cfg["trainer"]["valid_beam"] == 4
        label = cfg["decoder"]["label"]  # YAML's decoder: {label: {...}}
        assert (label["embed_dim"], label["hidden"], cfg["decoder"]["joint_dim"]) == (256, 320, 320)
    model = build_model(cfg["encoder"], cfg["decoder"], cfg["loss"], input_dim=80, vocab_size=501)
    assert 18e6 < sum(p.numel() for p in model.parameters()) < 20e6
