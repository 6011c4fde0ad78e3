"""ROUGE-1, ROUGE-2 and ROUGE-L F1 (Lin, 2004) for headline generation, with ``rouge-score``.

Scores are F1 averaged over pairs (full length, no stemming), in percent, as Gigaword
headline results are reported (Rush et al., 2015). ``rouge-score``'s tokenizer lower-cases and
keeps only ``[a-z0-9]`` runs, so ``#`` digit placeholders and punctuation do not count.
"""

__all__ = ["ROUGE_TYPES", "rouge_f1"]

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def rouge_f1(refs: list[str], hyps: list[str]) -> dict[str, float]:
    """Mean F1 per ROUGE type over aligned reference and hypothesis strings, in percent."""
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    from rouge_score import rouge_scorer  # here: rouge-score imports NLTK, which ASR never needs

    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=False)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for ref, hyp in zip(refs, hyps):
        for kind, score in scorer.score(ref, hyp).items():
            totals[kind] += score.fmeasure
    n = max(len(refs), 1)
    return {kind: 100.0 * total / n for kind, total in totals.items()} | {"pairs": len(refs)}
