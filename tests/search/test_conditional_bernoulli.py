"""CB prefix beam search: exhaustive search is the exact argmax of P(y) with exact scores,
beam 1 is greedy search, batch and padding change nothing."""

import pytest
import torch

from cbasr.config.schema import LabelContextConfig
from cbasr.losses import cb_marginal_nll, cb_marginal_nll_windowed
from cbasr.modules.decoders import (
    AttentionEmissionDecoder,
    AutoregressiveDecoder,
    LabelOrder,
    MonotonicAttentionDecoder,
    PointwiseDecoder,
)
from cbasr.search import BeamSearchOptions, beam_search, cb_beam_search
from tests.reference.search_enumeration import argmax_unique, label_sequences, padded
from tests.search import tiny

D, V, T = 4, 3, 5  # encoder width, vocabulary (blank + 2 labels), frames
LABEL = LabelContextConfig(embed_dim=3, hidden=4)  # the small decoders' label network

EXACT_DECODERS = {
    "pointwise": lambda: PointwiseDecoder(D, V, hidden=3),
    "attention_emission": lambda: AttentionEmissionDecoder(D, V, label=LABEL, joint_dim=4),
    "monotonic": lambda: MonotonicAttentionDecoder(D, V, window=2, attention_dim=3, label=LABEL),
    "monotonic_variable": lambda: MonotonicAttentionDecoder(
        D, V, window=3, variable=True, attention_dim=3, label=LABEL
    ),
}


def _exact_log_probs(decoder, h: torch.Tensor, length: int) -> dict:
    """``log P(y)`` of every ``y`` with at most ``length`` labels, by the exact CB marginal."""
    seqs = label_sequences(V - 1, length)
    targets, target_lens = padded(seqs)
    B = len(seqs)
    lens = torch.full((B,), length)
    with torch.no_grad():
        emit, terms = decoder.cb_terms(h[:, :length].expand(B, -1, -1), lens, targets, target_lens)
        marginal = (
            cb_marginal_nll if decoder.order is LabelOrder.MEMORYLESS else cb_marginal_nll_windowed
        )
        return dict(zip(seqs, (-marginal(emit, terms, lens, target_lens)).tolist()))


@pytest.mark.parametrize("name", list(EXACT_DECODERS))
@pytest.mark.parametrize("seed", [0, 1])
def test_exhaustive_search_is_the_exact_argmax_with_exact_marginals(name, seed):
    """Without pruning, every label sequence comes out with score log P(y) (eq. 38, summed over
    all its emission patterns) and the best is the enumerated argmax. Breaking the merging of
    equal prefixes (or, second order, of equal emissions) breaks the scores."""
    torch.manual_seed(seed)
    decoder = EXACT_DECODERS[name]().double().eval()
    h = 2.0 * torch.randn(2, T, D, dtype=torch.float64)
    lens = torch.tensor([T, T - 1])  # the second utterance is padded
    hyps = cb_beam_search(decoder, h, lens, BeamSearchOptions(beam=None, nbest=None))
    # A beam as wide as the number of distinct states (prefix; and the last emission frame for
    # second order) is exhaustive too, but only if alignments reaching a state are merged:
    # there are 3^5 = 243 alignments, 63 prefixes and 115 (prefix, last frame) states.
    states = 115 if decoder.order is LabelOrder.SECOND_ORDER else 63
    merged = cb_beam_search(decoder, h, lens, BeamSearchOptions(beam=states, nbest=None))
    assert [[(x.tokens, round(x.am_score, 9)) for x in n] for n in merged] == [
        [(x.tokens, round(x.am_score, 9)) for x in n] for n in hyps
    ]
    for b, length in enumerate(lens.tolist()):
        exact = _exact_log_probs(decoder, h[b : b + 1], length)
        found = {tuple(x.tokens): x.am_score for x in hyps[b]}
        assert set(found) == set(exact)
        for y, score in found.items():
            assert score == pytest.approx(exact[y], abs=1e-9), y
        assert tuple(hyps[b][0].tokens) == argmax_unique(exact)
        assert hyps[b][0].score == hyps[b][0].am_score


@pytest.mark.parametrize("name", ["pointwise", "attention_emission"])
def test_a_pruned_beam_collects_part_of_the_mass(name):
    """With a beam, a returned hypothesis's score sums the alignments that survived: never more
    than log P(y), and here, on longer inputs, strictly less for some."""
    torch.manual_seed(3)
    decoder = EXACT_DECODERS[name]().double().eval()
    h = 2.0 * torch.randn(1, 8, D, dtype=torch.float64)
    hyps = cb_beam_search(decoder, h, torch.tensor([8]), BeamSearchOptions(beam=3, nbest=None))[0]
    exact = _exact_log_probs(decoder, h, 8)
    gaps = [exact[tuple(x.tokens)] - x.am_score for x in hyps]
    assert min(gaps) > -1e-9 and max(gaps) > 1e-6


@pytest.mark.parametrize("name", tiny.CB)
def test_beam_one_is_greedy_search(name):
    """Beam 1 keeps the better of "stay" and "emit the best label" at each frame: the greedy
    search of CBModel, for every CB decoder (exact and sampled-only ones)."""
    model = tiny.build(name, seed=1)
    feats, lens = tiny.batch(seed=2)
    greedy = model.greedy_decode(feats, lens)
    beam = [nbest[0].tokens for nbest in beam_search(model, feats, lens, BeamSearchOptions(beam=1))]
    assert beam == greedy
    assert any(len(y) > 2 for y in greedy)  # the models do emit: the comparison is not vacuous


@pytest.mark.parametrize("name", ["pointwise", "monotonic_variable", "autoregressive"])
def test_batch_and_padding_change_nothing(name):
    model = tiny.build(name, seed=4)
    feats, lens = tiny.batch(seed=5)
    together = beam_search(model, feats, lens, BeamSearchOptions(beam=4, nbest=2))
    for b in range(len(lens)):
        alone = beam_search(
            model, feats[b : b + 1, : lens[b]], lens[b : b + 1], BeamSearchOptions(beam=4, nbest=2)
        )[0]
        assert [x.tokens for x in alone] == [x.tokens for x in together[b]]
        assert [x.am_score for x in alone] == pytest.approx(
            [x.am_score for x in together[b]], abs=1e-4
        )


def test_history_decoders_are_searched_frame_synchronously():
    """An autoregressive decoder's beam search returns valid hypotheses whose scores are
    probabilities of alignment sets (negative), best first."""
    decoder = AutoregressiveDecoder(D, V, label=LABEL, emission_hidden=3).eval()
    hyps = cb_beam_search(
        decoder, torch.randn(1, 6, D), torch.tensor([6]), BeamSearchOptions(beam=4, nbest=None)
    )[0]
    assert len({tuple(x.tokens) for x in hyps}) == len(hyps) == 4
    assert all(x.am_score < 0 for x in hyps) and hyps[0].score == max(x.score for x in hyps)


def test_bad_options_are_refused():
    decoder = PointwiseDecoder(D, V)
    with pytest.raises(ValueError, match="ilm_weight .* HAT models only"):
        cb_beam_search(
            decoder, torch.randn(1, 3, D), torch.tensor([3]), BeamSearchOptions(ilm_weight=0.5)
        )
    with pytest.raises(ValueError, match="beam must be >= 1"):
        BeamSearchOptions(beam=0)
