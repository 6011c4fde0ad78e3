"""Tables (mean and spread over seeds) and convergence plots of the toy study.

Reads ``<out>/runs/**/seed*.json`` (from :mod:`cbasr.toy.sweep`) and
``<out>/compare/seed*.json`` (from :mod:`cbasr.toy.compare`); writes ``<out>/results.md`` and
PNG figures under ``<out>/plots/``.
"""

import json
import statistics
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402

from cbasr.toy.sweep import SWEPT, SweepConfig  # noqa: E402

__all__ = ["load_runs", "write_report"]


def load_runs(out: Path) -> dict[tuple[str, str], list[dict]]:
    """``{(variant, method): [run per seed]}``."""
    runs = defaultdict(list)
    for path in sorted((out / "runs").glob("*/*/seed*.json")):
        run = json.loads(path.read_text())
        runs[(run["variant"], run["method"])].append(run)
    return runs


def _final(run: dict, key: str) -> float:
    return run["history"][key][-1]


def _mean_sd(values: list[float], fmt: str = "{:.4g}") -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(sd)}"


def _summary(run: dict) -> dict[str, float]:
    h = run["history"]
    return {
        "log_likelihood": h["log_likelihood"][-1],
        "bound": h["bound"][-1],
        "emission_mse": h["emission_mse"][-1],
        "label_mse": h["label_mse"][-1],
        "variance_0": h["variance"][0],
        "variance_mean": statistics.mean(h["variance"][1:] or h["variance"]),
        "seconds": run["seconds"],
    }


COLUMNS = {
    "log_likelihood": "held-out log Q(y)",
    "bound": "held-out bound (eq. 19)",
    "emission_mse": "emission MSE",
    "label_mse": "label MSE",
    "variance_0": "grad. variance, step 0",
    "variance_mean": "grad. variance, mean over training",
    "seconds": "seconds / run",
}


def _paired_gap(runs, variant, method, key="log_likelihood") -> list[float]:
    """Per seed, the method's final ``key`` minus the exact marginal's on the same population."""
    exact = {r["seed"]: _summary(r)[key] for r in runs.get((variant, "exact"), [])}
    return [
        _summary(r)[key] - exact[r["seed"]]
        for r in runs.get((variant, method), [])
        if r["seed"] in exact
    ]


