"""Where a small loss's time goes on a GPU: per-call time, host time per launch, cProfile."""
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_losses  # noqa: E402


def timed(fn, n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return 1e6 * host / n, 1e6 * (time.perf_counter() - t0) / n


def main():
    B, T, U, V = 8, 200, 50, 64
    x = torch.randn(1000, device="cuda")
    print("aten add: host/total us per call %.1f / %.1f" % timed(lambda: torch.add(x, 1), 300))
    from cbasr.losses import _cb_triton

    emit_t = torch.randn(T, B, U, device="cuda")
    lens = torch.full((B,), U, device="cuda")
    for _ in range(3):
        _cb_triton.forward(emit_t, lens)
    print("cb triton forward wrapper: %.1f / %.1f" % timed(lambda: _cb_triton.forward(emit_t, lens), 300))
    alpha = emit_t.new_empty(T + 1, B, U + 1)
    log_z = emit_t.new_empty(B)
    l32 = lens.int()
    block, warps = _cb_triton._block(U + 1)
    kernel = _cb_triton._forward_kernel

    def bare():
        kernel[(B,)](emit_t, alpha, log_z, l32, T, B, U, BLOCK=block, num_warps=warps)

    print("cb _forward_kernel bare JIT launch: %.1f / %.1f" % timed(bare, 300))
    for name in ("ctc", "cb", "hat_fused"):
        leaves, run = bench_losses._make_inputs(name, B, T, U, V, "cuda")

        def once():
            for leaf in leaves:
                leaf.grad = None
            run().sum().backward()

        for _ in range(5):
            once()
        print(f"{name} forward+backward: host/total us %.1f / %.1f" % timed(once, 50))
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            once()
        torch.cuda.synchronize()
        prof.disable()
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out).sort_stats("tottime")
        stats.print_stats(14)
        print(out.getvalue()[-3500:])


main()
