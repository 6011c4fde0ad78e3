"""Benchmark the sampling estimators: time of one estimate (sampling, loss and backward).

Every estimator of :mod:`cbasr.estimators` runs on the same random batch (``B`` utterances of
``T`` frames and ``L`` labels, memoryless rewards, ``M`` samples); the exact objective
(:func:`cbasr.estimators.cb_expected_reward`) and the exact marginal
(:func:`cbasr.losses.cb_marginal_nll`) are timed beside them. Reported: median and minimum of
``--repeats`` runs after one warm-up run (CUDA: synchronised). Variance and bias are measured
by ``recipes/toy``, not here.

Usage::

    .venv/bin/python scripts/bench_estimators.py --threads 2
    .venv/bin/python scripts/bench_estimators.py --device cuda --batch 32 --frames 500
"""

import argparse
import json
import statistics
import time

import torch

from cbasr.estimators import (
    RebarControlVariate,
    cb_expected_reward,
    cb_reinforce,
    forced_suffix_reinforce,
    multi_sample_lower_bound,
    relax_cb,
    straight_through_cb,
    variational_lower_bound,
)
from cbasr.losses import cb_marginal_nll


def _cases(M: int):
    control = RebarControlVariate(learn=False)
    return {
        "exact marginal (eq. 38)": lambda x, r, k, n, g: cb_marginal_nll(x, r, n, k),
        "expected reward (eq. 19)": lambda x, r, k, n, g: -cb_expected_reward(x, k, r, n),
        **{
            f"cb_reinforce {e}": (
                lambda x, r, k, n, g, e=e: cb_reinforce(x, k, r, n, e, M, "loo", g).loss
            )
            for e in ("global", "idb", "bb", "mbb")
        },
        "forced_suffix_reinforce": lambda x, r, k, n, g: (
            forced_suffix_reinforce(x, k, r, n, M, "loo", 0.0, g).loss
        ),
        "variational Q_Bin (eq. 46)": lambda x, r, k, n, g: (
            variational_lower_bound(x, k, r, n, "binomial", M, "loo", generator=g).loss
        ),
        "multi-sample Q_FS (eq. 47)": lambda x, r, k, n, g: (
            multi_sample_lower_bound(x, k, r, n, "forced_suffix", M, generator=g).loss
        ),
        "straight-through (eq. 37)": lambda x, r, k, n, g: (
            straight_through_cb(x, k, r, n, "id_checking", 0.5, M, g).loss
        ),
        "relax id_checking (eq. 36)": lambda x, r, k, n, g: (
            relax_cb(x, k, r, n, control.to(x.dtype).to(x.device), "id_checking", M, "loo", g).loss
        ),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--labels", type=int, default=30)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    g = torch.Generator(device=device).manual_seed(0)
    B, T, L = args.batch, args.frames, args.labels
    logits = torch.randn(B, T, device=device, generator=g)
    rewards = -3 * torch.rand(B, T, L, device=device, generator=g)
    total = torch.full((B,), L, device=device)
    lengths = torch.full((B,), T, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for name, fn in _cases(args.samples).items():
        times = []
        for repeat in range(args.repeats + 1):
            x, r = logits.clone().requires_grad_(), rewards.clone().requires_grad_()
            sync()
            start = time.perf_counter()
            torch.autograd.grad(fn(x, r, total, lengths, g).sum(), (x, r))
            sync()
            if repeat:  # the first run is a warm-up
                times.append(time.perf_counter() - start)
        rows.append({"estimator": name, "median_s": statistics.median(times), "min_s": min(times)})
        print(
            f"{name:32s} median {rows[-1]['median_s'] * 1e3:8.1f} ms  "
            f"min {rows[-1]['min_s'] * 1e3:8.1f} ms",
            flush=True,
        )
    print(json.dumps({"config": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
