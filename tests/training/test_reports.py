"""What a training run reports as it goes (cbasr.training.reports): each figure of a progress
line from its own measurement."""

import logging

from cbasr.training.reports import TrainingLog


class _Meter:
    """An interval with a distinct value for each figure."""

    def interval(self):
        return {"grad_norm": 2.5, "frames_per_second": 1234.0, "data_fraction": 0.3, "stats": {}}


def test_a_progress_line_shows_each_figure_from_its_own_key(tmp_path, caplog):
    report = TrainingLog(tmp_path, is_main=False, unit="tokens")
    with caplog.at_level(logging.INFO, logger="cbasr.training.trainer"):
        report.progress(
            _Meter(), epoch=2, batch=3, batches=10, step=23, loss=1.25, lr=1e-3, bad_steps=0
        )
    assert (
        "epoch 2 batch 3/10 step 23: loss 1.2500 lr 1.00e-03 grad-norm 2.50, 1234 tokens/s "
        "(data 30%)"
    ) in caplog.text
