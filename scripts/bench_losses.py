"""Forward + backward time and peak extra memory of the sequence losses (issue 4).

Compares, at equal ``(B, T, U, V)``:

- ``ctc_nll`` (PyTorch's kernel) and ``cb_marginal_nll`` (explicit forward-backward: on CPU
  the compiled lattice, on CUDA the Triton kernels; ``cb_pytorch`` is the same call on the
  PyTorch reference), plus a
  plain autograd version of the same CB lattice (``T`` logaddexp steps recorded by autograd);
  the CTC and CB rows both start from ``(B, T, V)`` logits and include the log-softmax (and,
  for CB, the gather of the ``L`` reference labels);
- ``rnnt_nll`` (torchaudio, fused log-softmax over ``V`` classes including blank),
  ``rnnt_lattice`` (the same loss by :func:`cbasr.losses.rnnt_lattice_nll`: fused gather and
  log-sum-exp, then the anti-diagonal lattice), ``hat_nll`` (blank logits ``(B, T, U + 1)``
  and label logits over ``V - 1`` labels, with the log-softmax included; a second HAT row
  takes the log-probabilities as given) and ``hat_fused`` (:func:`cbasr.losses.
  hat_nll_from_logits` on one ``(B, T, U + 1, V)`` joint whose unit 0 is the blank logit, as
  the model's ``tanh`` joint trains it); ``hat_pruned`` is the pruned HAT loss
  (:mod:`cbasr.losses.pruned`, ``S = 4`` positions per frame): the trivial joint's
  loss from ``(B, T, V)`` and ``(B, U + 1, V)`` projections, which chooses the windows, plus
  the pruned lattice from ``(B, T, S, V)`` window scores. Like every row it starts from the
  joint's scores: what pruning saves in a model, the joint network evaluated on ``U + 1``
  positions per frame instead of ``S``, is outside all rows.

``--json`` prints one object per measurement (shape, implementation, ``ms`` the median,
``peak_mb``, and which counter measured the memory).

Each measurement runs in a fresh subprocess. Peak extra memory is the growth of the process's
peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs`` after the inputs exist)
on CPU, and ``torch.cuda.max_memory_allocated`` growth on CUDA; it includes the gradients.
``--cpu-memory tensors`` counts on CPU what CUDA's counter counts: the peak of the bytes held by
tensors, from the allocator's events in ``torch.profiler`` (one more, profiled run), without
the allocator's slack, code pages and thread stacks that the resident set holds. With
``--backend`` a loss runs on that backend of :mod:`cbasr._backends` (``triton`` on a CPU needs
``TRITON_INTERPRET=1``: a CUDA code path's memory measured without a GPU, Python's cycle
collector run after each interpreted kernel, whose reference cycles would hold storages a GPU
frees; its times mean nothing).
Times are medians over up to ``--repeats`` runs after one warm-up run (which is the only run
when it alone exceeds ``--budget-s``).

On a CPU shared with other jobs, OpenMP worker threads that spin-wait after each parallel op
slow loops of small ops (the CB and transducer lattices; by how much: recipes/synth/RESULTS.md,
"Measurements behind defaults"); use ``--omp-wait-policy passive`` or ``--threads 1`` there.

    .venv/bin/python scripts/bench_losses.py --device cpu --threads 2 --omp-wait-policy passive
    .venv/bin/python scripts/bench_losses.py --sizes 8,200,50,64 --losses cb,cb_autograd,ctc
    TRITON_INTERPRET=1 .venv/bin/python scripts/bench_losses.py --device cpu --cpu-memory tensors \
        --backend triton --sizes 8,200,50,64 --losses ctc,cb,rnnt,hat_fused --repeats 0
"""

import argparse
import contextlib
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cbasr._backends import use_backend  # noqa: E402
from cbasr.losses import (  # noqa: E402
    cb_marginal_nll,
    ctc_nll,
    hat_nll,
    hat_nll_from_logits,
    pruned_transducer_nll,
    rnnt_lattice_nll,
    rnnt_nll,
    simple_transducer_nll,
)

LOSSES = [
    "ctc",
    "cb",
    "cb_pytorch",
    "cb_autograd",
    "rnnt",
    "rnnt_lattice",
    "hat",
    "hat_fused",
    "hat_pruned",
    "hat_given_log_probs",
]
PRUNE_RANGE = 4  # the hat_pruned row's label positions per frame
DEFAULT_SIZES = "8,200,50,64;8,400,80,256;4,1000,200,1000"


