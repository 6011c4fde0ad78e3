"""CTC prefix beam search: exhaustive search is the exact argmax of P(y) with exact scores."""

import pytest
import torch

from cbasr.losses import ctc_nll
from cbasr.search import BeamSearchOptions, beam_search, ctc_prefix_beam_search
from tests.reference.search_enumeration import argmax_unique, label_sequences, padded
from tests.search import tiny


def _exact_log_probs(log_probs: torch.Tensor, length: int) -> dict:
    """``log P(y | x)`` of every ``y`` with at most ``length`` labels (``-inf`` if impossible)."""
    seqs = label_sequences(log_probs.shape[-1] - 1, length)
    targets, target_lens = padded(seqs)
    B = len(seqs)
    nll = ctc_nll(
        log_probs[:, :length].expand(B, -1, -1), targets, torch.full((B,), length), target_lens
    )
    return dict(zip(seqs, (-nll).tolist()))


@pytest.mark.parametrize("V,T,seed", [(3, 5, 0), (3, 5, 1), (4, 4, 2)])
def test_exhaustive_search_is_the_exact_argmax_with_exact_marginals(V, T, seed):
    """Every feasible label sequence comes out with score log P(y) (repeats need a blank in
    between, so some are infeasible) and the best is the enumerated argmax."""
    g = torch.Generator().manual_seed(seed)
    log_probs = (2.0 * torch.randn(2, T, V, generator=g, dtype=torch.float64)).log_softmax(-1)
    lens = torch.tensor([T, T - 1])
    hyps = ctc_prefix_beam_search(log_probs, lens, BeamSearchOptions(beam=None, nbest=None))
    # a beam as wide as the number of prefixes is exhaustive too, thanks to prefix merging
    prefixes = len(label_sequences(V - 1, T))
    merged = ctc_prefix_beam_search(log_probs, lens, BeamSearchOptions(beam=prefixes, nbest=None))
    assert [[(x.tokens, round(x.am_score, 9)) for x in n] for n in merged] == [
        [(x.tokens, round(x.am_score, 9)) for x in n] for n in hyps
    ]
    for b, length in enumerate(lens.tolist()):
        exact = _exact_log_probs(log_probs[b : b + 1], length)
        feasible = {y: v for y, v in exact.items() if v > float("-inf")}
        found = {tuple(x.tokens): x.am_score for x in hyps[b]}
        assert set(found) == set(feasible)
        for y, score in found.items():
            assert score == pytest.approx(exact[y], abs=1e-9), y
        assert tuple(hyps[b][0].tokens) == argmax_unique(feasible)


def test_a_pruned_beam_never_exceeds_the_exact_score():
    g = torch.Generator().manual_seed(5)
    log_probs = (2.0 * torch.randn(1, 7, 3, generator=g, dtype=torch.float64)).log_softmax(-1)
    hyps = ctc_prefix_beam_search(
        log_probs, torch.tensor([7]), BeamSearchOptions(beam=2, nbest=None)
    )[0]
    exact = _exact_log_probs(log_probs, 7)
    gaps = [exact[tuple(x.tokens)] - x.am_score for x in hyps]
    assert min(gaps) > -1e-9 and max(gaps) > 1e-6


def test_batch_and_padding_change_nothing():
    model = tiny.build("pointwise", "ctc", seed=3)
    feats, lens = tiny.batch(seed=4)
    together = beam_search(model, feats, lens, BeamSearchOptions(beam=4, nbest=3))
    for b in range(len(lens)):
        alone = beam_search(
            model, feats[b : b + 1, : lens[b]], lens[b : b + 1], BeamSearchOptions(beam=4, nbest=3)
        )[0]
        assert [x.tokens for x in alone] == [x.tokens for x in together[b]]
        assert [x.am_score for x in alone] == pytest.approx(
            [x.am_score for x in together[b]], abs=1e-4
        )
