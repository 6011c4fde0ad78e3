"""The split of the sweeps between ``make test`` and ``make test-slow`` (tests/backends.py,
tests/sweeps.py): what the fast suite keeps is a representative of every case."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import backends
from tests.sweeps import diagonal


class _Item:
    """A collected case as :func:`tests.backends.swept` reads it."""

    def __init__(self, name, params, marks=(), function=None):
        self.path, self.originalname = Path("tests/test_x.py"), name
        self.callspec = SimpleNamespace(params=params) if params else None
        self.function = function or (lambda: None)
        self._marks = set(marks)

    def get_closest_marker(self, name):
        return name if name in self._marks else None


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setattr(backends, "triton_interpreted", lambda: True)


def _slow(items) -> list[int]:
    slow = backends.swept(items)
    return [i for i, item in enumerate(items) if item in slow]


def test_the_triton_cases_keep_each_value_of_each_parameter_once(interpreted):
    cases = [
        {"backend": b, "monotonic": m, "dtype": d}
        for b in ("numba", "torch", "triton")
        for m in (False, True)
        for d in ("float32", "float64")
    ]
    items = [_Item("test_a", case) for case in cases]
    slow = _slow(items)
    # the other backends run every case; of triton's four, in order, (False, float32) sets two
    # values, (False, float64) and (True, float32) one new value each, and (True, float64)
    # none: it is left to make test-slow
    assert slow == [11]
    kept = [cases[i] for i in range(8, 12) if i not in slow]
    assert {c["monotonic"] for c in kept} == {False, True}
    assert {c["dtype"] for c in kept} == {"float32", "float64"}


def test_each_test_is_covered_on_its_own_and_marked_tests_keep_their_rule(interpreted):
    def keep_none():
        pass

    keep_none.on_triton_keep = lambda case: False
    items = [
        _Item("test_a", {"backend": "triton", "n": 1}),
        _Item("test_b", {"backend": "triton", "n": 1}),  # another test: its own cover
        _Item("test_b", {"backend": "triton", "n": 1, "m": [2]}),  # unhashable value: new
        _Item("test_c", {"backend": "triton", "n": 1}, function=keep_none),
        _Item("test_d", {"n": 1}, marks={"triton"}),  # a kernel module's own test
        _Item("test_d", {"n": 1}, marks={"triton"}),
        _Item("test_e", {"n": 1}),  # no kernel
        _Item("test_e", {"n": 1}),
        _Item("test_f", {"backend": "triton", "n": 1}, marks={"slow"}),  # slow already
        _Item("test_f", {"backend": "triton", "n": 1}),
        _Item("test_g", None, marks={"triton"}),  # not parametrised
    ]
    assert _slow(items) == [3, 5]


def test_on_a_gpu_every_triton_case_runs_in_make_test(monkeypatch):
    monkeypatch.setattr(backends, "triton_interpreted", lambda: False)
    items = [_Item("test_a", {"backend": "triton", "n": 1}) for _ in range(3)]
    assert backends.swept(items) == []


def test_the_diagonal_keeps_each_row_and_each_column():
    params = diagonal(["r0", "r1", "r2"], ["c0", "c1"])
    fast = [p.values for p in params if not p.marks]
    assert sorted(fast) == [("r0", "c0"), ("r1", "c1"), ("r2", "c0")]
    assert len(params) == 6
