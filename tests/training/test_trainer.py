import json
import logging
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from cbasr.config import CONF_DIR, plain, to_typed
from cbasr.config.schema import register_configs
from cbasr.data.dataset import collate
from cbasr.evaluation.scoring import error_counts
from cbasr.models import CTCModel, LossOutput
from cbasr.search import BeamSearchOptions, beam_search
from cbasr.storage.checkpoint import load_checkpoint, save_checkpoint
from cbasr.training.asr_task import asr_trainer, train
from cbasr.training.trainer import Trainer


def make_cfg(data, exp_dir, *overrides):
    """The composed ``conf/train.yaml`` for the tone corpus, with a tiny fast model on one thread.

    One thread: on a shared 2-core machine two threads can run 10x slower (SYNTH_NOTES.md).
    """
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                f"exp_dir={exp_dir}",
                f"data.manifest_dir={data / 'corpus'}",
                f"data.feature_dir={data / 'fbank'}",
                f"data.vocab={data / 'lang/phones.txt'}",
                "encoder.hidden=24",
                "encoder.num_layers=1",
                "data.max_frames=1200",
                "optim.lr=5e-3",
                "trainer.max_epochs=3",
                "trainer.progress_bar=false",
                "trainer.num_threads=1",
                *overrides,
            ],
        )
    return to_typed(cfg)


