"""Pruned transducer losses (cbasr.losses.pruned): the trivial joint, the windows, and the
pruned lattice against enumeration of the paths inside the windows, in float64."""

import pytest
import torch
import torch.nn.functional as F

from cbasr._backends import use_backend
from cbasr.losses import (
    hat_nll_from_logits,
    prune_ranges,
    pruned_transducer_nll,
    rnnt_lattice_nll,
    simple_transducer_nll,
    transducer_lattice_nll,
    trivial_joint_log_probs,
)
from tests.backends import BACKENDS, interpreted, on_triton_keep
from tests.reference import lattice_enumeration as ref

F64 = torch.float64
# (frames, label units >= 1): ragged, one without labels, one with more labels than frames
UTTERANCES = [(6, [1, 3, 2, 2]), (4, [2, 1]), (3, []), (2, [3, 1, 2])]
# windows of 2 positions hold one label per frame
UTTERANCES_S2 = UTTERANCES[:3] + [(2, [3, 1])]
CRITERIA = ["rnnt", "hat"]


@pytest.fixture(autouse=True, params=BACKENDS)
def lattice(request):
    """Which transducer lattice serves the tensors: the compiled CPU loop, the PyTorch recursion
    or the Triton kernels."""
    with use_backend(request.param):
        yield request.param


def _lengths_and_targets(utterances, device="cpu"):
    U = max(len(y) for _, y in utterances)
    targets = torch.zeros(len(utterances), U, dtype=torch.long)
    for b, (_, y) in enumerate(utterances):
        targets[b, : len(y)] = torch.tensor(y, dtype=torch.long)
    il = torch.tensor([t for t, _ in utterances])
    tl = torch.tensor([len(y) for _, y in utterances])
    return targets.to(device), il.to(device), tl.to(device)


