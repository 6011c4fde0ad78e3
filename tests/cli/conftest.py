"""Entry points called in this process set torch's thread count (cbasr-decode and cbasr-align
default to one thread); put it back after each test."""

import pytest
import torch


@pytest.fixture(autouse=True)
def restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def trained(tone_data, tmp_path_factory):
    """A CTC experiment trained for 10 epochs on the tone corpus (tests copy it to change it)."""
    from tests.cli.training import train_cli

    exp = tmp_path_factory.mktemp("cli") / "exp"
    run = train_cli(tone_data, exp, "trainer.max_epochs=10")
    assert run.returncode == 0, run.stderr[-3000:]
    return exp
