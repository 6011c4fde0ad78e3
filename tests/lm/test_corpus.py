"""LM text read a line at a time into flat storage, equal to per-sentence token lists."""

import json

import numpy as np
import pytest

from cbasr.data.vocab import Vocabulary
from cbasr.lm.corpus import Sentences, read_sentences
from cbasr.lm.neural import pad_sentences, token_batches

VOCAB = Vocabulary(["a", "b", "c", "d"])


def test_a_text_file_gives_each_usable_line_s_ids_and_names_the_skipped_ones(tmp_path):
    text = tmp_path / "lm.txt"
    text.write_text("a b c\n\nd a\nb q a\n   \nc\n")
    sentences, skipped = read_sentences(text, VOCAB, units="words")
    assert isinstance(sentences, Sentences) and len(sentences) == 3
    assert [s.tolist() for s in sentences] == [
        VOCAB.encode(["a", "b", "c"]),
        VOCAB.encode(["d", "a"]),
        VOCAB.encode(["c"]),
    ]
    assert skipped == [f"{text}:4\ttoken 'q' not in the vocabulary"]
    assert sentences[-1].tolist() == VOCAB.encode(["c"]) and sentences[1].dtype == np.int32


def test_a_manifest_gives_its_units(tmp_path):
    manifest = tmp_path / "train.jsonl"
    records = [
        {
            "id": "u1",
            "audio": "u1.wav",
            "duration": 1.0,
            "speaker": "s",
            "words": "x",
            "phones": ["b", "a"],
        },
        {
            "id": "u2",
            "audio": "u2.wav",
            "duration": 1.0,
            "speaker": "s",
            "words": "y",
            "phones": ["z"],
        },
    ]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in records))
    sentences, skipped = read_sentences(manifest, VOCAB, units="phones")
    assert [s.tolist() for s in sentences] == [VOCAB.encode(["b", "a"])]
    assert skipped == ["u2\ttoken 'z' not in the vocabulary"]


def test_sentences_index_like_a_list_and_batch_like_one():
    lists = [[1, 2, 3], [4], [2, 2], [3, 1, 4, 2], [1]]
    flat = Sentences.of(lists)
    assert len(flat) == 5 and [s.tolist() for s in flat] == lists
    with pytest.raises(IndexError, match="sentence 5 of 5"):
        flat[5]
    with pytest.raises(TypeError, match="indexed by int"):
        flat[1:3]
    with pytest.raises(ValueError, match="read-only"):
        flat[0][0] = 7
    for seed in (None, 3):
        assert token_batches(flat, 8, seed=seed) == token_batches(lists, 8, seed=seed)
    targets, lens = pad_sentences([flat[3], flat[1]], "cpu")
    assert targets.tolist() == [[3, 1, 4, 2], [4, 1, 1, 1]] and lens.tolist() == [4, 1]
    with pytest.raises(ValueError, match="offsets"):
        Sentences(np.array([1, 2]), np.array([0, 1]))
