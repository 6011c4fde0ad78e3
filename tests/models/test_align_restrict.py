"""loss.align_restrict_left: in training, no label edge before the frame of the label's gold
end minus the buffer, against a lattice sum in float64 over the search's step-wise scores."""

import math

import pytest
import torch

from cbasr.data.dataset import collate
from cbasr.models.base import subsampling_stride
from cbasr.training.asr_task import asr_trainer
from tests.models.test_dual_mode import TARGET_LENS, TARGETS, _batch, _model
from tests.models.test_dual_mode import _oracle_three_way as oracle_edges
from tests.search import tiny
from tests.training.test_trainer import make_cfg

# each label's gold end frame, -1 unknown; utterance lengths 12, 9, 5, 2 encoder frames
ENDS = torch.tensor([[3, 6, 11], [4, -1, 0], [7, 0, 0], [5, 0, 0]])
LENS = torch.tensor([12, 9, 5, 2])


def _earliest(left: int) -> list[list[int]]:
    """Each label's first frame with an edge: its end minus ``left``, at most the last frame;
    0 for an unknown end."""
    return [
        [0 if e < 0 else min(int(e) - left, int(n) - 1) for e in ends[:u]]
        for ends, u, n in zip(ENDS, TARGET_LENS, LENS)
    ]


