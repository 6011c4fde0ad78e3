"""scripts/bench_losses.py: the tensor-bytes memory counter (``--cpu-memory tensors``)."""

import pytest
import torch

from tests.scripts import load_script

MIB = 2**20


@pytest.fixture(scope="module")
def bench_losses():
    return load_script("bench_losses")


def test_tensor_peak_counts_the_largest_simultaneous_holding(bench_losses):
    kept = []

    def one_then_three():  # 1 MiB freed before 3 MiB are taken: the peak is 3 MiB
        a = torch.ones(MIB, dtype=torch.uint8)
        del a
        kept.append(torch.ones(3 * MIB, dtype=torch.uint8))

    def one_and_three():  # both held at once: 4 MiB
        a = torch.ones(MIB, dtype=torch.uint8)
        kept.append(torch.ones(3 * MIB, dtype=torch.uint8))
        del a

    assert 3 * MIB <= bench_losses._tensor_peak(one_then_three) < 3 * MIB + 64 * 1024
    assert 4 * MIB <= bench_losses._tensor_peak(one_and_three) < 4 * MIB + 64 * 1024


def test_tensor_peak_starts_from_what_is_held_on_entry(bench_losses):
    held = torch.ones(8 * MIB, dtype=torch.uint8)  # allocated before: not counted
    assert bench_losses._tensor_peak(lambda: torch.ones(MIB, dtype=torch.uint8)) < 2 * MIB
    del held
