"""Entry points called in this process set torch's thread count (cbasr-decode and cbasr-align
default to one thread); put it back after each test."""

import pytest
import torch

from tests.shared import built_once


@pytest.fixture(autouse=True)
def restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _train(tone_data):
    def build(root):
        from tests.cli.training import train_cli

        run = train_cli(tone_data, root / "exp", "trainer.max_epochs=10")
        assert run.returncode == 0, run.stderr[-3000:]

    return build


@pytest.fixture(scope="session")
def trained(tone_data, tmp_path_factory, worker_id):
    """A CTC experiment trained for 10 epochs on the tone corpus, once per test run; read only
    (tests copy it to change it)."""
    with built_once(tmp_path_factory, worker_id, "cli", _train(tone_data)) as root:
        yield root / "exp"
