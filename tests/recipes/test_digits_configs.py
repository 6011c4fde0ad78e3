"""Every pinned system of the digits recipe composes, builds, reads word units, and keeps the
model settings of the synth recipe's system of the same name, except the changes the digits
measurements chose (CHANGES)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from cbasr.builder import build_model
from cbasr.config import CONF_DIR, to_plain
from cbasr.config.schema import register_configs

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SYSTEMS = [
    "blstm_ctc",
    "cb_attention_emission",
    "cb_mc_pointwise",
    "cb_monotonic",
    "cb_monotonic_variable",
    "cb_pointwise",
    "cb_reinforce_mbb",
    "demo_hat",
    "hat",
    "hat_standard",
    "hat_tanh",
    "rnnt",
    "rnnt_standard",
    "rnnt_v1",
    "tdt",
]
# What the digits recipe sets apart from the synth system it starts from (RESULTS.md).
CHANGES = {
    "hat": {("loss", "topology"): "monotonic", ("decoder", "blank_joint"): "linear"},
    "hat_tanh": {("loss", "topology"): "monotonic"},
    "demo_hat": {("loss", "topology"): "monotonic", ("decoder", "history_repeat"): 0.1},
    "rnnt": {
        ("loss", "topology"): "monotonic",
        ("loss", "ctc_weight"): 0.3,
        ("decoder", "history_noise"): 0.4,
        ("decoder", "history_repeat"): 0.1,
    },
    "rnnt_v1": {("loss", "topology"): "monotonic", ("loss", "ctc_weight"): 0.3},
    # no synth system: the RNN-T's, with the TDT joint and loss
    "tdt": {
        ("decoder", "joint"): "tdt",
        ("loss", "name"): "tdt",
        ("loss", "sigma"): 0.05,
        ("loss", "ctc_weight"): 0.3,
        ("decoder", "history_repeat"): 0.1,
    },
}
SYNTH_NAME = {
    "hat_standard": "hat",
    "hat_tanh": "hat",
    "rnnt_standard": "rnnt",
    "rnnt_v1": "rnnt",
    "tdt": "rnnt",
}


def _compose(recipe: str, name: str) -> dict:
    register_configs()
    with initialize_config_dir(str(RECIPES / recipe / "conf"), version_base="1.3"):
        cfg = compose(name, overrides=[f"hydra.searchpath=[file://{CONF_DIR}]"])
    return to_plain(cfg)


def test_the_systems():
    assert sorted(p.stem for p in (RECIPES / "digits/conf").glob("*.yaml")) == SYSTEMS


@pytest.mark.parametrize("name", SYSTEMS)
def test_pinned_config_composes_and_keeps_the_synth_model(name):
    cfg, synth = _compose("digits", name), _compose("synth", SYNTH_NAME.get(name, name))
    assert cfg["exp_dir"] == f"exp/{name}"
    for (group, key), value in CHANGES.get(name, {}).items():
        assert cfg[group][key] == value != synth[group].get(key), (group, key)
        synth[group][key] = value
    data = cfg["data"]
    assert (data["manifest_dir"], data["vocab"], data["units"]) == (
        "data/digits",
        "data/lang/words.txt",
        "words",
    )
    assert data["feature_dir"] == "data/fbank"
    for group in ("encoder", "decoder", "loss", "optim"):
        assert cfg[group] == synth[group], group
    assert data["spec_augment"] == synth["data"]["spec_augment"]
    assert {**cfg["trainer"], "max_epochs": None} == {**synth["trainer"], "max_epochs": None}
    assert cfg["trainer"]["max_epochs"] == 8
    model = build_model(cfg["encoder"], cfg["decoder"], cfg["loss"], input_dim=80, vocab_size=12)
    assert sum(p.numel() for p in model.parameters()) > 0