def cb_autograd_lattice(emit_logits, label_log_probs, input_lengths, target_lengths):
    """The CB lattice of eq. (38) written plainly and differentiated by autograd: the baseline
    the explicit forward-backward is measured against. Impossible states start at a finite
    floor because autograd's logaddexp backward turns ``-inf`` + ``-inf`` into NaN (the
    package's explicit backward does not need this)."""
    B, T, L = label_log_probs.shape
    floor = -1e30
    frames = torch.arange(T, device=emit_logits.device)
    valid_t = frames[None, :] < input_lengths[:, None]  # (B, T)
    valid_l = torch.arange(L, device=emit_logits.device)[None, :] < target_lengths[:, None]
    a = torch.where(valid_t, emit_logits, 0.0)
    stay = F.logsigmoid(-a).masked_fill(~valid_t, 0.0).sum(1)  # (B,)
    valid = valid_t[:, :, None] & valid_l[:, None, :]  # (B, T, L)
    emit = torch.where(valid, a[:, :, None] + label_log_probs, floor)  # (B, T, L)
    alpha = torch.full((B, L + 1), floor, device=a.device, dtype=a.dtype)
    alpha[:, 0] = 0.0
    for t in range(T):
        moved = torch.cat([alpha.new_full((B, 1), floor), alpha[:, :-1] + emit[:, t]], dim=1)
        alpha = torch.logaddexp(alpha, moved)  # (B, L + 1)
    return -(stay + alpha.gather(1, target_lengths[:, None])[:, 0])


def _make_inputs(loss, B, T, U, V, device, prune_range=PRUNE_RANGE):
    """Leaf tensors (requiring grad) and a closure computing the per-utterance losses."""
    g = torch.Generator(device="cpu").manual_seed(0)
    il = torch.full((B,), T, dtype=torch.long, device=device)
    tl = torch.full((B,), U, dtype=torch.long, device=device)
    targets = torch.randint(1, V, (B, U), generator=g).to(device)

    def leaf(*shape):
        return torch.randn(*shape, generator=g).to(device).requires_grad_()

    if loss == "ctc":
        z = leaf(B, T, V)
        return [z], lambda: ctc_nll(z.log_softmax(-1), targets, il, tl)
    if loss in ("cb", "cb_pytorch", "cb_autograd"):
        z, a = leaf(B, T, V), leaf(B, T)
        fn = cb_autograd_lattice if loss == "cb_autograd" else cb_marginal_nll

        def run():
            lp = z.log_softmax(-1).gather(2, targets[:, None, :].expand(B, T, U))  # (B, T, L)
            # cb: the device's default backend (numba on CPU, triton on CUDA); cb_pytorch: the
            # PyTorch reference
            with use_backend("torch") if loss == "cb_pytorch" else contextlib.nullcontext():
                return fn(a, lp, il, tl)

        return [z, a], run
    if loss in ("rnnt", "rnnt_lattice"):
        z = leaf(B, T, U + 1, V)
        fn = rnnt_nll if loss == "rnnt" else rnnt_lattice_nll
        return [z], lambda: fn(z, targets, il, tl, blank=0)
    if loss == "hat_fused":  # the model's tanh joint: blank unit 0 beside V - 1 label units
        z = leaf(B, T, U + 1, V)
        return [z], lambda: hat_nll_from_logits(None, z, targets - 1, il, tl)
    if loss == "hat_pruned":
        am, lm, z = leaf(B, T, V), leaf(B, U + 1, V), leaf(B, T, prune_range, V)

        def pruned():
            simple, starts = simple_transducer_nll(am, lm, targets, il, tl, prune_range, hat=True)
            return pruned_transducer_nll(z, starts, targets, il, tl, hat=True) + 0.5 * simple

        return [am, lm, z], pruned
    blank_logits = leaf(B, T, U + 1)
    if loss == "hat":
        z = leaf(B, T, U + 1, V - 1)
        return [blank_logits, z], lambda: hat_nll(
            blank_logits, z.log_softmax(-1), targets - 1, il, tl
        )
    with torch.no_grad():
        lp = torch.randn(B, T, U + 1, V - 1, generator=g).to(device).log_softmax(-1)
    lp.requires_grad_()
    return [blank_logits, lp], lambda: hat_nll(blank_logits, lp, targets - 1, il, tl)


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _release_and_reset(device) -> int:
    """Free what can be freed and reset the peak counter; returns the baseline in bytes."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    return _rss_kib("VmRSS") * 1024


def _peak(device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return _rss_kib("VmHWM") * 1024


def _tensor_peak(once) -> int:
    """Peak growth of the bytes held by CPU tensors over one call of ``once`` (the allocator's
    events recorded by ``torch.profiler``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, acc_events=True) as prof:
        once()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def measure(loss, B, T, U, V, device_name, threads, max_repeats, budget_s, cpu_memory, backend):
    """Child process body: median forward + backward time and peak extra memory."""
    torch.set_num_threads(threads)
    device = torch.device(device_name)
    if backend == "triton" and device.type == "cpu":
        _collect_after_interpreted_launches()
    with use_backend(backend) if backend else contextlib.nullcontext():
        return _measure(loss, B, T, U, V, device, max_repeats, budget_s, cpu_memory)


