"""Compile every Triton kernel of the package for a GPU, without one (``python -m
tests.triton_compile``; run by tests/test_triton_compile.py in a process without
``TRITON_INTERPRET``): all of Triton's stages down to the cubin for an H100 (``sm_90``), in
float32 and float64 (and half precision where a kernel reads it), with each setting of a
kernel's boolean switches (``MONOTONIC``), at block sizes and warps as the launchers pick them
(one warp, whose ``tl.gather`` is a warp shuffle, and two, whose exchange goes through shared
memory; the samplers' 32 lanes; the rows' kernels' tile):
with its integer arguments as run-time values, and with every one Triton may specialise (a row
stride, the first column) set to the constant 1 too (Triton compiles an argument equal to 1 as
a constant, so a loop bound of 1 becomes an empty loop there). The interpreter runs neither
stage. A float64 kernel whose ``FLOOR`` constant the compiler rounded to float32
fails too, and so does a kernel that lets Triton specialise an integer argument that is a size
of the batch (see :mod:`cbasr._triton`: each new batch shape would compile it again). Prints
one line per compilation, ``FAIL`` for a failure.

``--every-variant`` compiles every combination of the above. Without it, a representative of
each (``make test``'s): every kernel in float32 at each launch with its switches all off and all
on (each setting of each switch once), with its integers equal to 1 at the first launch, and
at the first launch with run-time integers and the switches off in float16 and, for the
kernels that take a ``FLOOR``, float64 (bfloat16 and the rest of the combinations: ``make
test-slow``)."""

import importlib
import inspect
import itertools
import math
import re
import struct
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from cbasr._triton import block
from cbasr.losses._cb_second_order_triton import _tile

ROOT = Path(__file__).resolve().parents[1]
TARGET = GPUTarget("cuda", 90, 32)
# pointers that are not of the kernel's float type, by kernel and argument
POINTERS = {
    # the count tables and samplers: the distribution's int64 totals and lengths
    **{
        name: {"lengths_ptr": "*i64", "total_ptr": "*i64"}
        for name in (
            "_tilt_kernel",
            "_prefix_kernel",
            "_inclusion_kernel",
            "_id_checking_kernel",
            "_log_prob_backward_kernel",
        )
    },
    "_log_prob_kernel": {"lengths_ptr": "*i64", "total_ptr": "*i64", "codes_ptr": "*i8"},
    "_suffix_kernel": {"lengths_ptr": "*i64", "total_ptr": "*i64", "possible_ptr": "*i1"},
    "_bounded_kernel": {"lengths_ptr": "*i64", "total_ptr": "*i64", "out_ptr": "*i64"},
    # the simple loss: the model's int64 targets and lengths, the windows' int64 starts
    **{
        name: {
            "targets_ptr": "*i64",
            "input_lengths_ptr": "*i64",
            "target_lengths_ptr": "*i64",
        }
        for name in ("_simple_edges_kernel", "_simple_grad_am_kernel", "_simple_grad_lm_kernel")
    },
    "_windows_kernel": {
        "input_lengths_ptr": "*i64",
        "target_lengths_ptr": "*i64",
        "starts_ptr": "*i64",
    },
    "_viterbi_kernel": {"emitted_ptr": "*i8"},
    "_windowed_viterbi_kernel": {"best_k_ptr": "*i32", "far_row_ptr": "*i32"},
    # the CTC lattice: the model's int64 targets and lengths
    **{
        name: {"targets_ptr": "*i64", "input_lengths_ptr": "*i64", "target_lengths_ptr": "*i64"}
        for name in ("_ctc_forward_kernel", "_ctc_backward_kernel")
    },
    # the loss's own lengths, as the caller passes them (int64)
    "_marginal_forward_kernel": {"input_lengths_ptr": "*i64", "target_lengths_ptr": "*i64"},
    "_marginal_backward_kernel": {"input_lengths_ptr": "*i64", "target_lengths_ptr": "*i64"},
    # the transducer lattice and HAT's joint passes: the model's int64 targets and lengths
    "_lattice_forward_kernel": {"lengths_ptr": "*i64"},
    "_lattice_backward_kernel": {"lengths_ptr": "*i64"},
    **{
        name: {
            "targets_ptr": "*i64",
            "starts_ptr": "*i64",
            "input_lengths_ptr": "*i64",
            "target_lengths_ptr": "*i64",
        }
        for name in ("_joint_edges_kernel", "_joint_grad_kernel")
    },
}
INTEGERS = ("lengths", "total", "rows")  # pointers to int32 arrays
# (BLOCK, num_warps) as the launchers pick them (cbasr._triton.block): one warp, whose
# tl.gather is a warp shuffle, and two, whose tl.gather goes through shared memory; the
# samplers' lanes are one warp of 32; the rows' kernels take 4 warps
LAUNCHES = [block(64), block(256)]
SAMPLERS = ("_id_checking_kernel", "_bounded_kernel")
# integer arguments that stay the same over a run (a joint's row stride, its first label unit,
# the column of label 0), which Triton may specialise; every other integer argument is a size
# of the batch
STEADY = ("stride", "start", "offset")
# kernels that also read (and write) half precision, computing in float32: those pointers
HALVES = {
    "_row_logsumexp_kernel": ("x_ptr",),
    "_row_softmax_kernel": ("x_ptr", "grad_ptr"),
    "_joint_edges_kernel": ("x_ptr", "blank_ptr"),
    "_joint_grad_kernel": ("x_ptr", "blank_ptr", "grad_ptr", "grad_blank_ptr"),
}


