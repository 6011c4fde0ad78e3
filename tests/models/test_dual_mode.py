"""Dual-mode training of a transducer over a chunked Conformer (loss.dual_mode) and its in-place
distillation (loss.distill_weight), against the search's step-wise scores as the oracle."""

import pytest
import torch

from cbasr import builder
from tests.inference.test_streaming import CHUNKED as STREAMING_CHUNKED
from tests.search import tiny

# test_streaming's chunked Conformer with 1 chunk of left context, chunk-wise convolutions
CHUNKED = {**STREAMING_CHUNKED, "left_chunks": 1, "chunk_conv": "chunk"}
TARGETS = torch.tensor([[1, 2, 2], [3, 1, 0], [4, 0, 0], [2, 0, 0]])
TARGET_LENS = torch.tensor([3, 2, 1, 1])
LOSS = {"transducer": "rnnt", "hat": "hat", "hat_linear": "hat"}


def _model(decoder, encoder=CHUNKED, **options):
    torch.manual_seed(4)
    loss = {"name": LOSS[decoder], **options}
    model = builder.build_model(encoder, tiny.DECODERS[decoder], loss, tiny.FEATS, tiny.VOCAB)
    return model.double()


def _batch():
    feats, lens = tiny.batch(seed=3)
    return feats.double(), lens


@pytest.mark.parametrize("prune", [0, 2])
@pytest.mark.parametrize("decoder", ["transducer", "hat"])
def test_dual_mode_adds_the_full_context_loss_in_training_only(decoder, prune):
    """Training: the streaming loss plus the same model's loss with the full-context encoder
    (the same weights); the reported NLL is the streaming one's; evaluation: the streaming
    loss alone."""
    dual = _model(decoder, dual_mode=True, prune_range=prune).train()
    feats, lens = _batch()
    torch.manual_seed(0)  # the decoder's dropout: the same draws, in the same order
    out = dual.loss(feats, lens, TARGETS, TARGET_LENS)
    dual.dual_mode = False
    torch.manual_seed(0)
    stream = dual.loss(feats, lens, TARGETS, TARGET_LENS)
    with dual.encoder.full_context():
        full = dual.loss(feats, lens, TARGETS, TARGET_LENS)
    torch.testing.assert_close(out.loss, stream.loss + full.loss)
    torch.testing.assert_close(out.nll, stream.nll)
    assert out.stats["full_context_loss"] == pytest.approx(float(full.nll.sum()) / 7)
    assert not torch.allclose(full.nll, stream.nll)  # the modes differ: chunks of 3 frames
    dual.eval()
    with torch.no_grad():
        alone = dual.loss(feats, lens, TARGETS, TARGET_LENS)
        dual.dual_mode = True
        evaluated = dual.loss(feats, lens, TARGETS, TARGET_LENS)
    torch.testing.assert_close(evaluated.loss, alone.loss)
    torch.testing.assert_close(evaluated.nll, alone.nll)
    assert "full_context_loss" not in evaluated.stats


def _oracle_three_way(model, h, targets, target_lens):
    """Per node ``(t, u)``: log P(blank), log P(y_{u+1}) and log P(the rest), from the
    search's step-wise scores (the prediction network run label by label)."""
    B, T = h.shape[:2]
    out = torch.full((B, T, targets.shape[1] + 1, 3), float("nan"), dtype=h.dtype)
    dec = model.decoder
    for b in range(B):
        U = int(target_lens[b])
        state = dec.begin(h[b : b + 1], torch.tensor([T]))
        for u in range(U + 1):
            label = int(targets[b, u]) if u < U else 1
            for t in range(T):
                blank, labels = dec.frame_scores(state, t)
                y = labels[0, label - 1]
                rest = torch.cat([labels[0, : label - 1], labels[0, label:]]).logsumexp(0)
                out[b, t, u] = torch.stack([blank[0], y, rest])
            if u < U:
                state = dec.commit(state, torch.tensor([True]), targets[b, u : u + 1])
    return out


