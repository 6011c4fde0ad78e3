"""The backends a lattice test runs under (:mod:`cbasr._backends`): the compiled CPU loops, the
PyTorch reference and the Triton kernels, the last marked ``triton`` (on CPU in Triton's
interpreter, which tests/conftest.py switches on)."""

import pytest

from cbasr._backends import triton_interpreted

BACKENDS = ["numba", "torch", pytest.param("triton", marks=pytest.mark.triton)]


def interpreted(backend: str) -> bool:
    """Whether ``backend`` runs Triton's interpreter: a check with hundreds of calls (gradcheck)
    is left to the other backends and to a GPU run there."""
    return backend == "triton" and triton_interpreted()


def skip_interpreted(backend: str, why: str) -> None:
    """Skip a test too large for Triton's interpreter under the ``triton`` backend (it runs in
    full with ``--device cuda`` on a GPU)."""
    if interpreted(backend):
        pytest.skip(f"too slow in Triton's interpreter: {why}")