def _params(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_training_learns_and_fills_the_experiment_dir(tone_data, tmp_path):
    exp = tmp_path / "exp"
    t = train(make_cfg(tone_data, exp, "trainer.max_epochs=12"), exp)
    history = json.loads((exp / "history.json").read_text())
    assert [h["epoch"] for h in history] == list(range(1, 13))
    assert history[-1]["valid_error_rate"] < 15.0 < history[0]["valid_error_rate"]
    assert history[-1]["train_loss"] < 0.5 * history[0]["train_loss"]
    for name in (
        "checkpoints/last.pt",
        "checkpoints/best.pt",
        "vocab.txt",
        "cmvn.json",
        "config.json",
        "training_curves.png",
    ):
        assert (exp / name).is_file(), name
    assert list((exp / "tensorboard").glob("events.out.tfevents.*"))
    assert t.state.best_metrics["valid_error_rate"] == min(h["valid_error_rate"] for h in history)
    assert set(t.state.best_metrics) == {"valid_error_rate", "valid_loss"}  # the task's metrics


class _Killed(Exception):
    pass


def test_interrupted_run_resumes_bit_for_bit(tone_data, tmp_path, monkeypatch):
    # dropout on, so the torch RNG state matters as much as the data position
    overrides = ("trainer.max_epochs=3", "encoder.dropout=0.3", "trainer.checkpoint_minutes=0")
    whole = train(make_cfg(tone_data, tmp_path / "a", *overrides), tmp_path / "a")

    real_step, calls = Trainer.train_step, {"n": 0}

    def step_then_die(self, *args):
        calls["n"] += 1
        if calls["n"] == 11:  # in the middle of the second epoch
            raise _Killed
        return real_step(self, *args)

    monkeypatch.setattr(Trainer, "train_step", step_then_die)
    with pytest.raises(_Killed):
        train(make_cfg(tone_data, tmp_path / "b", *overrides), tmp_path / "b")
    monkeypatch.setattr(Trainer, "train_step", real_step)
    resumed = train(make_cfg(tone_data, tmp_path / "b", *overrides), tmp_path / "b")
    assert resumed.state.step == whole.state.step
    for key, value in _params(whole.model).items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    a = json.loads((tmp_path / "a/history.json").read_text())
    b = json.loads((tmp_path / "b/history.json").read_text())
    assert [(h["train_loss"], h["valid_loss"]) for h in a] == [
        (h["train_loss"], h["valid_loss"]) for h in b
    ]


def test_finished_run_is_a_no_op_and_a_changed_model_is_refused(tone_data, tmp_path, caplog):
    exp = tmp_path / "exp"
    train(make_cfg(tone_data, exp, "trainer.max_epochs=1"), exp)
    stamp = (exp / "checkpoints/last.pt").stat().st_mtime_ns
    with caplog.at_level(logging.INFO):
        train(make_cfg(tone_data, exp, "trainer.max_epochs=1"), exp)
    assert (
        "nothing to do" in caplog.text and (exp / "checkpoints/last.pt").stat().st_mtime_ns == stamp
    )
    with pytest.raises(ValueError, match=r"different \['encoder'\]"):
        train(make_cfg(tone_data, exp, "trainer.max_epochs=2", "encoder.hidden=16"), exp)


def test_a_resumed_run_refuses_another_model_but_not_an_older_configs_defaults(
    tone_data, tmp_path, caplog
):
    exp = tmp_path / "exp"
    train(make_cfg(tone_data, exp, "trainer.max_epochs=1"), exp)
    with pytest.raises(ValueError, match=r"holds a run with different \['encoder'\]"):
        asr_trainer(
            make_cfg(tone_data, exp, "trainer.max_epochs=2", "encoder.hidden=16"), exp
        ).fit()
    # A checkpoint written before the schema had some of today's entries: they take the
    # defaults, so nothing changed; one holding a trainer option since removed resumes too.
    last = exp / "checkpoints/last.pt"
    ckpt = load_checkpoint(last)
    del ckpt["config"]["encoder"]["rnn_type"], ckpt["config"]["data"]["max_utts"]
    ckpt["config"]["trainer"]["emit_bias_init"] = "label_rate"
    ckpt["config"]["trainer"]["max_long_gap_share"] = 0.5
    ckpt["config"]["optim"]["weight_noise_start"] = 0
    torch.save(ckpt, last)
    with caplog.at_level(logging.WARNING, logger="cbasr.training.trainer"):
        t = train(make_cfg(tone_data, exp, "trainer.max_epochs=2", "trainer.seed=7"), exp)
    assert t.state.epoch == 2
    assert "['trainer.seed'] changed since the checkpoint" in caplog.text


def test_resume_falls_back_to_the_newest_checkpoint_that_loads(tone_data, tmp_path, caplog):
    """A truncated last.pt: resume from the newest epoch file, naming the skipped one; a deleted
    last.pt: the same, never a silent restart over the earlier run."""
    exp = tmp_path / "exp"
    train(make_cfg(tone_data, exp, "trainer.max_epochs=2"), exp)
    history = json.loads((exp / "history.json").read_text())
    (exp / "checkpoints/last.pt").write_bytes(b"")  # truncated to zero bytes
    with caplog.at_level(logging.INFO):
        t = train(make_cfg(tone_data, exp, "trainer.max_epochs=2"), exp)
    assert "skipped checkpoints that do not load: last.pt (" in caplog.text
    assert "resuming from epoch-2.pt" in caplog.text and "nothing to do" in caplog.text
    assert t.state.epoch == 2 and t.state.history == history
    (exp / "checkpoints/last.pt").unlink()
    (exp / "checkpoints/epoch-2.pt").write_bytes(b"not a checkpoint")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        t = train(make_cfg(tone_data, exp, "trainer.max_epochs=2"), exp)
    assert "epoch-2.pt (" in caplog.text and "resuming from epoch-1.pt" in caplog.text
    assert t.state.epoch == 2 and t.state.history[:1] == history[:1]  # epoch 2 trained again


def test_a_truncated_best_pt_harms_neither_resume_nor_the_next_best(tone_data, tmp_path):
    """last.pt still loads: the run resumes from it; the next better epoch rewrites best.pt
    whole; decoding the truncated best.pt meanwhile fails naming the file."""
    from cbasr.inference.experiment import Experiment
    from cbasr.storage.checkpoint import load_checkpoint

    exp = tmp_path / "exp"
    by_loss = "trainer.best_metric=valid_loss"
    train(make_cfg(tone_data, exp, "trainer.max_epochs=1", by_loss), exp)
    best = exp / "checkpoints/best.pt"
    best.write_bytes(best.read_bytes()[: best.stat().st_size // 2])
    with pytest.raises(RuntimeError, match="best.pt"):
        Experiment(exp, "best")
    t = train(make_cfg(tone_data, exp, "trainer.max_epochs=4", by_loss), exp)
    assert t.state.epoch == 4 and len(t.state.history) == 4
    best_epoch = min(t.state.history, key=lambda h: h["valid_loss"])["epoch"]
    assert best_epoch > 1  # a later epoch was better and rewrote best.pt
    assert load_checkpoint(best, "cpu")["state"]["epoch"] == best_epoch
    assert Experiment(exp, "best").epoch == best_epoch


def test_a_fresh_start_over_an_earlier_run_needs_resume_never(tone_data, tmp_path, caplog):
    exp = tmp_path / "exp"
    train(make_cfg(tone_data, exp, "trainer.max_epochs=1"), exp)
    for path in (exp / "checkpoints").glob("*.pt"):
        path.write_bytes(b"")
    with pytest.raises(
        RuntimeError, match=r"holds an earlier run \(.*history.json\) but none of its"
    ):
        train(make_cfg(tone_data, exp, "trainer.max_epochs=1"), exp)
    with caplog.at_level(logging.WARNING):
        t = train(make_cfg(tone_data, exp, "trainer.max_epochs=1", "trainer.resume=never"), exp)
    assert "trainer.resume=never: removing the earlier run's" in caplog.text
    assert t.state.epoch == 1 and len(json.loads((exp / "history.json").read_text())) == 1
    assert load_checkpoint(exp / "checkpoints/last.pt")["state"]["epoch"] == 1


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

    monkeypatch.setattr(
        CTCModel,
        "loss",
        lambda self, *batch: LossOutput(
            real_loss(self, *batch).loss * float("nan"), real_loss(self, *batch).nll, {}
        ),
    )
    with pytest.raises(RuntimeError, match="3 steps in a row had a non-finite loss"):
        train(
            make_cfg(tone_data, tmp_path / "b", "trainer.max_epochs=1", "trainer.max_bad_steps=3"),
            tmp_path / "b",
        )
    assert (tmp_path / "b/checkpoints/last.pt").is_file()


def test_a_non_finite_loss_after_the_backward_keeps_the_loss_scale(
    tone_data, tmp_path, monkeypatch, caplog
):
    """One process finds a non-finite loss in its one read after the backward: the step is
    skipped with the parameters unchanged, fp16's loss scale kept (no gradient overflowed) and
    the scaler ready for the next step, which trains."""
    t = asr_trainer(make_cfg(tone_data, tmp_path / "a"), tmp_path / "a")
    t.initialise()
    t.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)  # fp16's (on CUDA only)
    batches = t.task.epoch_batches(0)[:2]
    real_loss = CTCModel.loss

    def nan(self, *b):  # the second utterance's loss
        out = real_loss(self, *b)
        second = torch.arange(len(out.loss)) == 1
        return LossOutput(torch.where(second, math.nan, out.loss), out.nll, {})

    before = {k: p.detach().clone() for k, p in t.model.named_parameters()}
    results = []
    for i, (batch, indices) in enumerate(zip(t.loader(batches), batches)):
        monkeypatch.setattr(CTCModel, "loss", nan if i == 0 else real_loss)
        with caplog.at_level(logging.WARNING):
            results.append(t.train_step(batch, t.task.batch_size(indices)[0]))
        if i == 0:
            first_ids = batch.ids
            assert all(torch.equal(p, before[k]) for k, p in t.model.named_parameters())
    assert results[0].nll is None and t.scaler.get_scale() == 1024.0
    assert f"non-finite loss for ['{first_ids[1]}']; skipping the step" in caplog.text
    assert results[1].nll is not None and math.isfinite(results[1].grad_norm)
    assert not all(torch.equal(p, before[k]) for k, p in t.model.named_parameters())


def test_a_batch_without_a_readable_utterance_is_a_skipped_step(tone_data, tmp_path, caplog):
    """One process: an empty batch (every utterance skipped by the loader) logs and skips the
    step, with no forward, backward or read."""
    t = asr_trainer(make_cfg(tone_data, tmp_path / "a"), tmp_path / "a")
    t.initialise()
    batches = t.task.epoch_batches(0)[:1]
    batch = next(iter(t.loader(batches)))
    empty = collate([])
    assert not empty.ids and batch.ids
    with caplog.at_level(logging.WARNING):
        result = t.train_step(empty, 10, want_save=True)
    assert result.nll is None and result.save is True
    assert "no readable utterance in this shard; skipping the step" in caplog.text
    assert t.train_step(batch, t.task.batch_size(batches[0])[0]).nll is not None


def test_several_processes_agree_on_a_skip_before_the_backward(
    tone_data, tmp_path, monkeypatch, caplog
):
    """With several processes, the NLL sum, a save and a skip are agreed before DDP's backward:
    the other processes' values come from a stand-in for the all-reduce."""
    from cbasr.training import distributed
    from cbasr.training.task import TaskOutput

    t = asr_trainer(make_cfg(tone_data, tmp_path / "a"), tmp_path / "a")
    others = {"values": [0.0, 0.0, 0.0]}  # the other process's (bad, nll, save)

    def all_reduce_sum(values, ctx, device):
        return [a + b for a, b in zip(values, others["values"], strict=True)]

    monkeypatch.setattr(distributed, "all_reduce_sum", all_reduce_sum)
    losses = torch.tensor([1.0, 2.0])
    good = TaskOutput(losses, losses, ["a", "b"])
    bad = TaskOutput(torch.tensor([1.0, math.inf]), losses, ["a", "b"])

    def agree(out, want_save, other=(0.0, 0.0, 0.0)):
        others["values"] = list(other)
        return t._agree_before_backward(out, want_save)

    agreed = agree(good, False, (0.0, 5.0, 0.0))
    assert agreed.nll == 8.0 and agreed.save is False
    assert agree(good, False, (0.0, 0.0, 1.0)).save is True  # the other process's save
    assert agree(good, True).save is True
    with caplog.at_level(logging.WARNING):
        skipped = agree(bad, False)
        assert skipped.nll is None and skipped.save is False
        assert "non-finite loss for ['b']; skipping the step" in caplog.text
        assert agree(good, True, (1.0, 0.0, 0.0)).nll is None  # the other process's bad shard
        assert "no readable utterance" not in caplog.text
        skipped = agree(None, True)
        assert skipped.nll is None and skipped.save is True
        assert "no readable utterance in this shard; skipping the step" in caplog.text


def test_cb_model_trains_and_logs_the_emission_rate(tone_data, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    real_step, results = Trainer.train_step, []

    def recorded(self, *args):
        results.append(real_step(self, *args))
        return results[-1]

    monkeypatch.setattr(Trainer, "train_step", recorded)
    exp = tmp_path / "cb"
    t = train(
        make_cfg(tone_data, exp, "loss=cb_marginal", "trainer.max_epochs=2", "trainer.log_every=5"),
        exp,
    )
    history = json.loads((exp / "history.json").read_text())
    assert history[-1]["train_loss"] < history[0]["train_loss"] and t.state.bad_steps == 0
    events = EventAccumulator(str(exp / "tensorboard"))
    events.Reload()
    assert {"train/emission_rate", "train/label_rate"} <= set(events.Tags()["scalars"])
    # the model's 0-d tensors, read by the step with the gradient norm: floats
    stats = [r.stats for r in results]
    assert stats and all(set(s) == {"emission_rate", "label_rate"} for s in stats)
    assert all(type(v) is float and 0 < v < 1 for s in stats for v in s.values())


# --- resume after a real kill ---------------------------------------------------------------
BIN = Path(sys.executable).parent
# Everything that draws random numbers, so the test sees whether every RNG state is restored.
RANDOM_EVERYTHING = (
    "encoder.dropout=0.3",
    "data.spec_augment.freq_masks=2",
    "data.spec_augment.freq_mask_width=8",
    "data.spec_augment.time_masks=2",
    "data.speed_perturb=[0.9,1.0,1.1]",
    "optim.weight_noise=0.01",
)


def _overrides(data, exp_dir, *overrides) -> list[str]:
    return [
        f"exp_dir={exp_dir}",
        f"data.manifest_dir={data / 'corpus'}",
        f"data.feature_dir={data / 'fbank'}",
        f"data.vocab={data / 'lang/phones.txt'}",
        "encoder.hidden=24",
        "encoder.num_layers=1",
        "data.max_frames=1200",
        "optim.lr=5e-3",
        "trainer.progress_bar=false",
        "trainer.num_threads=1",
        *overrides,
    ]


def run_cli(data, exp_dir, *overrides, env=None, launcher=()) -> subprocess.CompletedProcess:
    """``cbasr-train`` as a user runs it, in a process of its own (``launcher``: e.g. torchrun)."""
    cmd = [*launcher, str(BIN / "cbasr-train"), *_overrides(data, exp_dir, *overrides)]
    return subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=300
    )


def test_sigkilled_run_resumes_bit_for_bit(tone_data, tmp_path):
    overrides = ("trainer.max_epochs=2", "trainer.checkpoint_every_steps=3", *RANDOM_EVERYTHING)
    whole = train(make_cfg(tone_data, tmp_path / "whole", *overrides), tmp_path / "whole")
    assert whole.steps_per_epoch == 8 and whole.state.step == 16

    # Checkpoints: step 3, step 6, end of epoch 1 (step 8), step 9, then SIGKILL halfway through
    # writing the one of step 12, in the middle of epoch 2.
    exp = tmp_path / "killed"
    run = run_cli(tone_data, exp, *overrides, env={"CBASR_FAULT_INJECTION": "kill-in-checkpoint:5"})
    assert run.returncode == -signal.SIGKILL, run.stderr[-3000:]
    assert len(list((exp / "checkpoints").glob(".last.pt.*.tmp"))) == 1  # the unfinished write
    last = load_checkpoint(exp / "checkpoints/last.pt")
    assert (last["state"]["step"], last["state"]["epoch"], last["state"]["batch_in_epoch"]) == (
        9,
        1,
        1,
    )

    run = run_cli(tone_data, exp, *overrides)  # the same command again
    assert run.returncode == 0, run.stderr[-3000:]
    assert "resumed from" in run.stdout and not list((exp / "checkpoints").glob(".*.tmp"))
    resumed = load_checkpoint(exp / "checkpoints/last.pt")
    assert resumed["state"]["step"] == whole.state.step
    for key, value in whole.model.state_dict().items():
        assert torch.equal(value, resumed["model"][key]), key
    for key in ("train_loss", "valid_loss", "valid_error_rate"):
        assert [h[key] for h in whole.state.history] == [
            h[key] for h in resumed["state"]["history"]
        ], key


@pytest.mark.slow
def test_runs_killed_at_random_moments_resume_bit_for_bit(tone_data, tmp_path):
    """SIGKILL from outside, at arbitrary times (mid-step, mid-write, mid-validation), until a run finishes."""
    import random

    overrides = ("trainer.max_epochs=12", "trainer.checkpoint_every_steps=2", *RANDOM_EVERYTHING)
    whole = train(make_cfg(tone_data, tmp_path / "whole", *overrides), tmp_path / "whole")
    exp, rng, kills = tmp_path / "killed", random.Random(0), 0
    cmd = [str(BIN / "cbasr-train"), *_overrides(tone_data, exp, *overrides)]
    while True:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:  # start-up takes about 3 s, the whole run about 10 s
            proc.wait(timeout=rng.uniform(2.0, 5.0) if kills < 20 else None)
            break
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
    assert proc.returncode == 0 and kills >= 1
    resumed = load_checkpoint(exp / "checkpoints/last.pt")
    for key, value in whole.model.state_dict().items():
        assert torch.equal(value, resumed["model"][key]), key


# --- schedules, early stopping, best and kept checkpoints -------------------------------------
def test_plateau_early_stopping_best_and_kept_checkpoints(tone_data, tmp_path, monkeypatch):
    # scripted validations: the loss is best at epoch 4, the error rate at epoch 6
    losses, errors = [3.0, 2.0, 2.5, 1.5, 1.6, 1.7], [10.0, 20.0, 5.0, 30.0, 4.0, 3.0]
    scripted = iter([{"valid_loss": v, "valid_error_rate": e} for v, e in zip(losses, errors)])
    monkeypatch.setattr(Trainer, "validate", lambda self: next(scripted))
    exp = tmp_path / "exp"
    overrides = (
        "data.max_frames=4000",
        "trainer.max_epochs=10",
        "trainer.best_metric=valid_loss",
        "optim.scheduler=constant",
        "optim.lr=1e-3",
        "optim.plateau_factor=0.5",
        "optim.plateau_patience=1",
        "trainer.early_stopping_patience=2",
        "trainer.keep_checkpoints=1",
    )
    t = train(make_cfg(tone_data, exp, *overrides), exp)
    assert t.state.stopped_early and t.state.epoch == 6 and t.state.best_epoch == 4
    # lr at each epoch's end, before its validation: halved after epochs 3, 5 and 6
    assert [h["lr"] for h in t.state.history] == pytest.approx(
        [1e-3, 1e-3, 1e-3, 5e-4, 5e-4, 2.5e-4]
    )
    assert t.schedule.get_last_lr() == pytest.approx([1.25e-4])
    assert load_checkpoint(exp / "checkpoints/best.pt")["state"]["epoch"] == 4
    assert sorted(p.name for p in (exp / "checkpoints").glob("epoch-*.pt")) == [
        "epoch-4.pt",
        "epoch-6.pt",
    ]
    assert load_checkpoint(exp / "checkpoints/last.pt")["state"]["epoch"] == 6
    rerun = train(make_cfg(tone_data, exp, *overrides), exp)  # stopped early: nothing left to do
    assert rerun.state.epoch == 6


def test_options_are_checked_at_start(tone_data, tmp_path):
    """Composition rejects a misspelt choice (tests/config); a config handed to the trainer as a
    plain dict (from Python, or an old config.json) is checked again when it starts."""
    with pytest.raises(ValueError, match="trainer.precision=fp16 needs a CUDA device"):
        asr_trainer(
            make_cfg(tone_data, tmp_path / "exp", "trainer.device=cpu", "trainer.precision=fp16"),
            tmp_path / "exp",
        )
    for group, key, value, message in (
        ("trainer", "precision", "fp8", r"trainer.precision: Invalid value 'fp8', expected one of"),
        ("trainer", "best_metric", "wer", "trainer.best_metric: Invalid value 'wer'"),
        ("trainer", "max_epochs", "ten", "trainer.max_epochs: Value 'ten' of type 'str' could not"),
        ("trainer", "max_epoch", 3, "trainer.max_epoch: Key 'max_epoch' not in 'TrainerConfig'"),
        (
            "data",
            "features",
            "mp3",
            r"data.features: Invalid value 'mp3', expected one of \[cached",
        ),
        ("data", "max_frames", "many", "data.max_frames: Value 'many' of type 'str' could not"),
        ("encoder", "rnn_type", "lsmt", r"encoder.rnn_type: Invalid value 'lsmt'.*\[lstm, gru\]"),
        ("decoder", "hiden", 3, "decoder.hiden: Key 'hiden' not in 'PointwiseDecoderConfig'"),
        ("loss", "name", "cbb", r"unknown loss 'cbb'; choose one of \['cb_marginal'"),
        ("optim", "name", "lion", "optim.name: Invalid value 'lion', expected one of"),
        ("optim", "scheduler", "step", "optim.scheduler: Invalid value 'step'"),
    ):
        cfg = plain(make_cfg(tone_data, tmp_path / "exp", "trainer.device=cpu"))
        cfg[group][key] = value
        with pytest.raises(ValueError, match=message):
            asr_trainer(cfg, tmp_path / "exp")


def test_bf16_autocast_on_cpu(tone_data, tmp_path, monkeypatch):
    real_loss, seen = CTCModel.loss, []

    def recording(self, *batch):
        seen.append(
            torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        )
        return real_loss(self, *batch)

    monkeypatch.setattr(CTCModel, "loss", recording)
    t = train(
        make_cfg(tone_data, tmp_path / "exp", "trainer.max_epochs=1", "trainer.precision=bf16"),
        tmp_path / "exp",
    )
    assert (
        seen
        and all(seen)
        and t.state.bad_steps == 0
        and math.isfinite(t.state.history[0]["train_loss"])
    )


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_on_cuda_trains_and_resumes(tone_data, tmp_path, precision):
    overrides = ("trainer.device=cuda", f"trainer.precision={precision}")
    t = train(
        make_cfg(tone_data, tmp_path / "exp", "trainer.max_epochs=1", *overrides), tmp_path / "exp"
    )
    assert t.state.step > 0 and math.isfinite(t.state.history[0]["train_loss"])
    ckpt = load_checkpoint(tmp_path / "exp/checkpoints/last.pt")
    if precision == "fp16":
        assert ckpt["scaler"]["scale"] > 0  # the gradient scaler's state is checkpointed
    t = train(
        make_cfg(tone_data, tmp_path / "exp", "trainer.max_epochs=2", *overrides), tmp_path / "exp"
    )
    assert t.state.epoch == 2 and t.scaler.is_enabled() == (precision == "fp16")


def test_augmentation_is_for_training_only(tone_data, tmp_path):
    plain = asr_trainer(make_cfg(tone_data, tmp_path / "a"), tmp_path / "a")
    augmented = asr_trainer(
        make_cfg(
            tone_data,
            tmp_path / "b",
            "data.spec_augment.time_masks=2",
            "data.spec_augment.freq_masks=2",
            "data.speed_perturb=[0.9,1.1]",
        ),
        tmp_path / "b",
    )
    assert (
        augmented.task.valid_set.augmentation is None
        and augmented.task.train_set.augmentation.masks
    )
    assert (
        augmented.validate() == plain.validate()
    )  # the same initial model sees the same validation data
    assert not torch.equal(augmented.task.train_set[0][1], plain.task.train_set[0][1])


def test_on_the_fly_features_with_speed_perturbation_train(tone_data, tmp_path):
    exp = tmp_path / "exp"
    t = train(
        make_cfg(
            tone_data,
            exp,
            "trainer.max_epochs=2",
            "data.features=on_the_fly",
            "data.speed_perturb=[0.9,1.0,1.1]",
            "data.num_workers=1",
        ),
        exp,
    )
    assert t.task.train_set.store is None and t.state.bad_steps == 0
    assert t.state.history[-1]["train_loss"] < t.state.history[0]["train_loss"]


def test_utterance_mean_norm_reaches_training_validation_and_decoding_alike(tone_data, tmp_path):
    """data.mean_norm=utterance: the training and validation items and the decoders' features
    (Experiment.normalise, the Recognizer's, the export's description) all subtract each
    utterance's own mean after the train split's CMVN."""
    from cbasr import Recognizer
    from cbasr.inference.experiment import Experiment
    from cbasr.inference.export import export_model

    exp = tmp_path / "exp"
    t = train(make_cfg(tone_data, exp, "trainer.max_epochs=1", "data.mean_norm=utterance"), exp)
    assert t.task.train_set.utterance_mean and t.task.valid_set.utterance_mean
    valid = t.task.valid_set
    utt_id, feats, _ = valid[0]
    assert feats.mean(dim=0).abs().max() < 1e-5
    stored = valid.store[utt_id]
    torch.testing.assert_close(Experiment(exp).normalise(stored), feats)
    recognizer = Recognizer.from_pretrained(exp)
    assert recognizer.features.utterance_mean
    wav = next(p for p in (tone_data / "corpus").rglob("*.wav") if utt_id in p.name)
    torch.testing.assert_close(recognizer.features_of(wav), feats, atol=1e-3, rtol=0)
    description = export_model(Experiment(exp), "torchscript", tmp_path / "model.pt")
    assert description["cmvn"]["utterance_mean"] is True


# --- what TensorBoard and the history show ----------------------------------------------------
def _scalars(exp):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(exp / "tensorboard"))
    events.Reload()
    return events


def test_tensorboard_shows_losses_rates_and_throughput(tone_data, tmp_path):
    exp = tmp_path / "exp"
    train(make_cfg(tone_data, exp, "trainer.max_epochs=1", "trainer.log_every=2"), exp)
    tags = set(_scalars(exp).Tags()["scalars"])
    assert {
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/bad_steps",
        "perf/frames_per_second",
        "perf/data_fraction",
        "epoch/train_loss",
        "epoch/valid_loss",
        "epoch/valid_error_rate",
    } <= tags
    history = json.loads((exp / "history.json").read_text())[0]
    assert history["frames_per_second"] > 0 and 0 <= history["data_fraction"] <= 1


def test_cb_emission_rate_against_the_label_rate(tone_data, tmp_path):
    exp = tmp_path / "cb"
    train(
        make_cfg(tone_data, exp, "loss=cb_marginal", "trainer.max_epochs=1", "trainer.log_every=2"),
        exp,
    )
    events = _scalars(exp)
    assert {
        "train/emission_rate",
        "train/label_rate",
        "epoch/valid_emission_rate",
        "epoch/valid_label_rate",
    } <= set(events.Tags()["scalars"])
    layout = (
        events.Tensors("custom_scalars__config__")
        if "custom_scalars__config__" in events.Tags()["tensors"]
        else None
    )
    assert layout, "no custom-scalars layout"
    history = json.loads((exp / "history.json").read_text())[0]
    assert 0 < history["valid_emission_rate"] < 1 and 0 < history["valid_label_rate"] < 1


def test_weight_noise_changes_training(tone_data, tmp_path):
    def final(name, *overrides):
        t = train(
            make_cfg(tone_data, tmp_path / name, "trainer.max_epochs=1", *overrides),
            tmp_path / name,
        )
        return t.model.state_dict()

    clean = final("clean")
    noisy = final("noisy", "optim.weight_noise=0.05")
    assert not torch.equal(clean["encoder.rnn.weight_ih_l0"], noisy["encoder.rnn.weight_ih_l0"])
    # the noise is gone after each step: biases, never perturbed, differ only through the noisy gradients
    assert (clean["decoder.net.0.weight"] - noisy["decoder.net.0.weight"]).abs().max() < 0.05


def test_text_input_trains_a_cb_model_on_source_tokens(tmp_path):
    """Gigaword-style text-to-text: source ids from the token store, no CMVN, the embedding front end."""
    from cbasr.cli import features, vocab
    from cbasr.corpora.gigaword import prepare_gigaword
    from tests.corpora.fake_gigaword import make_fake_gigaword

    make_fake_gigaword(tmp_path / "giga")
    prepare_gigaword(tmp_path / "giga", tmp_path / "data", strict=False)
    features.main(
        [
            "--manifest-dir",
            str(tmp_path / "data"),
            "--out",
            str(tmp_path / "src"),
            "--splits",
            "train",
            "dev",
            "--source-units",
            "words",
            "--workers",
            "0",
        ]
    )
    vocab.main(
        [
            "--manifest",
            str(tmp_path / "data" / "train.jsonl"),
            "--units",
            "words",
            "--out",
            str(tmp_path / "lang" / "words.txt"),
        ]
    )
    exp = tmp_path / "exp"
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                f"exp_dir={exp}",
                f"data.manifest_dir={tmp_path / 'data'}",
                f"data.feature_dir={tmp_path / 'src'}",
                f"data.vocab={tmp_path / 'lang' / 'words.txt'}",
                "data.units=words",
                "encoder=text_blstm",
                "encoder.hidden=16",
                "encoder.num_layers=1",
                "encoder.embedding_dim=8",
                "loss=cb_marginal",
                "trainer.max_epochs=25",
                "optim.lr=2e-2",
                "trainer.progress_bar=false",
                "trainer.num_threads=1",
                "trainer.keep_checkpoints=1",
            ],
        )
    t = train(to_typed(cfg), exp)
    history = json.loads((exp / "history.json").read_text())
    assert (exp / "source_vocab.txt").is_file() and not (exp / "cmvn.json").exists()
    assert t.model.encoder.subsampling.embedding.num_embeddings == len(
        (tmp_path / "src/source_vocab.txt").read_text().split()
    )
    assert len(t.task.train_set) == 3 and history[-1]["train_loss"] < 0.7 * history[0]["train_loss"]


