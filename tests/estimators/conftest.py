"""Estimator tests run single-threaded (see the fixture)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    """Run on one thread: these tests make many small ops, which two threads only slow down
    on a shared CPU. Restores the setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
