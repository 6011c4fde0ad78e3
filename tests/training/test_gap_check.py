"""check_long_gaps: the second-order CB model's training utterances with more encoder frames
per label than its window, counted and logged (a warning) at training start."""

import logging

from cbasr.training.asr_task import asr_trainer
from cbasr.training.gap_check import check_long_gaps
from tests.search import tiny
from tests.training.test_trainer import make_cfg


def test_counts_the_utterances_beyond_the_window(caplog):
    model = tiny.build("monotonic_variable")  # window W = 4, 2 input frames per encoder frame
    assert model.decoder.window == 4 and model.output_frames(20) == 10
    # encoder frames per label: 10 / 3, 10 / 2 = 5 > 4, 16 / 1 = 16 > 4, 8 / 2 = 4 (not above)
    frames, labels = [20, 20, 32, 16], [3, 2, 1, 2]
    with caplog.at_level(logging.INFO, logger="cbasr.training.gap_check"):
        assert check_long_gaps(model, frames, labels) == (2, 16.0)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "2 of 4 training utterances (50.0%)" in caplog.text
    assert "W = 4 (worst 16.0 frames per label)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cbasr.training.gap_check"):
        assert check_long_gaps(model, [20, 16], [3, 2]) == (0, 4.0)
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert check_long_gaps(tiny.build("monotonic"), frames, labels) is None
    assert check_long_gaps(tiny.build("hat"), frames, labels) is None


def test_training_start_warns_of_a_window_too_short_for_the_data(tone_data, tmp_path, caplog):
    overrides = ["decoder=monotonic_variable", "loss=cb_marginal", "decoder.window=1"]
    cfg = make_cfg(tone_data, tmp_path / "a", *overrides)
    with caplog.at_level(logging.INFO, logger="cbasr.training.gap_check"):
        asr_trainer(cfg, tmp_path / "a")  # logged, not refused
    assert "than the second-order window W = 1" in caplog.text
