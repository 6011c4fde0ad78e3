import pytest
import torch

from cbasr.config.schema import LabelContextConfig
from cbasr.modules.label_context import START, LabelContext


def _net(context: int, num_layers: int = 1) -> LabelContext:
    config = LabelContextConfig(embed_dim=5, hidden=6, num_layers=num_layers, context=context)
    return LabelContext(7, config, dropout=0.0)


@pytest.mark.parametrize("context", [-1, 0, 1, 2, 4])
def test_step_by_step_equals_teacher_forced(context):
    torch.manual_seed(0)
    net = _net(context, num_layers=2 if context == -1 else 1).eval()
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
    net = _net(context).eval()
    a = torch.tensor([[1, 2, 3, 4]])
    b = torch.tensor([[1, 2, 5, 6]])  # differs from label 2 on
    ga, gb = net(a), net(b)
    torch.testing.assert_close(ga[:, :3], gb[:, :3])  # g_0..g_2 read y_1, y_2 only
    assert not torch.allclose(ga[:, 3], gb[:, 3])


def test_finite_context_forgets_older_labels():
    torch.manual_seed(0)
    net = _net(2).eval()
    a, b = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[5, 6, 3, 4]])
    torch.testing.assert_close(net(a)[:, 4], net(b)[:, 4])  # g_4 sees y_3, y_4 only
    assert not torch.allclose(net(a)[:, 3], net(b)[:, 3])


@pytest.mark.parametrize("context", [-1, 0, 2])
@pytest.mark.parametrize("from_start", [False, True])
@pytest.mark.parametrize("method", ["step_rows", "step_masked"])
def test_stepping_some_rows_advances_the_chosen_rows_only(context, from_start, method):
    """Rows 0 and 2 of 3 read a label: their outputs and states equal a full step's, row 1's
    state is untouched (from the initial state too: the LSTM's implicit zero state);
    ``step_rows`` names the rows, ``step_masked`` masks them."""
    torch.manual_seed(0)
    net = _net(context).eval()
    state = net.initial_state(3)
    if not from_start:
        _, state = net.step(torch.full((3,), START), state)
    labels, rows = torch.tensor([3, 4, 5]), torch.tensor([0, 2])
    if method == "step_rows":
        g, stepped = net.step_rows(labels, state, rows)
    else:
        g, stepped = net.step_masked(labels, state, torch.tensor([True, False, True]))
        g = g[rows]
    g_all, full = net.step(labels, state)
    torch.testing.assert_close(g, g_all[rows])

    def row(s, r):  # one row of a state (LSTM: (h, c) batched along dim 1)
        if s is None:
            return torch.zeros(2, 1, 6)
        return torch.stack([x[:, r] for x in s]) if isinstance(s, tuple) else s[r]

    for r in (0, 2):
        torch.testing.assert_close(row(stepped, r), row(full, r))
    torch.testing.assert_close(row(stepped, 1), row(state, 1))
    if context != 0:
        assert not torch.allclose(row(stepped, 0), row(state, 0))
