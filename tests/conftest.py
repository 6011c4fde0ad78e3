"""Shared pytest options: ``--device`` and the ``slow`` / ``gpu`` / ``triton`` markers."""

import os

import pytest
import torch


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        help="torch device for device-parametrised tests (cpu, cuda, cuda:1, ...)",
    )


def pytest_configure(config):
    # Triton kernels (the ``triton`` marker) run on CPU tensors in Triton's interpreter, which
    # is chosen when a kernel module is imported: before any test imports one.
    if not config.getoption("--device").startswith("cuda"):
        os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and config.getoption("--device").startswith("cuda"):
        return
    skip_gpu = pytest.mark.skip(reason="needs --device cuda and a visible GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def device(request) -> torch.device:
    return torch.device(request.config.getoption("--device"))


@pytest.fixture(scope="session")
def tone_data(tmp_path_factory):
    """A prepared tone corpus (see tests/fakes.py): ``corpus/``, ``fbank/`` (40 mel bins), ``lang/phones.txt``."""
    from cbasr.cli import features, vocab
    from tests.fakes import make_tone_corpus

    root = tmp_path_factory.mktemp("tone")
    make_tone_corpus(root / "corpus", {"train": 160, "dev": 16, "test": 16})
    features.main(
        [
            "--manifest-dir",
            str(root / "corpus"),
            "--out",
            str(root / "fbank"),
            "--num-mel-bins",
            "40",
            "--workers",
            "0",
        ]
    )
    vocab.main(
        [
            "--manifest",
            str(root / "corpus" / "train.jsonl"),
            "--out",
            str(root / "lang" / "phones.txt"),
        ]
    )
    return root


@pytest.fixture(autouse=True)
def commands_raise(monkeypatch):
    """In-process calls of the commands' ``main`` raise their exceptions (``CBASR_DEBUG=1``) for
    the tests to match; tests/cli/test_fatal_errors.py checks the one-line form users see."""
    monkeypatch.setenv("CBASR_DEBUG", "1")


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """Tests that train or decode in this process set one torch thread (``make_cfg``); the
    count is put back after each."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