def _no_dropout(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def _oracle_nll(edges, T: int, U: int, earliest=()) -> float:
    """``-log`` of the summed paths of the standard lattice over ``edges (T, U + 1, 3)`` (log
    blank, log next label, log rest), no edge of label ``u`` (0-based) on the frames before
    ``earliest[u]`` where given."""
    alpha = torch.full((T, U + 1), float("-inf"), dtype=torch.float64)
    for t in range(T):
        for u in range(U + 1):
            terms = [torch.tensor(0.0, dtype=torch.float64)] if t == u == 0 else []
            if t > 0:
                terms.append(alpha[t - 1, u] + edges[t - 1, u, 0])
            early = 0 < u <= len(earliest) and t < earliest[u - 1]
            if u > 0 and not early:
                terms.append(alpha[t, u - 1] + edges[t, u - 1, 1])
            if terms:
                alpha[t, u] = torch.stack(terms).logsumexp(0)
    return -float(alpha[T - 1, U] + edges[T - 1, U, 0])


def assert_evaluation_keeps_every_edge(model, feats, lens, **inputs):
    """In evaluation the loss is the whole lattice's (and BatchNorm's running statistics)."""
    with torch.no_grad():
        evaluated = model.eval().loss(feats, lens, TARGETS, TARGET_LENS, **inputs)
        h, out_lens = model.encoder(feats, lens)
        edges = oracle_edges(model, h, TARGETS, TARGET_LENS)
    for b in range(4):
        T, U = int(out_lens[b]), int(TARGET_LENS[b])
        assert float(evaluated.nll[b]) == pytest.approx(_oracle_nll(edges[b], T, U), rel=1e-6)


def test_the_barred_edges_are_the_frames_before_each_labels_end_minus_the_buffer():
    model = _model("hat", align_restrict_left=1).train()
    got = model.barred_edges(12, LENS, ENDS)
    assert got.shape == (4, 12, 4)
    for b, first in enumerate(_earliest(1)):
        for u in range(4):  # node u's label edge emits label u; column U has none
            frames = got[b, :, u].nonzero().flatten().tolist()
            assert frames == list(range(first[u] if u < len(first) else 0)), (b, u)
    assert got[1, :, 1].sum() == 0  # an unknown end bars nothing
    assert got[3, :, 0].nonzero().flatten().tolist() == [0]  # end 5 - 1 clamped to frame 1
    assert model.barred_edges(12, LENS) is None  # no ends given
    assert model.eval().barred_edges(12, LENS, ENDS) is None
    assert _model("hat").train().barred_edges(12, LENS, ENDS) is None  # off by default
    assert not _model("hat").needs_label_ends and model.needs_label_ends


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize(("decoder", "prune"), [("hat", 0), ("hat", 2), ("hat_linear", 0)])
@pytest.mark.parametrize("left", [0, 2])
def test_the_training_loss_sums_the_paths_that_emit_no_label_before_its_bound(
    decoder, prune, dual, left
):
    """In training, the NLL (the streaming mode's, with ``dual_mode``) is the lattice sum with
    no edge of label ``u`` before its bound; the full-context mode, evaluation, and training
    without the ends keep every edge."""
    options = {"align_restrict_left": left}
    model = _no_dropout(_model(decoder, prune_range=prune, dual_mode=dual, **options))
    feats, lens = _batch()
    out = model.train().loss(feats, lens, TARGETS, TARGET_LENS, label_ends=ENDS)
    plain = model.loss(feats, lens, TARGETS, TARGET_LENS)
    with torch.no_grad():
        h, out_lens = model.encoder(feats, lens)
        edges = oracle_edges(model, h, TARGETS, TARGET_LENS)
    assert out_lens.tolist() == LENS.tolist()
    for b, first in enumerate(_earliest(left)):
        T, U = int(LENS[b]), int(TARGET_LENS[b])
        want = _oracle_nll(edges[b], T, U, first)
        whole = _oracle_nll(edges[b], T, U)
        assert float(out.nll[b]) == pytest.approx(want, rel=1e-6)
        assert want > whole + 1e-6  # every utterance here has a label bounded past frame 0
        if not prune:
            assert float(plain.nll[b]) == pytest.approx(whole, rel=1e-6)
    if dual:  # the full-context mode's loss keeps its label edges
        with torch.no_grad(), model.encoder.full_context():
            full, _ = model.encoder(feats, lens)
            teacher = oracle_edges(model, full, TARGETS, TARGET_LENS)
        whole = [_oracle_nll(teacher[b], int(LENS[b]), int(TARGET_LENS[b])) for b in range(4)]
        if prune:  # the full-context mode's pruned loss: an upper bound of the exact NLL
            assert out.stats["full_context_loss"] > sum(whole) / 7
        else:
            assert out.stats["full_context_loss"] == pytest.approx(sum(whole) / 7, rel=1e-6)
    assert_evaluation_keeps_every_edge(model, feats, lens, label_ends=ENDS)


def test_a_full_context_model_is_bounded_too_and_forward_passes_the_ends():
    model = _no_dropout(_model("hat", encoder=tiny.ENCODER, align_restrict_left=0)).train()
    feats, lens = _batch()
    out = model(feats, lens, TARGETS, TARGET_LENS, label_ends=ENDS)
    with torch.no_grad():
        h, out_lens = model.encoder(feats, lens)
        edges = oracle_edges(model, h, TARGETS, TARGET_LENS)
    for b in range(4):
        T, U = int(out_lens[b]), int(TARGET_LENS[b])
        first = [min(int(e), T - 1) for e in ENDS[b, :U]]
        assert float(out.nll[b]) == pytest.approx(_oracle_nll(edges[b], T, U, first), rel=1e-6)


def test_align_restrict_left_options_are_checked_and_named():
    with pytest.raises(ValueError, match="loss.align_restrict_left applies.*topology 'monotonic'"):
        _model("hat", align_restrict_left=0, topology="monotonic")
    with pytest.raises(ValueError, match="loss.align_restrict_left applies.*got loss 'rnnt'"):
        _model("transducer", align_restrict_left=0)


@pytest.mark.parametrize("features", ["cached", "on_the_fly"])
def test_training_gives_the_model_each_labels_gold_end_frame(
    tone_data, tmp_path, monkeypatch, features
):
    """The task reads the training manifest's phone times (not the validation split's) and
    hands the model the encoder frame of each label's end, features cached or computed."""
    overrides = ["decoder=hat", "loss=hat", "loss.align_restrict_left=1"]
    overrides.append(f"data.features={features}")
    trainer = asr_trainer(make_cfg(tone_data, tmp_path, *overrides), tmp_path)
    task, model = trainer.task, trainer.model
    assert task.valid_set.label_ends is None and task.train_set.label_ends is not None
    period = 3 * 0.010  # the default encoder stacks 3 frames of 10 ms
    assert subsampling_stride(model) == 3 and task.frame_period == pytest.approx(period)
    seen, loss = {}, model.loss

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return loss(*args, **kwargs)

    monkeypatch.setattr(model, "loss", spy)
    batch = collate([task.train_set[0], task.train_set[1]])
    assert task.forward(model, batch).loss.isfinite().all()
    record = task.train_set.records[0]
    second = math.ceil(record["phone_starts"][2] / period) - 1  # the 2nd label's end frame
    assert seen["label_ends"][0, 1] == second
    assert torch.equal(seen["label_ends"], batch.label_end_frames(period))


def test_a_negative_align_restrict_left_fails_when_the_config_is_composed():
    """A negative buffer (a lag after the gold end) is refused by the schema, naming the
    option: the composed config as cbasr-train types it, and a plain one (a checkpoint's)."""
    from hydra import compose, initialize_config_dir

    from cbasr.builder import group_config
    from cbasr.config import CONF_DIR, to_typed
    from cbasr.config.schema import register_configs

    register_configs()
    overrides = ["exp_dir=x", "decoder=hat", "loss=hat", "loss.align_restrict_left=-1"]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    refused = r"loss.align_restrict_left must be >= 0 \(null: off\), got -1"
    with pytest.raises(ValueError, match=refused):
        to_typed(cfg)
    with pytest.raises(ValueError, match=refused.replace("-1", "-2")):
        group_config("loss", {"name": "hat", "align_restrict_left": -2})
    assert group_config("loss", {"name": "hat", "align_restrict_left": 0}).align_restrict_left == 0
    assert group_config("loss", {"name": "hat"}).align_restrict_left is None
