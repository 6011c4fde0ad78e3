"""The toy study of CB paper section 5.1 (cbasr.toy) and its recipe, recipes/toy/run.sh."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cbasr.toy.population import label_rewards, random_population, sample_batch
from cbasr.toy.sweep import expand_runs, load_sweep

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "toy"


def test_population_sequences_follow_the_emissions_and_transitions():
    population = random_population(5, 3, 1.0, 0.3, torch.Generator().manual_seed(0))
    batch = sample_batch(population, 20000, torch.Generator().manual_seed(1))
    positions = torch.arange(5)
    assert torch.equal(batch.labels >= 0, positions < batch.total[:, None])
    # E[L] = sum_t P_t(b_t = 1); the first label comes from the start state's distribution.
    mean = float(torch.sigmoid(population.emit_logits).sum())
    assert abs(float(batch.total.double().mean()) - mean) < 5 * (mean / 20000) ** 0.5
    first = batch.labels[batch.total > 0, 0]
    emit = torch.sigmoid(population.emit_logits)
    before = torch.cat([torch.ones(1, dtype=emit.dtype), torch.cumprod(1 - emit, 0)[:-1]])
    weights = before * emit / (before * emit).sum()  # P(first emission at t | L > 0)
    want = (weights[:, None] * torch.softmax(population.label_logits[:, 3], -1)).sum(0)
    got = torch.bincount(first, minlength=3).double() / len(first)
    assert (got - want).abs().max() < 0.02


def test_rewards_are_the_learners_transition_log_probabilities():
    learner = random_population(4, 3, 1.0, 0.5, torch.Generator().manual_seed(2))
    batch = sample_batch(learner, 8, torch.Generator().manual_seed(3))
    rewards = label_rewards(learner, batch)
    log_probs = torch.log_softmax(learner.label_logits, -1)
    for n in range(8):
        previous = 3
        for l in range(int(batch.total[n])):
            y = int(batch.labels[n, l])
            torch.testing.assert_close(rewards[n, :, l], log_probs[:, previous, y])
            previous = y


def test_sweep_file_is_checked_when_read(tmp_path):
    config = load_sweep(RECIPE / "conf" / "sweep.json")
    # 12 methods at the base and 8 in each of 8 variants, for 3 seeds; no Monte Carlo marginal at M = 1
    assert len(expand_runs(config)) == 3 * (12 + 8 * 8) - 3
    bad = json.loads((RECIPE / "conf" / "tiny.json").read_text())
    bad["base"]["num_frame"] = 4
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"unknown keys \['num_frame'\]"):
        load_sweep(tmp_path / "bad.json")


def _run(recipe: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(
        [str(recipe / "run.sh"), *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow  # a whole recipe (30 s); make test keeps the synthetic recipe's
def test_tiny_recipe_end_to_end_then_rerun_skips_every_stage(tmp_path):
    recipe = tmp_path / "toy"
    recipe.mkdir()
    shutil.copy(RECIPE / "run.sh", recipe)
    shutil.copytree(RECIPE / "conf", recipe / "conf")
    first = _run(recipe, "--conf", "conf/tiny.json")
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    exp = recipe / "exp" / "tiny"
    results = (exp / "results.md").read_text()
    for method in ("exact", "mbb", "forced_suffix", "relax", "elbo_bin"):
        assert f"| {method} |" in results
    assert "| forced_suffix | loo |" in results  # the shared-parameter comparison
    for plot in ("convergence_base", "sweep", "variance_shared_parameters"):
        assert (exp / "plots" / f"{plot}.png").stat().st_size > 10_000
    stamp = (exp / "results.md").stat().st_mtime_ns
    second = _run(recipe, "--conf", "conf/tiny.json")
    assert second.returncode == 0, second.stdout[-4000:]
    assert "40 of 40 runs already complete" in second.stdout
    assert "2 of 2 comparison seeds complete" in second.stdout and "nothing to do" in second.stdout
    assert (exp / "results.md").stat().st_mtime_ns == stamp


def test_unknown_option_is_refused():
    run = _run(RECIPE, "--stgae", "1")
    assert run.returncode == 2 and "unknown option --stgae" in run.stderr
