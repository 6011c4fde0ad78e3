import json

import pytest

from cbasr.cli import vocab
from cbasr.data.vocab import Vocabulary


def _manifest(path, phone_lists):
    path.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"u{i}",
                    "audio": "x.wav",
                    "duration": 1.0,
                    "speaker": "s",
                    "words": "w",
                    "phones": p,
                }
            )
            + "\n"
            for i, p in enumerate(phone_lists)
        )
    )
    return path


def test_inventory_keeps_tokens_unseen_in_training(tmp_path):
    train = _manifest(tmp_path / "train.jsonl", [["a", "b"], ["b"]])
    (tmp_path / "inventory.txt").write_text("a\nb\nc\n")
    vocab.main(
        [
            "--manifest",
            str(train),
            "--inventory",
            str(tmp_path / "inventory.txt"),
            "--out",
            str(tmp_path / "v.txt"),
        ]
    )
    assert Vocabulary.load(tmp_path / "v.txt").tokens == [
        "<blk>",
        "a",
        "b",
        "c",
    ]  # c only in dev, say
    vocab.main(["--manifest", str(train), "--out", str(tmp_path / "w.txt")])
    assert Vocabulary.load(tmp_path / "w.txt").tokens == ["<blk>", "b", "a"]


def test_training_tokens_outside_the_inventory_are_an_error(tmp_path, capsys):
    train = _manifest(tmp_path / "train.jsonl", [["a", "z"]])
    (tmp_path / "inventory.txt").write_text("a\nb\n")
    with pytest.raises(SystemExit):
        vocab.main(
            [
                "--manifest",
                str(train),
                "--inventory",
                str(tmp_path / "inventory.txt"),
                "--out",
                str(tmp_path / "v.txt"),
            ]
        )
    err = capsys.readouterr().err
    assert "tokens outside --inventory" in err and "['z']" in err
