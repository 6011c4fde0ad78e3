"""The schemas' own checks (``__post_init__``): a bad value fails when the config is typed, as
cbasr-train types the composed config, and as the builder types a plain group (a checkpoint's),
naming the key; the value next to it that is allowed passes."""

import pytest
from hydra import compose, initialize_config_dir

from cbasr.builder import group_config
from cbasr.config import CONF_DIR, to_typed
from cbasr.config.schema import register_configs

TRANSDUCER_LOSS = [  # (loss group options, what the error says, allowed options beside them)
    ({"max_symbols": 0}, "loss.max_symbols must be >= 1, got 0", {"max_symbols": 1}),
    (
        {"prune_range": 1},
        r"loss.prune_range must be 0 \(no pruning\) or >= 2, got 1",
        {"prune_range": 2},
    ),
    ({"prune_range": -2}, "loss.prune_range must be 0", {"prune_range": 0}),
    (
        {"simple_loss_scale": -0.5},
        "loss.simple_loss_scale must be >= 0",
        {"simple_loss_scale": 0.0},
    ),
    ({"ctc_weight": -1.0}, "loss.ctc_weight must be >= 0, got -1.0", {"ctc_weight": 0.0}),
    ({"name": "tdt", "sigma": -0.1}, "loss.sigma must be >= 0", {"name": "tdt", "sigma": 0.05}),
    (
        {"fastemit_lambda": float("nan")},
        "loss.fastemit_lambda must be >= 0",
        {"fastemit_lambda": 0.1},
    ),
    (
        {"name": "tdt", "fastemit_lambda": 0.1},
        "fastemit_lambda applies to the rnnt and hat",
        {"name": "tdt"},
    ),
    (
        {"name": "tdt", "topology": "monotonic"},
        "loss.topology applies to the rnnt and hat",
        {"name": "rnnt", "topology": "monotonic"},
    ),
    (
        {"distill_weight": 0.5},
        "loss.distill_weight needs dual_mode",
        {"distill_weight": 0.5, "dual_mode": True},
    ),
    (
        {"dual_mode": True, "distill_weight": -1.0},
        "loss.distill_weight must be >= 0",
        {"dual_mode": True},
    ),
    (
        {"name": "tdt", "dual_mode": True},
        "loss.dual_mode trains the rnnt and hat losses, got 'tdt'",
        {"name": "hat", "dual_mode": True},
    ),
    (
        {"name": "hat", "align_restrict_left": -1},
        r"loss.align_restrict_left must be >= 0 \(null: off\)",
        {"name": "hat", "align_restrict_left": 0},
    ),
    (
        {"name": "rnnt", "align_restrict_left": 1},
        "applies to the hat loss on the standard topology .* got loss 'rnnt', topology 'standard'",
        {"name": "hat", "align_restrict_left": 1},
    ),
    (
        {"name": "hat", "topology": "monotonic", "align_restrict_left": 1},
        "topology 'monotonic'",
        {"name": "hat", "topology": "monotonic"},
    ),
]


@pytest.mark.parametrize(("options", "error", "allowed"), TRANSDUCER_LOSS)
def test_a_transducer_loss_value_is_checked_by_its_schema(options, error, allowed):
    with pytest.raises(ValueError, match=error):
        group_config("loss", {"name": "rnnt", **options})
    typed = group_config("loss", {"name": "rnnt", **allowed})
    assert all(getattr(typed, key) == value for key, value in allowed.items())


def test_the_composed_config_is_checked_when_typed():
    register_configs()
    overrides = ["exp_dir=x", "decoder=transducer", "loss=rnnt", "loss.prune_range=1"]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    with pytest.raises(ValueError, match="loss.prune_range must be 0"):
        to_typed(cfg)
