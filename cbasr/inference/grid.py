"""Search weights tuned on a development split: every point of a grid decoded and scored, and a
table of the points, best first, naming the setting to decode the test set with.

The sweepable weights are shallow fusion's (``lm_weight``), the label bonus (``label_bonus``)
and HAT's internal-LM weight (``ilm_weight``, HAT paper eq. 9). :func:`run_grid` takes the
decoding as a function of a point, so that what a point changes (the search options, the
decoding directory's name) stays with the caller.
"""

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cbasr.evaluation.scoring import score_decode_dir

__all__ = ["SWEEPABLE", "GridResult", "grid_points", "run_grid", "grid_report"]

# weight -> the cbasr-decode option that sets it
SWEEPABLE = {
    "lm_weight": "--lm-weight",
    "label_bonus": "--label-bonus",
    "ilm_weight": "--ilm-weight",
}


@dataclass(frozen=True)
class GridResult:
    """One point's score on one split."""

    point: dict[str, float]
    error_rate: float
    ci95: tuple[float, float]
    decoding: str  # the decoding directory's name


def grid_points(values: dict[str, list[float]]) -> list[dict[str, float]]:
    """Every combination of ``values`` (weight -> its values), the first weight slowest."""
    unknown = set(values) - set(SWEEPABLE)
    if unknown:
        raise ValueError(f"not a sweepable weight: {sorted(unknown)}; known: {list(SWEEPABLE)}")
    return [dict(zip(values, combo)) for combo in itertools.product(*values.values())]


def run_grid(
    points: list[dict[str, float]],
    decode: Callable[[dict[str, float]], dict[str, Path]],
    token_map: str | Path | None = None,
) -> dict[str, list[GridResult]]:
    """Decode and score every point: ``decode(point)`` returns the decoding directory of each
    split. Per split, the results best first (lowest error rate, ties by directory name)."""
    results: dict[str, list[GridResult]] = {}
    for point in points:
        for split, out_dir in decode(point).items():
            score = score_decode_dir(out_dir, token_map=token_map)
            results.setdefault(split, []).append(
                GridResult(dict(point), score["error_rate"], tuple(score["ci95"]), out_dir.name)
            )
    return {
        split: sorted(found, key=lambda r: (r.error_rate, r.decoding))
        for split, found in results.items()
    }


def grid_report(split: str, results: list[GridResult], swept: list[str], title: str) -> str:
    """The Markdown table of one split's results (best first) and the best setting."""
    lines = [
        f"Grid on {split} ({title}); best first.\n",
        "| " + " | ".join(SWEEPABLE[k] for k in swept) + " | error rate (%) | 95% CI | decoding |",
        "|" + "---:|" * len(swept) + "---:|---|---|",
    ]
    for r in results:
        values = " | ".join(f"{r.point[k]:g}" for k in swept)
        low, high = r.ci95
        lines.append(f"| {values} | {r.error_rate:.2f} | [{low:.2f}, {high:.2f}] | {r.decoding} |")
    best = results[0]
    choice = " ".join(f"{SWEEPABLE[k]} {best.point[k]:g}" for k in swept)
    lines.append(
        f"\nBest on {split}: {choice} ({best.error_rate:.2f}%): decode the test set with these."
    )
    return "\n".join(lines) + "\n"