def _base_table(runs, methods) -> list[str]:
    head = ["held-out log Q(y) - exact's (paired by seed)", *COLUMNS.values()]
    lines = ["| method | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for method in methods:
        summaries = [_summary(r) for r in runs.get(("base", method), [])]
        cells = [_mean_sd(_paired_gap(runs, "base", method), "{:.3g}")]
        cells += [_mean_sd([s[k] for s in summaries]) for k in COLUMNS]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def _pivot(runs, variants, methods, key) -> list[str]:
    lines = ["| variant | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for variant in variants:
        cells = [
            _mean_sd([_summary(r)[key] for r in runs.get((variant, m), [])], "{:.3g}")
            for m in methods
        ]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return lines


def _compare_table(out: Path) -> list[str]:
    rows = defaultdict(list)
    for path in sorted((out / "compare").glob("seed*.json")):
        for row in json.loads(path.read_text())["results"]:
            rows[(row["estimator"], row["baseline"], row["step"])].append(row)
    if not rows:
        return ["(no comparison results)"]
    steps = sorted({k[2] for k in rows})
    pairs = list(dict.fromkeys((k[0], k[1]) for k in rows))
    head = " | ".join(f"variance @ {s} | bias / noise @ {s}" for s in steps)
    lines = [f"| estimator | baseline | {head} |", "|---" * (2 + 2 * len(steps)) + "|"]
    for estimator, baseline in pairs:
        cells = []
        for s in steps:
            found = rows.get((estimator, baseline, s), [])
            cells.append(_mean_sd([r["variance"] for r in found], "{:.3g}"))
            cells.append(_mean_sd([r["bias"] / r["noise"] for r in found], "{:.2g}"))
        lines.append(f"| {estimator} | {baseline} | " + " | ".join(cells) + " |")
    return lines


COLORS = {  # one colour per method, the same in every figure
    "exact": "black",
    "expected": "tab:gray",
    "global": "tab:red",
    "idb": "tab:orange",
    "bb": "tab:olive",
    "mbb": "tab:green",
    "mc": "gold",
    "forced_suffix": "tab:purple",
    "straight_through": "tab:brown",
    "relax": "tab:cyan",
    "elbo_fs": "tab:pink",
    "elbo_bin": "tab:blue",
}


def _color(method: str):
    return COLORS.get(method, "tab:gray")


def _band(ax, x, curves, label, log=False):
    curves = np.asarray(curves, dtype=float)
    if log:
        curves = np.log10(np.maximum(curves, 1e-300))
    mean, sd = curves.mean(0), curves.std(0)
    ax.plot(x, mean, label=label, color=_color(label))
    ax.fill_between(x, mean - sd, mean + sd, color=_color(label), alpha=0.15)


def _plot_convergence(runs, methods, path: Path) -> None:
    panels = [
        ("log_likelihood", "held-out log Q(y)"),
        ("bound", "held-out bound (eq. 19)"),
        ("emission_mse", "emission MSE"),
        ("label_mse", "label MSE"),
        ("variance", "log10 gradient variance"),
        ("reward", "sample reward (moving avg. 20)"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    for ax, (key, title) in zip(axes.flat, panels):
        for method in methods:
            group = runs.get(("base", method), [])
            if not group or (key == "variance" and method in ("exact", "expected")):
                continue
            h0 = group[0]["history"]
            if key == "variance":
                _band(
                    ax,
                    h0["variance_step"],
                    [r["history"]["variance"] for r in group],
                    method,
                    log=True,
                )
            elif key == "reward":
                window = min(20, len(h0["reward"]))
                smooth = [
                    np.convolve(r["history"]["reward"], np.ones(window) / window, "valid")
                    for r in group
                ]
                _band(ax, h0["reward_step"][window - 1 :], smooth, method)
            else:
                _band(ax, h0["step"], [r["history"][key] for r in group], method)
        ax.set_title(title)
        ax.set_xlabel("step")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("Toy study, base configuration: mean ± sd over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_sweep(runs, config: SweepConfig, path: Path) -> None:
    metrics = [
        ("emission_mse", "emission MSE"),
        ("label_mse", "label MSE"),
        ("variance_mean", "log10 mean grad. variance"),
    ]
    keys = [k for k in SWEPT if k in config.sweep]
    if not keys:
        return
    fig, axes = plt.subplots(
        len(metrics), len(keys), figsize=(4.5 * len(keys), 3.2 * len(metrics)), squeeze=False
    )
    for col, key in enumerate(keys):
        values = sorted(set(config.sweep[key]) | {getattr(config.base, key)})
        for row, (metric, title) in enumerate(metrics):
            ax = axes[row][col]
            for method in config.methods:
                if metric == "variance_mean" and method in ("exact", "expected"):
                    continue
                means, sds = [], []
                for value in values:
                    variant = "base" if value == getattr(config.base, key) else f"{key}={value}"
                    got = [_summary(r)[metric] for r in runs.get((variant, method), [])]
                    if metric == "variance_mean":
                        got = [np.log10(max(g, 1e-300)) for g in got]
                    means.append(np.mean(got) if got else np.nan)
                    sds.append(np.std(got) if got else np.nan)
                ax.errorbar(
                    values,
                    means,
                    yerr=sds,
                    marker="o",
                    capsize=2,
                    label=method,
                    color=_color(method),
                )
            ax.set_xscale("log", base=2)
            ax.set_xlabel(key)
            ax.set_title(title)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_compare(out: Path, path: Path) -> None:
    rows = defaultdict(list)
    for file in sorted((out / "compare").glob("seed*.json")):
        for row in json.loads(file.read_text())["results"]:
            rows[(row["step"], row["estimator"], row["baseline"])].append(row["variance"])
    if not rows:
        return
    steps = sorted({k[0] for k in rows})
    fig, axes = plt.subplots(1, len(steps), figsize=(5.5 * len(steps), 4), squeeze=False)
    for ax, step in zip(axes[0], steps):
        keys = [k for k in rows if k[0] == step]
        labels = [f"{k[1]}\n{k[2]}" for k in keys]
        means = [np.mean(rows[k]) for k in keys]
        sds = [np.std(rows[k]) for k in keys]
        ax.bar(range(len(keys)), means, yerr=sds, capsize=2)
        ax.set_xticks(range(len(keys)), labels, rotation=90, fontsize=7)
        ax.set_yscale("log")
        ax.set_title(f"gradient variance at shared parameters, step {step}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(config: SweepConfig, out: Path, command: str) -> Path:
    """Write ``results.md`` and the plots; returns the results path."""
    runs = load_runs(out)
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    methods = list(config.methods) + list(config.base_only_methods)
    variants = ["base"] + [
        f"{k}={v}" for k, vs in config.sweep.items() for v in vs if getattr(config.base, k) != v
    ]
    seeds = len(config.seeds)
    lines = [
        "# Toy study results (CB paper section 5.1)",
        "",
        f"Command: `{command}`",
        "",
        f"Base config: {json.dumps(config.base.__dict__)}; seeds {list(config.seeds)}; "
        f"every cell is the mean ± sd over the {seeds} seeds.",
        "",
        "## Base configuration, end of training",
        "",
        *_base_table(runs, methods),
        "",
        "## Sweep (one parameter changed from the base at a time), end of training",
        "",
    ]
    for key, title in [
        ("log_likelihood", "held-out log Q(y)"),
        ("emission_mse", "emission MSE"),
        ("label_mse", "label MSE"),
        ("variance_mean", "mean gradient variance"),
    ]:
        lines += [f"### {title}", "", *_pivot(runs, variants, list(config.methods), key), ""]
    lines += [
        "## Gradient variance and bias at shared parameters",
        "",
        f"{config.compare.draws} draws of M = {config.compare.num_samples} samples each, at the "
        "parameters of an exact-marginal learner at the given steps. 'bias / noise' is the "
        "distance of the mean estimate from the exact gradient over its Monte Carlo noise: "
        "about 1 for an unbiased estimator, >> 1 for a biased one.",
        "",
        *_compare_table(out),
        "",
    ]
    results = out / "results.md"
    results.write_text("\n".join(lines))
    _plot_convergence(runs, methods, plots / "convergence_base.png")
    _plot_sweep(runs, config, plots / "sweep.png")
    _plot_compare(out, plots / "variance_shared_parameters.png")
    return results
