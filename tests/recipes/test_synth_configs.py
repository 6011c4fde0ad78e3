"""Every pinned experiment of the synthetic recipe composes and builds its model."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from cbasr.builder import build_model
from cbasr.config import CONF_DIR, to_plain
from cbasr.config.schema import register_configs

RECIPE_CONF = Path(__file__).resolve().parents[2] / "recipes/synth/conf"


@pytest.mark.parametrize("name", sorted(p.stem for p in RECIPE_CONF.glob("*.yaml")))
def test_pinned_config_composes_and_builds(name):
    register_configs()
    with initialize_config_dir(str(RECIPE_CONF), version_base="1.3"):
        cfg = compose(name, overrides=[f"hydra.searchpath=[file://{CONF_DIR}]"])
    cfg = to_plain(cfg)
    assert cfg["exp_dir"] == f"exp/{name}"
    model = build_model(cfg["encoder"], cfg["decoder"], cfg["loss"], input_dim=80, vocab_size=50)
    assert sum(p.numel() for p in model.parameters()) > 0