@pytest.mark.parametrize("empty", [False, True])  # the third utterance without labels
@pytest.mark.parametrize("decoder", ["transducer", "hat", "hat_linear"])
def test_the_distillation_is_the_kl_of_the_three_way_distributions(decoder, empty):
    """The distillation term, per utterance: the mean over the valid nodes of KL(full ||
    streaming) between the (blank, next label, rest) distributions, times the labels (at least
    one: an utterance without labels still has its blanks); the distributions equal the
    search's step-wise scores; no gradient reaches the teacher."""
    model = _model(decoder, dual_mode=True, distill_weight=0.5).eval()
    feats, lens = _batch()
    student, out_lens = model.encoder(feats, lens)
    with model.encoder.full_context():
        teacher, _ = model.encoder(feats, lens)
    teacher.requires_grad_(True)
    targets, target_lens = TARGETS.clone(), TARGET_LENS.clone()
    if empty:
        targets[2], target_lens[2] = 0, 0
    kd = model.distillation(teacher, student, out_lens, targets, target_lens)
    p = _oracle_three_way(model, teacher.detach(), targets, target_lens)
    q = _oracle_three_way(model, student.detach(), targets, target_lens)
    for b in range(4):
        T, U = int(out_lens[b]), int(target_lens[b])
        pb, qb = p[b, :T, : U + 1], q[b, :T, : U + 1]
        torch.testing.assert_close(pb.logsumexp(-1), torch.zeros(T, U + 1, dtype=pb.dtype))
        kl = (pb.exp() * (pb - qb)).sum(-1)
        want = kl.sum() / (T * (U + 1)) * max(U, 1)
        assert float(kd[b]) == pytest.approx(float(want), rel=1e-9, abs=1e-12)
    # utterances of more than one chunk differ between the modes; one of 2 frames does not
    assert out_lens.tolist() == [12, 9, 5, 2] and float(kd[:3].min()) > 0
    assert abs(float(kd[3])) < 1e-12
    kd.sum().backward()
    assert teacher.grad is None or teacher.grad.abs().max() == 0
    same = model.distillation(student, student, out_lens, targets, target_lens)
    assert same.abs().max() < 1e-12


def test_the_distillation_is_added_with_its_weight_and_trains_the_streaming_side():
    feats, lens = _batch()
    torch.manual_seed(0)
    plain = _model("hat", dual_mode=True).train()
    weighted = _model("hat", dual_mode=True, distill_weight=0.5).train()
    weighted.load_state_dict(plain.state_dict())
    for model in (plain, weighted):  # no dropout: the term recomputed below draws nothing
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    torch.manual_seed(0)
    base = plain.loss(feats, lens, TARGETS, TARGET_LENS)
    torch.manual_seed(0)
    out = weighted.loss(feats, lens, TARGETS, TARGET_LENS)
    student, out_lens = weighted.encoder(feats, lens)
    with weighted.encoder.full_context():
        teacher, _ = weighted.encoder(feats, lens)
    kd = weighted.distillation(teacher, student, out_lens, TARGETS, TARGET_LENS)
    torch.testing.assert_close(out.loss, base.loss + 0.5 * kd)
    assert out.stats["distill"] == pytest.approx(float(kd.sum()) / 7)
    out.loss.sum().backward()
    assert weighted.encoder.proj[0].weight.grad.abs().sum() > 0


def test_dual_mode_options_are_checked_and_named():
    with pytest.raises(ValueError, match="distill_weight must be >= 0"):
        _model("hat", dual_mode=True, distill_weight=-1.0)
    with pytest.raises(ValueError, match="distill_weight needs dual_mode"):
        _model("hat", distill_weight=0.5)
    with pytest.raises(ValueError, match="dual_mode needs a chunked Conformer"):
        _model("hat", encoder=tiny.ENCODER, dual_mode=True)
    with pytest.raises(ValueError, match="chunk_size 0"):
        _model("hat", encoder={**CHUNKED, "chunk_size": 0}, dual_mode=True)


def test_the_full_context_pass_reads_no_value_the_chunked_pass_checked(reads):
    """With the pruned loss, the second pass's simple loss takes the first pass's checks of the
    same targets and lengths: the dual-mode loss reads its values once; with barred edges
    (align_restrict_left: the first pass on the whole lattice) the second checks its own."""
    dual = _model("hat", dual_mode=True, prune_range=2).train()
    feats, lens = _batch()
    out = dual.loss(feats, lens, TARGETS, TARGET_LENS)
    assert reads[0] == 1 and out.loss.isfinite().all()
    crowded = TARGETS.clone()  # 3 labels in the last utterance's 2 frames: no windows
    crowded[3] = torch.tensor([2, 1, 1])
    with pytest.raises(ValueError, match="prune_range"):
        dual.loss(feats, lens, crowded, torch.tensor([3, 2, 1, 3]))
