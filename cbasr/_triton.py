"""What the Triton kernels share (package-internal): the log-add-exp of two blocks, ``log1p`` and
``softplus``, and the block size for a vector of states. Importing this module needs Triton
(see :mod:`cbasr._backends`).

Float constants in the kernels: Triton 3.6 passes a Python float argument as float32, and builds
the float constant of a comparison, ``tl.where`` or ``tl.maximum`` in float32 too, rounding it
for a float64 kernel (``log`` of the smallest float64 normal, about -708, moves by 5e-6). A
kernel's float constant (``FLOOR``, the least exponent) is therefore a ``tl.constexpr``, brought
to the block's precision by an addition, which builds it in the result's type:
``low = tl.zeros_like(x) + FLOOR``. The interpreter keeps float64 throughout, so only the
compiled kernels show the difference; ``tests/triton_compile.py`` fails a float64 kernel whose
compiled code holds its ``FLOOR`` rounded.

Sizes are not specialised: every integer argument that is a size of the batch (frames, labels,
utterances, rows) is in the kernel's ``do_not_specialize``. Triton otherwise compiles a kernel
once more for each new pattern of sizes equal to 1 or divisible by 16, which in training (each
batch its own ``T``, ``B`` and ``L``) means compilations in the middle of the run; and a size of
1 made a compile-time constant can leave an empty loop, which Triton 3.6 fails to compile for a
GPU. A kernel is then compiled once per block size and dtype (``tests/triton_compile.py``
checks the lists)."""

import triton
import triton.language as tl

__all__: list[str] = []  # package-internal


@triton.jit
def log_add_exp(x, y):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """``log(exp(x) + exp(y))``; ``-inf`` when both are ``-inf``."""
    top = tl.maximum(x, y)
    top = tl.where(top == float("-inf"), 0.0, top)
    return top + tl.log(tl.exp(x - top) + tl.exp(y - top))


@triton.jit
def log1p(z):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """``log(1 + z)`` for ``z >= 0`` to a few units in the last place (Triton has no ``log1p``
    outside CUDA's libdevice): with ``u = 1 + z`` rounded, ``log(u) * z / (u - 1)`` corrects
    the rounding (Goldberg 1991, "What every computer scientist should know about
    floating-point arithmetic", theorem 4); ``z`` itself where ``u`` rounds to 1."""
    u = 1.0 + z
    exact = u == 1.0
    return tl.where(exact, z, tl.log(u) * (z / tl.where(exact, 1.0, u - 1.0)))


@triton.jit
def softplus(x):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """``log(1 + exp(x)) = -log sigmoid(-x)``."""
    return tl.maximum(x, 0.0) + log1p(tl.exp(-tl.abs(x)))


def block(num_states: int) -> tuple[int, int]:
    """The block size (a power of two, at least 16) and the number of warps for a vector of
    ``num_states`` states held by one program."""
    size = max(16, triton.next_power_of_2(num_states))
    return size, max(1, min(8, size // 128))
