import pytest
import torch

from cbasr.modules.label_context import START, LabelContext


@pytest.mark.parametrize("context", [-1, 0, 1, 2, 4])
def test_step_by_step_equals_teacher_forced(context):
    torch.manual_seed(0)
    net = LabelContext(
        vocab_size=7, embed_dim=5, hidden=6, num_layers=2 if context == -1 else 1, context=context
    ).eval()
    targets = torch.randint(1, 7, (3, 5))
    forced = net(targets)  # (3, 6, 6)
    assert forced.shape == (3, 6, 6)
    state = net.initial_state(3)
    g, state = net.step(torch.full((3,), START), state)
    steps = [g]
    for u in range(5):
        g, state = net.step(targets[:, u], state)
        steps.append(g)
    torch.testing.assert_close(torch.stack(steps, dim=1), forced)


@pytest.mark.parametrize("context", [-1, 1, 2])
def test_g_u_reads_only_earlier_labels(context):
    torch.manual_seed(0)
    net = LabelContext(vocab_size=7, embed_dim=5, hidden=6, context=context).eval()
    a = torch.tensor([[1, 2, 3, 4]])
    b = torch.tensor([[1, 2, 5, 6]])  # differs from label 2 on
    ga, gb = net(a), net(b)
    torch.testing.assert_close(ga[:, :3], gb[:, :3])  # g_0..g_2 read y_1, y_2 only
    assert not torch.allclose(ga[:, 3], gb[:, 3])


def test_finite_context_forgets_older_labels():
    torch.manual_seed(0)
    net = LabelContext(vocab_size=7, embed_dim=5, hidden=6, context=2).eval()
    a, b = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[5, 6, 3, 4]])
    torch.testing.assert_close(net(a)[:, 4], net(b)[:, 4])  # g_4 sees y_3, y_4 only
    assert not torch.allclose(net(a)[:, 3], net(b)[:, 3])


def test_select_state_keeps_unchosen_rows():
    torch.manual_seed(0)
    net = LabelContext(vocab_size=7, embed_dim=5, hidden=6, context=-1).eval()
    state = net.initial_state(2)
    g0, state = net.step(torch.full((2,), START), state)
    g1, new = net.step(torch.tensor([3, 4]), state)
    kept = net.select_state(state, torch.tensor([True, False]), new)
    g2, _ = net.step(torch.tensor([5, 5]), kept)
    ref0, _ = net.step(torch.tensor([5]), tuple(s[:, :1] for s in new))
    ref1, _ = net.step(torch.tensor([5]), tuple(s[:, 1:] for s in state))
    torch.testing.assert_close(g2, torch.cat([ref0, ref1]))


def test_negative_context_other_than_minus_one_is_refused():
    with pytest.raises(ValueError, match="context must be"):
        LabelContext(7, context=-2)
