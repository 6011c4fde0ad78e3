"""The TDT loss against enumeration of every (token, duration) path, with gradients."""

import math

import pytest
import torch

from cbasr.losses.tdt import check_durations, tdt_nll


def _enumerate(tokens, durations_lp, targets, T, U, durations, sigma=0.0) -> float:
    """``log P(y | x)`` by walking every path from ``(0, 0)``: one node at a time, each edge a
    (token, duration) pair; a path is complete when a blank lands exactly on frame ``T`` with
    all ``U`` labels emitted, and dead when an edge leaves the frames."""
    total = []

    def walk(t, u, score):
        for k, d in enumerate(durations):
            step = float(durations_lp[t, u, k])
            if d > 0:  # blank
                weight = score + float(tokens[t, u, 0]) - sigma + step
                if t + d == T and u == U:
                    total.append(weight)
                elif t + d < T:
                    walk(t + d, u, weight)
            if u < U and t + d < T:  # label y_{u+1}
                walk(t + d, u + 1, score + float(tokens[t, u, targets[u]]) - sigma + step)

    walk(0, 0, 0.0)
    if not total:
        return -math.inf
    top = max(total)
    return top + math.log(sum(math.exp(s - top) for s in total))


def _random(B, T, U, V, D, seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64).log_softmax(-1)
    durs = torch.randn(B, T, U + 1, D, generator=g, dtype=torch.float64).log_softmax(-1)
    targets = torch.randint(1, V, (B, U), generator=g)
    return tokens, durs, targets


@pytest.mark.parametrize("durations", [(0, 1, 2, 3, 4), (1,), (0, 1), (1, 2), (0, 1, 3), (1, 2, 5)])
@pytest.mark.parametrize("sigma", [0.0, 0.05])
def test_matches_enumeration_of_every_path(durations, sigma):
    B, T, U, V = 3, 6, 3, 4
    tokens, durs, targets = _random(B, T, U, V, len(durations), seed=len(durations))
    frames = torch.tensor([6, 4, 5])
    labels = torch.tensor([3, 2, 0])
    nll = tdt_nll(tokens, durs, targets, frames, labels, durations, sigma)
    for b in range(B):
        T_b, U_b = int(frames[b]), int(labels[b])
        expected = _enumerate(tokens[b], durs[b], targets[b].tolist(), T_b, U_b, durations, sigma)
        assert nll[b].item() == pytest.approx(-expected, rel=1e-10, abs=1e-10), (b, durations)


def test_no_path_is_infinite_not_nan():
    """Without duration 0, three labels cannot come from two frames (one blank must end)."""
    tokens, durs, targets = _random(1, 2, 3, 4, 2, seed=0)
    nll = tdt_nll(tokens, durs, targets, torch.tensor([2]), torch.tensor([3]), (1, 2))
    assert nll.item() > 1e29  # the unreachable floor, not nan


def test_gradients_by_gradcheck():
    tokens, durs, targets = _random(2, 5, 2, 3, 3, seed=3)
    tokens.requires_grad_(True)
    durs.requires_grad_(True)
    frames, labels = torch.tensor([5, 3]), torch.tensor([2, 1])

    def loss(x, y):
        return tdt_nll(x, y, targets, frames, labels, (0, 1, 2), 0.05)

    assert torch.autograd.gradcheck(loss, (tokens, durs))


def test_padding_and_batch_do_not_change_an_utterance():
    tokens, durs, targets = _random(2, 7, 4, 5, 3, seed=5)
    frames, labels = torch.tensor([7, 4]), torch.tensor([4, 2])
    both = tdt_nll(tokens, durs, targets, frames, labels, (0, 1, 2))
    alone = tdt_nll(
        tokens[1:, :4, :3], durs[1:, :4, :3], targets[1:, :2], frames[1:], labels[1:], (0, 1, 2)
    )
    assert both[1].item() == pytest.approx(alone.item(), rel=1e-12)


def test_nemo_fixed_case():
    """NeMo's hand-computed case (test_rnnt_pytorch.py, test_case_fixed_case_act_label): T = 3,
    one label, durations 0-2, sigma 0.05, all logits 0 over V = 4 tokens: cost 4.155739. A
    path that could end on a label instead of a blank would give another number."""
    tokens = torch.zeros(1, 3, 2, 4, dtype=torch.float64).log_softmax(-1)
    durs = torch.zeros(1, 3, 2, 3, dtype=torch.float64).log_softmax(-1)
    one = (torch.tensor([[1]]), torch.tensor([3]), torch.tensor([1]))
    nll = tdt_nll(tokens, durs, *one, (0, 1, 2), 0.05)
    assert nll.item() == pytest.approx(4.155739, abs=1e-6)


@pytest.mark.parametrize("durations", [(), (0, 2), (2, 1), (1, 1), (-1, 1), (0.5, 1), (True, 1)])
def test_bad_durations_are_refused(durations):
    with pytest.raises(ValueError, match="durations"):
        check_durations(durations)


def test_bad_shapes_and_labels_are_named():
    tokens, durs, targets = _random(1, 4, 2, 3, 2, seed=1)
    lengths = (torch.tensor([4]), torch.tensor([2]))
    with pytest.raises(ValueError, match="duration_log_probs"):
        tdt_nll(tokens, durs, targets, *lengths, (0, 1, 2))
    with pytest.raises(ValueError, match="targets"):
        tdt_nll(tokens, durs, torch.tensor([[1, 3]]), *lengths, (0, 1))
    with pytest.raises(ValueError, match="logit_lengths"):
        tdt_nll(tokens, durs, targets, torch.tensor([5]), lengths[1], (0, 1))
    with pytest.raises(ValueError, match="logit_lengths"):
        tdt_nll(tokens, durs, targets, torch.tensor([0]), lengths[1], (0, 1))
    with pytest.raises(ValueError, match="target_lengths"):
        tdt_nll(tokens, durs, targets, lengths[0], torch.tensor([3]), (0, 1))
    with pytest.raises(ValueError, match="token_log_probs must have shape"):
        tdt_nll(tokens[0], durs, targets, *lengths, (0, 1))
    with pytest.raises(ValueError, match="targets must have shape"):
        tdt_nll(tokens, durs, targets[:, :1], *lengths, (0, 1))
    with pytest.raises(ValueError, match="token_log_probs must be a floating"):
        tdt_nll(tokens.long(), durs, targets, *lengths, (0, 1))


@pytest.mark.parametrize("pad", [-1, 0, 3, 99])
def test_padding_labels_of_any_value_are_ignored(pad):
    tokens, durs, targets = _random(1, 4, 2, 3, 2, seed=2)
    lengths = (torch.tensor([4]), torch.tensor([1]))
    padded = torch.tensor([[int(targets[0, 0]), pad]])
    torch.testing.assert_close(
        tdt_nll(tokens, durs, padded, *lengths, (0, 1)),
        tdt_nll(tokens[:, :, :2], durs[:, :, :2], targets[:, :1], *lengths, (0, 1)),
    )
