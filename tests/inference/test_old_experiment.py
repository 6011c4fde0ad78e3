"""An experiment trained before ``decoder.label`` (its checkpoint's config and ``config.json``
with ``decoder.hidden``, ``decoder.context``...) loads as it did: the keys move into
``decoder.label`` when the config is read, with one log line, and the weights fit."""

import json
import logging

import torch

from cbasr import builder
from cbasr.inference.experiment import Experiment
from cbasr.storage.checkpoint import load_checkpoint, save_checkpoint
from cbasr.storage.files import write_json
from cbasr.training.asr_task import _settings
from tests.inference.fake_experiment import make_experiment


def flattened(cfg: dict) -> dict:
    """``cfg`` as written before ``decoder.label``: its entries at the decoder's top level."""
    decoder = {k: v for k, v in cfg["decoder"].items() if k != "label"}
    return {**cfg, "decoder": {**decoder, **cfg["decoder"]["label"]}, "trainer": {}}


def test_an_experiment_written_with_the_flat_keys_loads_and_says_so(tone_data, tmp_path, caplog):
    exp_dir = make_experiment(tmp_path / "exp", tone_data, "hat_context1", "hat")
    path = exp_dir / "checkpoints" / "best.pt"
    ckpt = load_checkpoint(path)
    today = {**ckpt["config"], "trainer": {}}
    old = flattened(today)
    assert old["decoder"]["context"] == 1 and "label" not in old["decoder"]
    save_checkpoint(path, {**ckpt, "config": old})
    write_json(exp_dir / "config.json", old)

    with caplog.at_level(logging.INFO, logger="cbasr.config.upgrade"):
        exp = Experiment(exp_dir)
    moved = [r.getMessage() for r in caplog.records if r.name == "cbasr.config.upgrade"]
    assert len(moved) == 1 and "decoder.context" in moved[0] and "decoder.label.context" in moved[0]
    assert exp.model.decoder.prediction.context == 1  # the window of one label, not an LSTM
    for name, value in ckpt["model"].items():
        torch.testing.assert_close(exp.model.state_dict()[name], value)

    # config.json read back, and the check a resumed run makes against its checkpoint
    from_json = builder.model_configs(json.loads((exp_dir / "config.json").read_text()))
    assert from_json == builder.model_configs(today)
    assert _settings(old) == _settings(today)
