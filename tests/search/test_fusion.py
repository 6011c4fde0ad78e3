"""Shallow fusion with external LMs (LSTM and ARPA) in every family's search: weight 0 is no
LM, fused scores add the LM's own sequence score, a strong LM changes the decision, and the
vocabularies are matched by token."""

import pytest
import torch

from cbasr.lm.arpa import read_arpa
from cbasr.modules.language_model import LSTMLanguageModel
from cbasr.search import (
    ArpaLMScorer,
    BeamSearchOptions,
    NeuralLMScorer,
    beam_search,
    load_language_model,
)
from cbasr.storage.checkpoint import save_checkpoint
from tests.search import tiny

TOKENS = ["<blk>", "a", "b", "c", "d"]  # the tiny models' vocabulary (VOCAB = 5)
FAMILIES = [
    ("pointwise", "cb_marginal"),
    ("attention_emission", "cb_marginal"),
    ("pointwise", "ctc"),
    ("transducer", "rnnt"),
    ("hat", "hat"),
]

# A bigram that strongly prefers "d" after anything and makes "a" rare.
BIGRAM = """\\data\\
ngram 1=6
ngram 2=3

\\1-grams:
-1.0 </s>
-99 <s> 0.0
-2.5 a -0.5
-1.0 b 0.0
-0.2 d -0.1
-1.5 <unk>

\\2-grams:
-0.05 <s> d
-0.1 d d
-3.0 a a

\\end\\
"""


def _lstm_scorer(seed: int = 0, lm_tokens=TOKENS):
    torch.manual_seed(seed)
    lm = LSTMLanguageModel(len(lm_tokens), embed_dim=4, hidden=6, num_layers=1, dropout=0.0)
    with torch.no_grad():
        lm.out.weight.mul_(4.0)  # a peaked LM, so that fusion can change decisions
    return NeuralLMScorer(lm, lm_tokens, TOKENS)


@pytest.fixture(scope="module")
def arpa_scorer(tmp_path_factory):
    path = tmp_path_factory.mktemp("arpa") / "bigram.arpa"
    path.write_text(BIGRAM)
    return ArpaLMScorer(read_arpa(path), TOKENS)


def _model(decoder, loss):
    if decoder in ("transducer", "hat"):
        return tiny.build(decoder, loss, seed=1, shift=1.0)
    return tiny.build(decoder, loss, seed=2, shift=1.5)


@pytest.mark.parametrize("decoder,loss", FAMILIES)
def test_weight_zero_is_no_lm(decoder, loss, arpa_scorer):
    model = _model(decoder, loss)
    feats, lens = tiny.batch(seed=3)
    plain = beam_search(model, feats, lens, BeamSearchOptions(beam=3, nbest=3))
    for scorer in (_lstm_scorer(), arpa_scorer):
        fused = beam_search(
            model, feats, lens, BeamSearchOptions(beam=3, nbest=3, lm_weight=0.0), scorer
        )
        assert [[(x.tokens, x.score, x.am_score) for x in n] for n in fused] == [
            [(x.tokens, x.score, x.am_score) for x in n] for n in plain
        ]


@pytest.mark.parametrize("decoder,loss", FAMILIES)
@pytest.mark.parametrize("kind", ["lstm", "arpa"])
def test_fused_scores_add_the_lm_score_of_the_sequence(decoder, loss, kind, arpa_scorer):
    """score = am + lambda log P_LM(y) + bonus |y|, with log P_LM(y) (end of sentence included)
    computed by the LM on the whole sequence, not by the search's row states; a strong LM
    changes the best hypothesis towards what it likes."""
    model = _model(decoder, loss)
    scorer = _lstm_scorer() if kind == "lstm" else arpa_scorer
    feats, lens = tiny.batch(seed=3)
    fused = beam_search(
        model,
        feats,
        lens,
        BeamSearchOptions(beam=3, nbest=3, lm_weight=0.7, label_bonus=0.3),
        scorer,
    )
    for x in (x for n in fused for x in n):
        assert x.lm_score == pytest.approx(scorer.sequence_log_prob(x.tokens), abs=1e-4)
        assert x.score == pytest.approx(
            x.am_score + 0.7 * x.lm_score + 0.3 * len(x.tokens), abs=1e-4
        )
    plain = beam_search(model, feats, lens, BeamSearchOptions(beam=3))
    strong = beam_search(model, feats, lens, BeamSearchOptions(beam=3, lm_weight=5.0), scorer)
    changed = [(p[0], s[0]) for p, s in zip(plain, strong) if p[0].tokens != s[0].tokens]
    assert changed
    assert all(
        scorer.sequence_log_prob(s.tokens) > scorer.sequence_log_prob(p.tokens) for p, s in changed
    )


