"""trainer.cuda_graphs: the static step (padded to bucket shapes, the fused update that skips a
non-finite step on the device) against the eager step on the CPU; the graphs themselves against
the static step on CUDA (gpu-marked, run by scripts/gpu_check.sh)."""

import contextlib
import dataclasses
import logging
import math

import pytest
import torch

from cbasr.config.schema import OptimConfig, TrainerConfig
from cbasr.data.dataset import Batch
from cbasr.models import CTCModel, LossOutput
from cbasr.storage import faults
from cbasr.training.asr_task import AsrTask, asr_trainer
from cbasr.training.graphs import GraphedSteps, _Shape
from cbasr.training.options import check_options, make_optimizer
from cbasr.training.trainer import Trainer
from tests.training.test_trainer import make_cfg

# no dropout: the static step draws its masks over the padded batch; the three clipping cases
PRESETS = {
    "ctc": ["encoder.dropout=0", "optim.weight_decay=0.01"],  # (Adam's L2, not AdamW's)
    "hat_pruned": [
        "encoder.dropout=0",
        "decoder=hat",
        "decoder.dropout=0",
        "loss=hat",
        "loss.prune_range=2",
        "optim.grad_clip=0",  # no clipping
    ],
    "cb": ["encoder.dropout=0", "decoder=pointwise", "loss=cb_marginal", "optim.grad_clip=0.5"],
    # the second-order CB: its band starts at every (padded) frame in a graph step
    "cb_second_order": [
        "encoder.dropout=0",
        "decoder=monotonic_variable",
        "decoder.window=8",
        "decoder.dropout=0",
        "loss=cb_marginal",
    ],
}


def _trainer(data, exp, *overrides, static=False):
    cfg = make_cfg(data, exp, *overrides)
    t = Trainer(AsrTask(cfg, exp), cfg.trainer, cfg.optim, exp, static_step=static)
    t.initialise()
    return t


def _steps(t, n, grads=None):
    """The trainer's step on the first ``n`` batches of its first epoch (``grads``, a list:
    each step's gradients appended, by parameter name)."""
    batches = t.task.epoch_batches(0)[:n]
    results = []
    for batch, indices in zip(t.loader(batches), batches):
        tokens, _ = t.task.batch_size(indices)
        results.append(t.train_step(batch, tokens))
        if grads is not None:
            grads.append({k: p.grad.clone() for k, p in t.model.named_parameters()})
    return results


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_static_step_trains_as_the_eager_step(tone_data, tmp_path, preset):
    eager = _trainer(tone_data, tmp_path / "e", *PRESETS[preset])
    static = _trainer(tone_data, tmp_path / "s", *PRESETS[preset], static=True)
    want_grads, got_grads = [], []
    want, got = _steps(eager, 4, want_grads), _steps(static, 4, got_grads)
    # the batches were padded (to 4 utterances, 64 frames, 8 labels), and more than one shape seen
    assert len(static.graphed.shapes) > 1
    for w, g in zip(want, got):
        assert g.nll == pytest.approx(w.nll, rel=1e-5)
        assert g.grad_norm == pytest.approx(w.grad_norm, rel=1e-4)
        assert g.stats.keys() == w.stats.keys()
    for w, g in zip(want_grads, got_grads, strict=True):
        for name in w:  # each gradient, to its own scale
            scale = float(w[name].abs().max())
            torch.testing.assert_close(g[name], w[name], rtol=1e-3, atol=1e-5 * scale, msg=name)
    # Adam divides each gradient entry by its own running size, so an entry that is rounding
    # noise (a gradient of 1e-9 among ones of 1e-3, summed in another order over the second
    # order's wider band) moves by up to a learning rate either way: compare at that scale
    atol = 1e-4 if preset == "cb_second_order" else 1e-6
    for (name, w), g in zip(eager.model.state_dict().items(), static.model.state_dict().values()):
        assert torch.allclose(g, w, rtol=1e-4, atol=atol), name
    assert static.schedule.get_last_lr() == pytest.approx(eager.schedule.get_last_lr())
    group = static.optimizer.param_groups[0]
    assert isinstance(group["lr"], torch.Tensor)
    assert float(group["lr"]) == pytest.approx(static.schedule.get_last_lr()[0])


