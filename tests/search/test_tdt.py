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
        "label": {"context": context, "embed_dim": 4, "hidden": 8},
        "durations": list(durations),
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


def _lattice_masses(model, h, T: int, cap: int) -> dict:
    """Every label sequence's summed path mass with at most ``cap`` labels of duration 0 in a
    row on one frame, by a plain forward pass in float64 over the nodes ``(t, y, labels of
    duration 0 so far on t)`` of the TDT lattice (:mod:`cbasr.losses.tdt`): each prefix's
    token and duration log-probabilities read from the teacher-forced decoder
    (``model.decoder(h, lens, y)``), none of the search's machinery."""
    durations = model.decoder.joint.durations
    V = model.decoder.joint.vocab_size
    lens = torch.tensor([T])
    cache = {}

    def logs(y):  # (log P_T (V,), log P_D (|D|,)) at every frame of prefix y
        if y not in cache:
            targets = torch.tensor([list(y) or [1]])
            log_t, log_d = model.decoder(h, lens, targets)
            cache[y] = log_t[0, :, len(y)].double(), log_d[0, :, len(y)].double()
        return cache[y]

    def add(table, key, value):
        table[key] = torch.logaddexp(table[key], value) if key in table else value

    waiting = {t: {} for t in range(T + 1)}
    waiting[0][((), 0)] = torch.tensor(0.0, dtype=torch.float64)
    finished = {}
    for t in range(T):
        nodes = waiting[t]
        while nodes:  # labels of duration 0 first make nodes of this frame
            (y, zeros), mass = nodes.popitem()
            log_t, log_d = logs(y)
            for j, d in enumerate(durations):
                if d > 0 and t + d <= T:
                    edge = mass + log_t[t, 0] + log_d[t, j]
                    add(
                        finished if t + d == T else waiting[t + d],
                        y if t + d == T else (y, 0),
                        edge,
                    )
                for v in range(1, V):
                    edge = mass + log_t[t, v] + log_d[t, j]
                    if d == 0 and zeros < cap:
                        add(nodes, (y + (v,), zeros + 1), edge)
                    elif 0 < d and t + d < T:
                        add(waiting[t + d], (y + (v,), 0), edge)
    return {y: float(mass) for y, mass in finished.items()}


@pytest.mark.parametrize(
    "durations,cap", [((0, 1, 2), 1), ((0, 1, 2), 2), ((0, 1, 3), 2), ((1, 2), 1)]
)
def test_the_exhaustive_search_sums_every_path_of_the_capped_lattice(durations, cap):
    """Without pruning, the finished prefixes and their masses are those of a plain forward
    pass over the lattice in float64, for every prefix (longer than the cap too: the cap is
    the search's lattice)."""
    model = _model(durations, seed=11 + cap, max_symbols=cap).double()
    T = 4
    h = torch.randn(1, T, model.encoder.output_dim, dtype=torch.float64)
    with torch.no_grad():
        expected = _lattice_masses(model, h, T, cap)
        options = BeamSearchOptions(beam=None, nbest=None)
        found = tdt_beam_search(model.decoder, h, torch.tensor([T]), options, cap)[0]
    masses = {tuple(hyp.tokens): hyp.am_score for hyp in found}
    assert masses == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert len(masses) > 10 and max(map(len, masses)) > cap


