"""recipes/digits/run.sh on the tiny corpus, as a user runs it, and rerun idempotently."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
TINY_MODEL = [
    "encoder.hidden=16",
    "encoder.num_layers=1",
    "trainer.max_epochs=2",
    "trainer.num_threads=1",
    "data.max_frames=3000",
]


def _copy_recipe(tmp_path: Path) -> Path:
    recipe = tmp_path / "digits"
    recipe.mkdir()
    shutil.copy(RECIPES / "digits" / "run.sh", recipe)
    shutil.copytree(RECIPES / "digits" / "conf", recipe / "conf")
    shutil.copytree(RECIPES / "shared", tmp_path / "shared")
    return recipe


def _run(recipe: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(
        [str(recipe / "run.sh"), *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_data_stages_build_a_word_vocabulary(tmp_path):
    recipe = _copy_recipe(tmp_path)
    run = _run(recipe, "--size", "tiny", "--workers", "0", "--stop-stage", "2")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    for stage in range(3):
        assert f"stage {stage}:" in run.stdout
    assert "stage 3:" not in run.stdout
    words = (recipe / "data/digits/words.txt").read_text().split()
    assert (recipe / "data/lang/words.txt").read_text().split()[1:] == words
    train = (recipe / "data/digits/train.jsonl").read_text().splitlines()
    assert (recipe / "data/fbank/train").is_dir() and len(train) == 12
    # the recipe's corpus: no train word repeats its predecessor (--train-repeats none)
    assert "train repeats: none" in run.stdout
    for line in train:
        words = json.loads(line)["words"].split()
        assert all(a != b for a, b in zip(words, words[1:])), words
    repeats = (recipe / "data/digits/repeats.jsonl").read_text().splitlines()
    assert (recipe / "data/fbank/repeats").is_dir() and len(repeats) == 2


@pytest.mark.slow
def test_tiny_recipe_end_to_end_then_rerun_skips_every_stage(tmp_path):
    recipe = _copy_recipe(tmp_path)
    first = _run(recipe, "--size", "tiny", "--workers", "0", *TINY_MODEL)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    for stage in range(6):
        assert f"stage {stage}:" in first.stdout
    exp = recipe / "exp" / "blstm_ctc"
    config = json.loads((exp / "config.json").read_text())
    assert config["data"]["units"] == "words"
    for split in ("dev", "test", "repeats"):
        manifest = (recipe / "data/digits" / f"{split}.jsonl").read_text().splitlines()
        words = sum(len(json.loads(line)["words"].split()) for line in manifest)
        for name in (f"{split}_beam8", split):
            score = json.loads((exp / "decode" / name / "score.json").read_text())
            assert (score["utts"], score["ref_tokens"]) == (len(manifest), words)
        assert f"| blstm_ctc | {split} | {score['error_rate']:.2f} |" in first.stdout
    assert len(json.loads((exp / "history.json").read_text())) == 2
    assert list((recipe / "log").glob("run-*.log"))

    stamps = {
        p: p.stat().st_mtime_ns
        for p in [
            recipe / "data/digits/train.jsonl",
            recipe / "data/fbank/train/feats.bin",
            exp / "checkpoints/last.pt",
            exp / "decode/dev/hyp.trn",
        ]
    }
    second = _run(recipe, "--size", "tiny", "--workers", "0", *TINY_MODEL)
    assert second.returncode == 0, second.stdout[-4000:]
    assert "features complete" in second.stdout and "nothing to do" in second.stdout
    assert "already decoded with this checkpoint" in second.stdout
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())


def test_unknown_option_is_refused():
    run = _run(RECIPES / "digits", "--stgae", "3")
    assert run.returncode == 2 and "unknown option --stgae" in run.stderr
