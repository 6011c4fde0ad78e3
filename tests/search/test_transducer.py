"""Transducer beam search (RNN-T and HAT): exact sums over the capped lattice without pruning,
exact single-frame scores, beam 1 is greedy search, HAT eq. (9) with the internal LM."""

import dataclasses
import gc
import itertools
import weakref

import pytest
import torch
import torch.nn.functional as F

from cbasr.config.schema import LabelContextConfig
from cbasr.losses import hat_nll, rnnt_nll
from cbasr.modules.decoders import TransducerDecoder
from cbasr.search import (
    BeamSearchOptions,
    beam_search,
    hat_internal_lm_step,
    transducer_beam_search,
)
from tests.reference.lattice_enumeration import transducer_log_marginal
from tests.reference.search_enumeration import (
    argmax_unique,
    capped_transducer_log_prob,
    label_sequences,
    padded,
    reference_transducer_search,
)
from tests.search import tiny

D, V = 4, 3


def _decoder(joint: str, seed: int = 0) -> TransducerDecoder:
    """``joint``: ``"rnnt"``, ``"hat"`` (blank unit of the joint) or ``"hat_linear"`` (eq. 5)."""
    torch.manual_seed(seed)
    blank_joint = "linear" if joint == "hat_linear" else "tanh"
    return (
        TransducerDecoder(
            D,
            V,
            joint=joint.removesuffix("_linear"),
            label=LabelContextConfig(embed_dim=3, hidden=4),
            joint_dim=4,
            blank_joint=blank_joint,
        )
        .double()
        .eval()
    )


