"""Engine tests train in this process with one torch thread (``make_cfg``); put the count back after each."""

import pytest
import torch


@pytest.fixture(autouse=True)
def restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
