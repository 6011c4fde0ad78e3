"""The sentence generator: lengths, determinism, vocabulary."""

from collections import Counter

from cbasr.corpora.synth.text import MAX_WORDS, MIN_WORDS, SentenceGenerator, vocabulary


def _sentences(seed: int, n: int = 2000) -> list:
    generator = SentenceGenerator(seed)
    return [generator.sentence() for _ in range(n)]


def test_lengths_and_form():
    sentences = _sentences(0)
    lengths = Counter(len(s.words.split()) for s in sentences)
    assert min(lengths) == MIN_WORDS == 3 and max(lengths) == MAX_WORDS == 15
    assert len(lengths) >= 10  # varied lengths, not a couple of fixed templates
    for sentence in sentences:
        assert sentence.words == sentence.words.lower().strip()
        assert "  " not in sentence.words and sentence.words.replace(" ", "").isalpha()
        assert sentence.text == sentence.words + ("?" if sentence.question else ".")
    assert 0.02 < sum(s.question for s in sentences) / len(sentences) < 0.3


def test_deterministic_given_seed():
    assert _sentences(5, 200) == _sentences(5, 200)
    assert _sentences(5, 200) != _sentences(6, 200)


def test_vocabulary():
    words = vocabulary()
    assert 300 <= len(words) <= 1500
    used = {w for s in _sentences(1, 5000) for w in s.words.split()}
    assert used <= words
    assert len(used) > 0.9 * len(words)  # the grammar reaches nearly all of it


def test_sentences_rarely_repeat():
    sentences = [s.words for s in _sentences(2, 3000)]
    assert len(set(sentences)) > 0.97 * len(sentences)


def test_articles():
    sentences = " ".join(" " + s.words + " " for s in _sentences(3, 5000))
    assert " an apple" in sentences or " an old" in sentences
    assert " an useful" not in sentences and " an usual" not in sentences
    assert " a apple" not in sentences and " a old" not in sentences