def test_a_non_finite_loss_skips_the_update_on_the_device(tone_data, tmp_path, monkeypatch, caplog):
    t = _trainer(tone_data, tmp_path, *PRESETS["ctc"], static=True)
    _steps(t, 1)  # the optimizer's state exists
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    moments = {k: v.clone() for k, v in t.optimizer.state[t.graphed.params[0]].items()}
    real_loss = CTCModel.loss

    def second_inf(self, *batch, **extra):
        out = real_loss(self, *batch, **extra)
        bump = torch.zeros_like(out.loss)
        bump[1] = math.inf
        return LossOutput(out.loss + bump, out.nll, {})

    monkeypatch.setattr(CTCModel, "loss", second_inf)
    batches = t.task.epoch_batches(0)[1:2]
    batch = next(iter(t.loader(batches)))
    tokens, _ = t.task.batch_size(batches[0])
    with caplog.at_level(logging.WARNING):
        result = t.train_step(batch, tokens)
    assert result.nll is None and math.isnan(result.grad_norm)
    assert f"non-finite loss for ['{batch.ids[1]}']; the update was skipped" in caplog.text
    for k, v in t.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    for k, v in t.optimizer.state[t.graphed.params[0]].items():
        assert torch.equal(v, moments[k]), k  # the step count too
    assert t.schedule.steps == 1


def test_a_non_finite_gradient_of_finite_losses_skips_the_update_on_the_device(
    tone_data, tmp_path, caplog
):
    """Every loss finite, the gradient norm not (a parameter's gradient made infinite by a
    hook): the step is skipped with a warning naming the batch, the parameters, Adam's moments
    and the learning-rate schedule left as they were; the next step trains."""
    t = _trainer(tone_data, tmp_path, *PRESETS["ctc"], static=True)
    _steps(t, 1)  # the optimizer's state exists
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    moments = {k: v.clone() for k, v in t.optimizer.state[t.graphed.params[0]].items()}
    batches = t.task.epoch_batches(0)[1:3]
    loader = iter(t.loader(batches))
    batch = next(loader)
    tokens, _ = t.task.batch_size(batches[0])
    hook = t.graphed.params[0].register_hook(lambda grad: torch.full_like(grad, math.inf))
    try:
        with caplog.at_level(logging.WARNING):
            result = t.train_step(batch, tokens)
    finally:
        hook.remove()
    assert result.nll is None and math.isnan(result.grad_norm)
    assert f"non-finite gradient for {batch.ids}; the update was skipped" in caplog.text
    assert "non-finite loss" not in caplog.text
    for k, v in t.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    for k, v in t.optimizer.state[t.graphed.params[0]].items():
        assert torch.equal(v, moments[k]), k  # the step count too
    assert t.schedule.steps == 1
    result = t.train_step(next(loader), t.task.batch_size(batches[1])[0])
    assert result.nll is not None and math.isfinite(result.grad_norm)
    assert t.schedule.steps == 2


def test_the_padded_batch_copies_the_first_row_and_weighs_it_nothing():
    feats = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2) + 1
    batch = Batch(
        ["a", "b"],
        feats,
        torch.tensor([3, 2]),
        torch.tensor([[5, 6], [7, 0]]),
        torch.tensor([2, 1]),
        torch.tensor([[0.1, 0.2], [0.3, math.nan]]),
    )
    model = torch.nn.Linear(1, 1)
    steps = GraphedSteps(
        None, model, torch.optim.Adam(model.parameters()), 0.0, torch.device("cpu"), graphs=False
    )
    with pytest.raises(ValueError, match="trainer.cuda_graphs=true needs a CUDA device, not cpu"):
        GraphedSteps(None, model, torch.optim.Adam(model.parameters()), 0.0, torch.device("cpu"))
    key = steps.shape_of(batch)
    assert key == (4, 64, 8)
    assert GraphedSteps.shape_of(
        steps, Batch([], torch.zeros(5, 65, 2), None, torch.zeros(5, 9), None)
    ) == (8, 128, 16)
    shape = _Shape(key, batch, torch.device("cpu"))
    shape.load(batch, tokens=7)
    s = shape.batch
    assert s.feats.shape == (4, 64, 2) and s.targets.shape == (4, 8)
    assert torch.equal(s.feats[:2, :3], feats) and not s.feats[:, 3:].any()
    assert torch.equal(s.feats[2], s.feats[0]) and torch.equal(s.feats[3], s.feats[0])
    assert s.feat_lens.tolist() == [3, 2, 3, 3] and s.target_lens.tolist() == [2, 1, 2, 2]
    assert (
        s.targets[:, :2].tolist() == [[5, 6], [7, 0], [5, 6], [5, 6]] and not s.targets[:, 2:].any()
    )
    assert s.label_ends[3, :2].tolist() == pytest.approx([0.1, 0.2])
    assert s.label_ends[:, 2:].isnan().all() and s.label_ends[1, 1].isnan()
    assert shape.weights.tolist() == [1, 1, 0, 0] and float(shape.tokens) == 7
    with pytest.raises(ValueError, match="a batch without the label times of its shape"):
        shape.load(
            Batch(["c"], feats[:1], torch.tensor([3]), torch.tensor([[9]]), torch.tensor([1])), 1
        )
    # a smaller batch later in the same shape leaves nothing of the first behind
    shape.load(
        Batch(
            ["c"],
            feats[:1, :2],
            torch.tensor([2]),
            torch.tensor([[9]]),
            torch.tensor([1]),
            torch.tensor([[0.5]]),
        ),
        1,
    )
    assert not s.feats[:, 2:].any() and s.targets[:, 1:].sum() == 0
    assert shape.weights.tolist() == [1, 0, 0, 0] and s.label_ends[:, 1:].isnan().all()