def test_a_batch_is_searched_as_each_utterance_alone():
    """Utterances of several lengths (one without frames): each one's hypotheses and masses
    as searched alone, and the joint evaluated on each utterance's own frames only."""
    model = _model((0, 1, 2, 3), seed=5, max_symbols=3).double()
    with torch.no_grad():
        model.decoder.joint.out[-1].bias[0] -= 3.0  # emit now and then
    lens = torch.tensor([9, 4, 0, 7])
    h = torch.randn(len(lens), int(lens.max()), model.encoder.output_dim, dtype=torch.float64)
    frames = []
    model.decoder.joint.encoder_proj.register_forward_hook(lambda m, i, o: frames.append(len(o)))
    options = BeamSearchOptions(beam=3, nbest=None, label_bonus=0.5)
    with torch.no_grad():
        together = tdt_beam_search(model.decoder, h, lens, options, 3)
        assert sum(frames) == int(lens.sum())  # every frame of an utterance, padding never
        alone = [
            tdt_beam_search(model.decoder, h[b : b + 1, : int(n)], lens[b : b + 1], options, 3)[0]
            for b, n in enumerate(lens.tolist())
        ]
    assert together[2] == [] and any(len(nbest) > 1 for nbest in together)
    for mine, single in zip(together, alone):
        assert [hyp.tokens for hyp in mine] == [hyp.tokens for hyp in single]
        assert [hyp.am_score for hyp in mine] == pytest.approx([hyp.am_score for hyp in single])
    assert any(len(nbest[0].tokens) > 2 for nbest in together if nbest)


def test_merging_sums_each_lattice_node_into_its_first_slot():
    """:func:`tdt_entries.merge` against a loop over the slots: per group, the live slots of
    equal ``(hash, length, frame)`` summed (log-sum-exp) into the first of them, the rest
    emptied; empty slots never join a node, whatever their fields."""
    from cbasr.search import tdt_entries

    g = torch.Generator().manual_seed(0)
    N, K = 5, 40
    e = tdt_entries.empty(N, K, "cpu")
    e["am"] = torch.randn(N, K, generator=g, dtype=torch.float64)
    e["am"][torch.rand(N, K, generator=g) < 0.2] = float("-inf")
    e["hash"] = torch.randint(0, 4, (N, K), generator=g)  # few prefixes, frames: many equal
    e["length"] = e["hash"] % 2
    e["frame"] = torch.randint(5, 7, (N, K), generator=g)
    merged = tdt_entries.merge(e)["am"]
    expected = torch.full((N, K), float("-inf"), dtype=torch.float64)
    for n in range(N):
        first = {}
        for k in range(K):
            if e["am"][n, k] > float("-inf"):
                node = tuple(int(e[f][n, k]) for f in ("hash", "length", "frame"))
                lead = first.setdefault(node, k)
                expected[n, lead] = torch.logaddexp(expected[n, lead], e["am"][n, k])
    assert torch.equal(merged.isfinite(), expected.isfinite())
    assert merged[merged.isfinite()].tolist() == pytest.approx(
        expected[expected.isfinite()].tolist()
    )
    live = e["am"].isfinite()
    assert 0 < int(merged.isfinite().sum()) < int(live.sum())  # some merged
    # the other fields are kept as they were
    assert torch.equal(tdt_entries.merge(e)["hash"], e["hash"])


def _joint_calls(model, h, lens, options, cap) -> tuple[int, int]:
    """``(joint calls, frames visited)`` of one utterance's beam search."""
    calls, frames = [], []
    hooks = [
        model.decoder.joint.out.register_forward_hook(lambda *a: calls.append(1)),
        model.decoder.joint.encoder_proj.register_forward_hook(lambda *a: frames.append(1)),
    ]
    with torch.no_grad():
        tdt_beam_search(model.decoder, h, lens, options, cap)
    for hook in hooks:
        hook.remove()
    return len(calls), len(frames)


