"""Every Triton kernel compiles for a GPU (sm_90, float32 and float64, half precision where
a kernel reads it, as the launchers launch it, integer arguments at run time and equal to 1,
no batch size specialised), checked on the CPU by
tests/triton_compile.py in a process without Triton's interpreter: the interpreter tests check
what the kernels compute, this what a GPU would be given."""

import importlib.util
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None, reason="needs the triton package"
    ),
]


def _compile(tmp_path, *args) -> tuple[str, Counter]:
    """Run tests/triton_compile.py with ``args``: its output and each kernel's compilations."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # compile, do not read a cached result
    run = subprocess.run(
        [sys.executable, "-m", "tests.triton_compile", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = run.stdout.splitlines()
    failures = [line for line in lines if line.startswith("FAIL")]
    assert run.returncode == 0 and not failures, "\n".join(failures) or run.stderr[-2000:]
    compiled = Counter(line.split()[1] for line in lines if line.startswith("ok"))
    assert len(compiled) >= 16  # every kernel module's kernels were found
    # both lowerings of tl.gather (a warp shuffle in one warp, shared memory across two), both
    # transducer topologies, and the constants Triton makes of integers equal to 1
    for variant in ("BLOCK=64, 1 warp(s)", "BLOCK=256, 2 warp(s)", "MONOTONIC=False"):
        assert variant in run.stdout
    assert "MONOTONIC=True" in run.stdout and "integers equal to 1" in run.stdout
    return run.stdout, compiled


def test_every_kernel_compiles_for_a_gpu(tmp_path):
    """A representative of each variant: float32, float16, and float64 where the kernel takes
    a ``FLOOR`` (see the script)."""
    from tests import triton_compile  # (imports triton)

    out, compiled = _compile(tmp_path)
    for name, count in compiled.items():
        assert count >= (2 if name.rsplit(".", 1)[1] in triton_compile.HALVES else 1), name
    for dtype in ("fp32", "fp64", "fp16"):
        assert f" {dtype}, " in out
    assert " fp64, integers equal to 1" not in out  # (the slow test's)


@pytest.mark.slow
def test_every_kernel_compiles_in_every_variant(tmp_path):
    from tests import triton_compile

    out, compiled = _compile(tmp_path, "--every-variant")
    for name, count in compiled.items():  # float32 and float64 (and half precision), at least
        assert count >= (8 if name.rsplit(".", 1)[1] in triton_compile.HALVES else 2), name
    assert " bf16, " in out and " fp64, integers equal to 1" in out
