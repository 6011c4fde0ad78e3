"""The backends a lattice test runs under (:mod:`cbasr._backends`): the compiled CPU loops, the
PyTorch reference and the Triton kernels, the last marked ``triton`` (on CPU in Triton's
interpreter, which tests/conftest.py switches on)."""

from collections.abc import Callable

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


def on_triton_keep(keep: Callable[[dict], bool]):
    """Decorate a test parametrised over the backends whose ``triton`` cases repeat one kernel
    path over many parameters: in Triton's interpreter, ``make test`` runs only the ``triton``
    cases whose parameters (a dict by name) ``keep`` accepts, ``make test-slow`` runs them all
    (tests/conftest.py marks the others ``slow``; on a GPU, none is). The other backends run
    every case in both."""

    def mark(test):
        test.on_triton_keep = keep
        return test

    return mark


def sweep_marks(item) -> list:
    """The marks :func:`on_triton_keep` gives a collected test case (``[]`` or ``[slow]``)."""
    keep = getattr(getattr(item, "function", None), "on_triton_keep", None)
    params = getattr(getattr(item, "callspec", None), "params", {})
    on_triton = any(isinstance(v, str) and v == "triton" for v in params.values())
    swept = keep is not None and on_triton and triton_interpreted()
    return [pytest.mark.slow] if swept and not keep(params) else []