def kernel_modules() -> list[str]:
    return sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "cbasr").rglob("_*triton.py")
    )


def launches(name: str, fn) -> list[tuple[dict, int]]:
    """``(block constants, num_warps)`` of the compilations of one kernel, as launched."""
    parameters = inspect.signature(fn.fn).parameters
    if name in SAMPLERS:
        return [({"BLOCK": 32}, 1)]
    if "WINDOW" in parameters:  # the second-order tiles: (16 states, W = 16), (256, W = 4)
        tiles = [_tile(16, 16), _tile(256, 4)]
        return [({"BLOCK": size, "WINDOW": window}, warps) for size, window, warps in tiles]
    if "BLOCK" in parameters:
        return [({"BLOCK": size}, warps) for size, warps in LAUNCHES]
    return [({}, 4)]


def variants(name: str, fn, dtype: str):
    """``(label, signature, constants, switches)`` of the compilations of one kernel (the
    boolean switches' values, in the signature's order)."""
    signature, constants, specialised = {}, {}, []
    for param in inspect.signature(fn.fn).parameters.values():
        if "constexpr" in str(param.annotation):
            signature[param.name] = "constexpr"
            # FLOOR: the least exponent, a float (a constant, so that it keeps float64 there)
            floor = math.log(sys.float_info.min) + 0.5 if dtype == "fp64" else -87.0
            values = {
                "BLOCK": 64,
                "FRAMES": 128,
                "WINDOW": 16,
                "FLOOR": floor,
                "ROWS": 8,
                "COLS": 256,
                "STEPS": 40,
            }
            constants[param.name] = values.get(param.name, False)  # else a switch: below
        elif param.name.endswith("_ptr"):
            integer = any(word in param.name for word in INTEGERS)
            own = param.name in HALVES.get(name, ()) or dtype not in ("fp16", "bf16")
            default = "*i32" if integer else f"*{dtype}" if own else "*fp32"
            signature[param.name] = POINTERS.get(name, {}).get(param.name, default)
        else:
            signature[param.name] = "i32"
            if not any(p.name == param.name and p.do_not_specialize for p in fn.params):
                specialised.append(param.name)
    flags = [n for n, v in constants.items() if v is False]  # boolean switches (MONOTONIC)
    for values in itertools.product((False, True), repeat=len(flags)):
        switched = {**constants, **dict(zip(flags, values))}
        label = "".join(f", {n}={v}" for n, v in zip(flags, values))
        yield f"run-time integers{label}", signature, switched, values
        if specialised:  # (the sizes never are: see specialised_sizes)
            ones = {**signature, **{n: "constexpr" for n in specialised}}
            one = {**switched, **{n: 1 for n in specialised}}
            yield f"integers equal to 1{label}", ones, one, values