def test_validation_by_a_beam_search(tone_data, tmp_path):
    """trainer.valid_beam=N: the validation error rate is the beam search's (recomputed here
    from cbasr.search.beam_search over the validation split), not the greedy search's."""
    rates = {}
    for beam in (0, 3):
        overrides = ["decoder=hat", "loss=hat", f"trainer.valid_beam={beam}"]
        trainer = asr_trainer(
            make_cfg(tone_data, tmp_path / str(beam), *overrides), tmp_path / str(beam)
        )
        with torch.no_grad():  # a random HAT model that emits: the blank unit's bias down
            trainer.model.decoder.joint.out[-1].bias[0] -= 3.0
        rates[beam] = trainer.validate()["valid_error_rate"]
    task, model = trainer.task, trainer.model
    errors = ref_tokens = 0
    for i in range(len(task.valid_set)):
        batch = collate([task.valid_set[i]])
        (nbest,) = beam_search(
            model.eval(), batch.feats, batch.feat_lens, BeamSearchOptions(beam=3)
        )
        ref = batch.targets[0, : int(batch.target_lens[0])].tolist()
        counts = error_counts([task.vocab.decode(ref)], [task.vocab.decode(nbest[0].tokens)])
        errors, ref_tokens = errors + counts["errors"], ref_tokens + counts["ref_tokens"]
    assert rates[3] == pytest.approx(100.0 * errors / ref_tokens)
    assert rates[3] != rates[0]
    with pytest.raises(ValueError, match="trainer.valid_beam must be 0"):
        asr_trainer(
            make_cfg(tone_data, tmp_path / "bad", "trainer.valid_beam=-1"), tmp_path / "bad"
        )


