"""Label-synchronous search of the autoregressive CB decoders: exhaustive search is the exact
argmax of P(y) with exact scores, early stopping keeps the best alignment, pruning never adds
mass, batch and padding change nothing; the oracle enumerates every (emission pattern, labels)
pair and scores it step by step through the decoder's own one-step methods."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from cbasr.config.schema import LabelContextConfig
from cbasr.modules.decoders import AutoregressiveDecoder, PointwiseDecoder
from cbasr.modules.label_context import START
from cbasr.search import BeamSearchOptions, beam_search, cb_label_beam_search
from tests.reference.search_enumeration import argmax_unique
from tests.search import tiny

D, V, T = 4, 3, 5  # encoder width, vocabulary (blank + 2 labels), frames


def _decoder(
    emission: str, seed: int, num_layers: int = 1, sharpen: float = 1.0
) -> AutoregressiveDecoder:
    torch.manual_seed(seed)
    decoder = (
        AutoregressiveDecoder(
            D,
            V,
            label=LabelContextConfig(embed_dim=3, hidden=4, num_layers=num_layers),
            emission=emission,
            emission_hidden=3,
        )
        .double()
        .eval()
    )
    with torch.no_grad():  # emit about half the time, so that every length has real mass
        last = decoder.emission.net[-1] if emission == "encoder" else decoder.emission_out
        last.bias.add_(1.0 if sharpen == 1.0 else 0.0)
        last.weight.mul_(sharpen)
        decoder.out[-1].weight.mul_(sharpen)
    return decoder


def _joint_log_probs(decoder: AutoregressiveDecoder, h: torch.Tensor, length: int) -> dict:
    """``{(emission times, labels): log P(b, y)}`` over every pattern of the first ``length``
    frames and every labelling, frame by frame as the model defines it: the emission logit of
    frame ``u`` from the encoder (or, Luo, from the state after the labels before ``u``), the
    label from one LSTM step on ``[h_t; E y_{l-1}]``."""
    out = {}
    with torch.no_grad():
        for pattern in itertools.product((0, 1), repeat=length):
            times = tuple(t for t, bit in enumerate(pattern) if bit)
            for labels in itertools.product(range(1, V), repeat=len(times)):
                zeros = h.new_zeros(decoder.num_layers, 1, decoder.hidden)
                lstm, s, prev, total, i = (
                    (zeros, zeros),
                    h.new_zeros(1, decoder.hidden),
                    START,
                    0.0,
                    0,
                )
                for u in range(length):
                    a = float(decoder.emission_step(h[u : u + 1], s))
                    if not pattern[u]:
                        total += F.logsigmoid(torch.tensor(-a, dtype=torch.float64)).item()
                        continue
                    total += F.logsigmoid(torch.tensor(a, dtype=torch.float64)).item()
                    log_probs, s, lstm = decoder.label_step(
                        h[u : u + 1], torch.tensor([prev]), lstm
                    )
                    total += float(log_probs[0, labels[i] - 1])
                    prev, i = labels[i], i + 1
                out[(times, labels)] = total
    return out


def _marginals(joint: dict) -> dict:
    by_labels: dict[tuple, list[float]] = {}
    for (_, labels), value in joint.items():
        by_labels.setdefault(labels, []).append(value)
    return {
        y: torch.logsumexp(torch.tensor(v, dtype=torch.float64), 0).item()
        for y, v in by_labels.items()
    }


@pytest.mark.parametrize("emission", ["encoder", "decoder"])
@pytest.mark.parametrize("seed", [0, 1])
def test_exhaustive_search_is_the_exact_argmax_with_exact_marginals(emission, seed):
    """Without pruning every label sequence comes out with score log P(y), summed over all its
    emission patterns, and the best is the enumerated argmax. The oracle also checks itself
    against the teacher-forced label terms of training for encoder emissions. Seed 1 has a
    two-layer decoder LSTM."""
    decoder = _decoder(emission, seed, num_layers=1 + seed)
    h = 2.0 * torch.randn(2, T, D, dtype=torch.float64)
    lens = torch.tensor([T, T - 1])  # the second utterance is padded
    hyps = cb_label_beam_search(decoder, h, lens, BeamSearchOptions(beam=None, nbest=None))
    for b, length in enumerate(lens.tolist()):
        joint = _joint_log_probs(decoder, h[b], length)
        exact = _marginals(joint)
        assert math.isclose(
            torch.logsumexp(torch.tensor(list(exact.values())), 0).item(), 0.0, abs_tol=1e-9
        )
        found = {tuple(x.tokens): x.am_score for x in hyps[b]}
        assert set(found) == set(exact)
        for y, score in found.items():
            assert score == pytest.approx(exact[y], abs=1e-9), y
        assert tuple(hyps[b][0].tokens) == argmax_unique(exact)
        if emission == "encoder":  # the oracle's label terms are training's
            (times, labels) = max(joint, key=lambda key: len(key[0]))
            targets = torch.tensor([labels])
            taught = decoder.label_log_probs(h[b : b + 1], targets, torch.tensor([[times]])).sum()
            a = decoder.emission_logits(h[b : b + 1, :length])[0]
            bits = torch.zeros(length, dtype=torch.bool)
            bits[list(times)] = True
            emissions = torch.where(bits, F.logsigmoid(a), F.logsigmoid(-a)).sum()
            assert float((taught + emissions).detach()) == pytest.approx(
                joint[(times, labels)], abs=1e-9
            )


def test_early_stopping_keeps_the_best_alignment():
    """A beam as wide as every candidate prunes nothing; the search then stops as soon as no
    live hypothesis can beat the best ended one, which for emissions from the encoder is a true
    bound, so the label sequence of the best single alignment is found with at least that
    alignment's probability (and at most its own marginal). With Luo's emissions the bound is
    an estimate (the future emissions depend on future states), so no such claim is made."""
    decoder = _decoder(
        "encoder", seed=2, num_layers=2, sharpen=6.0
    )  # a confident model stops early
    h = 2.0 * torch.randn(1, T, D, dtype=torch.float64)
    joint = _joint_log_probs(decoder, h[0], T)
    exact = _marginals(joint)
    (best_times, best_labels), best = max(joint.items(), key=lambda item: item[1])
    assert len(best_times) >= 2
    hyps = cb_label_beam_search(
        decoder, h, torch.tensor([T]), BeamSearchOptions(beam=len(joint), nbest=None)
    )[0]
    found = {tuple(x.tokens): x.am_score for x in hyps}
    assert best - 1e-9 <= found[best_labels] <= exact[best_labels] + 1e-9
    # it did stop early: some alignments were never completed (run to the end unpruned, the
    # search would have found them all, as the exhaustive search does)
    assert len(found) < len(exact) or any(found[y] < exact[y] - 1e-6 for y in found)


@pytest.mark.parametrize("emission", ["encoder", "decoder"])
def test_a_pruned_beam_collects_part_of_the_mass(emission):
    decoder = _decoder(emission, seed=3)
    h = 2.0 * torch.randn(1, 7, D, dtype=torch.float64)
    exact = _marginals(_joint_log_probs(decoder, h[0], 7))
    hyps = cb_label_beam_search(
        decoder, h, torch.tensor([7]), BeamSearchOptions(beam=3, nbest=None)
    )[0]
    gaps = [exact[tuple(x.tokens)] - x.am_score for x in hyps]
    assert min(gaps) > -1e-9 and max(gaps) > 1e-6
    assert [x.score for x in hyps] == sorted((x.score for x in hyps), reverse=True)


@pytest.mark.parametrize("name", ["autoregressive", "autoregressive_luo"])
def test_batch_and_padding_change_nothing(name):
    model = tiny.build(name, seed=4)
    feats, lens = tiny.batch(seed=5)
    options = BeamSearchOptions(beam=4, nbest=2, cb_search="label")
    together = beam_search(model, feats, lens, options)
    assert any(len(n[0].tokens) > 2 for n in together)
    for b in range(len(lens)):
        alone = beam_search(model, feats[b : b + 1, : lens[b]], lens[b : b + 1], options)[0]
        assert [x.tokens for x in alone] == [x.tokens for x in together[b]]
        assert [x.am_score for x in alone] == pytest.approx(
            [x.am_score for x in together[b]], abs=1e-4
        )


def test_the_label_synchronous_search_is_chosen_by_option():
    """``cb_search="label"`` runs the label-synchronous search through ``beam_search``; the
    default (``"auto"``) and ``"frame"`` run the frame-synchronous one, a different search; the
    label search on a memoryless decoder is refused with the reason."""
    model = tiny.build("autoregressive", seed=6, shift=0.0)  # emits on some frames only
    feats, lens = tiny.batch(seed=7)
    h, enc_lens = model.encoder(feats, lens)
    options = BeamSearchOptions(beam=3, nbest=3)
    chosen = beam_search(model, feats, lens, BeamSearchOptions(beam=3, nbest=3, cb_search="label"))
    label = cb_label_beam_search(model.decoder, h, enc_lens, options)
    assert [[(x.tokens, x.am_score) for x in n] for n in chosen] == [
        [(x.tokens, x.am_score) for x in n] for n in label
    ]
    auto = beam_search(model, feats, lens, options)
    frame = beam_search(model, feats, lens, BeamSearchOptions(beam=3, nbest=3, cb_search="frame"))
    assert [[(x.tokens, x.am_score) for x in n] for n in auto] == [
        [(x.tokens, x.am_score) for x in n] for n in frame
    ]
    # a different search: the same words may win, but from different sets of alignments
    assert [[(x.tokens, round(x.am_score, 4)) for x in n] for n in frame] != [
        [(x.tokens, round(x.am_score, 4)) for x in n] for n in label
    ]
    with pytest.raises(ValueError, match="needs an autoregressive decoder"):
        beam_search(tiny.build("pointwise"), feats, lens, BeamSearchOptions(cb_search="label"))
    with pytest.raises(ValueError, match="CB models only"):
        beam_search(tiny.build("transducer"), feats, lens, BeamSearchOptions(cb_search="frame"))
    with pytest.raises(ValueError, match="cb_search must be one of"):
        BeamSearchOptions(cb_search="time")
    with pytest.raises(TypeError, match="needs an autoregressive decoder"):
        cb_label_beam_search(
            PointwiseDecoder(D, V), torch.randn(1, 3, D), torch.tensor([3]), options
        )


@pytest.mark.parametrize("length_norm", [False, True])
@pytest.mark.parametrize("bonus", [0.0, 0.7])
def test_the_early_stopping_bound_is_never_below_a_descendants_final_score(length_norm, bonus):
    """A live hypothesis with fused score ``best`` and ``labels`` labels can end with ``k`` more
    labels (1 <= k <= remaining) and a fused score at most ``best + bonus * k`` (every other term
    is a log probability); ranked per label with ``length_norm``, that is at most
    ``(best + bonus * k) / (labels + k)``. The bound must cover every k, for scores of either
    sign (a positive one with a bonus: the shortest ending is the best; a negative one: the
    longest)."""
    from cbasr.search.label_synchronous import _upper_bounds

    grid = [
        (b, n, r) for b in (-9.0, -2.5, -0.1, 0.0, 0.4, 3.0) for n in (0, 1, 4) for r in (1, 2, 5)
    ]
    best, labels, remaining = zip(*grid)
    best = torch.tensor(best, dtype=torch.float64)
    labels, remaining = torch.tensor(labels), torch.tensor(remaining)
    options = BeamSearchOptions(beam=4, label_bonus=bonus, length_norm=length_norm)
    bound = _upper_bounds(best, labels, remaining, options)
    for i, (b, n, r) in enumerate(grid):
        for k in range(1, r + 1):
            final = b + bonus * k
            reachable = final / (n + k) if length_norm else final
            assert float(bound[i]) >= reachable - 1e-12, (b, n, r, k)