def _hand_batch(B: int, T: int, L: int) -> Batch:
    return Batch(
        [f"u{k}" for k in range(B)],
        torch.randn(B, T, 2),
        torch.full((B,), T),
        torch.ones(B, L, dtype=torch.long),
        torch.full((B,), L),
    )


def test_the_least_recently_used_shape_is_dropped_and_float_stats_pass_through():
    model = torch.nn.Linear(2, 1)

    def forward(model, batch):
        loss = model(batch.feats).squeeze(-1).sum(1)  # (B,)
        return LossOutput(loss, loss.detach(), {"mean": loss.detach().mean(), "fixed": 2.0})

    optimizer = make_optimizer(model, OptimConfig(), torch.device("cpu"))
    steps = GraphedSteps(forward, model, optimizer, 1.0, torch.device("cpu"), graphs=False)
    steps.max_shapes = 2
    shapes = [(2, 10, 3), (5, 10, 3), (2, 70, 3), (2, 10, 9)]  # buckets a, b, c, d
    for B, T, L in [shapes[0], shapes[1], shapes[0], shapes[2]]:  # a, b, a, c: b goes
        values = steps(_hand_batch(B, T, L), 10, contextlib.nullcontext)
    assert list(steps.shapes) == [(4, 64, 8), (4, 128, 8)]
    assert values.stats["fixed"] == 2.0 and math.isfinite(values.stats["mean"])
    assert len(values.finite) == 2 and all(values.finite)
    steps(_hand_batch(*shapes[3]), 10, contextlib.nullcontext)  # d: a goes
    assert list(steps.shapes) == [(4, 128, 8), (4, 64, 16)]
    assert steps.shape_of(_hand_batch(3, 10, 0)) == (4, 64, 8)  # no label: one label's bucket


def test_the_trainer_checks_the_run_and_arms_its_fault_point(tone_data, tmp_path, monkeypatch):
    """A trainer is eager unless asked; the static one checks what only the built run knows
    (one process), and its step has the eager step's fault-injection point."""
    assert asr_trainer(make_cfg(tone_data, tmp_path / "e"), tmp_path / "e").graphed is None
    checked = []
    real_check = Trainer._check_graphable
    monkeypatch.setattr(Trainer, "_check_graphable", lambda self: checked.append(real_check(self)))
    t = _trainer(tone_data, tmp_path / "s", *PRESETS["ctc"], static=True)
    assert checked == [None]
    t.dist = dataclasses.replace(t.dist, world_size=2)
    with pytest.raises(ValueError, match="trainer.cuda_graphs=true trains in one process"):
        real_check(t)
    armed = []
    monkeypatch.setattr(faults, "kill_if_armed", lambda *args: armed.append(args))
    t.state.step = 6
    _steps(t, 1)
    assert armed == [("kill-in-step", 7, 0)]


