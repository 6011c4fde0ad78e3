"""The searches run many tiny tensor operations, which one intra-op thread does fastest (with
two threads on a busy machine each op can wait milliseconds for the other)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
