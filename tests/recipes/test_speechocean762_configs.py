"""The speechocean762 recipe's systems compose, build, and share one encoder, data and budget:
the seed systems of the comparison, each a decoder and loss over the CTC system's encoder."""

import pytest

from cbasr.builder import build_model
from tests.recipes.test_digits_configs import RECIPES, _compose

SYSTEMS = {  # name: the recipe whose system of that name it is (its decoder and loss)
    "blstm_ctc": "synth",
    "cb_pointwise": "synth",
    "cb_monotonic": "synth",
    "cb_monotonic_variable": "synth",
    "cb_mc_pointwise": "synth",
    "cb_reinforce_mbb": "synth",
    "forced_suffix": "synth",
    "rnnt": "synth",
    "tdt": "digits",
    "hat": "synth",
}
# Where a system's loss departs from its seed's: the transducers add the CTC auxiliary loss,
# without which they stay all blank on this corpus.
LOSS_CHANGES = {"rnnt": {"ctc_weight": 0.3}, "hat": {"ctc_weight": 0.3}}
# The transducers, the monotonic CB systems and the sampled CB criteria start from the CTC
# system's encoder and train 10 epochs more.
FROM_CTC = {"init_from": "exp/blstm_ctc/checkpoints/best.pt", "init_skip": ["decoder.*"]}
FROM_CTC["max_epochs"] = 10
TRANSDUCER_FROM_CTC = {**FROM_CTC, "init_skip": ["decoder.*", "ctc_head.*"]}
TRAINER_CHANGES = {
    "rnnt": TRANSDUCER_FROM_CTC,
    "hat": TRANSDUCER_FROM_CTC,
    "tdt": TRANSDUCER_FROM_CTC,
    "cb_monotonic": FROM_CTC,
    "cb_monotonic_variable": FROM_CTC,
    "cb_mc_pointwise": FROM_CTC,
    "cb_reinforce_mbb": FROM_CTC,
}


def test_the_systems():
    assert sorted(p.stem for p in (RECIPES / "speechocean762/conf").glob("*.yaml")) == sorted(
        SYSTEMS
    )


@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_system_composes_builds_and_shares_the_ctc_systems_encoder_and_data(name):
    cfg, ctc = _compose("speechocean762", name), _compose("speechocean762", "blstm_ctc")
    assert cfg["exp_dir"] == f"exp/{name}"
    for group in ("encoder", "data", "optim"):
        assert cfg[group] == ctc[group], group
    assert cfg["trainer"] == {**ctc["trainer"], **TRAINER_CHANGES.get(name, {})}
    seed = _compose(SYSTEMS[name], name)
    if name == "tdt":  # the digits recipe's is for repeated digits
        seed["decoder"]["history_repeat"] = cfg["decoder"]["history_repeat"]
    changes = LOSS_CHANGES.get(name, {})
    assert all(seed["loss"][key] != value for key, value in changes.items())
    assert (cfg["decoder"], cfg["loss"]) == (seed["decoder"], {**seed["loss"], **changes})
    assert cfg["data"]["manifest_dir"] == "data/so762" and cfg["data"]["units"] == "phones"
    model = build_model(cfg["encoder"], cfg["decoder"], cfg["loss"], input_dim=80, vocab_size=40)
    assert sum(p.numel() for p in model.parameters()) > 4e6
