import json

import pytest
import torch

from cbasr.data.features import FeatureStore
from cbasr.data.source_tokens import (
    TokenStore,
    extract_source_tokens,
    open_store,
    source_vocabulary,
)


def _manifest(path, sources):
    path.write_text(
        "".join(
            json.dumps({"id": f"u{i}", "source": s, "words": "x"}) + "\n"
            for i, s in enumerate(sources)
        )
    )
    return path


def test_ids_round_trip_with_unknowns_and_rerun_is_a_no_op(tmp_path):
    train = _manifest(tmp_path / "train.jsonl", ["b a a", "c a", "b"])
    vocab = source_vocabulary(train, "words")
    assert vocab == ["<pad>", "<unk>", "a", "b", "c"]
    assert source_vocabulary(train, "words", size=4) == ["<pad>", "<unk>", "a", "b"]
    test = _manifest(tmp_path / "test.jsonl", ["a z b", ""])
    summary = extract_source_tokens(test, tmp_path / "tok" / "test", "words", vocab)
    assert summary["kind"] == "tokens" and summary["dim"] == 5 and summary["unknown"] == 1
    store = open_store(tmp_path / "tok" / "test")
    assert (
        isinstance(store, TokenStore)
        and store.num_frames("u0") == 3
        and store.num_frames("u1") == 0
    )
    assert store["u0"].tolist() == [2, 1, 3] and store["u0"].dtype == torch.int64
    stamp = (tmp_path / "tok" / "test" / "ids.bin").stat().st_mtime_ns
    extract_source_tokens(test, tmp_path / "tok" / "test", "words", vocab)
    assert (tmp_path / "tok" / "test" / "ids.bin").stat().st_mtime_ns == stamp
    with pytest.raises(FileNotFoundError, match="incomplete"):
        TokenStore(tmp_path / "nowhere")


def test_open_store_gives_features_for_filterbank_dirs(tone_data):
    assert isinstance(open_store(tone_data / "fbank" / "dev"), FeatureStore)