def _collect_after_interpreted_launches() -> None:
    """Run Python's cycle collector after each kernel Triton's interpreter runs: the
    interpreter's reference cycles keep the storages of a launch's arguments alive until the
    collector runs, which a GPU does not (what they add to a loss's tensor peak:
    recipes/synth/RESULTS.md, "Measurements behind defaults")."""
    from triton.runtime.interpreter import GridExecutor

    call = GridExecutor.__call__

    def call_and_collect(self, *args, **kwargs):
        call(self, *args, **kwargs)
        gc.collect()

    GridExecutor.__call__ = call_and_collect


def _measure(loss, B, T, U, V, device, max_repeats, budget_s, cpu_memory):
    leaves, run = _make_inputs(loss, B, T, U, V, device)

    def once(leaves, run):
        for x in leaves:
            x.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        run().sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    # Load and initialise the kernels on a tiny problem so that the measured peak is the
    # loss's own memory, not code pages or thread pools touched for the first time.
    once(*_make_inputs(loss, 2, 8, 3, min(V, 8), device))
    base = _release_and_reset(device)
    first = once(leaves, run)  # warm-up, and the only timed run when it exceeds the budget
    peak = _peak(device) - base
    times = []
    while len(times) < max_repeats and sum(times) + first < budget_s:
        times.append(once(leaves, run))
    times = times or [first]
    if device.type == "cpu" and cpu_memory == "tensors":
        for x in leaves:
            x.grad = None  # freed before the count starts, as the first run found them
        peak = _tensor_peak(lambda: once(leaves, run))
    return {"time_s": statistics.median(times), "peak_bytes": peak, "runs": len(times)}


