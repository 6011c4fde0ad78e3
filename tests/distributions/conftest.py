"""Distribution tests run single-threaded, and on CPU twice: once with the compiled kernels
(:mod:`cbasr.distributions._kernels`) and once with the PyTorch recursions they stand in for
(what CUDA tensors and double backward use), so that every oracle holds for both."""

import pytest
import torch

from cbasr._backends import use_backend


@pytest.fixture(autouse=True)
def _single_thread():
    """Run on one thread: these tests make many small ops, which two threads only slow down
    on a shared CPU. Restores the setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, params=["kernels", "pytorch"])
def recursion(request):
    """Which implementation of the count recursions serves CPU tensors in this test."""
    with use_backend("numba" if request.param == "kernels" else "torch"):
        yield request.param
