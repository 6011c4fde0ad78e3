"""Shared pytest options: ``--device`` and the ``slow`` / ``gpu`` / ``triton`` markers."""

import os
from pathlib import Path

import pytest
import torch

from tests.shared import built_once


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
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # pytest-xdist's workers (``-n auto``: one per core) fill the cores already: one torch
        # thread in each, and in the commands they start (torch reads OMP_NUM_THREADS)
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the marks added here
def pytest_collection_modifyitems(config, items):
    from tests.backends import swept

    for item in swept(items):
        item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available() and config.getoption("--device").startswith("cuda"):
        return
    skip_gpu = pytest.mark.skip(reason="needs --device cuda and a visible GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def device(request) -> torch.device:
    return torch.device(request.config.getoption("--device"))


def _build_tone_data(root: Path) -> None:
    from cbasr.cli import features, vocab
    from tests.fakes import make_tone_corpus

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


@pytest.fixture
def reads(monkeypatch):
    """``[n]``: the copies to the host that :mod:`cbasr.checks` made (its ``one_read`` blocks'
    and ``read``'s), counted from the fixture's start; a test may reset it."""
    from cbasr import checks

    count = [0]
    read = checks._read

    def counted(stats):
        count[0] += 1
        return read(stats)

    monkeypatch.setattr(checks, "_read", counted)
    return count


@pytest.fixture(scope="session")
def tone_data(tmp_path_factory, worker_id):
    """A prepared tone corpus (see tests/fakes.py): ``corpus/``, ``fbank/`` (40 mel bins),
    ``lang/phones.txt``; built once per test run, read only."""
    with built_once(tmp_path_factory, worker_id, "tone", _build_tone_data) as root:
        yield root


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