def _units(seed, utterances=UTTERANCES, V=4, width=None, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    T = max(t for t, _ in utterances)
    U1 = max(len(y) for _, y in utterances) + 1
    shape = (len(utterances), T, U1 if width is None else width, V)
    return (2 * torch.randn(shape, generator=g, dtype=F64)).to(device).requires_grad_()


def _full_nll(units, targets, il, tl, criterion):
    """The exact loss of the model whose joint is ``units`` at every node."""
    if criterion == "hat":
        return hat_nll_from_logits(None, units, (targets - 1).clamp(min=0), il, tl)
    return rnnt_lattice_nll(units, targets, il, tl)


def _edge_functions(units_b, y, criterion):
    """``(blank(t, u), label(t, u))`` log weights of one utterance's ``(T, U + 1, V)`` joint."""
    if criterion == "hat":
        blank = F.logsigmoid(units_b[..., 0])
        labels = F.logsigmoid(-units_b[..., 0])[..., None] + units_b[..., 1:].log_softmax(-1)
        return (lambda t, u: blank[t, u]), (lambda t, u: labels[t, u, y[u] - 1])
    log_probs = units_b.log_softmax(-1)
    return (lambda t, u: log_probs[t, u, 0]), (lambda t, u: log_probs[t, u, y[u]])


def _windowed_log_marginal(units_b, y, starts_b, S, criterion):
    """Enumeration: the log of the summed probability of the lattice paths whose every node
    ``(t, u)`` has ``starts_b[t] <= u < starts_b[t] + S`` (the final node's blank included)."""
    T, U = len(starts_b), len(y)
    blank, label = _edge_functions(units_b, y, criterion)
    terms = []
    for moves in ref.transducer_paths(T, U):
        t = u = 0
        total, inside = torch.zeros((), dtype=F64), True
        for m in moves:
            inside &= starts_b[t] <= u < starts_b[t] + S
            if m == "b":
                total, t = total + blank(t, u), t + 1
            else:
                total, u = total + label(t, u), u + 1
        if inside:
            terms.append(total)
    return (
        torch.logsumexp(torch.stack(terms), 0) if terms else torch.tensor(float("-inf"), dtype=F64)
    )


def _pruned_joint(units, starts, S):
    """The joint's scores on the windows, read off a whole-lattice joint (positions past
    ``U`` repeat ``U``, as :meth:`Joint.pruned_scores` does)."""
    B, T, U1, V = units.shape
    positions = (starts[..., None] + torch.arange(S, device=units.device)).clamp(max=U1 - 1)
    return units.gather(2, positions[..., None].expand(B, T, S, V))


# ---- the trivial joint ------------------------------------------------------------------------


@pytest.mark.parametrize("criterion", CRITERIA)
def test_trivial_joint_equals_the_explicit_joint_lattice(criterion, device):
    """Factored normaliser against the ``(B, T, U + 1, V)`` sum ``am_t + lm_u``: edge weights,
    and the loss and gradients of the full lattice loss on that joint."""
    targets, il, tl = _lengths_and_targets(UTTERANCES, device)
    g = torch.Generator().manual_seed(3)
    B, T, U1, V = len(UTTERANCES), 6, targets.shape[1] + 1, 4
    am = (3 * torch.randn(B, T, V, generator=g, dtype=F64)).to(device).requires_grad_()
    lm = (3 * torch.randn(B, U1, V, generator=g, dtype=F64)).to(device).requires_grad_()
    blank, emit = trivial_joint_log_probs(am, lm, targets, tl, hat=criterion == "hat")
    got = transducer_lattice_nll(blank, emit, il, tl)
    want = _full_nll(am[:, :, None] + lm[:, None], targets, il, tl, criterion)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    got_grads = torch.autograd.grad(got.sum(), (am, lm))
    want_grads = torch.autograd.grad(want.sum(), (am, lm))
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("criterion", CRITERIA)
def test_trivial_joint_float32_where_the_large_units_differ(criterion):
    """``am``'s and ``lm``'s large entries on different units: a float32 product of
    ``exp(am - max)`` and ``exp(lm - max)`` would underflow to 0 (log 0 = -inf)."""
    targets, il, tl = _lengths_and_targets([(3, [1, 2])])
    am = torch.full((1, 3, 4), -60.0)
    lm = torch.full((1, 3, 4), -60.0)
    am[..., 1], lm[..., 2] = 60.0, 60.0
    blank, emit = trivial_joint_log_probs(am, lm, targets, tl, hat=criterion == "hat")
    joint = (am[:, :, None] + lm[:, None]).double()
    if criterion == "hat":
        want = (
            joint[..., 1:]
            .log_softmax(-1)[0, :, :2]
            .gather(-1, targets[0, None, :, None].expand(3, 2, 1) - 1)
        )
        want = want[..., 0] + F.logsigmoid(-joint[0, :, :2, 0])
    else:
        want = joint.log_softmax(-1)[0, :, :2].gather(
            -1, targets[0, None, :, None].expand(3, 2, 1)
        )[..., 0]
    assert torch.isfinite(emit).all() and torch.isfinite(blank).all()
    torch.testing.assert_close(emit[0].double(), want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("criterion", CRITERIA)
def test_trivial_joint_gradcheck(criterion):
    targets, il, tl = _lengths_and_targets([(3, [1, 2]), (2, [3])])
    g = torch.Generator().manual_seed(5)
    am = torch.randn(2, 3, 4, generator=g, dtype=F64, requires_grad=True)
    lm = torch.randn(2, 3, 4, generator=g, dtype=F64, requires_grad=True)

    def edges(a, b):
        blank, emit = trivial_joint_log_probs(a, b, targets, tl, hat=criterion == "hat")
        return torch.cat([blank.flatten(), emit.flatten()])

    assert torch.autograd.gradcheck(edges, (am, lm))


# ---- the windows ------------------------------------------------------------------------------


def _assert_windows_hold_a_path(starts, il, tl, S):
    for b in range(starts.shape[0]):
        s = starts[b, : int(il[b])].tolist()
        U_b = int(tl[b])
        assert s[0] == 0, s
        assert all(0 <= s[t] - s[t - 1] <= S - 1 for t in range(1, len(s))), s
        assert s[-1] >= U_b - S + 1, (s, U_b)
        assert max(s) <= max(U_b - S + 1, 0), (s, U_b)


@pytest.mark.parametrize("S", [2, 3, 5])
def test_windows_hold_a_path_whatever_the_occupancy(S):
    g = torch.Generator().manual_seed(S)
    for _ in range(50):
        B, T = 4, int(torch.randint(1, 9, (), generator=g))
        il = torch.randint(1, T + 1, (B,), generator=g)
        il[0] = T
        tl = torch.minimum(torch.randint(0, 3 * T, (B,), generator=g), il * (S - 1))
        occupancy = torch.rand(B, T, int(tl.max()) + 1, generator=g) ** 8
        starts = prune_ranges(occupancy, il, tl, S)
        assert starts.shape == (B, T) and starts.dtype == torch.long
        _assert_windows_hold_a_path(starts, il, tl, S)


def test_windows_follow_the_occupancy_where_it_allows():
    """Occupancy on one path, a label on each of frames 0-3: each window is the one holding
    the frame's nodes. Occupancy all on the last or the first position: the windows start as
    late (one label per frame from the start) or as early (one per frame to the end) as a
    path allows."""
    T, U, S = 6, 4, 2

    def starts_for(nodes):
        occupancy = torch.zeros(1, T, U + 1)
        for t, u in nodes:
            occupancy[0, t, u] = 1.0
        return prune_ranges(occupancy, torch.tensor([T]), torch.tensor([U]), S)[0].tolist()

    diagonal = [(t, min(t + d, U)) for t in range(T) for d in (0, 1)]
    assert starts_for(diagonal) == [0, 1, 2, 3, 3, 3]
    assert starts_for([(t, U) for t in range(T)]) == [0, 1, 2, 3, 3, 3]
    assert starts_for([(t, 0) for t in range(T)]) == [0, 0, 0, 1, 2, 3]
    # a frame wanting to jump ahead raises the frames before it instead of breaking the path
    assert starts_for([(0, 0), (1, 0), (2, 0), (3, 4), (4, 4), (5, 4)]) == [0, 1, 2, 3, 3, 3]


def test_windows_refuse_more_labels_than_they_hold():
    with pytest.raises(
        ValueError,
        match=r"utterance 1 of the batch has 5 labels in 2 frames.*prune_range=3.*at most 2",
    ):
        prune_ranges(torch.rand(2, 4, 6), torch.tensor([4, 2]), torch.tensor([3, 5]), 3)
    with pytest.raises(ValueError, match="prune_range must be >= 2"):
        prune_ranges(torch.rand(1, 4, 3), torch.tensor([4]), torch.tensor([2]), 1)


# ---- the pruned lattice -----------------------------------------------------------------------


@pytest.mark.parametrize("criterion", CRITERIA)
@pytest.mark.parametrize("S", [2, 3])
def test_pruned_loss_matches_enumeration_inside_the_windows(criterion, S, device):
    utterances = UTTERANCES_S2 if S == 2 else UTTERANCES
    targets, il, tl = _lengths_and_targets(utterances, device)
    units = _units(7 + S, utterances, device=device)
    g = torch.Generator().manual_seed(S)
    occupancy = torch.rand(*units.shape[:3], generator=g).to(device)
    starts = prune_ranges(occupancy, il, tl, S)
    windowed = _pruned_joint(units, starts, S)
    nll = pruned_transducer_nll(windowed, starts, targets, il, tl, hat=criterion == "hat")
    grad = torch.autograd.grad(nll.sum(), units)[0]
    for b, (tb, y) in enumerate(utterances):
        units_b = units[b].detach().cpu().clone().requires_grad_()
        want = -_windowed_log_marginal(
            units_b[:tb, : len(y) + 1], y, starts[b, :tb].tolist(), S, criterion
        )
        (want_grad,) = torch.autograd.grad(want, units_b)
        torch.testing.assert_close(nll[b].cpu(), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad[b].cpu(), want_grad, rtol=1e-10, atol=1e-12)
    # an upper bound of the exact loss, strictly above it where a window left paths out
    full = _full_nll(units, targets, il, tl, criterion)
    assert (nll >= full - 1e-12).all()
    assert (nll > full + 1e-6).any()


@pytest.mark.parametrize("criterion", CRITERIA)
def test_pruned_loss_is_the_exact_loss_when_the_windows_cover_the_lattice(criterion, device):
    targets, il, tl = _lengths_and_targets(UTTERANCES, device)
    units = _units(11, device=device)
    S = units.shape[2]  # U + 1: one window, the whole column
    starts = torch.zeros(units.shape[:2], dtype=torch.long, device=device)
    nll = pruned_transducer_nll(
        _pruned_joint(units, starts, S), starts, targets, il, tl, criterion == "hat"
    )
    want = _full_nll(units, targets, il, tl, criterion)
    torch.testing.assert_close(nll, want, rtol=1e-12, atol=1e-12)
    got_grad = torch.autograd.grad(nll.sum(), units)[0]
    torch.testing.assert_close(
        got_grad, torch.autograd.grad(want.sum(), units)[0], rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("criterion", CRITERIA)
def test_pruned_loss_gradcheck_and_padding(lattice, criterion):
    """gradcheck on the windows; NaN in padded frames and past the windows' positions changes
    nothing and gets zero gradient."""
    utterances = [(3, [1, 2]), (2, [3])]
    targets, il, tl = _lengths_and_targets(utterances)
    S = 2
    starts = prune_ranges(torch.rand(2, 3, 3), il, tl, S)
    windowed = _units(13, utterances, V=4, width=S)
    hat = criterion == "hat"
    assert torch.autograd.gradcheck(
        lambda x: pruned_transducer_nll(x, starts, targets, il, tl, hat),
        (windowed,),
        fast_mode=interpreted(lattice),  # (its random projections: 2 calls, not 2 per entry)
    )
    padded = windowed.detach().clone()
    padded[1, 2:] = float("nan")  # frames past T_1 = 2
    padded.requires_grad_()
    nll = pruned_transducer_nll(padded, starts, targets, il, tl, hat)
    torch.testing.assert_close(nll, pruned_transducer_nll(windowed, starts, targets, il, tl, hat))
    grad = torch.autograd.grad(nll.sum(), padded)[0]
    assert torch.isfinite(grad).all() and (grad[1, 2:] == 0).all()


@on_triton_keep(lambda case: case["monotonic"] == (case["criterion"] == "hat"))  # each once
@pytest.mark.parametrize("monotonic", [False, True])
@pytest.mark.parametrize("criterion", CRITERIA)
def test_pruned_loss_over_many_tiles_of_rows_equals_the_pytorch_backend(
    lattice, criterion, monotonic
):
    """Windows of 1200 joint rows (several tiles of the Triton kernels) give the NLLs and
    gradients of the PyTorch backend (itself checked against enumeration above), NaN in the
    padded frames included."""
    g = torch.Generator().manual_seed(10)
    B, T, U, S, V = 3, 50, 12, 8, 5
    il, tl = torch.tensor([50, 37, 44]), torch.tensor([12, 7, 11])
    targets = torch.randint(1, V, (B, U), generator=g)
    starts = prune_ranges(torch.rand(B, T, U + 1, generator=g), il, tl, S, monotonic=monotonic)
    units = torch.randn(B, T, S, V, generator=g, dtype=F64)
    units[1, 37:] = float("nan")  # padded frames hold anything
    hat = criterion == "hat"
    got_units = units.clone().requires_grad_()
    got = pruned_transducer_nll(got_units, starts, targets, il, tl, hat, monotonic)
    with use_backend("torch"):
        want_units = units.clone().requires_grad_()
        want = pruned_transducer_nll(want_units, starts, targets, il, tl, hat, monotonic)
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    got_grad = torch.autograd.grad(got.sum(), got_units)[0]
    want_grad = torch.autograd.grad(want.sum(), want_units)[0]
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-10, atol=1e-12)
    assert (got_grad[1, 37:] == 0).all()


@pytest.mark.parametrize("monotonic", [False, True])
@pytest.mark.parametrize("criterion", CRITERIA)
def test_pruned_loss_of_half_precision_units_sums_in_float32(criterion, monotonic):
    """bfloat16 units (a joint under autocast): the loss is float32, the float32 loss of the
    same (rounded) units, and the gradient is the units' own dtype."""
    utterances = [(4, [1, 2]), (3, [3])]
    targets, il, tl = _lengths_and_targets(utterances)
    S = 2
    starts = prune_ranges(torch.rand(2, 4, 3), il, tl, S, monotonic=monotonic)
    units = _units(17, utterances, V=4, width=S).to(torch.bfloat16).requires_grad_()
    hat = criterion == "hat"
    nll = pruned_transducer_nll(units, starts, targets, il, tl, hat, monotonic)
    want = pruned_transducer_nll(units.detach().float(), starts, targets, il, tl, hat, monotonic)
    assert nll.dtype == torch.float32 and torch.isfinite(want).all()
    torch.testing.assert_close(nll, want)
    assert torch.autograd.grad(nll.sum(), units)[0].dtype == torch.bfloat16


# ---- the simple loss --------------------------------------------------------------------------


@pytest.mark.parametrize("criterion", CRITERIA)
def test_simple_loss_is_the_trivial_joint_loss_with_its_gradient(criterion):
    targets, il, tl = _lengths_and_targets(UTTERANCES)
    g = torch.Generator().manual_seed(17)
    am = torch.randn(4, 6, 4, generator=g, dtype=F64, requires_grad=True)
    lm = torch.randn(4, 5, 4, generator=g, dtype=F64, requires_grad=True)
    hat = criterion == "hat"
    nll, starts = simple_transducer_nll(am, lm, targets, il, tl, 3, hat)
    want = _full_nll(am[:, :, None] + lm[:, None], targets, il, tl, criterion)
    torch.testing.assert_close(nll, want, rtol=1e-12, atol=1e-12)
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=F64)  # any use of the per-utterance loss
    for a, b in zip(
        torch.autograd.grad((weights * nll).sum(), (am, lm)),
        torch.autograd.grad((weights * want).sum(), (am, lm)),
    ):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    _assert_windows_hold_a_path(starts, il, tl, 3)


def test_simple_loss_ignores_what_padded_frames_hold():
    """NaN in the encoder side's padded frames: the same loss, windows and gradient, and no
    gradient into the padding."""
    targets, il, tl = _lengths_and_targets(UTTERANCES)
    g = torch.Generator().manual_seed(19)
    am = torch.randn(4, 6, 4, generator=g, dtype=F64)
    lm = torch.randn(4, 5, 4, generator=g, dtype=F64, requires_grad=True)
    padded = am.clone()
    for b, (tb, _) in enumerate(UTTERANCES):
        padded[b, tb:] = float("nan")
    am.requires_grad_(), padded.requires_grad_()
    for hat in (False, True):
        want, want_starts = simple_transducer_nll(am, lm, targets, il, tl, 3, hat)
        got, starts = simple_transducer_nll(padded, lm, targets, il, tl, 3, hat)
        torch.testing.assert_close(got, want)
        for b, (tb, _) in enumerate(UTTERANCES):
            assert starts[b, :tb].tolist() == want_starts[b, :tb].tolist()
        grad_am, grad_lm = torch.autograd.grad(got.sum(), (padded, lm))
        assert torch.isfinite(grad_am).all() and torch.isfinite(grad_lm).all()
        for b, (tb, _) in enumerate(UTTERANCES):
            assert (grad_am[b, tb:] == 0).all()
        torch.testing.assert_close(grad_lm, torch.autograd.grad(want.sum(), lm)[0])


def test_simple_loss_windows_hold_the_paths_of_a_confident_trivial_joint():
    """A trivial joint sure of one alignment (label u on frame u, blanks elsewhere): the
    windows chosen from its posteriors keep that path, so the pruned loss of a joint with the
    same confidence is close to the exact one."""
    T, y, V, S = 6, [1, 2, 3], 4, 2
    targets, il, tl = _lengths_and_targets([(T, y)])
    am = torch.full((1, T, V), -8.0, dtype=F64)
    lm = torch.full((1, len(y) + 1, V), -8.0, dtype=F64)
    am[0, :, 0] = 4.0  # blank everywhere ...
    for u in range(len(y)):
        am[0, u, y[u]] = 12.0  # ... except y_{u+1} at frame u
    _, starts = simple_transducer_nll(am, lm, targets, il, tl, S, hat=False)
    assert starts[0].tolist() == [0, 1, 2, 2, 2, 2]
    units = am[:, :, None] + lm[:, None]
    nll = pruned_transducer_nll(_pruned_joint(units, starts, S), starts, targets, il, tl)
    assert float(nll - _full_nll(units, targets, il, tl, "rnnt")) < 1e-3


def test_enumeration_helper_keeps_exactly_the_paths_inside():
    """The oracle itself, on a uniform RNN-T joint over 2 units (each edge 1/2): windows over
    every position keep all C(T + U - 1, U) paths; one position per frame keeps none (an
    emission leaves the frame's window); ``[0, 1]`` then ``[1, 2]`` keeps the paths that emit
    on the first frame."""
    units = torch.zeros(3, 3, 2, dtype=F64)
    y = [1, 1]
    edge = torch.tensor(0.5, dtype=F64).log()
    every = _windowed_log_marginal(units, y, [0, 0, 0], 3, "rnnt")
    torch.testing.assert_close(every, torch.log(torch.tensor(6.0, dtype=F64)) + 5 * edge)
    assert len(ref.transducer_paths(3, 2)) == 6
    assert _windowed_log_marginal(units, y, [0, 0, 0], 1, "rnnt") == float("-inf")
    # emit y1 on frame 0 (the only way to reach u = 1 there), then y2 on frame 1 or 2: 2 paths
    first = _windowed_log_marginal(units, y, [0, 1, 1], 2, "rnnt")
    torch.testing.assert_close(first, torch.log(torch.tensor(2.0, dtype=F64)) + 5 * edge)


# ---- the one-label-per-frame lattice ------------------------------------------------------------

# at most one label per frame; a repeat; one without labels; U_b = T_b
MONOTONIC = [(6, [1, 3, 3, 2]), (4, [2, 1]), (3, []), (2, [3, 1])]


def _monotonic_windowed_log_marginal(units_b, y, starts_b, S, criterion):
    """Enumeration over the one-label-per-frame paths whose node ``(t, u)`` at every frame has
    ``starts_b[t] <= u < starts_b[t] + S``."""
    blank, label = _edge_functions(units_b, y, criterion)
    terms = []
    for moves in ref.monotonic_transducer_paths(len(starts_b), len(y)):
        u, total, inside = 0, torch.zeros((), dtype=F64), True
        for t, m in enumerate(moves):
            inside &= starts_b[t] <= u < starts_b[t] + S
            if m == "b":
                total = total + blank(t, u)
            else:
                total, u = total + label(t, u), u + 1
        if inside:
            terms.append(total)
    return (
        torch.logsumexp(torch.stack(terms), 0) if terms else torch.tensor(float("-inf"), dtype=F64)
    )


@pytest.mark.parametrize("S", [2, 3])
def test_monotonic_windows_hold_a_path_whatever_the_occupancy(S):
    """Random occupancy and lengths: the windows rise by at most one per frame, and a uniform
    joint's windowed loss (counting the monotonic paths inside them) is finite."""
    g = torch.Generator().manual_seed(40 + S)
    for _ in range(40):
        B, T = 3, int(torch.randint(1, 7, (), generator=g))
        il = torch.randint(1, T + 1, (B,), generator=g)
        il[0] = T
        tl = torch.minimum(torch.randint(0, T + 2, (B,), generator=g), il)
        occupancy = torch.rand(B, T, int(tl.max()) + 1, generator=g) ** 8
        starts = prune_ranges(occupancy, il, tl, S, monotonic=True)
        for b in range(B):
            s = starts[b, : int(il[b])].tolist()
            assert s[0] == 0 and all(0 <= s[t] - s[t - 1] <= 1 for t in range(1, len(s))), s
            y = [1] * int(tl[b])
            units_b = torch.zeros(len(s), len(y) + 1, 2, dtype=F64)
            assert torch.isfinite(_monotonic_windowed_log_marginal(units_b, y, s, S, "rnnt"))


def test_monotonic_windows_refuse_more_labels_than_frames():
    with pytest.raises(ValueError, match=r"utterance 0 .* 3 labels in 2 frames.*at most 1 label"):
        prune_ranges(torch.rand(1, 2, 4), torch.tensor([2]), torch.tensor([3]), 3, monotonic=True)


@pytest.mark.parametrize("criterion", CRITERIA)
def test_monotonic_pruned_loss_matches_enumeration_inside_the_windows(criterion):
    S = 2
    targets, il, tl = _lengths_and_targets(MONOTONIC)
    units = _units(31, MONOTONIC)
    occupancy = torch.rand(*units.shape[:3], generator=torch.Generator().manual_seed(32))
    starts = prune_ranges(occupancy, il, tl, S, monotonic=True)
    hat = criterion == "hat"
    nll = pruned_transducer_nll(
        _pruned_joint(units, starts, S), starts, targets, il, tl, hat, monotonic=True
    )
    grad = torch.autograd.grad(nll.sum(), units)[0]
    for b, (tb, y) in enumerate(MONOTONIC):
        units_b = units[b].detach().clone().requires_grad_()
        want = -_monotonic_windowed_log_marginal(
            units_b[:tb, : len(y) + 1], y, starts[b, :tb].tolist(), S, criterion
        )
        (want_grad,) = torch.autograd.grad(want, units_b)
        torch.testing.assert_close(nll[b], want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad[b], want_grad, rtol=1e-10, atol=1e-12)
    # an upper bound of the exact monotonic loss, equal to it with windows over every position
    if hat:
        full = hat_nll_from_logits(None, units, targets - 1, il, tl, monotonic=True)
    else:
        full = rnnt_lattice_nll(units, targets, il, tl, monotonic=True)
    assert (nll >= full - 1e-12).all() and (nll > full + 1e-6).any()
    whole = torch.zeros(units.shape[:2], dtype=torch.long)
    covered = pruned_transducer_nll(units, whole, targets, il, tl, hat, monotonic=True)
    torch.testing.assert_close(covered, full, rtol=1e-12, atol=1e-12)


def test_monotonic_simple_loss_is_the_trivial_joint_loss():
    targets, il, tl = _lengths_and_targets(MONOTONIC)
    g = torch.Generator().manual_seed(33)
    am = torch.randn(4, 6, 4, generator=g, dtype=F64, requires_grad=True)
    lm = torch.randn(4, 5, 4, generator=g, dtype=F64, requires_grad=True)
    simple, starts = simple_transducer_nll(am, lm, targets, il, tl, 2, monotonic=True)
    blank, emit = trivial_joint_log_probs(am, lm, targets, tl)
    want = transducer_lattice_nll(blank, emit, il, tl, monotonic=True)
    torch.testing.assert_close(simple, want)
    grads = torch.autograd.grad(simple.sum(), (am, lm))
    for got, w in zip(grads, torch.autograd.grad(want.sum(), (am, lm))):
        torch.testing.assert_close(got, w)
    assert all(
        0 <= int(starts[b, t]) - int(starts[b, t - 1]) <= 1
        for b in range(4)
        for t in range(1, int(il[b]))
    )


def test_monotonic_windows_follow_the_occupancy_where_it_allows():
    """All occupancy on the first position: the windows start as late as a path allows (the
    last label emitted on the last frame); all on the last: one label per frame from the
    start."""
    T, U, S = 6, 4, 2

    def starts_for(u):
        occupancy = torch.zeros(1, T, U + 1)
        occupancy[0, :, u] = 1.0
        return prune_ranges(occupancy, torch.tensor([T]), torch.tensor([U]), S, True)[0].tolist()

    assert starts_for(0) == [0, 0, 0, 0, 1, 2]
    assert starts_for(U) == [0, 1, 2, 3, 3, 3]


@pytest.mark.parametrize("criterion", CRITERIA)
def test_fastemit_inside_windows_that_cover_the_lattice_is_the_whole_lattice_s(criterion, device):
    """FastEmit on the pruned loss: with one window over the whole column, the value and the
    scaled gradient of FastEmit on the whole lattice (checked against its definition in
    tests/losses/test_fastemit.py); a smaller window's gradient moves with lambda."""
    targets, il, tl = _lengths_and_targets(UTTERANCES, device)
    units = _units(11, device=device)
    S, hat = units.shape[2], criterion == "hat"
    starts = torch.zeros(units.shape[:2], dtype=torch.long, device=device)
    windowed = _pruned_joint(units, starts, S)
    nll = pruned_transducer_nll(windowed, starts, targets, il, tl, hat, fastemit=0.5)
    if hat:
        want = hat_nll_from_logits(None, units, (targets - 1).clamp(min=0), il, tl, fastemit=0.5)
    else:
        want = rnnt_lattice_nll(units, targets, il, tl, fastemit=0.5)
    torch.testing.assert_close(nll, want, rtol=1e-12, atol=1e-12)
    got, expected = (torch.autograd.grad(x.sum(), units)[0] for x in (nll, want))
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    plain = torch.autograd.grad(_full_nll(units, targets, il, tl, criterion).sum(), units)[0]
    assert (got - plain).abs().max() > 1e-3  # lambda moved it
    with pytest.raises(ValueError, match="fastemit .* must be >= 0, got -1"):
        pruned_transducer_nll(windowed, starts, targets, il, tl, hat, fastemit=-1.0)
