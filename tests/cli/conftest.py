"""Entry points called in this process set torch's thread count (cbasr-decode and cbasr-align
default to one thread); put it back after each test."""

import pytest
import torch


@pytest.fixture(autouse=True)
def restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