def rounded_floor(ttir: str, floor: float | None, dtype: str) -> str:
    """Where a float64 kernel holds its ``FLOOR`` rounded to float32 (Triton builds some float
    constants in float32, see :mod:`cbasr._triton`): a message, else ``""``."""
    if floor is None or dtype != "fp64":
        return ""
    as_float32 = struct.unpack("f", struct.pack("f", floor))[0]
    constants = re.findall(r"(?:dense<|arith\.constant )(-?[0-9][0-9.e+-]*)", ttir)
    if any(float(c) == as_float32 for c in constants):
        return f"FLOOR = {floor!r} is rounded to float32 ({as_float32!r}) in the kernel"
    return ""


def specialised_sizes(fn) -> list[str]:
    """The integer arguments of a kernel that are sizes of the batch and that Triton would
    still specialise (on being 1 or divisible by 16)."""
    return [
        p.name
        for p in fn.params
        if not p.is_constexpr
        and not p.name.endswith("_ptr")
        and p.name not in STEADY
        and not p.do_not_specialize
    ]


def representative(dtype: str, launch: int, label: str, floor: bool, switches: tuple) -> bool:
    """Whether ``make test``'s run compiles this variant (see the module's docstring): float64
    where the kernel takes a ``FLOOR`` (whose rounding the run checks)."""
    if len(set(switches)) > 1:  # a mixed setting of two switches or more
        return False
    if dtype == "fp32":
        return launch == 0 or "run-time" in label
    first = launch == 0 and "run-time" in label and not any(switches)
    return first and (dtype == "fp16" or (dtype == "fp64" and floor))


def main(every_variant: bool) -> int:
    failures = 0
    for module_name in kernel_modules():
        module = importlib.import_module(module_name)
        for name, fn in sorted(vars(module).items()):
            if not isinstance(fn, triton.runtime.jit.JITFunction) or not name.endswith("_kernel"):
                continue
            sizes = specialised_sizes(fn)
            if sizes:
                failures += 1
                print(f"FAIL {module_name}.{name}: sizes specialised: {', '.join(sizes)}")
            for dtype in ("fp32", "fp64", "fp16", "bf16"):
                if dtype in ("fp16", "bf16") and name not in HALVES:
                    continue
                for (launch, (sizes, warps)), variant in itertools.product(
                    enumerate(launches(name, fn)), variants(name, fn, dtype)
                ):
                    label, signature, constants, switches = variant
                    floor = "FLOOR" in constants
                    chosen = representative(dtype, launch, label, floor, switches)
                    if not (every_variant or chosen):
                        continue
                    if sizes:
                        constants = {**constants, **sizes}
                        label += "".join(f", {n}={v}" for n, v in sizes.items())
                        label += f", {warps} warp(s)"
                    source = ASTSource(fn=fn, signature=signature, constexprs=constants)
                    try:
                        compiled = triton.compile(
                            source, target=TARGET, options={"num_warps": warps}
                        )
                    except Exception as error:  # a compiler pass failing raises RuntimeError
                        failures += 1
                        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                        print(f"FAIL {module_name}.{name} {dtype}, {label}: {first[:300]}")
                        continue
                    rounded = rounded_floor(compiled.asm["ttir"], constants.get("FLOOR"), dtype)
                    if rounded:
                        failures += 1
                        print(f"FAIL {module_name}.{name} {dtype}, {label}: {rounded}")
                    else:
                        print(f"ok {module_name}.{name} {dtype}, {label}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main("--every-variant" in sys.argv[1:]))
