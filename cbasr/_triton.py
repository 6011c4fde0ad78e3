"""What the Triton kernels share (package-internal): the log-add-exp of two blocks and the block
size for a vector of states. Importing this module needs Triton (see :mod:`cbasr._backends`)."""

import triton
import triton.language as tl

__all__: list[str] = []  # package-internal


@triton.jit
def log_add_exp(x, y):  # pragma: no cover - compiled (or interpreted: the tests run it)
    """``log(exp(x) + exp(y))``; ``-inf`` when both are ``-inf``."""
    top = tl.maximum(x, y)
    top = tl.where(top == float("-inf"), 0.0, top)
    return top + tl.log(tl.exp(x - top) + tl.exp(y - top))


def block(num_states: int) -> tuple[int, int]:
    """The block size (a power of two, at least 16) and the number of warps for a vector of
    ``num_states`` states held by one program."""
    size = max(16, triton.next_power_of_2(num_states))
    return size, max(1, min(8, size // 128))
