import pytest

from cbasr.evaluation.rouge import rouge_f1


def test_hand_worked_rouge():
    # ref "a b c d", hyp "a b d": unigrams 3/3 precision, 3/4 recall -> F1 6/7; bigrams: only
    # "a b" matches: P 1/2, R 1/3 -> F1 0.4; LCS "a b d" = 3 -> F1 6/7.
    scores = rouge_f1(["a b c d", "x y"], ["a b d", "z"])
    assert scores["rouge1"] == pytest.approx(100 * (6 / 7 + 0) / 2)
    assert scores["rouge2"] == pytest.approx(100 * (0.4 + 0) / 2)
    assert scores["rougeL"] == pytest.approx(100 * (6 / 7 + 0) / 2)
    assert scores["pairs"] == 2
    with pytest.raises(ValueError, match="2 references but 1 hypotheses"):
        rouge_f1(["a", "b"], ["a"])
