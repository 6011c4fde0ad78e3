"""cb_marginal_nll_windowed: the second-order CB model with emission gaps told apart up to W
(every longer gap reads the entry of gap W), against enumeration of every emission set, under
the PyTorch recursions and the Triton kernels (:mod:`cbasr.losses._cb_second_order_triton`;
on CPU in Triton's interpreter)."""

import math

import pytest
import torch

from cbasr._backends import use_backend
from cbasr.losses import cb_marginal_nll, cb_marginal_nll_windowed
from tests.backends import on_triton_keep, skip_interpreted
from tests.reference import lattice_enumeration as ref

F64 = torch.float64

LENGTHS = [(7, 3), (6, 2), (3, 3), (5, 0), (4, 1)]


@pytest.fixture(autouse=True, params=["torch", pytest.param("triton", marks=pytest.mark.triton)])
def lattice(request):
    """Which implementation of the recursions serves the tensors in this test (the second-order
    lattice has no compiled CPU loop: the numba backend runs the PyTorch one)."""
    with use_backend(request.param):
        yield request.param


def _batch(seed, W, lengths=LENGTHS, dtype=F64, device="cpu", pad_value=None):
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    T = max(t for t, _ in lengths)
    L = max(l for _, l in lengths)
    emit_logits = 2 * torch.randn(B, T, generator=g, dtype=F64)
    label_log_probs = -3 * torch.rand(B, T, W, L, generator=g, dtype=F64)
    if pad_value is not None:
        for b, (tb, lb) in enumerate(lengths):
            emit_logits[b, tb:] = pad_value
            label_log_probs[b, tb:] = pad_value
            label_log_probs[b, ..., lb:] = pad_value
    return (
        emit_logits.to(device=device, dtype=dtype).requires_grad_(),
        label_log_probs.to(device=device, dtype=dtype).requires_grad_(),
        torch.tensor([t for t, _ in lengths], device=device),
        torch.tensor([l for _, l in lengths], device=device),
    )


