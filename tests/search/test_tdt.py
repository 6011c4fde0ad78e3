"""TDT searches: the exhaustive beam search is the loss's lattice exactly; greedy search follows
the predicted durations, one frame of its own per utterance."""

import itertools

import pytest
import torch

from cbasr import builder
from cbasr.losses.tdt import tdt_nll
from cbasr.search.hypotheses import BeamSearchOptions
from cbasr.search.models import beam_search
from cbasr.search.tdt import tdt_beam_search

ENCODER = {"name": "rnn", "hidden": 8, "num_layers": 1, "stack": 1, "stride": 1, "dropout": 0.0}


def _model(durations=(0, 1, 2), vocab_size=3, seed=0, max_symbols=2, context=-1):
    torch.manual_seed(seed)
    decoder = {
        "name": "transducer",
        "joint": "tdt",
        "context": context,
        "durations": list(durations),
        "embed_dim": 4,
        "hidden": 8,
        "joint_dim": 8,
        "dropout": 0.0,
    }
    loss = {"name": "tdt", "max_symbols": max_symbols}
    return builder.build_model(ENCODER, decoder, loss, 5, vocab_size).eval()


def _exact_many(model, h, lens, token_lists, chunk=1024) -> list[float]:
    """The lattice's log-probability of each label sequence (``h``: one utterance), a batch of
    padded sequences at a time."""
    scores = []
    for i in range(0, len(token_lists), chunk):
        batch = [list(tokens) for tokens in token_lists[i : i + chunk]]
        labels = torch.tensor([len(tokens) for tokens in batch])
        y = torch.ones(len(batch), max(1, int(labels.max())), dtype=torch.long)  # padding: 1
        for b, tokens in enumerate(batch):
            y[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        hb, lb = h.expand(len(batch), -1, -1), lens.expand(len(batch))
        log_t, log_d = model.decoder(hb, lb, y)
        nll = tdt_nll(log_t, log_d, y, lb, labels, model.decoder.joint.durations)
        scores += (-nll).tolist()
    return scores


def _exact(model, h, lens, tokens) -> float:
    return _exact_many(model, h, lens, [tokens])[0]


@pytest.mark.parametrize(
    "durations,context", [((0, 1, 2), -1), ((1, 3), -1), ((0, 1, 2, 3, 4), -1), ((0, 1, 2), 2)]
)
def test_exhaustive_search_is_the_tdt_lattice_exactly(durations, context):
    """Every prefix's summed mass, the prediction network an LSTM or the last two labels."""
    model = _model(durations, seed=len(durations), context=context)
    h, lens = torch.randn(1, 4, model.encoder.output_dim), torch.tensor([4])
    cap = 2
    hyps = tdt_beam_search(model.decoder, h, lens, BeamSearchOptions(beam=None, nbest=None), cap)[0]
    found = {tuple(hyp.tokens): hyp.am_score for hyp in hyps}
    shortest = [()] + [(a,) for a in (1, 2)] + list(itertools.product((1, 2), repeat=2))
    exact = dict(zip(found, _exact_many(model, h, lens, list(found))))
    for tokens in shortest:  # at most ``cap`` labels: the cap takes no path away
        assert found[tokens] == pytest.approx(exact[tokens], abs=1e-5)
    for tokens, score in found.items():  # longer ones: the capped search sums fewer paths
        assert score <= exact[tokens] + 1e-5


def test_a_pruned_beam_keeps_part_of_each_hypothesis_mass():
    model = _model(seed=3)
    h, lens = torch.randn(1, 6, model.encoder.output_dim), torch.tensor([6])
    options = BeamSearchOptions(beam=2, nbest=None)
    hyps = tdt_beam_search(model.decoder, h, lens, options, 2)[0]
    assert hyps and [hyp.score for hyp in hyps] == sorted((hyp.score for hyp in hyps), reverse=True)
    for hyp in hyps:
        assert hyp.am_score <= _exact(model, h, lens, hyp.tokens) + 1e-5


def test_the_label_bonus_is_added_per_label_and_buys_labels():
    """``label_bonus`` ranks by ``am_score + label_bonus * |y|``, leaves the masses as they are
    (exhaustive search), and steers the pruned beam the same way: a larger bonus never gives a
    best hypothesis with fewer labels, a bonus of 3 many more than none, one of -3 no label."""
    model = _model(seed=0)
    h, lens = torch.randn(1, 4, model.encoder.output_dim), torch.tensor([4])
    bonuses = (-3.0, 0.0, 1.0, 3.0)
    for beam in (None, 2):
        found = {}
        for bonus in bonuses:
            options = BeamSearchOptions(beam=beam, nbest=None, label_bonus=bonus)
            found[bonus] = tdt_beam_search(model.decoder, h, lens, options, 2)[0]
            for hyp in found[bonus]:
                assert hyp.score == pytest.approx(hyp.am_score + bonus * len(hyp.tokens))
        if beam is None:  # every prefix, with the same mass whatever the bonus
            unbiased = {tuple(hyp.tokens): hyp.am_score for hyp in found[0.0]}
            for bonus in bonuses:
                assert {tuple(hyp.tokens): hyp.am_score for hyp in found[bonus]} == unbiased
        counts = [len(found[bonus][0].tokens) for bonus in bonuses]
        assert counts == sorted(counts), (beam, counts)
        assert counts[0] == 0 and counts[-1] >= counts[1] + 5, (beam, counts)


def test_beam_search_dispatches_tdt_and_refuses_a_language_model():
    model = _model()
    feats, lens = torch.randn(2, 5, 5), torch.tensor([5, 3])
    hyps = beam_search(model, feats, lens, BeamSearchOptions(beam=3))
    assert len(hyps) == 2 and all(len(nbest) == 1 for nbest in hyps)
    with pytest.raises(ValueError, match="TDT"):
        beam_search(model, feats, lens, BeamSearchOptions(beam=3, lm_weight=0.5), lm=object())


def _steer(model, token: int, duration: int) -> None:
    """Make the joint's best token ``token`` and best duration ``duration`` everywhere."""
    joint = model.decoder.joint
    last = joint.out[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
        last.bias[token] = 10.0
        last.bias[joint.vocab_size + joint.durations.index(duration)] = 10.0


def _count_joint_calls(model) -> list:
    calls = []
    model.decoder.joint.out.register_forward_hook(lambda *args: calls.append(1))
    return calls


def test_greedy_skips_the_frames_a_blank_covers():
    model = _model((0, 1, 2, 3, 4))
    _steer(model, token=0, duration=4)
    calls = _count_joint_calls(model)
    feats, lens = torch.randn(1, 10, 5), torch.tensor([10])
    assert model.greedy_decode(feats, lens) == [[]]
    assert len(calls) == 3  # frames 0, 4 and 8


def test_greedy_blank_of_duration_zero_moves_on_by_its_best_positive_duration():
    model = _model((0, 1, 2))
    _steer(model, token=0, duration=0)  # blank is best, and duration 0: not an edge for blank
    joint = model.decoder.joint
    with torch.no_grad():
        joint.out[-1].bias[joint.vocab_size + 2] = 5.0  # then 2 beats 1
    calls = _count_joint_calls(model)
    assert model.greedy_decode(torch.randn(1, 6, 5), torch.tensor([6])) == [[]]
    assert len(calls) == 3  # frames 0, 2, 4


def test_greedy_emits_at_most_max_symbols_labels_of_duration_zero_per_frame():
    model = _model((0, 1, 2), max_symbols=3)
    _steer(model, token=2, duration=0)
    assert model.greedy_decode(torch.randn(1, 4, 5), torch.tensor([4])) == [[2] * 12]


def test_greedy_counts_the_labels_of_duration_zero_afresh_on_each_frame():
    """Frame 0 emits label 1 of duration 1; frame 1 label 2 of duration 0, every time: with
    max_symbols 2, frame 1 emits it twice (its count starts at 0 there), then moves on."""
    model = _model((0, 1), max_symbols=2)
    joint = model.decoder.joint
    V = joint.vocab_size

    def frame_units(state, t, g):  # (B,) frames -> (B, V + |D|) units
        units = torch.zeros(t.shape[0], V + 2)
        first = t == 0
        units[:, 1] = torch.where(first, 10.0, 0.0)  # label 1 on frame 0
        units[:, 2] = torch.where(first, 0.0, 10.0)  # label 2 on frame 1
        units[:, V] = torch.where(first, 0.0, 10.0)  # duration 0 on frame 1
        units[:, V + 1] = torch.where(first, 10.0, 0.0)  # duration 1 on frame 0
        return units

    joint.frame_units = frame_units
    h = torch.zeros(1, 2, joint.encoder_proj.in_features)
    assert model._greedy(h, torch.tensor([2])) == [[1, 2, 2]]
    assert model._greedy(h, torch.tensor([2]), frames=True) == ([[1, 2, 2]], [[0, 1, 1]])


def test_greedy_batch_equals_each_utterance_alone():
    model = _model((0, 1, 2, 3), seed=7)
    with torch.no_grad():  # emit now and then
        model.decoder.joint.out[-1].bias[0] -= 1.0
    feats, lens = torch.randn(3, 9, 5), torch.tensor([9, 4, 7])
    together = model.greedy_decode(feats, lens)
    alone = [
        model.greedy_decode(feats[b : b + 1, : int(lens[b])], lens[b : b + 1])[0] for b in range(3)
    ]
    assert together == alone and any(together)


def test_an_utterance_needs_a_frame_per_label_without_duration_zero():
    model = _model((1, 2))
    assert model.check_utterance(4, [1, 2, 1, 2]) is not None
    assert model.check_utterance(5, [1, 2, 1, 2]) is None
    assert _model((0, 1)).check_utterance(2, [1, 2, 1, 2]) is None


@pytest.mark.parametrize(
    "loss,message",
    [
        ({"name": "tdt", "topology": "monotonic"}, "topology"),
        ({"name": "tdt", "prune_range": 2}, "pruned"),
    ],
)
def test_options_that_do_not_apply_to_tdt_are_refused(loss, message):
    decoder = {"name": "transducer", "joint": "tdt"}
    with pytest.raises(ValueError, match=message):
        builder.build_model(ENCODER, decoder, loss, 5, 3)
