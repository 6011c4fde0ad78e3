import os
import stat

import pytest
import torch

from cbasr.storage.checkpoint import (
    CheckpointDir,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    seed_everything,
    set_rng_state,
)
from cbasr.storage.files import atomic_write, write_json, write_text


def test_interrupted_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"step": 1})

    def dies_halfway(f):
        f.write(b"partial")
        raise KeyboardInterrupt  # as if killed mid-write

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, dies_halfway, mode="wb")
    assert load_checkpoint(path) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary left behind


def test_unreadable_checkpoint_is_named(tmp_path):
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="cannot read checkpoint .*bad.pt"):
        load_checkpoint(tmp_path / "bad.pt")


def test_rng_state_round_trip():
    state = rng_state()
    a = torch.rand(3)
    set_rng_state(state)
    assert torch.equal(torch.rand(3), a)


def test_keep_the_latest_and_the_best_epoch_files(tmp_path):
    checkpoints = CheckpointDir(tmp_path, keep=2)
    scores = {1: (3.0, 0.0), 2: (1.0, 0.0), 3: (2.0, 0.0), 4: (5.0, 0.0), 5: (4.0, 0.0)}
    for epoch in scores:
        checkpoints.save(f"epoch-{epoch}", {"epoch": epoch})
    assert checkpoints.prune(scores) == [1]  # latest two: 4, 5; best two: 2, 3
    assert checkpoints.epochs() == [2, 3, 4, 5]
    assert CheckpointDir(tmp_path, keep=0).prune(scores) == []


def test_copy_makes_an_independent_file(tmp_path):
    checkpoints = CheckpointDir(tmp_path)
    checkpoints.save("epoch-1", {"epoch": 1})
    checkpoints.copy("epoch-1", "last")
    checkpoints.copy("epoch-1", "best")
    files = [checkpoints.file(name) for name in ("epoch-1", "last", "best")]
    assert len({f.stat().st_ino for f in files}) == 3 and all(f.stat().st_nlink == 1 for f in files)
    checkpoints.save("last", {"epoch": 2})  # a later save of last.pt leaves the others alone
    assert (
        load_checkpoint(checkpoints.file("best"))
        == {"epoch": 1}
        == load_checkpoint(checkpoints.file("epoch-1"))
    )
    with open(checkpoints.file("epoch-1"), "r+b") as f:  # damaging one damages no other
        f.truncate(10)
    assert load_checkpoint(checkpoints.file("best")) == {"epoch": 1}
    checkpoints.file("epoch-1").unlink()  # pruning an epoch file keeps best.pt
    assert load_checkpoint(checkpoints.file("best")) == {"epoch": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]


def test_files_get_the_mode_of_a_plain_open(tmp_path):
    """The temporary file is 0600; the result is 0o666 less the umask, as open() would make it."""
    old = os.umask(0o022)
    try:
        checkpoints = CheckpointDir(tmp_path)
        checkpoints.save("epoch-1", {"epoch": 1})
        checkpoints.copy("epoch-1", "best")
        write_json(tmp_path / "score.json", {"wer": 1.0})
        os.umask(0o077)
        write_text(tmp_path / "private.txt", "x")
    finally:
        os.umask(old)
    for name in ("epoch-1.pt", "best.pt", "score.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
    assert stat.S_IMODE((tmp_path / "private.txt").stat().st_mode) == 0o600


def test_unfinished_writes_of_a_killed_run_are_removed(tmp_path):
    checkpoints = CheckpointDir(tmp_path)
    checkpoints.save("last", {"step": 1})
    (tmp_path / ".last.pt.abc123.tmp").write_bytes(b"half a checkpoint")
    assert [p.name for p in checkpoints.remove_temporaries()] == [".last.pt.abc123.tmp"]
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_seed_everything_seeds_python_numpy_and_torch():
    import random

    import numpy as np

    draws = []
    for _ in range(2):
        seed_everything(7)
        draws.append((random.random(), float(np.random.rand()), float(torch.rand(1))))
    assert draws[0] == draws[1]
    seed_everything(8)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) != draws[0]
