"""cbasr-train-lm as a user runs it (a subprocess): perplexity drops, a rerun resumes, a changed
model or a misspelt key is refused at start, and the result decodes with cbasr-decode --lm."""

import json
import os
import sys
from pathlib import Path

import pytest

from tests import commands
from tests.cli.training import decode_args

BIN = Path(sys.executable).parent


def _train_lm(tone_data, exp, *overrides):
    cmd = [
        str(BIN / "cbasr-train-lm"),
        f"exp_dir={exp}",
        f"data.train={tone_data / 'corpus/train.jsonl'}",
        f"data.valid={tone_data / 'corpus/dev.jsonl'}",
        f"data.vocab={tone_data / 'lang/phones.txt'}",
        "lm.embed_dim=8",
        "lm.hidden=16",
        "lm.num_layers=1",
        "lm.dropout=0.0",
        "data.max_tokens=300",
        "optim.lr=0.01",
        "trainer.num_threads=1",
        *overrides,
    ]
    return commands.run(cmd, env={**os.environ, "HYDRA_FULL_ERROR": "0"})


@pytest.fixture(scope="module")
def trained_lm(tone_data, tmp_path_factory):
    exp = tmp_path_factory.mktemp("lm") / "lm"
    run = _train_lm(tone_data, exp, "trainer.max_epochs=3")
    assert run.returncode == 0, run.stderr[-3000:]
    return exp


def test_perplexity_drops_and_a_rerun_resumes(tone_data, trained_lm):
    history = json.loads((trained_lm / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3]
    # 5 tones drawn uniformly and 2-6 of them per sentence: the best possible is about 5.4
    assert history[-1]["valid_ppl"] < history[0]["valid_ppl"] and history[-1]["valid_ppl"] < 6.0
    assert (trained_lm / "checkpoints/best.pt").is_file() and (trained_lm / "vocab.txt").is_file()
    run = _train_lm(tone_data, trained_lm, "trainer.max_epochs=4")
    assert run.returncode == 0, run.stderr[-3000:]
    resumed = json.loads((trained_lm / "history.json").read_text())
    assert resumed[:3] == history and resumed[3]["epoch"] == 4
    assert "resumed from" in run.stderr + run.stdout


def test_a_changed_model_or_a_misspelt_key_is_refused(tone_data, trained_lm, tmp_path):
    run = _train_lm(tone_data, trained_lm, "lm.hidden=32", "trainer.max_epochs=5")
    assert run.returncode != 0 and "use another exp_dir" in run.stderr
    run = _train_lm(tone_data, tmp_path / "x", "lm.hiden=3")
    assert run.returncode != 0 and "Key 'hiden' not in 'LSTMLMConfig'" in run.stderr
    assert not (tmp_path / "x").exists()


def test_the_lm_decodes_with_cbasr_decode(tone_data, trained_lm, tmp_path):
    from cbasr.cli import decode
    from tests.inference.fake_experiment import make_experiment

    exp = make_experiment(tmp_path / "exp", tone_data, "pointwise", "cb_marginal")
    args = [
        *decode_args(tone_data, exp, "dev"),
        "--num-threads",
        "1",
        "--beam",
        "2",
    ]
    decode.main(args + ["--lm", str(trained_lm), "--lm-weight", "0.4"])
    info = json.loads((exp / f"decode/dev_beam2_lm0.4-{trained_lm.name}/decode.json").read_text())
    assert info["settings"]["lm"] == str(trained_lm) and info["settings"]["lm_weight"] == 0.4
    assert info["utts"] == 16


def test_an_unreadable_last_pt_falls_back_and_no_checkpoint_is_never_a_silent_restart(
    tone_data, trained_lm, tmp_path, monkeypatch
):
    """As cbasr-train: a truncated last.pt resumes from best.pt naming it; with no loadable
    checkpoint the earlier run is kept unless trainer.resume=never."""
    import shutil

    exp = tmp_path / "lm"
    shutil.copytree(trained_lm, exp)
    history = json.loads((exp / "history.json").read_text())
    best = min(history, key=lambda h: h["valid_ppl"])["epoch"]
    (exp / "checkpoints/last.pt").write_bytes(b"")
    run = _train_lm(tone_data, exp, f"trainer.max_epochs={len(history) + 1}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "skipped checkpoints that do not load: last.pt" in run.stdout + run.stderr
    resumed = json.loads((exp / "history.json").read_text())
    assert resumed[:best] == history[:best] and resumed[-1]["epoch"] == len(history) + 1
    for path in (exp / "checkpoints").glob("*.pt"):
        path.write_bytes(b"truncated")
    monkeypatch.setenv("CBASR_DEBUG", "0")  # the one-line error a user sees
    run = _train_lm(tone_data, exp, "trainer.max_epochs=2")
    assert run.returncode == 1 and "trainer.resume=never" in run.stderr
    assert "Traceback" not in run.stderr
    run = _train_lm(tone_data, exp, "trainer.max_epochs=2", "trainer.resume=never")
    assert run.returncode == 0, run.stderr[-3000:]
    assert [h["epoch"] for h in json.loads((exp / "history.json").read_text())] == [1, 2]