def test_an_eager_run_gets_the_plain_optimizer():
    model = torch.nn.Linear(2, 1)
    for name, kind in (("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)):
        plain = make_optimizer(model, OptimConfig(name=name))
        graphed = make_optimizer(model, OptimConfig(name=name), torch.device("cpu"))
        assert type(plain) is kind and type(graphed) is kind
        assert isinstance(plain.param_groups[0]["lr"], float) and not plain.defaults["fused"]
        assert isinstance(graphed.param_groups[0]["lr"], torch.Tensor)
        assert graphed.defaults["fused"] and graphed.defaults["capturable"]


def test_its_checkpoints_hold_a_float_lr_and_resume_either_way(tone_data, tmp_path):
    t = _trainer(tone_data, tmp_path, *PRESETS["ctc"], static=True)
    _steps(t, 2)
    t.state.step = 2
    t.save()
    lr = t.optimizer.param_groups[0]["lr"]
    assert isinstance(t._checkpoint()["optimizer"]["param_groups"][0]["lr"], float)
    assert isinstance(lr, torch.Tensor)  # the optimizer's own is still the tensor
    eager = _trainer(tone_data, tmp_path, *PRESETS["ctc"])
    assert eager.schedule.steps == 2
    assert eager.optimizer.param_groups[0]["lr"] == pytest.approx(float(lr))
    _steps(eager, 1)  # an eager Adam with a float lr
    static = _trainer(tone_data, tmp_path, *PRESETS["ctc"], static=True)
    group = static.optimizer.param_groups[0]
    assert isinstance(group["lr"], torch.Tensor) and float(group["lr"]) == pytest.approx(float(lr))
    assert group["lr"] is static.schedule._lr_tensors[0]  # the tensor a graph holds


def test_cuda_graphs_options_are_refused_in_one_line(tone_data, tmp_path):
    with pytest.raises(
        ValueError,
        match=r"^trainer.cuda_graphs=true needs a CUDA device \(trainer.device=cpu is cpu\)$",
    ):
        asr_trainer(make_cfg(tone_data, tmp_path, "trainer.cuda_graphs=true", "trainer.device=cpu"))
    cuda = torch.device("cuda")
    for trainer, optim, match in [
        (
            TrainerConfig(cuda_graphs=True, precision="fp16"),
            OptimConfig(),
            "takes trainer.precision=fp32 or bf16",
        ),
        (
            TrainerConfig(cuda_graphs=True),
            OptimConfig(name="sgd"),
            "needs optim.name=adam or adamw.*got sgd",
        ),
        (
            TrainerConfig(cuda_graphs=True),
            OptimConfig(weight_noise=0.1),
            "weight noise is drawn per step",
        ),
    ]:
        with pytest.raises(ValueError, match=match):
            check_options(trainer, optim, cuda)
    check_options(
        TrainerConfig(cuda_graphs=True, precision="bf16"), OptimConfig(name="adamw"), cuda
    )
    t = _trainer(tone_data, tmp_path / "c", *PRESETS["ctc"], static=True)
    t._check_graphable()
    t.model.encoder.dynamic_chunks = 4  # (as a chunked Conformer's)
    with pytest.raises(ValueError, match="encoder.dynamic_chunks > 0: each batch draws"):
        t._check_graphable()


@pytest.mark.gpu
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_cuda_graphs_replay_the_static_step(tone_data, tmp_path, preset):
    """The captured step's replays (batches copied from the host) against the eager step, on
    CUDA (the packed recurrent encoder there, the per-direction one in the graphs)."""
    on_cuda = ["trainer.device=cuda", *PRESETS[preset]]
    eager = _trainer(tone_data, tmp_path / "e", *on_cuda)
    graphs = _trainer(tone_data, tmp_path / "g", *on_cuda, "trainer.cuda_graphs=true")
    want, got = _steps(eager, 8), _steps(graphs, 8)
    assert graphs.graphed.captures == len(graphs.graphed.shapes) < 8  # some steps were replays
    for w, g in zip(want, got):
        assert g.nll == pytest.approx(w.nll, rel=1e-4)
        assert g.grad_norm == pytest.approx(w.grad_norm, rel=1e-3)
    atol = 1e-4 if preset == "cb_second_order" else 1e-5  # (Adam on rounding noise: above)
    for (name, w), g in zip(eager.model.state_dict().items(), graphs.model.state_dict().values()):
        assert torch.allclose(g, w, rtol=1e-3, atol=atol), name


@pytest.mark.gpu
def test_a_step_that_reads_the_device_fails_at_capture_naming_the_option(
    tone_data, tmp_path, monkeypatch
):
    real_loss = CTCModel.loss

    def reads(self, *batch, **extra):
        out = real_loss(self, *batch, **extra)
        if float(out.loss.sum()) > 0:  # a read of the device
            return out
        return out

    t = _trainer(tone_data, tmp_path, "trainer.device=cuda", "trainer.cuda_graphs=true")
    monkeypatch.setattr(CTCModel, "loss", reads)
    with pytest.raises(
        RuntimeError, match="trainer.cuda_graphs: this model's training step cannot"
    ):
        _steps(t, 1)