def _lattice(
    decoder: TransducerDecoder, h: torch.Tensor, y: tuple
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blank ``(T, U + 1)`` and label ``(T, U)`` edge log weights of ``y``'s lattice."""
    targets, _ = padded([y])
    targets = targets[:, : len(y)]
    with torch.no_grad():
        if decoder.joint.name == "rnnt":
            log_probs = decoder(h, torch.tensor([h.shape[1]]), targets)[0].log_softmax(
                -1
            )  # (T, U + 1, V)
            blank, labels = log_probs[..., 0], log_probs[..., 1:]
        else:
            b, log_probs = decoder(h, torch.tensor([h.shape[1]]), targets)
            blank, labels = F.logsigmoid(b[0]), F.logsigmoid(-b[0]).unsqueeze(-1) + log_probs[0]
    label = (
        torch.stack([labels[:, u, v - 1] for u, v in enumerate(y)], dim=1)
        if y
        else labels[:, :0, 0]
    )
    return blank, label


def _nll(decoder: TransducerDecoder, h: torch.Tensor, seqs: list) -> list[float]:
    """``-log P(y | x)`` by the training losses."""
    targets, target_lens = padded(seqs)
    B, T = len(seqs), h.shape[1]
    lens = torch.full((B,), T)
    with torch.no_grad():
        if decoder.joint.name == "rnnt":
            return rnnt_nll(
                decoder(h.expand(B, -1, -1), lens, targets).float(), targets, lens, target_lens
            ).tolist()
        blank, log_probs = decoder(h.expand(B, -1, -1), lens, targets)
        return hat_nll(blank, log_probs, targets - 1, lens, target_lens).tolist()


@pytest.mark.parametrize("joint", ["rnnt", "hat", "hat_linear"])
def test_exhaustive_search_sums_the_capped_lattice_exactly(joint):
    """Without pruning, the search returns every sequence of at most ``T * cap`` labels with the
    sum over its lattice paths having at most ``cap`` labels per frame (enumerated), which is
    the training loss's log P(y) for ``|y| <= cap``; the best is the argmax of those sums."""
    T, cap = 3, 2
    decoder = _decoder(joint)
    h = torch.randn(1, T, D, dtype=torch.float64)
    hyps = transducer_beam_search(
        decoder, h, torch.tensor([T]), BeamSearchOptions(beam=None, nbest=None, max_symbols=cap)
    )[0]
    found = {tuple(x.tokens): x.am_score for x in hyps}
    assert set(found) == set(label_sequences(V - 1, T * cap))
    capped = {y: capped_transducer_log_prob(*_lattice(decoder, h, y), cap) for y in found}
    for y, score in found.items():
        assert score == pytest.approx(capped[y], abs=1e-9), y
    short = [y for y in found if len(y) <= cap]
    tol = 1e-5 if joint == "rnnt" else 1e-9  # torchaudio's RNN-T loss runs in float32
    for y, nll in zip(short, _nll(decoder, h, short)):
        assert found[y] == pytest.approx(-nll, abs=tol)
    assert tuple(hyps[0].tokens) == argmax_unique(capped)
    # a small beam finds the same best hypothesis here, with part of its probability mass
    small = transducer_beam_search(
        decoder, h, torch.tensor([T]), BeamSearchOptions(beam=4, max_symbols=cap)
    )[0][0]
    assert small.tokens == hyps[0].tokens and small.am_score <= capped[tuple(small.tokens)] + 1e-9


@pytest.mark.parametrize("joint", ["rnnt", "hat", "hat_linear"])
@pytest.mark.parametrize("cap,beam", [(2, 3), (1, 2)])
def test_a_pruned_beam_equals_the_plain_reference_search(joint, cap, beam):
    """With pruning, the batched search (rows, snapshots, merging, joint pruning, the final
    choice among the blank-ended hypotheses) keeps exactly the hypotheses of the same algorithm
    written plainly, one prefix at a time."""
    T = 4
    decoder = _decoder(joint, seed=3)
    h = torch.randn(2, T, D, dtype=torch.float64)
    lens = torch.tensor([T, T - 1])
    found = transducer_beam_search(
        decoder, h, lens, BeamSearchOptions(beam=beam, nbest=None, max_symbols=cap)
    )

    def step(b):
        def scores(prefix, t):
            with torch.no_grad():
                state = decoder.begin(h[b : b + 1], lens[b : b + 1])
                for v in prefix:
                    state = decoder.commit(state, torch.tensor([True]), torch.tensor([v]))
                blank, labels = decoder.frame_scores(state, t)
            return float(blank[0]), labels[0].tolist()

        return scores

    for b in range(2):
        expected = reference_transducer_search(step(b), int(lens[b]), beam, cap)
        got = {tuple(x.tokens): x.am_score for x in found[b]}
        assert list(got) == list(expected)  # the same hypotheses, in the same order
        assert list(got.values()) == pytest.approx(list(expected.values()), abs=1e-9)


@pytest.mark.parametrize("joint", ["rnnt", "hat", "hat_linear"])
def test_on_one_frame_every_beam_score_is_the_exact_probability(joint):
    """One frame: each label sequence has a single lattice path, so even a pruned beam's scores
    are exact: log P(y | x) of the training loss."""
    decoder = _decoder(joint, seed=1)
    h = torch.randn(1, 1, D, dtype=torch.float64)
    hyps = transducer_beam_search(
        decoder, h, torch.tensor([1]), BeamSearchOptions(beam=2, nbest=None, max_symbols=3)
    )[0]
    seqs = [tuple(x.tokens) for x in hyps]
    assert len(seqs) == 2 and any(seqs)
    tol = 1e-5 if joint == "rnnt" else 1e-9
    assert [x.am_score for x in hyps] == pytest.approx(
        [-n for n in _nll(decoder, h, seqs)], abs=tol
    )


@pytest.mark.parametrize("name", tiny.TRANSDUCERS)
def test_beam_one_is_greedy_search(name):
    """Joint pruning of the blank-ended and the extended hypotheses with beam 1 compares the
    blank with the best label at every step, as TransducerModel.greedy_decode does."""
    model = tiny.build(name, seed=1, shift=2.0)
    feats, lens = tiny.batch(seed=2)
    greedy = model.greedy_decode(feats, lens)
    beam = [nbest[0].tokens for nbest in beam_search(model, feats, lens, BeamSearchOptions(beam=1))]
    assert beam == greedy
    caps = [model.max_symbols * model.output_frames(int(n)) for n in lens]
    assert any(len(y) > 2 for y in greedy) and any(len(y) < cap for y, cap in zip(greedy, caps))


def test_batch_and_padding_change_nothing():
    model = tiny.build("hat", seed=4, shift=1.5)
    feats, lens = tiny.batch(seed=5)
    together = beam_search(model, feats, lens, BeamSearchOptions(beam=3, nbest=2))
    for b in range(len(lens)):
        alone = beam_search(
            model, feats[b : b + 1, : lens[b]], lens[b : b + 1], BeamSearchOptions(beam=3, nbest=2)
        )[0]
        assert [x.tokens for x in alone] == [x.tokens for x in together[b]]
        assert [x.am_score for x in alone] == pytest.approx(
            [x.am_score for x in together[b]], abs=1e-4
        )


def test_the_internal_lm_step_equals_the_teacher_forced_internal_lm():
    decoder = _decoder("hat", seed=2)
    targets = torch.tensor([[2, 1, 1, 2]])
    teacher = decoder.internal_lm_log_probs(targets)[0]  # (U + 1, V - 1)
    state = decoder.begin(torch.randn(1, 2, D, dtype=torch.float64), torch.tensor([2]))
    for u in range(targets.shape[1] + 1):
        torch.testing.assert_close(hat_internal_lm_step(decoder, state)[0], teacher[u])
        if u < targets.shape[1]:
            state = decoder.commit(state, torch.tensor([True]), targets[:, u])


def test_hat_eq9_weights_the_model_and_subtracts_the_internal_lm():
    """lambda_2 = 0 (and no LM) is plain HAT search; with lambda_1, lambda_2 set, every final
    score is lambda_1 log P(y | x) - lambda_2 log P_ILM(y) (HAT eq. 9 without an external LM),
    with the ILM score of TransducerModel.internal_lm_score."""
    model = tiny.build("hat", seed=6, shift=1.5)
    feats, lens = tiny.batch(seed=7)
    plain = beam_search(model, feats, lens, BeamSearchOptions(beam=3, nbest=3))
    zero = beam_search(
        model, feats, lens, BeamSearchOptions(beam=3, nbest=3, am_weight=1.0, ilm_weight=0.0)
    )
    assert [[(x.tokens, x.score) for x in n] for n in zero] == [
        [(x.tokens, x.score) for x in n] for n in plain
    ]
    fused = beam_search(
        model, feats, lens, BeamSearchOptions(beam=3, nbest=3, am_weight=2.0, ilm_weight=0.7)
    )
    hyps = [x for n in fused for x in n]
    targets, target_lens = padded([tuple(x.tokens) for x in hyps])
    ilm = model.internal_lm_score(targets, target_lens).tolist()
    for x, expected in zip(hyps, ilm):
        assert x.ilm_score == pytest.approx(expected, abs=1e-4)
        assert x.score == pytest.approx(2.0 * x.am_score - 0.7 * expected, abs=1e-4)
    assert [x.tokens for x in fused[0]] != [x.tokens for x in plain[0]]  # the ILM term matters here


def test_the_internal_lm_needs_the_hat_joint():
    decoder = _decoder("rnnt")
    with pytest.raises(ValueError, match="needs the HAT joint"):
        transducer_beam_search(
            decoder,
            torch.randn(1, 2, D, dtype=torch.float64),
            torch.tensor([2]),
            BeamSearchOptions(ilm_weight=0.5, max_symbols=2),
        )
    model = tiny.build("transducer")
    with pytest.raises(
        ValueError, match="--ilm-weight .* needs a HAT model; this is a transducer model \\(rnnt\\)"
    ):
        beam_search(model, *tiny.batch(), BeamSearchOptions(ilm_weight=0.5))


# ---- the one-label-per-frame topology and the greedy rules ------------------------------------


@pytest.mark.parametrize("joint", ["rnnt", "hat"])
def test_monotonic_exhaustive_search_is_the_monotonic_lattice_exactly(joint):
    """Without pruning, one label per frame and no blank after an emission: every sequence of
    at most T labels, each with its one-label-per-frame lattice sum (enumerated)."""
    T = 3
    decoder = _decoder(joint, seed=5)
    h = torch.randn(1, T, D, dtype=torch.float64)
    options = BeamSearchOptions(beam=None, nbest=None, max_symbols=1)
    hyps = transducer_beam_search(decoder, h, torch.tensor([T]), options, monotonic=True)[0]
    found = {tuple(x.tokens): x.am_score for x in hyps}
    assert set(found) == set(label_sequences(V - 1, T))
    exact = {y: float(transducer_log_marginal(*_lattice(decoder, h, y), True)) for y in found}
    for y, score in found.items():
        assert score == pytest.approx(exact[y], abs=1e-9), y
    # a proper distribution over the sequences of at most T labels
    assert torch.logsumexp(torch.tensor(list(exact.values())), 0) == pytest.approx(0.0, abs=1e-9)
    assert tuple(hyps[0].tokens) == argmax_unique(exact)
    with pytest.raises(ValueError, match="at most 1 label per frame; got max_symbols=2"):
        transducer_beam_search(
            decoder, h, torch.tensor([T]), BeamSearchOptions(max_symbols=2), monotonic=True
        )


@pytest.mark.parametrize("name", ["transducer", "hat"])
def test_monotonic_beam_one_is_the_monotonic_greedy_search(name):
    model = tiny.build(name, seed=1, shift=2.0, loss_options={"topology": "monotonic"})
    assert model.max_symbols == 1
    feats, lens = tiny.batch(seed=2)
    greedy = model.greedy_decode(feats, lens)
    beam = [nbest[0].tokens for nbest in beam_search(model, feats, lens, BeamSearchOptions(beam=1))]
    assert beam == greedy
    assert any(len(y) > 2 for y in greedy)
    assert all(len(y) <= model.output_frames(int(n)) for y, n in zip(greedy, lens))


@pytest.mark.parametrize("name", tiny.TRANSDUCERS)
def test_masked_prediction_steps_give_the_same_hypotheses(name):
    """The GPU's way of stepping the prediction network (every row under a mask, no read of
    which rows) and the CPU's (the extended rows alone) find the same n-best, same scores."""
    model = tiny.build(name, seed=3, shift=2.5 if name == "hat_linear" else 1.5)
    feats, lens = tiny.batch(seed=6)
    h, h_lens = model.encoder(feats, lens)
    options = BeamSearchOptions(beam=4, nbest=3, max_symbols=2)
    results = [transducer_beam_search(model.decoder, h, h_lens, options, masked_commit=False)]

    def refuse(*args):
        raise AssertionError("masked_commit=True read the extended rows (commit)")

    model.decoder.commit = refuse
    results.append(transducer_beam_search(model.decoder, h, h_lens, options, masked_commit=True))
    for rows, masked_rows in zip(*results):
        assert [x.tokens for x in rows] == [x.tokens for x in masked_rows]
        assert [x.am_score for x in rows] == pytest.approx([x.am_score for x in masked_rows])
    assert any(len(rows[0].tokens) > 1 for rows in results[0])


# ---- the prefixes merged on the device ---------------------------------------------------------

DEVICE_CASES = {
    "beam 4, 2 labels a frame": ({"beam": 4, "nbest": 3, "max_symbols": 2}, {}),
    "beam 8, 3 labels a frame, whole beam": ({"beam": 8, "nbest": None, "max_symbols": 3}, {}),
    "beam 1": ({"beam": 1, "max_symbols": 2}, {}),
    "beam 16, alignments merged": (
        {"beam": 16, "nbest": None, "max_symbols": 2},
        {"shift": 0.0, "merges": True},
    ),
    "fusion: LM, bonus, length norm": (
        {
            "beam": 4,
            "nbest": None,
            "max_symbols": 2,
            "lm_weight": 0.6,
            "label_bonus": 0.3,
            "length_norm": True,
        },
        {"lm": True},
    ),  # fmt: skip
    "one label per frame": ({"beam": 5, "nbest": None, "max_symbols": 1}, {"monotonic": True}),
}


def _lstm_scorer():
    from cbasr.modules.language_model import LSTMLanguageModel
    from cbasr.search import NeuralLMScorer

    torch.manual_seed(11)
    tokens = ["<blk>", "a", "b", "c", "d"]  # the tiny models' vocabulary
    lm = LSTMLanguageModel(len(tokens), embed_dim=4, hidden=6, num_layers=1, dropout=0.0)
    with torch.no_grad():
        lm.out.weight.mul_(4.0)  # a peaked LM, so that fusion changes decisions
    return NeuralLMScorer(lm, tokens, tokens)


@pytest.mark.parametrize("case", list(DEVICE_CASES))
@pytest.mark.parametrize("name", tiny.TRANSDUCERS)
def test_prefixes_merged_on_the_device_give_the_host_s_hypotheses(name, case, monkeypatch):
    """Hashes, fixed-width beams, the slots of D and the traced-back labels (merge="device",
    and "graphs" as its static steps run eagerly) find the n-best of the tuples and dicts on
    the host: the same sequences in the same order (ties included: the context-1 HAT scores
    reordered label pairs alike), the same scores; with beam 16 the host merges alignments of
    a prefix (counted), and so must the device."""
    from cbasr.search import _prefix_tables as tables
    from cbasr.search import _transducer_graphs as graphs

    merges = []
    log_add = tables._log_add
    monkeypatch.setattr(tables, "_log_add", lambda a, b: merges.append(1) or log_add(a, b))
    settings, extra = DEVICE_CASES[case]
    if extra.get("monotonic") and name not in ("transducer", "hat"):
        pytest.skip("the one-label-per-frame topology: one RNN-T and one HAT suffice")
    loss_options = {"topology": "monotonic"} if extra.get("monotonic") else None
    shift = extra.get("shift", 2.5 if name == "hat_linear" else 1.5)
    model = tiny.build(name, seed=3, shift=shift, loss_options=loss_options)
    feats, lens = tiny.batch(seed=6)
    h, h_lens = model.encoder(feats, lens)
    if name.startswith("hat") and not extra:
        settings = {**settings, "ilm_weight": 0.4, "am_weight": 1.3}
    options = BeamSearchOptions(**settings)
    lm = _lstm_scorer() if extra.get("lm") else None
    monkeypatch.setattr(graphs, "CAPTURE", False)  # "graphs": the static steps, eagerly
    found = {
        merge: transducer_beam_search(
            model.decoder, h, h_lens, options, lm, monotonic=model.monotonic, merge=merge
        )
        for merge in ("host", "device", "graphs")
    }
    for host, *others in zip(found["host"], found["device"], found["graphs"]):
        for device in others:
            assert [x.tokens for x in device] == [x.tokens for x in host]
            for field in ("score", "am_score", "lm_score", "ilm_score"):
                got = [getattr(x, field) for x in device]
                expected = [getattr(x, field) for x in host]
                assert got == pytest.approx(expected, rel=1e-6, abs=1e-6), field
    assert any(len(x.tokens) > 1 for n in found["host"] for x in n)
    assert bool(merges) == extra.get("merges", bool(merges))
    if case.startswith("beam 8") and name == "hat_context1":  # equal scores, ranked alike
        scores = [x.score for x in found["host"][0]]
        assert len(set(scores)) < len(scores)


def test_device_prefixes_are_told_apart_by_their_hash():
    """The hash of every label sequence of up to 4 labels out of 4 differs (orders matter),
    and a hash that forgets the labels merges different prefixes: other hypotheses."""
    from cbasr.search import _prefix_tables as search

    seqs = [()] + [y for n in range(1, 5) for y in itertools.product(range(1, 5), repeat=n)]
    hashes = []
    for y in seqs:
        value = torch.zeros(1, dtype=torch.long)
        for v in y:
            value = search.extend_hash(value, torch.tensor([v]))
        hashes.append(int(value))
    assert hashes[0] == 0 and len(set(hashes)) == len(seqs)

    model = tiny.build("hat", seed=3, shift=0.0)
    h, h_lens = model.encoder(*tiny.batch(seed=6))
    options = BeamSearchOptions(beam=16, nbest=None, max_symbols=2)
    honest = transducer_beam_search(model.decoder, h, h_lens, options, merge="device")
    search_hash = search.extend_hash
    try:
        search.extend_hash = lambda prefix_hash, label: prefix_hash  # every prefix alike
        blind = transducer_beam_search(model.decoder, h, h_lens, options, merge="device")
    finally:
        search.extend_hash = search_hash
    assert [[x.tokens for x in n] for n in blind] != [[x.tokens for x in n] for n in honest]


def test_graphed_searches_are_kept_per_padded_shape_and_start_afresh(monkeypatch):
    """merge="graphs" (its static steps run eagerly): one search per padded batch shape and
    setting, reused by a later batch of another length in the same bucket (its frames past
    the batch's zeroed, its counter and beam reset), the oldest dropped past the limit."""
    from cbasr.search import _transducer_graphs as search

    monkeypatch.setattr(search, "CAPTURE", False)
    monkeypatch.setattr(search, "GRAPH_SHAPES", 2)
    models = [tiny.build("hat", seed=3, shift=1.5)]  # (dropped below)
    options = BeamSearchOptions(beam=4, nbest=2, max_symbols=2)
    search.clear_graphs()
    cache = search._GRAPHS

    def both(lengths, **change):
        model = models[0]
        h, h_lens = model.encoder(*tiny.batch(seed=len(lengths), lengths=lengths))
        o = dataclasses.replace(options, **change)
        return [
            [
                [x.tokens for x in n]
                for n in transducer_beam_search(model.decoder, h, h_lens, o, merge=m)
            ]
            for m in ("host", "graphs")
        ]

    for lengths in [(23, 17, 9, 4), (30, 2, 11, 8), (9, 9, 9, 9)]:
        host, graphed = both(lengths)
        assert graphed == host
    assert len(cache) == 1  # 12, 15 and 5 frames: one bucket of 64
    (found,) = cache.values()  # its static variables, the frame counter at the last batch's
    assert int(found.v["t"]) == 5 and found.h.shape[1] == 64
    del found
    host, graphed = both((23, 17, 9))
    assert graphed == host and len(cache) == 2
    host, graphed = both((23, 17, 9), beam=2)
    assert graphed == host and len(cache) == 2  # the first shape dropped
    assert all(key[0] == 3 for key in cache)
    host, graphed = both((23, 17, 9), nbest=1)  # applied after the search: the same graphs
    assert graphed == host and len(cache) == 2 and all(key[0] == 3 for key in cache)
    # the cache holds its decoders (so an id in a key is never another's) until dropped
    decoder = weakref.ref(models[0].decoder)
    models.clear()
    gc.collect()
    assert decoder() is not None
    search.clear_graphs()
    gc.collect()
    assert decoder() is None


def test_an_arpa_lm_fuses_alike_on_the_device_and_graphs_refuse_it(tmp_path, monkeypatch):
    """An ARPA LM keeps its histories on the host: merge="device" passes its states from frame
    to frame as they are (the same hypotheses and LM scores as the host merge); graphs, which
    keep tensors only, refuse it naming merge="device"."""
    from cbasr.lm.arpa import read_arpa
    from cbasr.search import ArpaLMScorer
    from cbasr.search import _transducer_graphs as search
    from tests.search.test_fusion import BIGRAM, TOKENS

    (tmp_path / "bigram.arpa").write_text(BIGRAM)
    lm = ArpaLMScorer(read_arpa(tmp_path / "bigram.arpa"), TOKENS)
    model = tiny.build("hat", seed=1, shift=1.0)
    h, h_lens = model.encoder(*tiny.batch(seed=6))
    options = BeamSearchOptions(beam=6, nbest=None, max_symbols=2, lm_weight=1.0)
    host, device = (
        transducer_beam_search(model.decoder, h, h_lens, options, lm, merge=m)
        for m in ("host", "device")
    )
    assert [[(x.tokens, round(x.lm_score, 5)) for x in n] for n in device] == [
        [(x.tokens, round(x.lm_score, 5)) for x in n] for n in host
    ]
    assert any(x.tokens for n in host for x in n)
    monkeypatch.setattr(search, "CAPTURE", False)
    with pytest.raises(ValueError, match="ArpaLMScorer keeps its histories on the host"):
        transducer_beam_search(model.decoder, h, h_lens, options, lm, merge="graphs")


def test_device_merge_needs_a_beam_and_a_known_name():
    decoder = _decoder("hat")
    h, lens = torch.randn(1, 2, D, dtype=torch.float64), torch.tensor([2])
    with pytest.raises(
        ValueError, match="merge=.graphs. replays CUDA graphs and needs a CUDA device, not cpu"
    ):
        transducer_beam_search(decoder, h, lens, BeamSearchOptions(max_symbols=2), merge="graphs")
    with pytest.raises(ValueError, match="masked_commit=False reads the extended rows"):
        transducer_beam_search(
            decoder, h, lens, BeamSearchOptions(max_symbols=2), merge="graphs", masked_commit=False
        )
    with pytest.raises(ValueError, match="merge='device' needs a beam width"):
        transducer_beam_search(
            decoder, h, lens, BeamSearchOptions(beam=None, max_symbols=2), merge="device"
        )
    with pytest.raises(ValueError, match="merge must be one of host, device, graphs, got 'gpu'"):
        transducer_beam_search(decoder, h, lens, BeamSearchOptions(max_symbols=2), merge="gpu")


@pytest.mark.gpu
@pytest.mark.parametrize("name", tiny.TRANSDUCERS)
def test_device_prefixes_on_cuda_give_the_cpu_s_hypotheses(name, device):
    """On CUDA (int64 hashes wrapping on the GPU's arithmetic, its sort and scatter), the
    three merges find what the host merge finds on the CPU, the frames replayed from CUDA
    graphs included (captured on the first call, replayed on the second)."""
    model = tiny.build(name, seed=3, shift=0.0)
    h, h_lens = model.encoder(*tiny.batch(seed=6))
    options = BeamSearchOptions(beam=16, nbest=4, max_symbols=2)
    expected = transducer_beam_search(model.decoder, h, h_lens, options, merge="host")
    model.to(device)
    for merge in ("host", "device", "graphs", "graphs"):  # graphs: captured, then replayed
        found = transducer_beam_search(
            model.decoder, h.to(device), h_lens.to(device), options, merge=merge
        )
        assert [[x.tokens for x in n] for n in found] == [[x.tokens for x in n] for n in expected]
        for n, m in zip(found, expected):
            assert [x.score for x in n] == pytest.approx([x.score for x in m], abs=1e-4)
