import pytest

from cbasr.data.vocab import BLANK, Vocabulary, tokens_of


def test_build_orders_by_frequency_then_name_with_blank_first():
    vocab = Vocabulary.build([["b", "a", "c"], ["c", "a"], ["c"]])
    assert vocab.tokens == [BLANK, "c", "a", "b"]
    assert vocab.encode(["a", "c"]) == [2, 1]
    assert vocab.decode([3, 1]) == ["b", "c"]


def test_save_load_round_trip(tmp_path):
    vocab = Vocabulary(["x", "y", "@2"])
    vocab.save(tmp_path / "v.txt")
    assert Vocabulary.load(tmp_path / "v.txt").tokens == vocab.tokens


def test_unknown_token_and_bad_file(tmp_path):
    with pytest.raises(KeyError, match="'q' is not in the vocabulary"):
        Vocabulary(["a"]).encode(["a", "q"])
    (tmp_path / "bad.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match="must start with <blk>"):
        Vocabulary.load(tmp_path / "bad.txt")
    with pytest.raises(ValueError, match="duplicate"):
        Vocabulary(["a", "a"])


def test_tokens_of_units():
    record = {"id": "u", "words": "ab  c", "phones": ["p", "q"]}
    assert tokens_of(record, "phones") == ["p", "q"]
    assert tokens_of(record, "words") == ["ab", "c"]
    assert tokens_of(record, "chars") == ["a", "b", "|", "c"]
    with pytest.raises(KeyError, match="'u' has no 'phones_full' field"):
        tokens_of(record, "phones_full")
