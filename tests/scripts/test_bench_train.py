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


@pytest.mark.parametrize("loss", ["ctc", "hat"])
def test_the_minimal_loop_trains_its_model_and_times_each_step(bench_train, loss):
    """scripts/conformer_floor.py: a CTC floor for the CTC loss, an RNN-T one otherwise; its
    forward and backward give every parameter a finite gradient, and its run times each step
    after the warm-up."""
    import conformer_floor

    ns = types.SimpleNamespace
    cfg = ns(
        loss=ns(name=loss),
        encoder=ns(d_model=8, num_heads=2, ffn_dim=16, num_layers=1, kernel_size=3, dropout=0.0),
        decoder=ns(label=ns(embed_dim=4, hidden=6), joint_dim=5),
        optim=ns(lr=1e-2),
    )
    torch.manual_seed(0)
    batch = ns(
        feats=torch.randn(2, 40, 20),
        feat_lens=torch.tensor([40, 31]),
        targets=torch.tensor([[1, 2, 3], [2, 2, 0]]),
        target_lens=torch.tensor([3, 2]),
    )
    model = conformer_floor.floor_model(cfg, 4, 20)
    assert model.kind == ("ctc" if loss == "ctc" else "rnnt")
    conformer_floor.floor_backward(model, batch, "fp32")
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    times = conformer_floor.floor_run(cfg, 4, [batch] * 3, 1, "fp32", torch.device("cpu"))
    assert len(times) == 2 and all(t > 0 for t in times)
