"""cbasr-average on a trained experiment, and decoding with its output."""

import json

import pytest
import torch

from cbasr.cli import average, decode
from cbasr.storage.checkpoint import load_checkpoint
from cbasr.training.asr_task import train
from tests.cli.training import decode_args
from tests.training.test_trainer import make_cfg


@pytest.fixture
def restore_torch_threads():
    threads = torch.get_num_threads()  # make_cfg trains on one thread
    yield
    torch.set_num_threads(threads)


def test_average_last_and_best_then_decode(tone_data, tmp_path, capsys, restore_torch_threads):
    exp = tmp_path / "exp"
    train(make_cfg(tone_data, exp, "trainer.max_epochs=3"), exp)
    ckpts = exp / "checkpoints"
    average.main(["--exp-dir", str(exp), "--last", "2"])
    averaged = load_checkpoint(ckpts / "averaged.pt")["model"]
    e2, e3 = (load_checkpoint(ckpts / f"epoch-{n}.pt")["model"] for n in (2, 3))
    for key, value in averaged.items():
        expected = (
            ((e2[key].double() + e3[key].double()) / 2).to(value.dtype)
            if value.is_floating_point()
            else e3[key]
        )
        assert torch.equal(value, expected), key
    assert not torch.equal(averaged["encoder.rnn.weight_ih_l0"], e3["encoder.rnn.weight_ih_l0"])

    decode.main(
        [
            *decode_args(tone_data, exp, "dev"),
            "--checkpoint",
            "averaged",
        ]
    )
    assert (
        json.loads((exp / "decode/dev_averaged/decode.json").read_text())["checkpoint"]
        == "averaged"
    )
    assert len((exp / "decode/dev_averaged/hyp.trn").read_text().splitlines()) == 16

    average.main(
        ["--exp-dir", str(exp), "--best", "1", "--name", "best1"]
    )  # the mean of one: best.pt
    best, best1 = (
        load_checkpoint(ckpts / "best.pt")["model"],
        load_checkpoint(ckpts / "best1.pt")["model"],
    )
    assert all(torch.equal(best[k], best1[k]) for k in best)

    capsys.readouterr()
    with pytest.raises(SystemExit):
        average.main(["--exp-dir", str(exp), "--last", "4"])
    assert "fewer than 4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        average.main(["--exp-dir", str(tmp_path / "nowhere"), "--last", "1"])
    assert "has " in capsys.readouterr().err