def test_length_normalisation_ranks_by_score_per_label():
    model = _model("pointwise", "cb_marginal")
    feats, lens = tiny.batch(seed=3)
    for nbest in beam_search(
        model, feats, lens, BeamSearchOptions(beam=4, nbest=None, length_norm=True)
    ):
        for x in nbest:
            assert x.score == pytest.approx(x.am_score / max(len(x.tokens), 1))
        assert [x.score for x in nbest] == sorted((x.score for x in nbest), reverse=True)


def test_vocabularies_are_matched_by_token(tmp_path, arpa_scorer):
    permuted = ["<blk>", "d", "c", "b", "a"]
    lstm = _lstm_scorer(1, permuted)
    ids = {t: i for i, t in enumerate(permuted)}
    targets = torch.tensor([[ids["a"], ids["c"], ids["c"]]])
    expected = lstm.model.sequence_log_probs(targets, torch.tensor([3]))[0].detach()
    state = lstm.begin(1)
    total = 0.0
    for label in (1, 3, 3):  # a c c in the recogniser's ids
        total += float(state["log_probs"][0, label - 1])
        state = lstm.advance(state, torch.tensor([True]), torch.tensor([label]))
    assert total + float(state["eos"][0]) == pytest.approx(float(expected), abs=1e-5)
    with pytest.raises(ValueError, match="token 'c' of the recogniser's vocabulary is not in"):
        NeuralLMScorer(lstm.model, ["<blk>", "a", "b", "d", "e"], TOKENS)
    # the ARPA file lists no "c": it scores as <unk>
    assert arpa_scorer.sequence_log_prob([3]) == pytest.approx(
        arpa_scorer.arpa.sentence_log_prob(["<unk>"])
    )


def test_load_language_model_reads_checkpoints_and_arpa_files(tmp_path):
    lm = LSTMLanguageModel(len(TOKENS), embed_dim=4, hidden=6, num_layers=1)
    config = {"name": "lstm", "embed_dim": 4, "hidden": 6, "num_layers": 1, "dropout": 0.1}
    save_checkpoint(
        tmp_path / "lm" / "checkpoints" / "best.pt",
        {"lm_config": config, "tokens": TOKENS, "model": lm.state_dict()},
    )
    scorer = load_language_model(tmp_path / "lm", TOKENS)
    assert isinstance(scorer, NeuralLMScorer)
    with torch.no_grad():
        expected = float(lm.eval().sequence_log_probs(torch.tensor([[1, 2]]), torch.tensor([2]))[0])
    assert scorer.sequence_log_prob([1, 2]) == pytest.approx(expected, abs=1e-6)
    (tmp_path / "x.arpa").write_text(BIGRAM)
    assert isinstance(load_language_model(tmp_path / "x.arpa", TOKENS), ArpaLMScorer)
    with pytest.raises(FileNotFoundError, match="has this language model been trained"):
        load_language_model(tmp_path, TOKENS)
    with pytest.raises(FileNotFoundError, match=r"nope.arpa not found \(--lm\)"):
        load_language_model(tmp_path / "nope.arpa", TOKENS)


def test_arpa_rows_follow_the_trigram_history(tmp_path):
    """The row states of the ARPA scorer (last two words of a trigram) give each sequence the
    probability of the one-word back-off recursion."""
    from tests.lm.test_arpa import TRIGRAM

    (tmp_path / "tri.arpa").write_text(TRIGRAM)
    scorer = ArpaLMScorer(read_arpa(tmp_path / "tri.arpa"), ["<blk>", "a", "b"])
    for seq in ([1, 2, 1, 1], [2, 1, 2, 1, 2], [1, 1, 2, 2]):
        state, total = scorer.begin(1), 0.0
        for label in seq:
            total += float(state["log_probs"][0, label - 1])
            state = scorer.advance(state, torch.tensor([True]), torch.tensor([label]))
        assert total + float(state["eos"][0]) == pytest.approx(
            scorer.sequence_log_prob(seq), abs=1e-5
        )


# Words spelled by the tiny models' labels: characters a, b, d and the separator |.
WORD_BIGRAM = """\\data\\
ngram 1=7
ngram 2=4

\\1-grams:
-1.0 </s>
-99 <s> 0.0
-1.2 a -0.3
-0.9 ab -0.2
-0.4 d -0.1
-1.1 dd -0.4
-2.0 <unk>

\\2-grams:
-0.1 <s> d
-0.3 d ab
-0.2 ab </s>
-2.5 a a

\\end\\
"""