def test_labels_that_stay_on_a_frame_are_pruned_jointly_with_what_moved_on():
    """A label of duration 0 is expanded further only if it is among the beam best of the
    frame's candidates: where duration 0 is improbable, every frame's label loop stops after
    its first step (one joint call per frame); where it is likely, the loop goes on."""
    model = _model((0, 1, 2), seed=2, max_symbols=3)
    h, lens = torch.randn(1, 8, model.encoder.output_dim), torch.tensor([8])
    joint = model.decoder.joint
    stay = joint.out[-1].bias[joint.vocab_size]  # duration 0's logit
    options = BeamSearchOptions(beam=4)
    with torch.no_grad():
        stay -= 8.0
    calls, frames = _joint_calls(model, h, lens, options, 3)
    assert frames == 8 and calls == frames  # (on the last frame, against the blanks that end)
    with torch.no_grad():
        stay += 16.0
    calls, frames = _joint_calls(model, h, lens, options, 3)
    assert frames == 8 and calls > 2 * frames


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
            for bonus in bonuses:  # (summed in another order: equal up to rounding)
                masses = {tuple(hyp.tokens): hyp.am_score for hyp in found[bonus]}
                assert masses == pytest.approx(unbiased, rel=1e-12)
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

    with torch.no_grad():  # the joint reads the frame alone: unit 0 on frame 0, 1 on frame 1
        joint.label_proj.weight.zero_()
        joint.encoder_proj.weight.zero_()
        joint.encoder_proj.bias.zero_()
        joint.encoder_proj.weight[0, 0] = joint.encoder_proj.weight[1, 1] = 10.0
        last = joint.out[-1]
        last.weight.zero_()
        last.bias.zero_()
        last.weight[1, 0] = 10.0  # label 1 on frame 0
        last.weight[V + 1, 0] = 10.0  # of duration 1
        last.weight[2, 1] = 10.0  # label 2 on frame 1
        last.weight[V, 1] = 10.0  # of duration 0
    h = torch.zeros(1, 2, joint.encoder_proj.in_features)
    h[0, 0, 0] = h[0, 1, 1] = 1.0
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


def test_states_reads_the_rows_of_every_frame_a_hypothesis_may_wait_on():
    """:class:`tdt_entries.States` (a ring of frames of rows, grown as a frame needs more):
    the rows read by id are the rows added, for the start and every frame up to ``horizon``
    back, across growths and the ring's wrap."""
    from cbasr.search import tdt_entries

    g = torch.Generator().manual_seed(0)

    def state(n):
        h = torch.randn(1, n, 4, generator=g), torch.randn(1, n, 4, generator=g)
        return {"g": torch.randn(n, 3, generator=g), "context": h}

    horizon = 2
    added = {-1: state(2)}
    states = tdt_entries.States(added[-1], horizon)
    for t, sizes in enumerate([(3,), (4, 5), (1,), (6, 2, 3), (2,), (9,)]):
        parts = [state(n) for n in sizes]
        states.add(t, parts)
        added[t] = {
            "g": torch.cat([p["g"] for p in parts]),
            "context": tuple(torch.cat([p["context"][i] for p in parts], 1) for i in (0, 1)),
        }
        frames = [f for f in added if f >= t - horizon or (f == -1 and t < horizon)]
        ids = torch.cat(
            [tdt_entries.States.ids(f, torch.arange(added[f]["g"].shape[0])) for f in frames]
        )
        read = states.read(ids, torch.ones_like(ids, dtype=torch.bool))
        assert torch.equal(read["g"], torch.cat([added[f]["g"] for f in frames]))
        for i in (0, 1):
            expected = torch.cat([added[f]["context"][i] for f in frames], 1)
            assert torch.equal(read["context"][i], expected)


@pytest.mark.parametrize("am_weight,label_bonus", [(1.0, 0.0), (1.0, 1.0), (0.5, 2.0)])
def test_the_ranking_score_weighs_am_and_length(am_weight, label_bonus):
    """:func:`tdt_entries.score` is ``am_weight * am + label_bonus * |y|`` at every setting,
    its shortcut (``am`` itself) included."""
    from cbasr.search import tdt_entries
    from cbasr.search.hypotheses import BeamSearchOptions

    e = tdt_entries.empty(2, 3, "cpu")
    e["am"] = torch.tensor([[-1.0, -2.5, -0.5], [-3.0, -0.25, -4.0]], dtype=torch.float64)
    e["length"] = torch.tensor([[0, 2, 5], [1, 3, 4]])
    options = BeamSearchOptions(beam=2, am_weight=am_weight, label_bonus=label_bonus)
    expected = am_weight * e["am"] + label_bonus * e["length"]
    assert torch.equal(tdt_entries.score(e, options), expected)
