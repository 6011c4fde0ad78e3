"""trainer.init_from: a new run from another model's weights, with a fresh optimizer."""

import shutil

import pytest
import torch

from cbasr.training.asr_task import asr_trainer, train
from tests.training.test_trainer import make_cfg


@pytest.fixture(scope="module")
def source(tone_data, tmp_path_factory):
    exp = tmp_path_factory.mktemp("source") / "exp"
    train(make_cfg(tone_data, exp, "trainer.max_epochs=2"), exp)
    return exp


def test_a_fine_tuned_run_starts_with_the_source_model_and_a_fresh_optimizer(
    tone_data, source, tmp_path
):
    last = source / "checkpoints/last.pt"
    original = asr_trainer(make_cfg(tone_data, source, "trainer.max_epochs=2"), source)
    original.initialise()  # resumes: the weights of last.pt
    assert original.state.step > 0
    tuned = asr_trainer(
        make_cfg(tone_data, tmp_path / "b", f"trainer.init_from={last}", "optim.lr=1e-3"),
        tmp_path / "b",
    )
    fresh = {k: v.clone() for k, v in tuned.model.state_dict().items()}
    tuned.initialise()
    assert tuned.state.step == 0 and tuned.state.history == []
    assert tuned.optimizer.state_dict()["state"] == {}
    assert tuned.optimizer.param_groups[0]["lr"] != original.optimizer.param_groups[0]["lr"]
    for name, value in original.model.state_dict().items():
        assert torch.equal(tuned.model.state_dict()[name], value), name
    assert any(not torch.equal(fresh[k], v) for k, v in tuned.model.state_dict().items())
    # the loss at step 0 is the source model's on the same batches
    assert tuned.validate()["valid_loss"] == original.validate()["valid_loss"]


def test_an_experiment_directory_means_its_best_checkpoint_and_a_run_trains_on(
    tone_data, source, tmp_path
):
    exp = tmp_path / "b"
    t = train(make_cfg(tone_data, exp, f"trainer.init_from={source}", "trainer.max_epochs=1"), exp)
    assert t.state.epoch == 1 and len(t.state.history) == 1
    resumed = asr_trainer(
        make_cfg(tone_data, exp, f"trainer.init_from={source}", "trainer.max_epochs=1"), exp
    )
    resumed.initialise()  # a resumed run keeps its own weights, not the source's again
    assert resumed.state.step == t.state.step


def test_a_shape_mismatch_names_the_parameter(tone_data, source, tmp_path):
    cfg = make_cfg(tone_data, tmp_path / "b", f"trainer.init_from={source}", "encoder.hidden=16")
    with pytest.raises(ValueError, match=r"parameter encoder\.\S+ has shape .*trainer.init_skip"):
        asr_trainer(cfg, tmp_path / "b").initialise()
    with pytest.raises(FileNotFoundError, match="nowhere.*trainer.init_from"):
        asr_trainer(
            make_cfg(tone_data, tmp_path / "c", f"trainer.init_from={tmp_path / 'nowhere'}"),
            tmp_path / "c",
        ).initialise()


def test_a_new_vocabulary_is_refused_unless_its_layer_is_left_new(tone_data, source, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tone_data, data)
    tokens = (data / "lang/phones.txt").read_text().split()
    (data / "lang/phones.txt").write_text("\n".join([tokens[0], *reversed(tokens[1:])]) + "\n")
    for init_from, exp in ((source, "b"), (source / "checkpoints/epoch-1.pt", "b1")):
        cfg = make_cfg(data, tmp_path / exp, f"trainer.init_from={init_from}")
        with pytest.raises(ValueError, match=r"vocabulary .* differs .* from id 1 on .*init_skip"):
            asr_trainer(
                cfg, tmp_path / exp
            ).initialise()  # a checkpoint file: its experiment's vocab
    cfg = make_cfg(
        data, tmp_path / "c", f"trainer.init_from={source}", "trainer.init_skip=[decoder.*]"
    )
    t = asr_trainer(cfg, tmp_path / "c")
    new_output = {k: v.clone() for k, v in t.model.state_dict().items() if k.startswith("decoder")}
    t.initialise()
    state = t.model.state_dict()
    assert new_output and all(torch.equal(state[k], v) for k, v in new_output.items())
    theirs = torch.load(source / "checkpoints/best.pt", weights_only=False)["model"]
    assert all(torch.equal(state[k], v) for k, v in theirs.items() if k.startswith("encoder"))