@pytest.mark.parametrize("units", ["chars", "sp:pieces.model"])
@pytest.mark.parametrize("decoder,loss", FAMILIES)
def test_word_level_fusion_scores_the_words_the_labels_spell(tmp_path, decoder, loss, units):
    """A word ARPA fused with a character (``|`` between words) or piece (``\u2581`` starting a
    word) recogniser: each hypothesis's LM score is the ARPA's sentence log probability of
    the words it spells, unknown words as <unk>, computed here by the ARPA on those words."""
    from cbasr.data.vocab import tokens_to_words

    path = tmp_path / "words.arpa"
    path.write_text(WORD_BIGRAM)
    arpa = read_arpa(path)
    tokens = (
        ["<blk>", "a", "b", "|", "d"]
        if units == "chars"
        else ["<blk>", "\u2581a", "b", "\u2581d", "d"]
    )
    scorer = load_language_model(path, tokens, words=True, units=units)
    model = _model(decoder, loss)
    feats, lens = tiny.batch(seed=3)
    options = BeamSearchOptions(beam=4, nbest=4, lm_weight=0.6, label_bonus=0.2)
    seen_words = set()
    for x in (x for n in beam_search(model, feats, lens, options, scorer) for x in n):
        words = tokens_to_words([tokens[v] for v in x.tokens], units)
        seen_words.update(words)
        known = [w if w in arpa.index else "<unk>" for w in words]
        assert x.lm_score == pytest.approx(arpa.sentence_log_prob(known), abs=1e-4), words
        assert x.lm_score == pytest.approx(scorer.sequence_log_prob(x.tokens), abs=1e-4)
        assert x.score == pytest.approx(
            x.am_score + 0.6 * x.lm_score + 0.2 * len(x.tokens), abs=1e-4
        )
    assert len(seen_words) > 2  # the hypotheses spell several different words


def test_word_level_fusion_needs_characters_or_pieces_and_an_arpa(tmp_path):
    path = tmp_path / "words.arpa"
    path.write_text(WORD_BIGRAM)
    with pytest.raises(ValueError, match="character or sentencepiece units, not 'phones'"):
        load_language_model(path, TOKENS, words=True, units="phones")
    checkpoint = tmp_path / "lm.pt"
    checkpoint.write_bytes(b"")
    with pytest.raises(ValueError, match="takes an ARPA word model"):
        load_language_model(checkpoint, TOKENS, words=True, units="chars")


def test_word_level_fusion_cache_is_bounded_and_changes_no_score(tmp_path):
    from cbasr.search.fusion import WordArpaScorer

    path = tmp_path / "words.arpa"
    path.write_text(WORD_BIGRAM)
    tokens = ["<blk>", "a", "b", "|", "d"]
    model = _model("pointwise", "cb_marginal")
    feats, lens = tiny.batch(seed=3)
    options = BeamSearchOptions(beam=4, nbest=4, lm_weight=0.6)
    scores = []
    for size in (200_000, 2):
        scorer = WordArpaScorer(read_arpa(path), tokens, "chars", cache_size=size)
        hyps = beam_search(model, feats, lens, options, scorer)
        scores.append([(x.tokens, x.lm_score) for n in hyps for x in n])
        assert scorer._scores_of.cache_info().currsize <= size
    assert scores[0] == scores[1] and len(scores[0]) > 4


def test_a_masked_lm_step_is_the_step_of_the_emitted_rows(arpa_scorer):
    """advance_masked: every row stepped, the new state kept where a label was emitted, the
    same states as advance (which reads the emitted rows); an ARPA LM's is its advance."""
    scorer = _lstm_scorer(seed=3)
    state = scorer.advance(scorer.begin(4), torch.tensor([True] * 4), torch.tensor([1, 2, 3, 4]))
    emitted, labels = torch.tensor([True, False, True, False]), torch.tensor([2, 1, 4, 3])
    masked = scorer.advance_masked(state, emitted, labels)
    plain = scorer.advance(state, emitted, labels)
    for key in ("log_probs", "eos"):
        torch.testing.assert_close(masked[key], plain[key])
    for got, expected in zip(masked["lstm"], plain["lstm"]):
        torch.testing.assert_close(got, expected)
    assert not torch.equal(masked["log_probs"][0], state["log_probs"][0])
    torch.testing.assert_close(masked["log_probs"][1], state["log_probs"][1])
    rows = arpa_scorer.begin(2)
    step = (torch.tensor([True, False]), torch.tensor([4, 1]))
    masked, plain = arpa_scorer.advance_masked(rows, *step), arpa_scorer.advance(rows, *step)
    assert masked["history"] == plain["history"] != rows["history"]
    torch.testing.assert_close(masked["log_probs"], plain["log_probs"])
