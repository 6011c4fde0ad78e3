"""recipes/synth/run.sh end to end on the tiny corpus, as a user runs it, and rerun idempotently."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "synth"
TINY_MODEL = [
    "encoder.hidden=16",
    "encoder.num_layers=1",
    "trainer.max_epochs=2",
    "data.max_frames=3000",
]


def _run(recipe: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(
        [str(recipe / "run.sh"), *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_tiny_recipe_end_to_end_then_rerun_skips_every_stage(tmp_path):
    recipe = tmp_path / "synth"
    recipe.mkdir()
    shutil.copy(RECIPE / "run.sh", recipe)
    shutil.copytree(RECIPE / "conf", recipe / "conf")
    shutil.copytree(RECIPE.parent / "shared", tmp_path / "shared")

    first = _run(recipe, "--size", "tiny", "--workers", "0", *TINY_MODEL)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    for stage in range(7):
        assert f"stage {stage}:" in first.stdout
    exp = recipe / "exp" / "blstm_ctc"
    for split in ("dev", "test"):
        score = json.loads((exp / "decode" / split / "score.json").read_text())
        assert score["utts"] == len(
            (recipe / "data/synth" / f"{split}.jsonl").read_text().splitlines()
        )
        assert f"| blstm_ctc | {split} | {score['error_rate']:.2f} |" in first.stdout
    assert len(json.loads((exp / "history.json").read_text())) == 2
    beam = json.loads((exp / "decode" / "test_beam8" / "decode.json").read_text())
    assert beam["utts"] == score["utts"] and "8" in json.dumps(beam)
    assert (exp / "decode" / "test_beam8" / "score.json").is_file()
    alignment = json.loads((exp / "align" / "dev" / "alignment.json").read_text())
    assert (exp / "align" / "dev" / "align.ctm").read_text().strip() and "onset" in json.dumps(
        alignment
    )
    assert list((recipe / "log").glob("run-*.log"))

    stamps = {
        p: p.stat().st_mtime_ns
        for p in [
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


def test_unknown_option_is_refused(tmp_path):
    run = _run(RECIPE, "--stgae", "3")
    assert run.returncode == 2 and "unknown option --stgae" in run.stderr