def test_checkpoints_pickle_no_cbasr_class(tone_data, tmp_path):
    """A checkpoint holds tensors, plain containers and numpy arrays, never a pickled cbasr
    object: moving or renaming a module (engines/ became training/, inference/, evaluation/)
    leaves every checkpoint written before loadable."""
    import pickletools
    import zipfile

    exp = tmp_path / "exp"
    train(make_cfg(tone_data, exp, "trainer.max_epochs=1"), exp)
    for path in (exp / "checkpoints").glob("*.pt"):
        with zipfile.ZipFile(path) as z:
            pickled = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
        globals_ = {str(arg) for op, arg, _ in pickletools.genops(pickled) if op.name == "GLOBAL"}
        assert globals_ and not [g for g in globals_ if g.startswith("cbasr")], (path, globals_)


def test_a_checkpoint_of_the_error_rate_and_loss_fields_resumes(tone_data, tmp_path):
    """Checkpoints written before ``best_metrics`` kept the best epoch's ``best_error_rate``
    and ``best_valid_loss`` (and, older still, no ``best_score``): they resume with those as
    the best epoch's metrics and score."""
    exp = tmp_path / "exp"
    first = train(make_cfg(tone_data, exp, "trainer.max_epochs=1"), exp)
    best = dict(first.state.best_metrics)
    for name in ("last", "best", "epoch-1"):
        path = exp / "checkpoints" / f"{name}.pt"
        ckpt = load_checkpoint(path)
        state = ckpt["state"]
        del state["best_metrics"]
        state.update(
            best_error_rate=best["valid_error_rate"],
            best_valid_loss=best["valid_loss"],
            best_score=None,
        )
        save_checkpoint(path, ckpt)
    resumed = asr_trainer(make_cfg(tone_data, exp, "trainer.max_epochs=2"), exp)
    resumed.initialise()
    assert resumed.state.best_metrics == best and resumed.state.epoch == 1
    assert resumed.state.best_score == [best["valid_error_rate"], best["valid_loss"]]