@pytest.mark.parametrize("W", [1, 2, 3, 8])
def test_matches_enumeration_values_and_gradients(W, device):
    a, lp, il, tl = _batch(W, W, device=device)
    nll = cb_marginal_nll_windowed(a, lp, il, tl)
    ga, glp = torch.autograd.grad(nll.sum(), (a, lp))
    for b, (tb, lb) in enumerate(LENGTHS):
        ra = a[b].detach().cpu().clone().requires_grad_()
        rlp = lp[b].detach().cpu().clone().requires_grad_()
        want = -ref.cb_windowed_log_marginal(ra[:tb], rlp[:tb, :, :lb])
        if math.isinf(want.item()):  # no alignment fits the window
            assert nll[b].item() == float("inf")
            assert ga[b].abs().sum() == 0 and glp[b].abs().sum() == 0
            continue
        want_ga, want_glp = torch.autograd.grad(want, (ra, rlp), allow_unused=True)
        want_glp = torch.zeros_like(rlp) if want_glp is None else want_glp
        torch.testing.assert_close(nll[b].cpu(), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ga[b].cpu(), want_ga, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(glp[b].cpu(), want_glp, rtol=1e-10, atol=1e-12)


def test_gradcheck(lattice):
    skip_interpreted(lattice, "gradcheck (the enumeration tests check the gradient)")
    a, lp, il, tl = _batch(20, 3, lengths=[(6, 3), (4, 1), (3, 0)])
    assert torch.autograd.gradcheck(lambda x, y: cb_marginal_nll_windowed(x, y, il, tl), (a, lp))


@pytest.mark.parametrize("extra", [0, 3])
def test_constant_over_gap_and_wide_window_equals_first_order(extra):
    # With P(y_l | t_l, t_l - t_{l-1}) = P(y_l | t_l) and W >= T no gap constraint binds.
    a, lp, il, tl = _batch(21, 1)
    T = a.shape[1]
    lp_wide = lp.expand(-1, -1, T + extra, -1)  # (B, T, W, L), constant over d
    windowed = cb_marginal_nll_windowed(a, lp_wide, il, tl)
    first = cb_marginal_nll(a, lp[:, :, 0], il, tl)
    torch.testing.assert_close(windowed, first, rtol=1e-12, atol=1e-12)
    g_w = torch.autograd.grad(windowed.sum(), (a, lp))
    g_1 = torch.autograd.grad(first.sum(), (a, lp))
    torch.testing.assert_close(g_w, g_1, rtol=1e-10, atol=1e-12)


def test_hand_worked_value():
    # T = 3, L = 1, W = 2, every P(B_t = 1) = sigmoid(0) = 1/2, so every b has P(b) = 1/8.
    # t_{-1} = -1: y_0 at frame 0 has gap 1 (d = 0), at frame 1 gap 2 (d = 1), at frame 2
    # gap 3 >= W, which reads d = W - 1 = 1 too. With P(y_0 | t=0, d=0) = 0.5,
    # P(y_0 | t=1, d=1) = 0.3 and P(y_0 | t=2, d=1) = 0.2: P(y) = (0.5 + 0.3 + 0.2) / 8, so
    # -log P(y) = log 8. Entries with d != min(t, W - 1) are never used.
    lp = torch.full((1, 3, 2, 1), 0.9, dtype=F64).log()
    lp[0, 0, 0, 0], lp[0, 1, 1, 0], lp[0, 2, 1, 0] = math.log(0.5), math.log(0.3), math.log(0.2)
    a = torch.zeros(1, 3, dtype=F64)
    nll = cb_marginal_nll_windowed(a, lp, torch.tensor([3]), torch.tensor([1]))
    torch.testing.assert_close(nll, torch.tensor([math.log(8.0)], dtype=F64))


def test_gaps_beyond_the_window_keep_their_probability():
    """Emissions possible only W + 2 frames apart (and the first one late): finite, and equal to
    the enumeration that reads the gap-W entry there; a gap that the labels make impossible
    everywhere still gives +inf with zero gradient."""
    W = 2
    a, lp, il, tl = _batch(22, W, lengths=[(7, 2), (7, 2), (5, 1)])
    blocked = lp.detach().clone()
    blocked[0, [0, 1, 2, 4, 5, 6]] = float("-inf")  # utterance 0: label terms only at frame 3 ...
    blocked[0, 6] = lp[0, 6].detach()  # ... frames 3 and 6: first gap 4, then 3, both > W
    blocked[2] = float("-inf")  # utterance 2: its label can never be emitted
    blocked.requires_grad_()
    nll = cb_marginal_nll_windowed(a, blocked, il, tl)
    want = -ref.cb_windowed_log_marginal(a[0].detach(), blocked[0].detach())
    assert torch.isfinite(nll[0]) and torch.isfinite(nll[1]) and nll[2].item() == float("inf")
    torch.testing.assert_close(nll[0], want, rtol=1e-12, atol=1e-12)
    ga, glp = torch.autograd.grad(nll.sum(), (a, blocked))
    assert ga[2].abs().sum() == 0 and glp[2].abs().sum() == 0
    assert torch.isfinite(ga).all() and torch.isfinite(glp).all()
    # the one alignment: d(-log P)/d term = -1 on its two gap-W entries
    torch.testing.assert_close(glp[0, 3, W - 1, 0], torch.tensor(-1.0, dtype=F64))
    torch.testing.assert_close(glp[0, 6, W - 1, 1], torch.tensor(-1.0, dtype=F64))


def test_batch_and_padding_invariance():
    a, lp, il, tl = _batch(23, 3, pad_value=float("nan"))
    nll = cb_marginal_nll_windowed(a, lp, il, tl)
    ga, glp = torch.autograd.grad(nll.sum(), (a, lp))
    assert torch.isfinite(ga).all() and torch.isfinite(glp).all()
    for b, (tb, lb) in enumerate(LENGTHS):
        a1 = a[b : b + 1, :tb].detach().clone().requires_grad_()
        lp1 = lp[b : b + 1, :tb, :, :lb].detach().clone().requires_grad_()
        one = cb_marginal_nll_windowed(a1, lp1, torch.tensor([tb]), torch.tensor([lb]))
        g1a, g1lp = torch.autograd.grad(one.sum(), (a1, lp1))
        torch.testing.assert_close(nll[b : b + 1], one, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ga[b, :tb], g1a[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(glp[b, :tb, :, :lb], g1lp[0], rtol=1e-12, atol=1e-12)
        assert ga[b, tb:].abs().sum() == 0
        assert glp[b, tb:].abs().sum() == 0 and glp[b, ..., lb:].abs().sum() == 0


def test_float32_is_close_to_float64(lattice):
    skip_interpreted(lattice, "T = 500 frames")
    g = torch.Generator().manual_seed(24)
    B, T, W, L = 2, 500, 8, 100
    a64 = torch.randn(B, T, generator=g, dtype=F64)
    lp64 = 3 * torch.randn(B, T, W, L, generator=g, dtype=F64).log_softmax(-1)
    il, tl = torch.tensor([500, 420]), torch.tensor([100, 90])
    out = {}
    for dtype in (torch.float32, F64):
        a, lp = a64.to(dtype).requires_grad_(), lp64.to(dtype).requires_grad_()
        nll = cb_marginal_nll_windowed(a, lp, il, tl)
        out[dtype] = (nll, *torch.autograd.grad(nll.sum(), (a, lp)))
    for x32 in out[torch.float32]:
        assert torch.isfinite(x32).all()
    torch.testing.assert_close(out[torch.float32][0].double(), out[F64][0], rtol=1e-6, atol=0)
    torch.testing.assert_close(out[torch.float32][2].double(), out[F64][2], rtol=0, atol=1e-3)


def test_errors_name_the_argument():
    a, lp, il, tl = _batch(25, 2, lengths=[(5, 3), (4, 2)])
    with pytest.raises(ValueError, match="label_log_probs must have shape"):
        cb_marginal_nll_windowed(a, lp[:, :, 0], il, tl)
    with pytest.raises(ValueError, match="label_log_probs must have shape"):
        cb_marginal_nll_windowed(a, lp[:, :3], il, tl)
    with pytest.raises(ValueError, match="window W >= 1"):
        cb_marginal_nll_windowed(a, lp[:, :, :0], il, tl)
    with pytest.raises(ValueError, match=r"target_lengths\[0\] = 4"):
        cb_marginal_nll_windowed(a, lp, il, torch.tensor([4, 2]))
    with pytest.raises(ValueError, match=r"target_lengths\[0\] = 3 > input_lengths\[0\] = 2"):
        cb_marginal_nll_windowed(a, lp, torch.tensor([2, 4]), tl)


@on_triton_keep(lambda case: case["seed"] < 5)  # each kernel path: the other seeds repeat it
@pytest.mark.parametrize("seed", range(20))
def test_random_sizes_match_enumeration(seed):
    g = torch.Generator().manual_seed(100 + seed)
    W = int(torch.randint(1, 5, (1,), generator=g))
    lengths = []
    for _ in range(3):
        tb = int(torch.randint(1, 8, (1,), generator=g))
        lengths.append((tb, int(torch.randint(0, min(tb, 4) + 1, (1,), generator=g))))
    a, lp, il, tl = _batch(seed, W, lengths=lengths)
    nll = cb_marginal_nll_windowed(a, lp, il, tl)
    for b, (tb, lb) in enumerate(lengths):
        want = -ref.cb_windowed_log_marginal(a[b, :tb], lp[b, :tb, :, :lb])
        torch.testing.assert_close(nll[b], want, rtol=1e-12, atol=1e-12)


def _best_windowed_path(emit_logits, label_log_probs):
    """Enumerated ``argmax_b P(b, y)`` of the second-order model (``((), -inf)`` if none)."""
    T, W, L = label_log_probs.shape
    best, best_lp = (), float("-inf")
    for s in ref.cb_emission_sets(T, L):
        gaps = [min(t - prev, W) for t, prev in zip(s, (-1,) + s[:-1])]
        lp = sum(
            float(torch.nn.functional.logsigmoid(emit_logits[t] if t in s else -emit_logits[t]))
            for t in range(T)
        ) + sum(float(label_log_probs[t, g - 1, l]) for l, (t, g) in enumerate(zip(s, gaps)))
        if lp > best_lp:
            best, best_lp = s, lp
    return best, best_lp


@pytest.mark.parametrize("W", [1, 2, 3, 8])
def test_viterbi_matches_enumeration(W):
    from cbasr.losses import cb_viterbi_windowed

    a, lp, il, tl = _batch(10 + W, W, pad_value=float("nan"))
    times, log_prob = cb_viterbi_windowed(a, lp, il, tl)
    for b in range(len(LENGTHS)):
        T, L = int(il[b]), int(tl[b])
        best, best_lp = _best_windowed_path(a[b, :T].detach(), lp[b, :T, :, :L].detach())
        assert times[b, :L].tolist() == list(best) and (times[b, L:] == -1).all()
        if math.isinf(best_lp):
            assert math.isinf(float(log_prob[b]))
        else:
            assert float(log_prob[b]) == pytest.approx(best_lp, abs=1e-9)


def test_posteriors_sum_over_gaps_and_match_enumeration():
    from cbasr.losses import cb_posteriors_windowed

    W = 2
    a, lp, il, tl = _batch(3, W)
    a, lp = a.detach(), lp.detach()
    post = cb_posteriors_windowed(a, lp, il, tl)
    for b in range(len(LENGTHS)):
        T, L = int(il[b]), int(tl[b])
        if L == 0:
            continue
        # Enumerated P(t_l = t | y): path weights of the admissible emission sets.
        weights = {}
        for s in ref.cb_emission_sets(T, L):
            gaps = [min(t - prev, W) for t, prev in zip(s, (-1,) + s[:-1])]
            w = sum(
                float(torch.nn.functional.logsigmoid(a[b, t] if t in s else -a[b, t]))
                for t in range(T)
            )
            weights[s] = w + sum(float(lp[b, t, g - 1, l]) for l, (t, g) in enumerate(zip(s, gaps)))
        if not weights:
            continue
        z = torch.logsumexp(torch.tensor(list(weights.values()), dtype=F64), 0)
        expected = torch.zeros(T, L, dtype=F64)
        for s, w in weights.items():
            for l, t in enumerate(s):
                expected[t, l] += math.exp(w - float(z))
        torch.testing.assert_close(post[b, :T, :L], expected)
        torch.testing.assert_close(post[b, :T, :L].sum(0), torch.ones(L, dtype=F64))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kernel_recursions_equal_the_reference_loops(dtype, device, lattice):
    """The kernels write what the loops write: alpha, the running far sums and beta, with
    ``-inf`` weights (impossible gaps) among them, for W = 1 and W = 4."""
    if lattice != "triton":
        pytest.skip("the kernels' own test")
    from cbasr.losses import _cb_second_order_triton as kernels
    from cbasr.losses.conditional_bernoulli_second_order import (
        _reversed_window,
        _windowed_alpha,
        _windowed_beta,
    )

    g = torch.Generator().manual_seed(3)
    for W in (1, 4):
        emit = -3 * torch.rand(3, 9, W, 4, generator=g, dtype=F64)
        emit[emit < -2.5] = -math.inf
        emit_rev = _reversed_window(emit.to(dtype))
        lengths = torch.tensor([4, 2, 0])
        tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == F64 else {}
        want_alpha, want_far = _windowed_alpha(emit_rev, 4)
        got_alpha, got_far = kernels.alpha(emit_rev.to(device), 4)
        torch.testing.assert_close(got_alpha.cpu(), want_alpha, **tol)
        torch.testing.assert_close(got_far.cpu(), want_far, **tol)
        got_beta = kernels.beta(emit_rev.to(device), lengths.to(device))
        torch.testing.assert_close(got_beta.cpu(), _windowed_beta(emit_rev, lengths), **tol)
        assert got_alpha.isfinite().any() and got_beta[:9, 0, 1:].isfinite().any()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_viterbi_kernel_equals_the_reference_loop(dtype, device, lattice):
    """The max-product kernel writes the loop's alpha, best window entries and far rows, ties
    (whole-number weights) broken the same way, for W = 1, 4 and 5 (a window tile of 8 rows,
    3 of them outside the window); a NaN window entry never wins (the loop with that entry
    -inf)."""
    if lattice != "triton":
        pytest.skip("the kernels' own test")
    from cbasr.losses import _cb_second_order_triton as kernels
    from cbasr.losses.conditional_bernoulli_second_order import (
        _reversed_window,
        _windowed_viterbi,
    )

    g = torch.Generator().manual_seed(5)
    for W in (1, 4, 5):
        emit = -torch.randint(0, 3, (3, 9, W, 4), generator=g).to(F64)  # many ties
        emit[torch.rand(emit.shape, generator=g) < 0.2] = -math.inf
        emit_rev = _reversed_window(emit.to(dtype))
        want = _windowed_viterbi(emit_rev, 4)
        got = kernels.viterbi(emit_rev.to(device), 4)
        for got_one, want_one in zip(got, want, strict=True):
            torch.testing.assert_close(got_one.cpu(), want_one, rtol=0, atol=0)
        assert want[2].any() and want[0][W:].isfinite().any()
        assert want[1].any() == (W > 1)  # W = 1 has the far entry only
        if W > 1:  # a NaN in a window entry (gap 0 of frame 5, label 2): as if -inf
            nan, inf = emit.clone(), emit.clone()
            nan[0, 5, 0, 2], inf[0, 5, 0, 2] = math.nan, -math.inf
            got = kernels.viterbi(_reversed_window(nan.to(dtype)).to(device), 4)
            want = _windowed_viterbi(_reversed_window(inf.to(dtype)), 4)
            for got_one, want_one in zip(got, want, strict=True):
                torch.testing.assert_close(got_one.cpu(), want_one, rtol=0, atol=0)
