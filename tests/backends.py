"""The backends a lattice test runs under (:mod:`cbasr._backends`): the compiled CPU loops, the
PyTorch reference and the Triton kernels, the last marked ``triton`` (on CPU in Triton's
interpreter, which tests/conftest.py switches on)."""

from collections.abc import Callable

import pytest

from cbasr._backends import triton_interpreted

BACKENDS = ["numba", "torch", pytest.param("triton", marks=pytest.mark.triton)]
NAMES = ("numba", "torch", "triton")


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


def _on_triton(item) -> bool:
    """Whether a collected case runs a Triton kernel: a ``triton`` backend parameter, or the
    ``triton`` marker on a test that takes no backend (the kernel modules' own tests)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    names = [v for v in params.values() if isinstance(v, str) and v in NAMES]
    if names:
        return "triton" in names
    return item.get_closest_marker("triton") is not None


def _case_values(params: dict) -> set:
    """A case's ``(name, value)`` pairs, the backend's left out (values compared by identity
    where they cannot be hashed, e.g. lists)."""
    pairs = set()
    for name, value in params.items():
        if isinstance(value, str) and value in NAMES:
            continue
        try:
            hash(value)
        except TypeError:
            value = ("id", id(value))
        pairs.add((name, value))
    return pairs


def swept(items) -> list:
    """The cases of the Triton interpreter's sweeps that ``make test`` leaves to ``make
    test-slow`` (tests/conftest.py marks them ``slow``; none on a GPU, where the kernels are fast).

    A test decorated with :func:`on_triton_keep` keeps the cases its predicate accepts. Every
    other test parametrised beyond the backend keeps, in collection order, each ``triton`` case
    that sets a parameter to a value no kept case has yet (a cover of the values: each value
    of each parameter runs in a kernel once; the other backends run every case)."""
    if not triton_interpreted():
        return []
    slow, seen = [], {}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if not params or not _on_triton(item) or item.get_closest_marker("slow"):
            continue
        keep = getattr(getattr(item, "function", None), "on_triton_keep", None)
        if keep is not None:
            kept = keep(params)
        else:
            covered = seen.setdefault((item.path, item.originalname), set())
            values = _case_values(params)
            kept = not values <= covered
            covered |= values
        if not kept:
            slow.append(item)
    return slow
