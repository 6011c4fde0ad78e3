"""Benchmark ``ConditionalBernoulli.log_prob`` + backward and ``sample`` against a naive DP.

The naive baseline is the straightforward O(T * k) dynamic programme for the count
``log C(k, I; w)`` (eq. 8) with a Python loop over frames and autograd recording every step;
its sampler runs ID-checking (eq. 11) over a naive suffix table. Both sides run in the same
process on the same inputs, and their log probabilities are checked against each other.

Timing: median (and minimum) of ``--repeats`` runs after one warm-up run, the implementations
of an operation taking turns (CUDA: synchronised).
Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` above the memory held before the
call. On CPU, the peak resident set size during the call minus the resident set before it,
measured in a fresh subprocess that has already built its inputs (Linux ``VmHWM``, reset
through ``/proc/self/clear_refs``; the same quantity as ``resource.getrusage().ru_maxrss``,
which is the fallback elsewhere but cannot be reset). It counts everything the call
allocates, the autograd graph included, at page granularity; one-time costs (lazy imports)
are paid by a tiny warm-up run first.

``--author-src`` adds the CB paper author's implementation (sdrobert/conditional-bernoulli's
``distributions.py`` with the ``pydrobert.torch`` its ``environment.yml`` pins; not shipped
here) as an ``author`` row of each operation; ``--json`` prints one object per measurement.

Usage::

    .venv/bin/python scripts/bench_distributions.py --threads 1
    .venv/bin/python scripts/bench_distributions.py --threads 1 --json --author-src SRC:SITE
    .venv/bin/python scripts/bench_distributions.py --device cuda
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from cbasr._backends import use_backend
from cbasr.distributions import ConditionalBernoulli

CASES = {
    "log_prob + backward": ("cbasr", "cbasr pytorch", "naive"),
    "sample": (
        "cbasr bounded",
        "cbasr id_checking",
        "cbasr id_checking pytorch",
        "cbasr draft",
        "naive id_checking",
    ),
}


# ---- the naive baseline ---------------------------------------------------------------------


def naive_log_prob(logits: torch.Tensor, total: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum_t b_t logit_t - log C(k, I; w)`` with a per-frame loop over a ``(B, k + 1)`` state.

    Only reachable counts are updated (count ``v <= t``), so no ``-inf - -inf`` enters autograd.
    """
    B, T = logits.shape
    K = int(total.max())
    alpha = logits.new_full((B, K + 1), float("-inf"))
    alpha[:, 0] = 0.0
    for t in range(T):
        top = min(t + 1, K)
        grown = torch.logaddexp(alpha[:, 1 : top + 1], alpha[:, :top] + logits[:, t : t + 1])
        alpha = torch.cat([alpha[:, :1], grown, alpha[:, top + 1 :]], dim=1)
    return (b * logits).sum(-1) - alpha.gather(1, total.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def naive_sample(logits: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """ID-checking: a naive suffix count table, then one Bernoulli step per frame."""
    B, T = logits.shape
    K = int(total.max())
    suffix = logits.new_full((T + 1, B, K + 1), float("-inf"))
    suffix[T, :, 0] = 0.0
    for t in range(T - 1, -1, -1):
        suffix[t, :, 0] = 0.0
        grown = suffix[t + 1, :, :-1] + logits[:, t : t + 1]
        suffix[t, :, 1:] = torch.logaddexp(suffix[t + 1, :, 1:], grown)
    remaining = total.clone()
    b = torch.zeros_like(logits)
    for t in range(T):
        one_fewer = (remaining - 1).clamp(min=0).unsqueeze(-1)
        on = logits[:, t] + suffix[t + 1].gather(1, one_fewer).squeeze(-1)
        p = torch.exp(on - suffix[t].gather(1, remaining.unsqueeze(-1)).squeeze(-1))
        p = torch.where(remaining > 0, p, 0.0)
        b[:, t] = (torch.rand(B, device=logits.device, dtype=logits.dtype) < p).to(logits.dtype)
        remaining = remaining - b[:, t].long()
    return b


# ---- cases ------------------------------------------------------------------------------------


def make_inputs(args):
    generator = torch.Generator().manual_seed(0)
    dtype = getattr(torch, args.dtype)
    logits = (torch.randn(args.batch, args.frames, generator=generator) * 2.0).to(
        args.device, dtype
    )
    total = torch.full((args.batch,), args.total, device=args.device)
    # Any sequence with k highs will do for log_prob: k random frames (cheap, so that the
    # memory measurement of a case is not hidden by building its inputs).
    frames = torch.rand(args.batch, args.frames, generator=generator).argsort(-1)[:, : args.total]
    b = torch.zeros(args.batch, args.frames).scatter(1, frames, 1.0).to(args.device, dtype)
    return logits, total, b


def _author_module():
    """The CB paper author's ``distributions`` module (sdrobert/conditional-bernoulli), found
    on ``sys.path`` (``--author-src``); it needs ``pydrobert.torch`` at the commit the
    author's ``environment.yml`` pins. Not part of cbasr: a baseline to measure against."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its torch.jit.script deprecation notes
        import distributions

    return distributions


def run_case(operation: str, implementation: str, logits, total, b) -> None:
    if implementation.endswith(" pytorch"):  # cbasr without its compiled CPU loops
        with use_backend("torch"):
            return run_case(operation, implementation.removesuffix(" pytorch"), logits, total, b)
    if implementation == "author":  # ConditionalBernoulli(given_count, logits=...)
        author = _author_module()
        if operation == "log_prob + backward":
            x = logits.detach().requires_grad_()
            author.ConditionalBernoulli(total, logits=x).log_prob(b).sum().backward()
        else:
            author.ConditionalBernoulli(total, logits=logits).sample()
        return
    if operation == "log_prob + backward":
        x = logits.detach().requires_grad_()
        if implementation == "cbasr":
            log_prob = ConditionalBernoulli(x, total).log_prob(b)
        else:
            log_prob = naive_log_prob(x, total, b)
        log_prob.sum().backward()
    elif implementation == "naive id_checking":
        naive_sample(logits, total)
    else:
        ConditionalBernoulli(logits, total, sampler=implementation.split()[1]).sample()


def time_operation(operation, implementations, inputs, args) -> dict[str, list[float]]:
    """Milliseconds per run of each implementation, one warm-up run each, then the repeats
    taken round-robin so that a change in machine load hits every implementation alike."""
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    times = {implementation: [] for implementation in implementations}
    for implementation in implementations:
        run_case(operation, implementation, *inputs)  # warm-up
    for _ in range(args.repeats):
        for implementation in implementations:
            sync()
            start = time.perf_counter()
            run_case(operation, implementation, *inputs)
            sync()
            times[implementation].append(1e3 * (time.perf_counter() - start))
    return times


def peak_memory_mib(operation, implementation, inputs, args) -> float:
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run_case(operation, implementation, *inputs)
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    # CPU: a fresh process, so that earlier cases do not hide this one's peak.
    case = json.dumps([operation, implementation])
    command = [sys.executable, __file__, "--measure", case] + args.forward
    return float(subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip())


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1])
    raise KeyError(key)


def measure_in_this_process(operation, implementation, args) -> None:
    """Print the peak resident set growth (MiB) of one call.

    Linux: reset the peak (``VmHWM``) through ``/proc/self/clear_refs``, then compare the
    peak after the call with the resident set before it. Elsewhere: the growth of
    ``ru_maxrss``, which misses anything below an earlier peak (e.g. during imports).
    """
    # A tiny warm-up run does the one-time work (lazy imports: torch.distributions' first
    # validation imports sympy, about 36 MiB) without touching much memory.
    tiny = argparse.Namespace(**{**vars(args), "batch": 1, "frames": 4, "total": 1})
    run_case(operation, implementation, *make_inputs(tiny))
    inputs = make_inputs(args)
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # reset VmHWM to the current resident set
        before = _status_kib("VmRSS")
        run_case(operation, implementation, *inputs)
        after = _status_kib("VmHWM")
    except OSError:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        run_case(operation, implementation, *inputs)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print((after - before) / 1024)


def check_agreement(logits, total, b) -> float:
    ours = ConditionalBernoulli(logits.double(), total).log_prob(b.double())
    naive = naive_log_prob(logits.double(), total, b.double())
    return float((ours - naive).abs().max())


def float32_errors(logits, total, b, author: bool) -> dict[str, float]:
    """Largest relative error of the float32 log probability against the float64 naive DP,
    per implementation (cbasr with and without its compiled loops, and the author's)."""
    reference = naive_log_prob(logits.double(), total, b.double())
    x, value = logits.float(), b.float()
    found = {"cbasr": ConditionalBernoulli(x, total).log_prob(value)}
    with use_backend("torch"):
        found["cbasr pytorch"] = ConditionalBernoulli(x, total).log_prob(value)
    if author:
        found["author"] = _author_module().ConditionalBernoulli(total, logits=x).log_prob(value)
    return {
        name: float(((log_prob.double() - reference) / reference).abs().max())
        for name, log_prob in found.items()
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--frames", type=int, default=1000)
    parser.add_argument("--total", type=int, default=200)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per measurement instead of a table"
    )
    parser.add_argument(
        "--author-src",
        default=None,
        help="directories (':'-separated) holding the CB paper author's distributions.py and "
        "its pydrobert.torch: adds an 'author' row to each operation",
    )
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    # The command line minus --measure, for the memory subprocesses.
    args.forward = [
        a for i, a in enumerate(argv) if a != "--measure" and (i == 0 or argv[i - 1] != "--measure")
    ]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cases = dict(CASES)
    if args.author_src:
        sys.path[:0] = args.author_src.split(":")
        cases = {operation: (*names, "author") for operation, names in CASES.items()}
    if args.measure is not None:
        measure_in_this_process(*json.loads(args.measure), args)
        return
    inputs = make_inputs(args)
    agreement = check_agreement(*inputs)
    errors = float32_errors(*inputs, author=bool(args.author_src))
    if args.json:
        print(json.dumps({"float32_relative_error": errors, "float64_max_abs": agreement}))
    else:
        described = ", ".join(f"{name} {error:.1e}" for name, error in errors.items())
        print(
            f"device={args.device} B={args.batch} T={args.frames} k={args.total} "
            f"dtype={args.dtype} threads={torch.get_num_threads()} repeats={args.repeats}; "
            f"max |log_prob(cbasr) - log_prob(naive)| in float64 = {agreement:.2e}; "
            f"float32 log_prob, largest relative error against the float64 DP: {described}\n"
        )
        print("| operation | implementation | median ms | min ms | peak extra memory (MiB) |")
        print("|---|---|---:|---:|---:|")
    for operation, implementations in cases.items():
        times = time_operation(operation, implementations, inputs, args)
        for implementation in implementations:
            median, fastest = statistics.median(times[implementation]), min(times[implementation])
            mib = peak_memory_mib(operation, implementation, inputs, args)
            if args.json:
                record = {
                    "shape": {"B": args.batch, "T": args.frames, "k": args.total},
                    "operation": operation,
                    "implementation": implementation,
                    "ms": round(median, 3),
                    "min_ms": round(fastest, 3),
                    "peak_mb": round(mib, 2),
                    "memory": "cuda max_memory_allocated"
                    if args.device.startswith("cuda")
                    else "VmHWM",
                    "dtype": args.dtype,
                    "threads": torch.get_num_threads(),
                    "float64_agreement": agreement,
                }
                print(json.dumps(record), flush=True)
                continue
            print(f"| {operation} | {implementation} | {median:.1f} | {fastest:.1f} | {mib:.1f} |")


if __name__ == "__main__":
    main()
