import json
import logging

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cbasr.cli.train import CONF_DIR
from cbasr.engines import trainer as trainer_module
from cbasr.engines.trainer import Trainer, train
from cbasr.models import CTCModel, LossOutput


def make_cfg(data, exp_dir, *overrides):
    """The composed ``conf/train.yaml`` for the tone corpus, with a tiny fast model."""
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[
            f"exp_dir={exp_dir}", f"data.manifest_dir={data / 'corpus'}", f"data.feature_dir={data / 'fbank'}",
            f"data.vocab={data / 'lang/phones.txt'}", "encoder.hidden=24", "encoder.num_layers=1",
            "data.max_frames=1200", "optim.lr=5e-3", "trainer.max_epochs=3", "trainer.progress_bar=false",
            *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def _params(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_training_learns_and_fills_the_experiment_dir(tone_data, tmp_path):
    exp = tmp_path / "exp"
    t = train(make_cfg(tone_data, exp, "trainer.max_epochs=12"), exp)
    history = json.loads((exp / "history.json").read_text())
    assert [h["epoch"] for h in history] == list(range(1, 13))
    assert history[-1]["valid_error_rate"] < 15.0 < history[0]["valid_error_rate"]
    assert history[-1]["train_loss"] < 0.5 * history[0]["train_loss"]
    for name in ("checkpoints/last.pt", "checkpoints/best.pt", "vocab.txt", "cmvn.json", "config.json",
                 "training_curves.png"):
        assert (exp / name).is_file(), name
    assert list((exp / "tensorboard").glob("events.out.tfevents.*"))
    assert t.state.best_error_rate == min(h["valid_error_rate"] for h in history)


class _Killed(Exception):
    pass


def test_interrupted_run_resumes_bit_for_bit(tone_data, tmp_path, monkeypatch):
    # dropout on, so the torch RNG state matters as much as the data position
    overrides = ("trainer.max_epochs=3", "encoder.dropout=0.3", "trainer.checkpoint_minutes=0")
    whole = train(make_cfg(tone_data, tmp_path / "a", *overrides), tmp_path / "a")

    real_step, calls = Trainer._step, {"n": 0}

    def step_then_die(self, batch):
        calls["n"] += 1
        if calls["n"] == 11:  # in the middle of the second epoch
            raise _Killed
        return real_step(self, batch)

    monkeypatch.setattr(Trainer, "_step", step_then_die)
    with pytest.raises(_Killed):
        train(make_cfg(tone_data, tmp_path / "b", *overrides), tmp_path / "b")
    monkeypatch.setattr(Trainer, "_step", real_step)
    resumed = train(make_cfg(tone_data, tmp_path / "b", *overrides), tmp_path / "b")
    assert resumed.state.step == whole.state.step
    for key, value in _params(whole.model).items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    a = json.loads((tmp_path / "a/history.json").read_text())
    b = json.loads((tmp_path / "b/history.json").read_text())
    assert [(h["train_loss"], h["valid_loss"]) for h in a] == [(h["train_loss"], h["valid_loss"]) for h in b]


def test_finished_run_is_a_no_op_and_a_changed_model_is_refused(tone_data, tmp_path, caplog):
    exp = tmp_path / "exp"
    train(make_cfg(tone_data, exp, "trainer.max_epochs=1"), exp)
    stamp = (exp / "checkpoints/last.pt").stat().st_mtime_ns
    with caplog.at_level(logging.INFO):
        train(make_cfg(tone_data, exp, "trainer.max_epochs=1"), exp)
    assert "nothing to do" in caplog.text and (exp / "checkpoints/last.pt").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match=r"different \['encoder'\]"):
        train(make_cfg(tone_data, exp, "trainer.max_epochs=2", "encoder.hidden=16"), exp)


def test_non_finite_losses_skip_steps_then_stop(tone_data, tmp_path, monkeypatch, caplog):
    real_loss, calls = CTCModel.loss, {"n": 0}

    def sometimes_inf(self, *batch):
        calls["n"] += 1
        out = real_loss(self, *batch)
        return LossOutput(out.loss + float("inf"), out.nll, {}) if calls["n"] == 2 else out

    monkeypatch.setattr(CTCModel, "loss", sometimes_inf)
    with caplog.at_level(logging.WARNING):
        t = train(make_cfg(tone_data, tmp_path / "a", "trainer.max_epochs=1"), tmp_path / "a")
    assert t.state.bad_steps == 1 and t.state.step == t.steps_per_epoch - 1
    assert "non-finite loss for ['" in caplog.text

    monkeypatch.setattr(CTCModel, "loss", lambda self, *batch: LossOutput(real_loss(self, *batch).loss * float("nan"),
                                                                           real_loss(self, *batch).nll, {}))
    monkeypatch.setattr(trainer_module, "MAX_BAD_STEPS_IN_A_ROW", 3)
    with pytest.raises(RuntimeError, match="3 steps in a row had a non-finite loss"):
        train(make_cfg(tone_data, tmp_path / "b", "trainer.max_epochs=1"), tmp_path / "b")
    assert (tmp_path / "b/checkpoints/last.pt").is_file()
