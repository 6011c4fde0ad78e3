"""The language model trains on the same loop as the acoustic model: what the loop gives one
task (mid-epoch resume bit for bit, early stopping, best.pt by the task's metric) it gives the
other; and a checkpoint of the first LM trainer's layout still resumes."""

import json
import math

import pytest
import torch
from hydra import compose, initialize_config_dir

from cbasr.config import CONF_DIR, plain, to_typed
from cbasr.config.lm_schema import register_lm_configs
from cbasr.storage.checkpoint import load_checkpoint, rng_state, save_checkpoint
from cbasr.training.lm_task import LmTask, lm_trainer, train_lm
from cbasr.training.trainer import Trainer


def make_lm_cfg(data, exp_dir, *overrides):
    register_lm_configs()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "train_lm",
            overrides=[
                f"exp_dir={exp_dir}",
                f"data.train={data / 'corpus/train.jsonl'}",
                f"data.valid={data / 'corpus/dev.jsonl'}",
                f"data.vocab={data / 'lang/phones.txt'}",
                "lm.embed_dim=8",
                "lm.hidden=16",
                "lm.num_layers=1",
                "lm.dropout=0.3",  # the RNG state matters as much as the data position
                "data.max_tokens=100",
                "optim.lr=0.01",
                "trainer.num_threads=1",
                "trainer.progress_bar=false",
                *overrides,
            ],
        )
    return to_typed(cfg)


class _Killed(Exception):
    pass


@pytest.mark.parametrize("shard_tokens", [10_000_000, 60])  # one shard, several
def test_a_killed_lm_run_resumes_mid_epoch_bit_for_bit(
    tone_data, tmp_path, monkeypatch, shard_tokens
):
    overrides = (
        "trainer.max_epochs=2",
        "trainer.checkpoint_minutes=0",
        f"data.shard_tokens={shard_tokens}",
    )
    whole = lm_trainer(make_lm_cfg(tone_data, tmp_path / "a", *overrides), tmp_path / "a")
    whole.fit()
    shards = len(whole.task.train_set.shards)
    assert shards == 1 if shard_tokens > 1000 else shards > 3
    steps = whole.steps_per_epoch
    assert steps > 4

    real_step, calls = Trainer.train_step, {"n": 0}

    def step_then_die(self, *args):
        calls["n"] += 1
        if calls["n"] == steps + 3:  # in the middle of the second epoch
            raise _Killed
        return real_step(self, *args)

    monkeypatch.setattr(Trainer, "train_step", step_then_die)
    with pytest.raises(_Killed):
        train_lm(make_lm_cfg(tone_data, tmp_path / "b", *overrides), tmp_path / "b")
    last = load_checkpoint(tmp_path / "b/checkpoints/last.pt")
    assert last["state"]["epoch"] == 1 and last["state"]["batch_in_epoch"] == 2  # mid-epoch
    monkeypatch.setattr(Trainer, "train_step", real_step)
    history = train_lm(make_lm_cfg(tone_data, tmp_path / "b", *overrides), tmp_path / "b")
    resumed = load_checkpoint(tmp_path / "b/checkpoints/last.pt")
    for key, value in whole.model.state_dict().items():
        assert torch.equal(value, resumed["model"][key]), key
    assert [h["valid_ppl"] for h in history] == [h["valid_ppl"] for h in whole.state.history]
    assert history[-1]["valid_ppl"] == pytest.approx(math.exp(history[-1]["valid_loss"]))


def test_lm_early_stopping_and_best_by_validation_perplexity(tone_data, tmp_path, monkeypatch):
    scripted = iter([3.0, 2.0, 2.5, 2.4, 2.2, 1.0])  # valid_loss: best at 2, then 3 worse ones

    def validate(self, model, autocast):
        loss = next(scripted)
        return {"valid_loss": loss, "valid_ppl": math.exp(loss)}

    monkeypatch.setattr(LmTask, "validate", validate)
    exp = tmp_path / "lm"
    history = train_lm(
        make_lm_cfg(tone_data, exp, "trainer.max_epochs=6", "trainer.early_stopping_patience=3"),
        exp,
    )
    assert [h["epoch"] for h in history] == [1, 2, 3, 4, 5]  # stopped after 3 without a better
    best = load_checkpoint(exp / "checkpoints/best.pt")
    assert best["state"]["best_epoch"] == 2 and best["state"]["epoch"] == 2
    assert best["tokens"][0] == "<blk>" and best["lm_config"]["hidden"] == 16


def test_a_first_layout_lm_checkpoint_resumes(tone_data, tmp_path):
    """The first LM trainer's checkpoint (epoch, history, no loop state) resumes after its
    epoch, keeping its history."""
    exp = tmp_path / "lm"
    cfg = make_lm_cfg(tone_data, exp, "trainer.max_epochs=1")
    trainer = lm_trainer(cfg, exp)
    trainer.fit()
    row = trainer.state.history[0]
    old_history = [{"epoch": 1, "train_ppl": row["train_ppl"], "valid_ppl": row["valid_ppl"]}]
    old = {
        "lm_config": plain(cfg)["lm"],
        "config": plain(cfg),
        "tokens": trainer.task.vocab.tokens,
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "epoch": 1,
        "history": old_history,
        "rng": rng_state(),
    }
    for path in (exp / "checkpoints").glob("*.pt"):
        path.unlink()
    save_checkpoint(exp / "checkpoints/last.pt", old)
    (exp / "history.json").write_text(json.dumps(old_history))
    history = train_lm(make_lm_cfg(tone_data, exp, "trainer.max_epochs=2"), exp)
    assert [h["epoch"] for h in history] == [1, 2]
    assert history[0]["valid_ppl"] == old_history[0]["valid_ppl"]
    assert history[0]["valid_loss"] == pytest.approx(math.log(old_history[0]["valid_ppl"]))
    assert json.loads((exp / "history.json").read_text())[0] == history[0]


def test_a_language_model_has_no_error_rate_to_pick_the_best_epoch(tone_data, tmp_path):
    exp = tmp_path / "lm"
    cfg = make_lm_cfg(tone_data, exp, "trainer.best_metric=valid_error_rate")
    with pytest.raises(ValueError, match=r"trainer.best_metric must be one of \('valid_loss',\)"):
        lm_trainer(cfg, exp)


def test_a_plain_config_from_python_is_typed_at_the_door(tone_data, tmp_path):
    exp = tmp_path / "lm"
    config = plain(make_lm_cfg(tone_data, exp, "trainer.max_epochs=1"))
    assert [h["epoch"] for h in train_lm(config, exp)] == [1]
    config["lm"]["hiden"] = 3
    with pytest.raises(ValueError, match="lm.hiden: Key 'hiden' not in 'LSTMLMConfig'"):
        lm_trainer(config, tmp_path / "other")
