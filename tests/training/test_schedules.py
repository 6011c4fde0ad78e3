import math

import pytest
import torch

from cbasr.training.schedules import LearningRateSchedule, warmup_decay


def _optimizer(lr=1.0):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def _lrs(schedule, steps):
    out = []
    for _ in range(steps):
        out.append(schedule.get_last_lr()[0])
        schedule.step()
    return out


def test_warmup_then_each_decay():
    kw = {"warmup_steps": 4, "total_steps": 14, "final_lr_scale": 0.1}
    for decay in (
        "constant",
        "cosine",
        "linear",
        "noam",
    ):  # linear warmup 1/4, 2/4, 3/4, 4/4 of the peak
        assert [warmup_decay(s, decay, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert [warmup_decay(s, "constant", **kw) for s in (4, 9, 100)] == [1.0, 1.0, 1.0]
    # after warmup: 10 steps from 1 to 0.1, then flat
    assert warmup_decay(9, "linear", **kw) == pytest.approx(1 - 0.9 * 0.5)
    assert (
        warmup_decay(14, "linear", **kw) == pytest.approx(0.1) == warmup_decay(50, "linear", **kw)
    )
    assert warmup_decay(9, "cosine", **kw) == pytest.approx(
        0.1 + 0.9 * 0.5
    )  # half way: the cosine's midpoint
    assert warmup_decay(11, "cosine", **kw) == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + math.cos(0.7 * math.pi))
    )
    assert warmup_decay(14, "cosine", **kw) == pytest.approx(0.1)
    # noam: inverse square root of the step, continuous at the peak
    assert warmup_decay(15, "noam", **kw) == pytest.approx(math.sqrt(4 / 16))
    assert warmup_decay(4, "noam", **kw) == pytest.approx(math.sqrt(4 / 5))
    with pytest.raises(ValueError, match="optim.scheduler must be one of"):
        warmup_decay(5, "exponential", **kw)


def test_schedule_sets_the_optimizer_learning_rate():
    schedule = LearningRateSchedule(
        _optimizer(2.0), "linear", warmup_steps=2, total_steps=6, final_lr_scale=0.0
    )
    assert _lrs(schedule, 7) == pytest.approx([1.0, 2.0, 2.0, 1.5, 1.0, 0.5, 0.0])


def test_reduce_on_plateau_after_patience_down_to_the_floor():
    opt = _optimizer(1.0)
    schedule = LearningRateSchedule(
        opt, "constant", plateau_factor=0.5, plateau_patience=2, min_lr_scale=0.2
    )
    seen = []
    for improved in (True, False, True, False, False, False, False, False, False):
        seen.append((schedule.end_epoch(improved), opt.param_groups[0]["lr"]))
    assert seen == [
        (False, 1.0),
        (False, 1.0),
        (False, 1.0),
        (False, 1.0),
        (True, 0.5),
        (False, 0.5),
        (True, 0.25),
        (False, 0.25),
        (True, 0.2),
    ]
    off = LearningRateSchedule(_optimizer(1.0), "constant")
    assert not any(off.end_epoch(False) for _ in range(5)) and off.get_last_lr() == [1.0]


def test_state_round_trip_gives_the_same_learning_rates():
    a = LearningRateSchedule(
        _optimizer(),
        "cosine",
        warmup_steps=3,
        total_steps=20,
        final_lr_scale=0.1,
        plateau_factor=0.5,
    )
    _lrs(a, 7)
    a.end_epoch(False)
    b = LearningRateSchedule(
        _optimizer(),
        "cosine",
        warmup_steps=3,
        total_steps=20,
        final_lr_scale=0.1,
        plateau_factor=0.5,
    )
    b.load_state_dict(a.state_dict())
    assert _lrs(b, 10) == _lrs(a, 10)  # bit for bit


def test_a_lambda_lr_state_from_older_checkpoints_is_read():
    old = torch.optim.lr_scheduler.LambdaLR(
        _optimizer(), lambda s: warmup_decay(s, "cosine", 3, 20, 0.1)
    )
    for _ in range(5):
        old.optimizer.step()
        old.step()
    new = LearningRateSchedule(
        _optimizer(), "cosine", warmup_steps=3, total_steps=20, final_lr_scale=0.1
    )
    new.load_state_dict(old.state_dict())
    assert new.get_last_lr() == old.get_last_lr()
