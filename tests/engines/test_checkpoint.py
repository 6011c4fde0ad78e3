import pytest
import torch

from cbasr.engines.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from cbasr.fileio import atomic_write


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
