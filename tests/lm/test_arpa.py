"""ARPA back-off n-grams: probabilities worked by hand, the vectorised distribution against the
one-word recursion, and malformed files named with their line."""

import gzip
import math

import pytest

from cbasr.lm.arpa import ArpaError, read_arpa

LN10 = math.log(10.0)

# Unigrams sum to 1 without <s>: P(</s>) = P(b) = 1/4, P(a) = 1/2.
TRIGRAM = """Written by hand for the tests.
\\data\\
ngram 1=4
ngram 2=4
ngram 3=2

\\1-grams:
-99 <s> -0.30103
-0.60206 </s>
-0.30103 a -0.17609
-0.60206 b -0.47712

\\2-grams:
-0.17609 <s> a -0.1
-0.47712 a b -0.2
-0.30103 b a
-0.30103 a </s>

\\3-grams:
-0.1 <s> a b
-0.2 a b a

\\end\\
"""


@pytest.fixture
def arpa(tmp_path):
    path = tmp_path / "lm.arpa"
    path.write_text(TRIGRAM)
    return read_arpa(path)


def _lp(model, word, *history):
    return model.log_prob(model.word_id(word), tuple(model.word_id(w) for w in history)) / LN10


def test_probabilities_worked_by_hand(arpa):
    assert arpa.order == 3 and arpa.words == ["<s>", "</s>", "a", "b"]
    assert _lp(arpa, "b", "<s>", "a") == pytest.approx(-0.1)  # listed trigram
    assert _lp(arpa, "a", "<s>", "a") == pytest.approx(
        -0.1 - 0.17609 - 0.30103
    )  # bo(<s> a) bo(a) P(a)
    assert _lp(arpa, "</s>", "a", "b") == pytest.approx(
        -0.2 - 0.47712 - 0.60206
    )  # bo(a b) bo(b) P(</s>)
    assert _lp(arpa, "a", "b", "a") == pytest.approx(-0.17609 - 0.30103)  # "b a" has no back-off: 1
    assert _lp(arpa, "b", "b", "b") == pytest.approx(
        -0.47712 - 0.60206
    )  # "b b" unlisted: back-off 1
    assert _lp(arpa, "a", "b", "a", "b", "b", "a") == pytest.approx(
        _lp(arpa, "a", "b", "a")
    )  # last 2 words
    # <s> a b </s>: -0.17609 - 0.1 - (0.2 + 0.47712 + 0.60206)
    assert arpa.sentence_log_prob(["a", "b"]) / LN10 == pytest.approx(-1.55527)


def test_the_distribution_of_a_history_is_the_recursion_for_every_word(arpa):
    ids = range(len(arpa.words))
    for history in [(), (0,), (2,), (3,), (0, 2), (2, 3), (3, 2), (3, 3), (1, 0, 2)]:
        dist = arpa.distribution(history)
        for w in ids:
            assert dist[w] == pytest.approx(arpa.log_prob(w, history)), (history, w)


def test_gzipped_files_read_the_same(tmp_path, arpa):
    with gzip.open(tmp_path / "lm.arpa.gz", "wt") as f:
        f.write(TRIGRAM)
    assert read_arpa(tmp_path / "lm.arpa.gz").ngrams == arpa.ngrams


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda s: s.replace("\\data\\\n", ""), "no \\\\data\\\\ header"),
        (lambda s: s.replace("ngram 2=4", "ngram 2=5"), "announces 5 2-grams but the file lists 4"),
        (lambda s: s.replace("-0.30103 b a\n", "-0.30103 b\n"), "lm.arpa:16: a 2-gram line needs"),
        (
            lambda s: s.replace("-0.1 <s> a b", "-0.1 <s> a c"),
            "lm.arpa:20: 3-gram '<s> a c' uses 'c', which has no unigram",
        ),
        (
            lambda s: s.replace("-0.60206 b -0.47712", "minus b -0.47712"),
            "lm.arpa:11: not a number",
        ),
        (lambda s: s.replace("</s>", "c"), "no </s> unigram"),
    ],
)
def test_malformed_files_are_named_with_the_line(tmp_path, edit, message):
    path = tmp_path / "lm.arpa"
    path.write_text(edit(TRIGRAM))
    with pytest.raises(ArpaError, match=message):
        read_arpa(path)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.arpa: ARPA language model not found"):
        read_arpa(tmp_path / "nope.arpa")


def test_a_history_shorter_than_the_order_is_kept_whole(tmp_path):
    """A 4-gram model after two words reads the trigram of both, not of the last alone."""
    path = tmp_path / "four.arpa"
    path.write_text(
        TRIGRAM.replace("ngram 3=2\n", "ngram 3=2\nngram 4=1\n").replace(
            "\\end\\", "\\4-grams:\n-0.5 <s> a b a\n\n\\end\\"
        )
    )
    model = read_arpa(path)
    assert model.order == 4
    assert _lp(model, "b", "<s>", "a") == pytest.approx(-0.1)  # the listed trigram <s> a b
    assert _lp(model, "a", "<s>", "a", "b") == pytest.approx(-0.5)
    # </s> after <s> a b: no 4-gram, bo(<s> a b) = 0; no trigram a b </s>: bo(a b) = -0.2; no
    # bigram b </s>: bo(b) = -0.47712; then the unigram
    want = -0.17609 - 0.1 + (0.0 - 0.2 - 0.47712 - 0.60206)
    assert model.sentence_log_prob(["a", "b"]) / LN10 == pytest.approx(want)
