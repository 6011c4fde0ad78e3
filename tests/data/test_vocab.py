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


def test_sentencepiece_units_round_trip_to_words(tmp_path):
    from cbasr.data.vocab import tokens_to_words, train_sentencepiece

    texts = [
        "the dollar rose against the yen",
        "oil prices fell sharply on monday",
        "the company said profits rose",
        "stocks fell as the dollar weakened",
    ] * 20
    model = train_sentencepiece(texts, tmp_path / "sp", vocab_size=40)
    units = f"sp:{model}"
    record = {"words": "the dollar fell sharply"}
    pieces = tokens_of(record, units)
    assert len(pieces) > 4 and pieces[0].startswith("\u2581")  # subword pieces, a word start marked
    assert tokens_to_words(pieces, units) == record["words"].split()
    again = train_sentencepiece(texts, tmp_path / "sp2", vocab_size=40)
    import sentencepiece

    def pieces_of(path):
        p = sentencepiece.SentencePieceProcessor(model_file=str(path))
        return [p.id_to_piece(i) for i in range(p.get_piece_size())]

    assert pieces_of(again) == pieces_of(model)  # deterministic
    with pytest.raises(FileNotFoundError, match="sentencepiece model .*nope.model not found"):
        tokens_of(record, f"sp:{tmp_path / 'nope.model'}")


def test_characters_and_source_field_back_to_words():
    from cbasr.data.vocab import tokens_to_words

    record = {"words": "deficit narrows", "source": "the deficit shrunk"}
    chars = tokens_of(record, "chars")
    assert chars[:8] == list("deficit|") and tokens_to_words(chars, "chars") == [
        "deficit",
        "narrows",
    ]
    assert tokens_of(record, "words", field="source") == ["the", "deficit", "shrunk"]
    assert tokens_to_words(["aa", "b"], "phones") == ["aa", "b"]
