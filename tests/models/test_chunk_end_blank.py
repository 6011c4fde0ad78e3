"""loss.chunk_end_blank: the streaming loss without label edges on the last frames of every
attention chunk but an utterance's last, against a lattice sum in float64 over the search's
step-wise scores."""

import pytest
import torch

from tests.models.test_dual_mode import CHUNKED, TARGET_LENS, TARGETS, _batch, _model
from tests.models.test_dual_mode import _oracle_three_way as oracle_edges
from tests.search import tiny


def _no_dropout(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def _oracle_nll(edges, T: int, U: int, barred: set[int], earliest=()) -> float:
    """``-log`` of the summed paths of the standard lattice over ``edges (T, U + 1, 3)`` (log
    blank, log next label, log rest), no label edge on the frames ``barred``, nor label ``u``'s
    (0-based) on the frames before ``earliest[u]`` where given."""
    alpha = torch.full((T, U + 1), float("-inf"), dtype=torch.float64)
    for t in range(T):
        for u in range(U + 1):
            terms = [torch.tensor(0.0, dtype=torch.float64)] if t == u == 0 else []
            if t > 0:
                terms.append(alpha[t - 1, u] + edges[t - 1, u, 0])
            early = 0 < u <= len(earliest) and t < earliest[u - 1]
            if u > 0 and t not in barred and not early:
                terms.append(alpha[t, u - 1] + edges[t, u - 1, 1])
            if terms:
                alpha[t, u] = torch.stack(terms).logsumexp(0)
    return -float(alpha[T - 1, U] + edges[T - 1, U, 0])


def test_the_barred_frames_are_each_chunks_last_but_the_utterances_last_chunks():
    model = _model("hat", chunk_end_blank=1).train()  # chunks of 3 encoder frames
    lens = torch.tensor([12, 9, 5, 2])
    got = model.barred_frames(12, lens)
    want = [[2, 5, 8], [2, 5], [2], []]
    assert [row.nonzero().flatten().tolist() for row in got] == want
    model.chunk_end_blank = 2
    got = model.barred_frames(12, lens)
    assert [row.nonzero().flatten().tolist() for row in got] == [
        [1, 2, 4, 5, 7, 8],
        [1, 2, 4, 5],
        [1, 2],
        [],
    ]
    assert model.eval().barred_frames(12, lens) is None
    assert _model("hat").train().barred_frames(12, lens) is None  # off by default


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize(  # with prune_range, too, the barred loss is the whole lattice's
    ("decoder", "prune"), [("hat", 0), ("hat", 2), ("hat_linear", 0)]
)
def test_the_streaming_loss_sums_the_paths_without_label_edges_at_chunk_ends(decoder, prune, dual):
    """In training, the NLL (the streaming mode's, with ``dual_mode``) is the lattice sum with
    no label edge on the barred frames; the full-context mode and evaluation keep them."""
    model = _no_dropout(_model(decoder, chunk_end_blank=1, prune_range=prune, dual_mode=dual))
    feats, lens = _batch()
    out = model.train().loss(feats, lens, TARGETS, TARGET_LENS)
    with torch.no_grad():
        h, out_lens = model.encoder(feats, lens)
        edges = oracle_edges(model, h, TARGETS, TARGET_LENS)
    barred = [{2, 5, 8}, {2, 5}, {2}, set()]
    assert out_lens.tolist() == [12, 9, 5, 2]
    for b in range(4):
        T, U = int(out_lens[b]), int(TARGET_LENS[b])
        want = _oracle_nll(edges[b], T, U, barred[b])
        assert float(out.nll[b]) == pytest.approx(want, rel=1e-6)
        if barred[b]:  # the bar removes paths the whole lattice has
            assert want > _oracle_nll(edges[b], T, U, set()) + 1e-6
    if dual:  # the full-context mode's loss keeps its label edges
        with torch.no_grad(), model.encoder.full_context():
            full, _ = model.encoder(feats, lens)
            teacher = oracle_edges(model, full, TARGETS, TARGET_LENS)
        whole = [
            _oracle_nll(teacher[b], int(out_lens[b]), int(TARGET_LENS[b]), set()) for b in range(4)
        ]
        if prune:  # the full-context mode's pruned loss: an upper bound of the exact NLL
            assert out.stats["full_context_loss"] > sum(whole) / 7
        else:
            assert out.stats["full_context_loss"] == pytest.approx(sum(whole) / 7, rel=1e-6)
    assert_evaluation_keeps_every_edge(model, feats, lens)


def assert_evaluation_keeps_every_edge(model, feats, lens, **inputs):
    """In evaluation the loss is the whole lattice's (and BatchNorm's running statistics)."""
    with torch.no_grad():
        evaluated = model.eval().loss(feats, lens, TARGETS, TARGET_LENS, **inputs)
        h, out_lens = model.encoder(feats, lens)
        edges = oracle_edges(model, h, TARGETS, TARGET_LENS)
    for b in range(4):
        T, U = int(out_lens[b]), int(TARGET_LENS[b])
        assert float(evaluated.nll[b]) == pytest.approx(
            _oracle_nll(edges[b], T, U, set()), rel=1e-6
        )


def test_chunk_end_blank_options_are_checked_and_named():
    with pytest.raises(ValueError, match="0 < chunk_end_blank < encoder.chunk_size"):
        _model("hat", chunk_end_blank=3)
    with pytest.raises(ValueError, match="chunk_size 0"):
        _model("hat", encoder={**CHUNKED, "chunk_size": 0}, chunk_end_blank=1)
    with pytest.raises(ValueError, match="got 1, chunk_size 0, dynamic_chunks None"):
        _model("hat", encoder=tiny.ENCODER, chunk_end_blank=1)
    with pytest.raises(ValueError, match="dynamic_chunks 4"):
        _model("hat", encoder={**CHUNKED, "dynamic_chunks": 4}, chunk_end_blank=1)
    with pytest.raises(ValueError, match="topology 'monotonic'"):
        _model("hat", chunk_end_blank=1, topology="monotonic")
    with pytest.raises(ValueError, match="got loss 'rnnt'"):
        _model("transducer", chunk_end_blank=1)
