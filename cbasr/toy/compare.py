"""Gradient variance and bias of the estimators at shared parameters (toy study, section 5.1).

The paper predicts var(eq. 29) <= var(eq. 23) <= var(eq. 21) for memoryless rewards
(eqs. 24-31) and a bias for the forced suffix (section 1). To compare estimators on equal
terms they are measured at the same parameters and on the same batch: those of a learner
trained with the exact marginal (eq. 38) at a few checkpoints. At each, every estimator gives
``draws`` independent gradient estimates w.r.t. all learner parameters; reported are the
total variance ``sum_p Var(g_p)`` and the distance of their mean from the exact gradient of
the objective it targets (eq. 19 through :func:`cbasr.estimators.cb_expected_reward`;
``E_{b|L}[sum_l R]`` without ``log P(L)`` for the forced suffix, whose eq. (1) has no prior
term; the exact marginal of eq. 38 for the Monte Carlo marginal, which is biased for it at
finite ``M``: the gradient of a bound that rises to it), next to that distance's Monte Carlo
noise ``sqrt(variance / draws)``. The Monte Carlo marginal always uses VIMCO's leave-one-out
baseline: it is measured in the ``loo`` rows only.
"""

import dataclasses
import math
import multiprocessing
from pathlib import Path

import torch

from cbasr.distributions import PoissonBinomial
from cbasr.estimators import cb_expected_reward
from cbasr.losses import cb_marginal_nll
from cbasr.toy.population import initial_learner, label_rewards, random_population, sample_batch
from cbasr.toy.sweep import SweepConfig, load_sweep, write_json
from cbasr.toy.training import flat_gradient, method_loss, new_state

__all__ = ["compare_at_shared_parameters", "compare_all"]


def _targets(learner, batch) -> dict[str, torch.Tensor]:
    """Exact gradients of ``-(eq. 19)``, of ``-E_{b|L}[sum_l R]`` and of ``-log P(y)``
    (eq. 38), ``(P,)`` each, by the estimators that target them."""
    N = batch.total.shape[0]
    emit = learner.emit_logits.expand(N, -1)
    rewards = label_rewards(learner, batch)
    objective = cb_expected_reward(emit, batch.total, rewards, batch.lengths)
    log_prior = PoissonBinomial(emit, batch.lengths).log_prob(batch.total)
    full = flat_gradient(-objective, learner, retain_graph=True)
    rewards_only = flat_gradient(-(objective - log_prior), learner)
    marginal = flat_gradient(
        cb_marginal_nll(emit, label_rewards(learner, batch), batch.lengths, batch.total), learner
    )
    return {"full": full, "forced_suffix": rewards_only, "mc": marginal}


def _measure(estimator, baseline, learner, batch, config: SweepConfig, generator, targets):
    toy = dataclasses.replace(
        config.base, num_samples=config.compare.num_samples, baseline=baseline
    )
    state = new_state(estimator, toy).frozen()  # RELAX: eta = 1 and the base temperature, fixed
    draws = torch.stack(
        [
            flat_gradient(method_loss(estimator, learner, batch, toy, state, generator)[0], learner)
            for _ in range(config.compare.draws)
        ]
    )
    target = targets.get(estimator, targets["full"])
    variance = float(draws.var(0).sum())
    return {
        "estimator": estimator,
        "baseline": baseline,
        "variance": variance,
        "bias": float((draws.mean(0) - target).norm()),
        "noise": math.sqrt(variance / len(draws)),
        "target_norm": float(target.norm()),
    }


def compare_at_shared_parameters(config: SweepConfig, seed: int, log=print) -> dict:
    """Train an exact-marginal learner on the base config and measure every estimator at the
    checkpoints; returns ``{"seed", "results": [...]}``."""
    base, compare = config.base, config.compare
    torch.set_num_threads(1)
    T, V = base.num_frames, base.vocab
    population = random_population(
        T, V, base.sigma, base.emit_rate, torch.Generator().manual_seed(seed)
    )
    data = torch.Generator().manual_seed(seed + 1_000)
    noise = torch.Generator().manual_seed(seed + 2_000)
    learner = initial_learner(T, V)
    optimizer = torch.optim.Adam(list(learner), lr=base.learning_rate)
    results = []
    last = max(compare.checkpoints)
    for step in range(last + 1):
        batch = sample_batch(population, base.batch_size, data)
        if step in compare.checkpoints:
            targets = _targets(learner, batch)
            for estimator in compare.estimators:
                for baseline in compare.baselines:
                    if baseline == "loo" and (
                        compare.num_samples < 2 or estimator == "straight_through"
                    ):
                        continue  # no leave-one-out with one sample; eq. (37) takes no baseline
                    if estimator == "mc" and baseline != "loo":
                        continue  # VIMCO's leave-one-out is part of the estimator
                    row = _measure(estimator, baseline, learner, batch, config, noise, targets)
                    row["step"] = step
                    results.append(row)
            log(f"compare seed {seed}: step {step} measured")
        if step == last:
            break
        emit = learner.emit_logits.expand(base.batch_size, -1)
        loss = cb_marginal_nll(emit, label_rewards(learner, batch), batch.lengths, batch.total)
        optimizer.zero_grad()
        loss.mean().backward()
        optimizer.step()
    return {"seed": seed, "results": results}


def _compare_seed(job: tuple[str, str, int]) -> str:
    conf, out, seed = job
    result = compare_at_shared_parameters(load_sweep(conf), seed, log=lambda *_: None)
    write_json(Path(out) / "compare" / f"seed{seed}.json", result)
    return f"compare seed {seed} written"


def compare_all(conf: str, out: Path, workers: int, log=print) -> None:
    """Run the comparison for every seed of the sweep file whose result is missing."""
    seeds = load_sweep(conf).seeds
    todo = [s for s in seeds if not (out / "compare" / f"seed{s}.json").exists()]
    log(f"{len(seeds) - len(todo)} of {len(seeds)} comparison seeds complete")
    jobs = [(str(conf), str(out), s) for s in todo]
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            log(_compare_seed(job))
        return
    with multiprocessing.get_context("spawn").Pool(min(workers, len(jobs))) as pool:
        for message in pool.imap_unordered(_compare_seed, jobs):
            log(message)
