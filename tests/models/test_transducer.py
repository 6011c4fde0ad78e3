"""TransducerModel's auxiliary CTC loss (loss.ctc_weight) and its topologies' utterance checks."""

import pytest
import torch

from cbasr.losses import ctc_nll
from tests.search import tiny


@pytest.mark.parametrize("name", ["transducer", "hat"])
def test_the_auxiliary_ctc_loss_is_added_in_training_only(name):
    """Training: the transducer's loss plus ctc_weight times CTC on the encoder's own head,
    whose parameters get gradients; evaluation: the transducer's loss alone."""
    feats, lens = tiny.batch(seed=3)
    targets = torch.tensor([[1, 2, 2], [3, 1, 0], [4, 0, 0], [2, 0, 0]])
    target_lens = torch.tensor([3, 2, 1, 1])
    plain = tiny.build(name, seed=2)
    aided = tiny.build(name, seed=2, loss_options={"ctc_weight": 0.3})
    aided.load_state_dict({**plain.state_dict(), **aided.ctc_head.state_dict(prefix="ctc_head.")})
    plain.train(), aided.train()
    torch.manual_seed(0)  # the same dropout draws in both
    base = plain.loss(feats, lens, targets, target_lens)
    torch.manual_seed(0)
    out = aided.loss(feats, lens, targets, target_lens)
    h, h_lens = aided.encoder(feats, lens)
    ctc = ctc_nll(aided.ctc_head(h).log_softmax(-1), targets, h_lens, target_lens)
    torch.testing.assert_close(out.loss, base.loss + 0.3 * ctc)
    torch.testing.assert_close(out.nll, base.nll)
    assert out.stats["ctc_loss"] == pytest.approx(float(ctc.detach().sum()) / 7)
    out.loss.sum().backward()
    assert aided.ctc_head.weight.grad.abs().sum() > 0
    aided.eval()
    with torch.no_grad():
        evaluated = aided.loss(feats, lens, targets, target_lens)
    torch.testing.assert_close(evaluated.loss, evaluated.nll)
    assert "ctc_loss" not in evaluated.stats
    assert not hasattr(plain, "ctc_head")
    with pytest.raises(ValueError, match="ctc_weight must be >= 0"):
        tiny.build(name, loss_options={"ctc_weight": -1.0})


def test_utterance_checks_name_the_topology_and_the_ctc_alignment():
    """Monotonic: at most one label per encoder frame; CTC: a frame per label and per repeat."""
    mono = tiny.build("hat", loss_options={"topology": "monotonic"})
    aided = tiny.build("hat", loss_options={"ctc_weight": 0.5})
    frames = 2 * 3  # 3 encoder frames after the tiny encoder's subsampling by 2
    assert mono.output_frames(frames) == 3
    assert mono.check_utterance(frames, [1, 2, 3]) is None
    assert "one-label-per-frame" in mono.check_utterance(frames, [1, 2, 3, 4])
    assert aided.check_utterance(frames, [1, 2, 3]) is None
    assert "auxiliary CTC" in aided.check_utterance(frames, [1, 2, 2])
    assert tiny.build("hat").check_utterance(frames, [1, 2, 2, 2, 2]) is None


@pytest.mark.parametrize(
    "name,loss_options,history",
    [
        ("transducer", {}, {"history_noise": 0.5}),
        ("hat", {"topology": "monotonic"}, {"history_noise": 0.5}),
        ("hat", {"prune_range": 2}, {"history_noise": 0.5}),
        ("transducer", {}, {"history_repeat": 0.5}),
        ("hat", {"prune_range": 2}, {"history_repeat": 0.5}),
    ],
)
def test_history_noise_changes_what_the_joint_reads_not_what_is_scored(name, loss_options, history):
    """decoder.history_noise and history_repeat: in training the prediction network reads
    changed labels, and the loss is the true labels' loss under that history (the lattice and
    the pruned loss alike); in evaluation the history is the true one."""
    feats, lens = tiny.batch(seed=3)
    targets = torch.tensor([[1, 2, 3], [3, 1, 0], [4, 0, 0], [2, 0, 0]])
    target_lens = torch.tensor([3, 2, 1, 1])
    options = {**history, "dropout": 0.0}
    model = tiny.build(name, seed=2, loss_options=loss_options, decoder_options=options)
    clean = tiny.build(name, seed=2, loss_options=loss_options, decoder_options={"dropout": 0.0})
    read = []
    model.decoder.prediction.register_forward_pre_hook(lambda _, args: read.append(args[0]))

    model.train()
    torch.manual_seed(0)
    noisy = model.loss(feats, lens, targets, target_lens).loss
    (history,) = read
    assert history.shape == targets.shape
    assert bool((history != targets).any())
    valid = torch.arange(3) < target_lens[:, None]
    assert int(history[valid].min()) >= 1 and int(history.max()) < tiny.VOCAB
    # the same loss, computed without noise, from the history the joint read
    clean.train()
    hook = clean.decoder.prediction.register_forward_pre_hook(lambda *_: (history,))
    torch.testing.assert_close(clean.loss(feats, lens, targets, target_lens).loss, noisy)

    model.eval()
    with torch.no_grad():
        evaluated = model.loss(feats, lens, targets, target_lens).loss
    torch.testing.assert_close(read[-1], targets)
    hook.remove()
    clean.eval()
    with torch.no_grad():
        torch.testing.assert_close(evaluated, clean.loss(feats, lens, targets, target_lens).loss)
