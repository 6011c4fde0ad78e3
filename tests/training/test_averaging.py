import json

import pytest
import torch

from cbasr.storage.checkpoint import CheckpointDir, load_checkpoint, save_checkpoint
from cbasr.training.averaging import average_checkpoints, average_state_dicts, select_epochs


def test_average_of_known_tensors():
    sds = [
        {
            "w": torch.tensor([1.0, 2.0]),
            "h": torch.tensor([1.0], dtype=torch.float16),
            "n": torch.tensor(k, dtype=torch.long),
        }
        for k in (3, 5, 10)
    ]
    sds[1]["w"] = torch.tensor([4.0, -2.0])
    sds[2]["w"] = torch.tensor([7.0, 3.0])
    sds[1]["h"] = torch.tensor([2.0], dtype=torch.float16)
    out = average_state_dicts(sds)
    assert torch.equal(out["w"], torch.tensor([4.0, 1.0]))
    assert out["h"].dtype == torch.float16 and torch.equal(
        out["h"], torch.tensor([4 / 3], dtype=torch.float16)
    )
    assert out["n"].item() == 10  # integer counters: from the last
    # float64 accumulation: in float16, 2048 + 1 + 1 would stay 2048 (and the mean 682.5)
    half = [{"w": torch.tensor([v], dtype=torch.float16)} for v in (2048.0, 1.0, 1.0)]
    assert average_state_dicts(half)["w"].item() == 683.5  # 2050 / 3 in float16
    with pytest.raises(ValueError, match="different entries"):
        average_state_dicts([{"a": torch.zeros(1)}, {"b": torch.zeros(1)}])


def _fake_experiment(tmp_path, errors):
    """epoch-N.pt holding w = N, and a history with the given error rates."""
    checkpoints = CheckpointDir(tmp_path / "checkpoints")
    history = []
    for epoch, err in enumerate(errors, start=1):
        save_checkpoint(
            checkpoints.file(f"epoch-{epoch}"),
            {
                "model": {"w": torch.full((2,), float(epoch))},
                "config": {"epoch": epoch},
                "state": {"epoch": epoch},
            },
        )
        history.append({"epoch": epoch, "valid_error_rate": err, "valid_loss": float(epoch)})
    (tmp_path / "history.json").write_text(json.dumps(history))
    return checkpoints, history


def test_last_and_best_selection_and_the_averaged_file(tmp_path):
    checkpoints, history = _fake_experiment(tmp_path, [9.0, 5.0, 7.0, 5.0, 8.0])
    assert select_epochs(checkpoints, history, last=3) == [3, 4, 5]
    # best by error rate, ties (epochs 2 and 4) broken by the loss: 2 first
    assert select_epochs(checkpoints, history, best=1) == [2]
    assert select_epochs(checkpoints, history, best=2) == [2, 4]
    assert select_epochs(checkpoints, history, best=3) == [2, 3, 4]
    assert select_epochs(checkpoints, history, best=2, metric="valid_loss") == [1, 2]
    path = average_checkpoints(tmp_path, [2, 3, 4])
    averaged = load_checkpoint(path)
    assert path.name == "averaged.pt" and torch.equal(averaged["model"]["w"], torch.full((2,), 3.0))
    assert averaged["state"] == {"epoch": 4} and averaged["averaged_from"] == [
        "epoch-2.pt",
        "epoch-3.pt",
        "epoch-4.pt",
    ]
    assert "optimizer" not in averaged
    checkpoints.file("epoch-3").unlink()
    with pytest.raises(ValueError, match="holds 4 usable epoch checkpoints .* fewer than 5"):
        select_epochs(checkpoints, history, last=5)
    with pytest.raises(ValueError, match="would replace a training checkpoint"):
        average_checkpoints(tmp_path, [2], name="last")
