"""The compiled CPU kernels' common ground (package-internal): numba's ``jit`` as the kernels
use it, and SIMD-friendly ``exp`` and ``log-add-exp`` in float64.

The kernels are loops compiled by numba (Lam, Pitrou and Seibert, 2015, "Numba: a LLVM-based
Python JIT compiler"), the ``numba`` backend of :mod:`cbasr._backends`. They serve CPU tensors
only; CUDA tensors, and the cases a kernel does not cover, keep the PyTorch code they stand in
for, which the tests hold each kernel to (they run the affected tests under each backend
through :func:`cbasr._backends.use_backend`).

Log-space lattices need an ``exp`` and a ``log1p`` per state. numba calls the C library for
``math.exp`` and ``math.log1p``, one value at a time, and a loop that calls them does not
vectorise (the PyPI llvmlite has no vector maths library). :func:`exp64` and
:func:`log_add_exp64` are written in arithmetic only, so LLVM vectorises the loops that use
them (four float64 lanes with AVX2):

- ``exp``: ``t = n ln 2 + r`` with ``|r| <= ln 2 / 2`` (``n`` rounded by the ``1.5 * 2**52``
  shift, ``ln 2`` split in two parts), ``exp(r)`` by its degree-13 Taylor polynomial (the
  remainder is below ``3e-17`` relative), and ``2**n`` assembled in the exponent bits;
- ``log1p(u)`` for ``u`` in ``[0, 1]``: above ``sqrt(2) - 1``, ``log1p(u) = ln 2 +
  log1p((u - 1) / 2)``; then ``log1p(v) = 2 atanh(s)`` with ``s = v / (2 + v)``,
  ``|s| <= 0.172``, by its odd series to ``s**21`` (remainder below ``3e-17`` relative).

:func:`exp32` is the float32 counterpart of ``exp`` (degree-7 polynomial, 8 lanes).

All are within a few units in the last place of the C library's results (the tests bound
the error). A loop with a division vectorises only under numba's ``error_model="numpy"``
(no ``ZeroDivisionError`` check), which :func:`jit` sets; and these functions need exact
IEEE rounding of their additions, so they must not be compiled with ``reassoc``.
"""

import math

import numba
import numpy as np
from llvmlite import ir
from numba.extending import intrinsic

__all__: list[str] = []  # package-internal


def jit(function=None, *, fastmath=frozenset({"contract"}), inline="never"):
    """numba's ``njit`` with an on-disk cache, without the GIL and with numpy's error model.
    ``fastmath`` defaults to contraction (fused multiply-add) only; ``inline="always"`` inlines
    a function into its callers in numba's own IR (a loop that calls a compiled function does
    not vectorise)."""
    if function is None:
        return lambda f: jit(f, fastmath=fastmath, inline=inline)
    return numba.njit(
        cache=True, nogil=True, fastmath=set(fastmath), error_model="numpy", inline=inline
    )(function)


# ---- float64 bit casts (LLVM bitcasts, which vectorise) ---------------------------------------


def _bitcast(source: str, target: str, llvm_type):
    """A numba intrinsic reinterpreting the IEEE bits of a ``source`` value as a ``target``
    (an LLVM bitcast: free, and it vectorises)."""

    @intrinsic
    def cast(typingctx, x):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], llvm_type)

        return getattr(numba.types, target)(getattr(numba.types, source)), codegen

    return cast


_bits = _bitcast("float64", "int64", ir.IntType(64))
_from_bits = _bitcast("int64", "float64", ir.DoubleType())
_bits32 = _bitcast("float32", "int32", ir.IntType(32))
_from_bits32 = _bitcast("int32", "float32", ir.FloatType())


_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 in two parts: n * _LN2_HI is exact for |n| < 2**20
_LN2_LO = 1.90821492927058770002e-10
_LN2 = 0.6931471805599453
_ROUND = 6755399441055744.0  # 1.5 * 2**52: x + _ROUND - _ROUND rounds x to an integer
_SQRT2_M1 = 0.41421356237309515
_EXP_MIN = -708.0  # exp below this (and of -inf) is 0: no subnormal results
_EXP_MAX = 709.0


