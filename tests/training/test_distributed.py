"""Several training processes (torchrun, gloo on CPU) against one process with the same global batch."""

import json

import pytest
import torch

from cbasr.data.batching import BucketBatchSampler, shard
from cbasr.storage.checkpoint import load_checkpoint
from cbasr.training.asr_task import train
from cbasr.training.distributed import DistContext, from_environment, replica_digest
from tests.training.test_trainer import BIN, make_cfg, run_cli

TORCHRUN = (str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2")
# SGD, not Adam: Adam's updates hardly change when every gradient doubles, SGD's do, so a
# shard that overlapped another (or a missing loss scaling) would show. Augmentation and
# weight noise are on: their draws must not depend on the process.
SAME_GLOBAL_BATCH = (
    "trainer.max_epochs=2",
    "optim.name=sgd",
    "optim.lr=0.5",
    "encoder.dropout=0",
    "data.spec_augment.freq_masks=2",
    "data.spec_augment.freq_mask_width=8",
    "data.speed_perturb=[0.9,1.0,1.1]",
    "optim.weight_noise=0.01",
)


def test_shards_are_disjoint_and_cover_the_batch():
    lengths = [50 + (7 * i) % 300 for i in range(101)]
    for batch in BucketBatchSampler(lengths, 2000, min_utts=3).batches():
        shards = [shard(batch, rank, 3) for rank in range(3)]
        assert all(shards) and sorted(sum(shards, [])) == sorted(batch)
    with pytest.raises(ValueError, match="rank 2 outside a world of 2"):
        shard([1, 2, 3], 2, 2)


def test_torchrun_environment_is_read():
    assert from_environment({}) == DistContext(0, 1, 0)
    assert from_environment({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}) == DistContext(
        3, 4, 1
    )
    with pytest.raises(ValueError, match="RANK=4 is not a process of WORLD_SIZE=4"):
        from_environment({"WORLD_SIZE": "4", "RANK": "4"})


def test_two_processes_train_the_one_process_model(tone_data, tmp_path):
    single = train(make_cfg(tone_data, tmp_path / "one", *SAME_GLOBAL_BATCH), tmp_path / "one")
    run = run_cli(tone_data, tmp_path / "two", *SAME_GLOBAL_BATCH, launcher=TORCHRUN)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    ckpt = load_checkpoint(tmp_path / "two/checkpoints/last.pt")
    assert ckpt["world_size"] == 2 and len(ckpt["rng_per_rank"]) == 2
    assert ckpt["state"]["step"] == single.state.step == 16
    history = json.loads((tmp_path / "two/history.json").read_text())
    for epoch in history:  # bit-identical replicas after every epoch
        first, second = epoch["replica_digests"]
        assert first == second
    assert history[-1]["replica_digests"][0] == replica_digest(ckpt["model"])
    assert (
        single.state.history[-1]["train_loss"] < 0.5 * single.state.history[0]["train_loss"]
    )  # it learnt
    for key, value in single.model.state_dict().items():
        torch.testing.assert_close(ckpt["model"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert (
        len(list((tmp_path / "two/tensorboard").glob("events.out.tfevents.*"))) == 1
    )  # process 0 only


@pytest.mark.slow
def test_two_processes_resume_bit_for_bit(tone_data, tmp_path):
    overrides = (*SAME_GLOBAL_BATCH, "encoder.dropout=0.3", "trainer.checkpoint_every_steps=3")
    assert run_cli(tone_data, tmp_path / "whole", *overrides, launcher=TORCHRUN).returncode == 0
    killed = run_cli(
        tone_data,
        tmp_path / "killed",
        *overrides,
        launcher=TORCHRUN,
        env={"CBASR_FAULT_INJECTION": "kill-in-step:11@1"},
    )  # process 1, mid-epoch 2
    assert killed.returncode != 0
    assert load_checkpoint(tmp_path / "killed/checkpoints/last.pt")["state"]["step"] == 9
    resumed = run_cli(tone_data, tmp_path / "killed", *overrides, launcher=TORCHRUN)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    a = load_checkpoint(tmp_path / "whole/checkpoints/last.pt")
    b = load_checkpoint(tmp_path / "killed/checkpoints/last.pt")
    assert a["state"]["step"] == b["state"]["step"] == 16
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