def _child(args, omp_wait_policy: str) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps(args)]
    env = dict(os.environ)
    if omp_wait_policy != "default":
        env["OMP_WAIT_POLICY"] = omp_wait_policy.upper()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="B,T,U,V;B,T,U,V;...")
    parser.add_argument("--losses", default=",".join(LOSSES), help=",".join(LOSSES))
    parser.add_argument("--repeats", type=int, default=5, help="most timed runs per cell")
    parser.add_argument("--budget-s", type=float, default=10.0, help="time budget per cell")
    parser.add_argument(
        "--omp-wait-policy",
        choices=["default", "passive", "active"],
        default="default",
        help="OMP_WAIT_POLICY for the measuring processes; 'passive' avoids OpenMP workers "
        "spinning against the main thread on a CPU shared with other jobs",
    )
    parser.add_argument(
        "--cpu-memory",
        choices=["rss", "tensors"],
        default="rss",
        help="on CPU, peak extra memory as the resident set's growth (VmHWM) or as the peak of "
        "the bytes held by tensors (what CUDA's max_memory_allocated counts; one profiled run)",
    )
    parser.add_argument(
        "--backend",
        choices=["torch", "numba", "triton"],
        help="run each loss on this backend (triton on CPU: TRITON_INTERPRET=1)",
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per measurement instead of tables"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*json.loads(args.child))))
        return

    sizes = [tuple(int(v) for v in s.split(",")) for s in args.sizes.split(";")]
    losses = args.losses.split(",")
    if not args.json:
        print(
            f"device={args.device} threads={args.threads} omp_wait_policy={args.omp_wait_policy} "
            f"torch={torch.__version__}\n"
        )
        print("| loss | (B, T, U, V) | fwd+bwd ms | peak extra MiB | extra / joint |")
        print("|---|---|---:|---:|---:|")
    results = {}
    for B, T, U, V in sizes:
        joint = B * T * (U + 1) * V * 4  # float32 bytes of the (B, T, U + 1, V) joint
        for loss in losses:
            r = _child(
                [loss, B, T, U, V, args.device, args.threads, args.repeats, args.budget_s]
                + [args.cpu_memory, args.backend],
                args.omp_wait_policy,
            )
            results[(loss, B, T, U, V)] = r
            if args.json:
                memory = "cuda max_memory_allocated" if args.device.startswith("cuda") else "VmHWM"
                if memory == "VmHWM" and args.cpu_memory == "tensors":
                    memory = "tensor bytes (torch.profiler)"
                print(
                    json.dumps(
                        {
                            "shape": {"B": B, "T": T, "U": U, "V": V},
                            "implementation": loss,
                            "ms": None if "error" in r else round(1e3 * r["time_s"], 3),
                            "peak_mb": None if "error" in r else round(r["peak_bytes"] / 2**20, 2),
                            "memory": memory,
                            "threads": args.threads,
                            "device": args.device,
                            **({"backend": args.backend} if args.backend else {}),
                            **({"error": r["error"]} if "error" in r else {}),
                        }
                    ),
                    flush=True,
                )
                continue
            if "error" in r:
                print(f"| {loss} | ({B}, {T}, {U}, {V}) | error: {r['error']} | | |")
                continue
            transducer = loss.startswith(("rnnt", "hat"))
            ratio = f"{r['peak_bytes'] / joint:.2f}" if transducer else ""
            print(
                f"| {loss} | ({B}, {T}, {U}, {V}) | {1e3 * r['time_s']:.1f} "
                f"| {r['peak_bytes'] / 2**20:.1f} | {ratio} |",
                flush=True,
            )
    if args.json:
        return
    print(
        "\n| (B, T, U, V) | cb / ctc time | cb pytorch / ctc time | cb autograd / cb time | "
        "hat / rnnt time | hat / rnnt memory | hat (given log-probs) / rnnt time | "
        "hat (given log-probs) / rnnt memory |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for B, T, U, V in sizes:

        def ratio(num, den, key, shape=(B, T, U, V)):
            a, b = results.get((num, *shape), {}), results.get((den, *shape), {})
            if key not in a or key not in b or b[key] == 0:
                return "n/a"
            return f"{a[key] / b[key]:.2f}"

        print(
            f"| ({B}, {T}, {U}, {V}) | {ratio('cb', 'ctc', 'time_s')} "
            f"| {ratio('cb_pytorch', 'ctc', 'time_s')} | {ratio('cb_autograd', 'cb', 'time_s')} "
            f"| {ratio('hat', 'rnnt', 'time_s')} "
            f"| {ratio('hat', 'rnnt', 'peak_bytes')} "
            f"| {ratio('hat_given_log_probs', 'rnnt', 'time_s')} "
            f"| {ratio('hat_given_log_probs', 'rnnt', 'peak_bytes')} |"
        )
    print(
        "\n| (B, T, U, V) | rnnt_lattice / rnnt time | rnnt_lattice / rnnt memory "
        "| hat_fused / rnnt time | hat_fused / rnnt memory "
        "| hat_pruned / rnnt time | hat_pruned / rnnt memory |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for B, T, U, V in sizes:
        shape = (B, T, U, V)
        cells = [
            _ratio(results, name, "rnnt", key, shape)
            for name in ("rnnt_lattice", "hat_fused", "hat_pruned")
            for key in ("time_s", "peak_bytes")
        ]
        print(f"| ({B}, {T}, {U}, {V}) | " + " | ".join(cells) + " |")


def _ratio(results, num, den, key, shape) -> str:
    a, b = results.get((num, *shape), {}), results.get((den, *shape), {})
    if key not in a or key not in b or b[key] == 0:
        return "n/a"
    return f"{a[key] / b[key]:.2f}"


if __name__ == "__main__":
    main()