@jit(inline="always")
def exp64(t):  # pragma: no cover - compiled
    """``exp(t)`` in float64, vectorisable; 0 for ``t < -708`` (``-inf`` included), NaN for NaN.
    Arguments above 709 are clamped there."""
    x = _EXP_MAX if t > _EXP_MAX else t  # (written so that NaN passes through)
    x = _EXP_MIN if x < _EXP_MIN else x
    shifted = x * _LOG2E + _ROUND
    n = shifted - _ROUND
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = 1.6059043836821613e-10  # 1/13!
    p = p * r + 2.08767569878681e-09
    p = p * r + 2.505210838544172e-08
    p = p * r + 2.755731922398589e-07
    p = p * r + 2.7557319223985893e-06
    p = p * r + 2.48015873015873e-05
    p = p * r + 0.0001984126984126984
    p = p * r + 0.001388888888888889
    p = p * r + 0.008333333333333333
    p = p * r + 0.041666666666666664
    p = p * r + 0.16666666666666666
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    # the low bits of `shifted` hold n: shifting n + 1023 into the exponent field gives 2**n
    scale = _from_bits((_bits(shifted) + 1023) << 52)
    return 0.0 if t < _EXP_MIN else p * scale


@jit(inline="always")
def log1p64(u):  # pragma: no cover - compiled
    """``log(1 + u)`` for ``u`` in ``[0, 1]``, vectorisable."""
    big = u > _SQRT2_M1
    v = (u - 1.0) * 0.5 if big else u
    s = v / (2.0 + v)
    z = s * s
    q = 0.047619047619047616  # 1/21: the series 2 atanh(s) = 2 s sum_k z**k / (2k + 1)
    q = q * z + 0.05263157894736842
    q = q * z + 0.058823529411764705
    q = q * z + 0.06666666666666667
    q = q * z + 0.07692307692307693
    q = q * z + 0.09090909090909091
    q = q * z + 0.1111111111111111
    q = q * z + 0.14285714285714285
    q = q * z + 0.2
    q = q * z + 0.3333333333333333
    q = q * z + 1.0
    return 2.0 * s * q + (_LN2 if big else 0.0)


@jit(inline="always")
def log_add_exp64(x, y):  # pragma: no cover - compiled
    """``log(exp(x) + exp(y))`` in float64, vectorisable; ``-inf`` when both are ``-inf``."""
    hi = x if x > y else y
    lo = y if x > y else x
    d = lo - hi  # <= 0; NaN when both are -inf
    d = d if d > -700.0 else -700.0  # exp(-700) leaves hi unchanged, and keeps it normal
    return hi + log1p64(exp64(d))


# float32: 8 lanes with AVX2. Constants are float32 so that nothing promotes to float64.
_F = np.float32
_LOG2E_32 = _F(_LOG2E)
_ROUND_32 = _F(12582912.0)  # 1.5 * 2**23
_LN2_HI_32 = _F(0.693359375)  # exact in 10 bits: n * _LN2_HI_32 is exact for |n| < 2**14
_LN2_LO_32 = _F(-2.12194440e-4)
_EXP_MIN_32 = _F(-87.0)  # exp below this is 0: no subnormal results
_EXP_MAX_32 = _F(88.0)
_ZERO_32 = _F(0.0)
(_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7) = (_F(1.0 / math.factorial(k)) for k in range(8))


@jit(inline="always")
def exp32(t):  # pragma: no cover - compiled
    """``exp(t)`` in float32, vectorisable (8 lanes): as :func:`exp64` with a degree-7 Taylor
    polynomial (remainder below ``6e-9`` relative); 0 for ``t < -87``, NaN for NaN. For float32
    arguments only (the kernels pick it by type): a float64 argument would be rounded."""
    x = _EXP_MAX_32 if t > _EXP_MAX_32 else t
    x = _EXP_MIN_32 if x < _EXP_MIN_32 else x
    shifted = x * _LOG2E_32 + _ROUND_32
    n = shifted - _ROUND_32
    r = (x - n * _LN2_HI_32) - n * _LN2_LO_32
    p = _C7
    p = p * r + _C6
    p = p * r + _C5
    p = p * r + _C4
    p = p * r + _C3
    p = p * r + _C2
    p = p * r + _C1
    p = p * r + _C0
    scale = _from_bits32((_bits32(shifted) + np.int32(127)) << np.int32(23))
    return _ZERO_32 if t < _EXP_MIN_32 else p * scale
