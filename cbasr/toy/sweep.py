"""The toy study's sweep: its typed configuration, the runs it expands to, and running them.

A sweep file (JSON, e.g. ``recipes/toy/conf/sweep.json``) names a base :class:`ToyConfig`,
the methods, the seeds, one-at-a-time variations of ``T``, ``N``, ``M`` and ``sigma`` around
the base, methods run at the base only, and the shared-parameter variance comparison. Unknown
keys are errors when the file is read. Each run writes
``<out>/runs/<variant>/<method>/seed<k>.json`` atomically, and a run whose file exists is
skipped, so an interrupted sweep resumes.
"""

import dataclasses
import json
import multiprocessing
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cbasr.toy.training import METHODS, ToyConfig, train

__all__ = [
    "CompareConfig",
    "SweepConfig",
    "Run",
    "load_sweep",
    "expand_runs",
    "run_all",
    "write_json",
]

SWEPT = ("num_frames", "batch_size", "num_samples", "sigma")


@dataclass(frozen=True)
class CompareConfig:
    """Gradient variance and bias of every estimator at shared parameters.

    The parameters are those of an ``exact``-marginal learner (base config) at ``checkpoints``
    steps; at each, ``draws`` gradient estimates with ``num_samples`` samples on one batch.
    """

    estimators: tuple[str, ...] = (
        "global",
        "idb",
        "bb",
        "mbb",
        "forced_suffix",
        "relax",
        "straight_through",
    )
    baselines: tuple[str, ...] = ("none", "loo")
    checkpoints: tuple[int, ...] = (0, 150, 300)
    draws: int = 200
    num_samples: int = 4


@dataclass(frozen=True)
class SweepConfig:
    base: ToyConfig = field(default_factory=ToyConfig)
    methods: tuple[str, ...] = ("exact", "expected", "global", "idb", "bb", "mbb", "forced_suffix")
    base_only_methods: tuple[str, ...] = ()
    seeds: tuple[int, ...] = (0, 1, 2)
    sweep: dict[str, tuple] = field(default_factory=dict)
    compare: CompareConfig = field(default_factory=CompareConfig)
    workers: int = 2


@dataclass(frozen=True)
class Run:
    variant: str  # "base" or "<field>=<value>"
    method: str
    seed: int
    config: ToyConfig

    def path(self, out: Path) -> Path:
        return out / "runs" / self.variant / self.method / f"seed{self.seed}.json"


def _strict(cls, values: dict, where: str):
    """``cls(**values)`` that names unknown keys (a typo fails when the file is read)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; allowed: {sorted(names)}")
    typed = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**typed)


def load_sweep(path: str | Path) -> SweepConfig:
    """Read and check a sweep file."""
    raw = json.loads(Path(path).read_text())
    raw = dict(raw)
    base = _strict(ToyConfig, raw.pop("base", {}), f"{path}: base")
    compare = _strict(CompareConfig, raw.pop("compare", {}), f"{path}: compare")
    sweep = raw.pop("sweep", {})
    bad = sorted(set(sweep) - set(SWEPT))
    if bad:
        raise ValueError(f"{path}: sweep keys {bad} are not swept; allowed: {list(SWEPT)}")
    config = _strict(SweepConfig, {**raw, "base": base, "compare": compare}, str(path))
    config = dataclasses.replace(config, sweep={k: tuple(v) for k, v in sweep.items()})
    for method in config.methods + config.base_only_methods + config.compare.estimators:
        if method not in METHODS:
            raise ValueError(f"{path}: unknown method {method!r}; known: {sorted(METHODS)}")
    return config


def expand_runs(config: SweepConfig) -> list[Run]:
    """The base runs (every method, base-only ones included) and one variant per swept value."""
    runs = [
        Run("base", m, s, config.base)
        for m in config.methods + config.base_only_methods
        for s in config.seeds
        if _runs_at(m, config.base)
    ]
    for key, values in config.sweep.items():
        for value in values:
            if getattr(config.base, key) == value:
                continue
            variant = dataclasses.replace(config.base, **{key: value})
            runs += [
                Run(f"{key}={value}", m, s, variant)
                for m in config.methods
                for s in config.seeds
                if _runs_at(m, variant)
            ]
    return runs


def _runs_at(method: str, toy) -> bool:
    """The Monte Carlo marginal needs two samples (VIMCO leaves one out); the rest run anywhere."""
    return method != "mc" or toy.num_samples >= 2


def write_json(path: Path, payload) -> None:
    """Write JSON atomically (a complete file or none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(payload))
    os.replace(partial, path)


def _one_run(job: tuple[Run, str]) -> str:
    run, out = job
    torch.set_num_threads(1)
    result = train(run.config, run.method, run.seed)
    result["variant"] = run.variant
    write_json(run.path(Path(out)), result)
    return f"{run.variant} {run.method} seed {run.seed}: {result['seconds']:.1f} s"


def run_all(runs: list[Run], out: Path, workers: int, log=print) -> None:
    """Run every run whose result is missing, on ``workers`` processes (largest first)."""
    todo = [r for r in runs if not r.path(out).exists()]
    log(f"{len(runs) - len(todo)} of {len(runs)} runs already complete; running {len(todo)}")
    if not todo:
        return
    # Rough cost order so that the long runs start first.
    todo.sort(
        key=lambda r: -(r.config.num_frames * r.config.batch_size * max(r.config.num_samples, 1))
    )
    jobs = [(r, str(out)) for r in todo]
    if workers <= 1:
        for job in jobs:
            log(_one_run(job))
        return
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for message in pool.imap_unordered(_one_run, jobs):
            log(message)
