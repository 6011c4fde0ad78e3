"""Where a small loss call's time goes on a GPU: host and total time per call of one PyTorch
operator, of a Triton launch (through its wrapper and bare) and of ``ctc``, ``cb`` and
``hat_fused`` forward + backward at (8, 200, 50, 64), then a cProfile of each loss call.

    python3 scripts/probe_launch.py      # on a GPU machine; prints its findings

``host`` is the time until the calls return, ``total`` until the device has finished them: equal
totals mean the host is the bound. ``benchmarks/gpu-4fba590/probe_launch.txt`` holds a run on
an H200.
"""

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_losses  # noqa: E402


def timed(fn, n: int) -> str:
    """``host / total`` microseconds per call of ``fn`` over ``n`` calls."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    total = time.perf_counter() - start
    return f"{1e6 * host / n:.1f} / {1e6 * total / n:.1f}"


def loss_call(name: str, sizes):
    leaves, run = bench_losses._make_inputs(name, *sizes, "cuda")

    def once():
        for leaf in leaves:
            leaf.grad = None
        run().sum().backward()

    return once


def main() -> None:
    B, T, U, V = sizes = (8, 200, 50, 64)
    x = torch.randn(1000, device="cuda")
    print("aten add, host / total us per call:", timed(lambda: torch.add(x, 1), 300))
    from cbasr.losses import _cb_triton

    emit_t = torch.randn(T, B, U, device="cuda")
    lens = torch.full((B,), U, device="cuda")
    print("cb Triton forward, wrapper:", timed(lambda: _cb_triton.forward(emit_t, lens), 300))
    alpha, log_z, l32 = emit_t.new_empty(T + 1, B, U + 1), emit_t.new_empty(B), lens.int()
    block, warps = _cb_triton._block(U + 1)

    def bare():
        _cb_triton._forward_kernel[(B,)](
            emit_t, alpha, log_z, l32, T, B, U, BLOCK=block, num_warps=warps
        )

    print("cb Triton forward, bare launch:", timed(bare, 300))
    for name in ("ctc", "cb", "hat_fused"):
        once = loss_call(name, sizes)
        for _ in range(5):
            once()
        print(f"{name} forward + backward, host / total us:", timed(once, 50))
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(20):
            once()
        torch.cuda.synchronize()
        profile.disable()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(14)
        print(out.getvalue()[-3500:])


if __name__ == "__main__":
    main()
