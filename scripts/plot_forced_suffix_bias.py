"""Redraw Figure 1 of the CB paper: the forced-suffix emission probabilities of eq. (3).

Left: a 3 s utterance with L = 38 labels and i.i.d. p = 0.5, at 10 ms (T = 300) and 30 ms
(T = 100) frames. Right: 30 ms frames with several p. Lines are the closed form
(:func:`cbasr.estimators.forced_suffix_marginals`); points are the empirical ``P(B_t = 1)`` of
``--samples`` forced-suffix samples (:func:`cbasr.estimators.forced_suffix_sample`); dashed
horizontal lines are the unbiased ``L / T`` and dotted vertical lines mark frame ``t = L``.
The largest deviation between points and lines, in Monte Carlo standard errors, is printed.

Usage::

    .venv/bin/python scripts/plot_forced_suffix_bias.py --out forced_suffix_bias.png
"""

import argparse
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from cbasr.estimators import forced_suffix_marginals, forced_suffix_sample  # noqa: E402

DURATION = 3.0  # seconds, an average TIMIT utterance
LABELS = 38  # an average TIMIT transcription


def _curve(
    ax, p: float, frame: float, samples: int, generator, label: str, every: int, guides=None
) -> float:
    """Draw one closed-form curve with its sampled points and its guide lines (in ``guides``,
    default the curve's colour); return the worst z-score of the points."""
    T = round(DURATION / frame)
    closed = forced_suffix_marginals(p, LABELS, T)
    logits = torch.full((1, T), math.log(p / (1 - p)), dtype=torch.float64)
    draws, _ = forced_suffix_sample(logits, LABELS, None, samples, generator)
    empirical = draws.mean((0, 1))
    seconds = (torch.arange(T, dtype=torch.float64) + 1) * frame
    (line,) = ax.plot(seconds, closed, label=label)
    ax.scatter(seconds[::every], empirical[::every], s=8, color=line.get_color(), alpha=0.6)
    guides = guides or line.get_color()
    ax.axhline(LABELS / T, color=guides, linestyle="--", linewidth=0.8)
    ax.axvline(LABELS * frame, color=guides, linestyle=":", linewidth=0.8)
    error = (closed * (1 - closed) / samples).sqrt() + 1 / samples
    return float(((empirical - closed).abs() / error).max())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="forced_suffix_bias.png", help="PNG to write")
    parser.add_argument("--samples", type=int, default=4000, help="forced-suffix samples per curve")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    generator = torch.Generator().manual_seed(args.seed)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    worst = []
    for frame, every in ((0.03, 1), (0.01, 3)):
        worst.append(
            _curve(
                left, 0.5, frame, args.samples, generator, f"{frame * 1000:.0f} ms frames", every
            )
        )
    left.set_title(f"p = 0.5, L = {LABELS}, {DURATION:.0f} s")
    for p in (0.2, 0.38, 0.5, 0.8):
        worst.append(_curve(right, p, 0.03, args.samples, generator, f"p = {p}", 1, "gray"))
    right.set_title(f"30 ms frames, L = {LABELS}, {DURATION:.0f} s")
    for ax in (left, right):
        ax.set_xlabel("time (s)")
        ax.legend(fontsize=8)
    left.set_ylabel("P*(B_t = 1)  (eq. 3)")
    fig.suptitle(
        "Forced-suffix emission probabilities: closed form (lines), samples (points), L/T (dashed)"
    )
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(
        f"wrote {args.out}; largest |sampled - eq. (3)| = {max(worst):.2f} standard errors "
        f"({args.samples} samples per curve)"
    )


if __name__ == "__main__":
    main()
