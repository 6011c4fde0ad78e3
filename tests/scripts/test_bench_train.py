"""scripts/bench_train.py: the random corpora, the synchronising operations' sites, the floor."""

import json
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench_train():
    sys.path.insert(0, str(ROOT / "scripts"))  # it imports conformer_floor beside it
    try:
        yield load_script("bench_train")
    finally:
        sys.path.remove(str(ROOT / "scripts"))


@pytest.mark.parametrize("profile,units,rate", [("synth", 45, 7), ("librispeech", 499, 30)])
def test_the_random_corpus_follows_its_profile(bench_train, tmp_path, profile, units, rate):
    root = bench_train.synthetic_corpus(tmp_path, utts=30, profile=profile)
    vocab = (root / "lang/phones.txt").read_text().split()
    assert len(vocab) == units + 1 and vocab[0] == "<blk>"
    index = (root / "fbank/train/index.tsv").read_text().splitlines()
    records = [json.loads(line) for line in (root / "synth/train.jsonl").read_text().splitlines()]
    frames = [int(line.split("\t")[2]) for line in index]
    assert len(frames) == len(records) == 30
    assert [len(r["phones"]) for r in records] == [max(1, n // rate) for n in frames]
    low, high = (60, 800) if profile == "synth" else (100, 2450)
    assert low <= min(frames) and max(frames) <= high
    mean = sum(frames) / len(frames)
    assert (150 < mean < 300) if profile == "synth" else (900 < mean < 1700)


def test_sync_sites_lists_each_waiting_operation_by_its_caller(bench_train, monkeypatch):
    """The step's synchronising operations (here warnings as CUDA's debug mode raises them),
    counted by the calling frames; the debug mode is set for the step and reset after."""
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    monkeypatch.setattr(bench_train, "_sync", lambda device: None)

    def wait():
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)

    def train_step(batch, tokens):
        assert batch == "batch on cuda" and tokens == 7
        for _ in range(3):
            wait()
        wait()

    batch = types.SimpleNamespace(to=lambda device: "batch on cuda")
    trainer = types.SimpleNamespace(
        device=torch.device("cuda"), loader=lambda batches: iter([batch]), train_step=train_step
    )
    report = bench_train.sync_sites(trainer, [0, 1], 7, "demo").splitlines()
    assert modes == ["warn", "default"]
    assert report[0] == "demo: 4 synchronising operations in one step"
    assert report[1].split()[0] == "3" and report[2].split()[0] == "1"
    assert "test_bench_train.py" in report[1] and "wait" in report[1]
    with pytest.raises(SystemExit, match="--sync-sites needs --device cuda"):
        bench_train.sync_sites(types.SimpleNamespace(device=torch.device("cpu")), [0], 1, "x")
