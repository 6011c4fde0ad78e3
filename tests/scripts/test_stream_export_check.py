"""scripts/stream_export_check.py: a split decoded over an exported encoder step, against the
eager model."""

import torch

from cbasr.data.features import write_feature_settings
from cbasr.inference.experiment import Experiment
from cbasr.inference.export import export_model
from cbasr.storage.checkpoint import load_checkpoint, save_checkpoint
from cbasr.training.options import fbank_options_of
from tests.cli.test_export import CHUNKED
from tests.inference.fake_experiment import make_experiment
from tests.scripts import load_script
from tests.search import tiny


def _script():
    return load_script("stream_export_check")


def test_the_check_counts_the_same_hypotheses_and_fails_on_a_different_one(
    tone_data, tmp_path, capsys
):
    exp_dir = make_experiment(tmp_path / "exp", tone_data, "hat", "hat", encoder=CHUNKED)
    write_feature_settings(exp_dir, fbank_options_of(tone_data / "fbank/train", 40), True)
    exp = Experiment(exp_dir)
    feats = torch.zeros(1, 30, exp.cmvn[0].numel())
    tiny.emit_about_a_third(exp.model, feats, torch.tensor([30]))
    best = exp_dir / "checkpoints/best.pt"  # the model that emits, as the check loads it
    save_checkpoint(best, {**load_checkpoint(best), "model": exp.model.state_dict()})
    out = tmp_path / "model.onnx"
    export_model(Experiment(exp_dir), "onnx", out)
    check = _script()
    args = ["--exp-dir", str(exp_dir), "--export", str(out)]
    assert check.main([*args, "--features", str(tone_data / "fbank/test"), "--limit", "3"]) == 0
    assert capsys.readouterr().out.startswith("3/3 hypotheses the same")
    other = tmp_path / "other"  # another model's export: its hypotheses differ
    make_experiment(other, tone_data, "hat", "hat", seed=1, encoder=CHUNKED)
    write_feature_settings(other, fbank_options_of(tone_data / "fbank/train", 40), True)
    assert check.main(["--exp-dir", str(other), "--export", str(out),
                       "--features", str(tone_data / "fbank/test"), "--limit", "3"]) == 1  # fmt: skip
