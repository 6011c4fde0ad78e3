"""cb_marginal_nll, cb_posteriors, cb_viterbi: CB paper eqs. (18), (38)-(40).

Every test runs under each backend (:mod:`cbasr._backends`): the compiled CPU lattice
(:mod:`cbasr.losses._cb_kernel`), the Triton kernels (:mod:`cbasr.losses._cb_triton`; on CPU
in Triton's interpreter, marked ``triton``) and the PyTorch recursion both stand in for."""

import math

import pytest
import torch
import torch.nn.functional as F

from cbasr._backends import use_backend
from cbasr.losses import cb_marginal_nll, cb_posteriors, cb_viterbi, ctc_nll
from tests.backends import BACKENDS, on_triton_keep, skip_interpreted
from tests.reference import lattice_enumeration as ref

F64 = torch.float64

# Ragged batch: full length, shorter frames, L = T, L = 0, L = 1.
LENGTHS = [(7, 4), (5, 2), (4, 4), (6, 0), (3, 1)]


@pytest.fixture(autouse=True, params=BACKENDS)
def lattice(request):
    """Which implementation of the lattice serves the tensors in this test."""
    with use_backend(request.param):
        yield request.param


def _batch(seed: int, lengths=LENGTHS, dtype=F64, device="cpu", pad_value=None):
    """Random ragged batch; padded entries hold ``pad_value`` (random if None)."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    T = max(t for t, _ in lengths)
    L = max(l for _, l in lengths)
    emit_logits = 2 * torch.randn(B, T, generator=g, dtype=F64)
    label_log_probs = -3 * torch.rand(B, T, L, generator=g, dtype=F64)
    if pad_value is not None:
        for b, (tb, lb) in enumerate(lengths):
            emit_logits[b, tb:] = pad_value
            label_log_probs[b, tb:] = pad_value
            label_log_probs[b, :, lb:] = pad_value
    in_lens = torch.tensor([t for t, _ in lengths])
    tgt_lens = torch.tensor([l for _, l in lengths])
    return (
        emit_logits.to(device=device, dtype=dtype).requires_grad_(),
        label_log_probs.to(device=device, dtype=dtype).requires_grad_(),
        in_lens.to(device),
        tgt_lens.to(device),
    )


def _trim(x, tb, lb=None):
    return x[:tb] if lb is None else x[:tb, :lb]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_enumeration_values_and_gradients(seed, device):
    a, lp, il, tl = _batch(seed, device=device)
    nll = cb_marginal_nll(a, lp, il, tl)
    ga, glp = torch.autograd.grad(nll.sum(), (a, lp))
    for b, (tb, lb) in enumerate(LENGTHS):
        ra = a[b].detach().cpu().clone().requires_grad_()
        rlp = lp[b].detach().cpu().clone().requires_grad_()
        want = -ref.cb_log_marginal(_trim(ra, tb), _trim(rlp, tb, lb))
        want_ga, want_glp = torch.autograd.grad(want, (ra, rlp), allow_unused=True)
        if want_glp is None:  # L_b = 0: no label term
            want_glp = torch.zeros_like(rlp)
        torch.testing.assert_close(nll[b].cpu(), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ga[b].cpu(), want_ga, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(glp[b].cpu(), want_glp, rtol=1e-10, atol=1e-12)


def test_equals_poisson_binomial_decomposition():
    # Eq. (18): log P(y) = log P(L) + log E_{b|L}[P(y | b)], P(L) Poisson-Binomial.
    a, lp, il, tl = _batch(3)
    nll = cb_marginal_nll(a, lp, il, tl)
    for b, (tb, lb) in enumerate(LENGTHS):
        want = -ref.cb_log_marginal_via_poisson_binomial(a[b, :tb], lp[b, :tb, :lb])
        torch.testing.assert_close(nll[b], want, rtol=1e-12, atol=1e-12)


def test_gradcheck(lattice):
    skip_interpreted(lattice, "gradcheck runs the lattice once per input element")
    a, lp, il, tl = _batch(4, lengths=[(5, 3), (4, 1), (3, 0)])
    assert torch.autograd.gradcheck(lambda x, y: cb_marginal_nll(x, y, il, tl), (a, lp))


def test_hand_worked_value():
    # T = 2, L = 1. P(B_1 = 1) = sigmoid(0) = 1/2, P(B_2 = 1) = sigmoid(log 3) = 3/4,
    # P(y_1 | t = 1) = 0.2, P(y_1 | t = 2) = 0.6.
    # P(y) = (1/2)(1 - 3/4)(0.2) + (1 - 1/2)(3/4)(0.6) = 0.025 + 0.225 = 0.25, so -log P = log 4.
    a = torch.tensor([[0.0, math.log(3.0)]], dtype=F64)
    lp = torch.log(torch.tensor([[[0.2], [0.6]]], dtype=F64))
    nll = cb_marginal_nll(a, lp, torch.tensor([2]), torch.tensor([1]))
    torch.testing.assert_close(nll, torch.tensor([math.log(4.0)], dtype=F64))
    # The same inputs, by hand, for the posteriors and the best path:
    # P(t_1 = 0 | y) = 0.025 / 0.25 = 0.1; best path emits at frame 1 with log 0.225.
    post = cb_posteriors(a, lp, torch.tensor([2]), torch.tensor([1]))
    torch.testing.assert_close(post, torch.tensor([[[0.1], [0.9]]], dtype=F64))
    times, best = cb_viterbi(a, lp, torch.tensor([2]), torch.tensor([1]))
    assert times.tolist() == [[1]]
    torch.testing.assert_close(best, torch.tensor([math.log(0.225)], dtype=F64))


@pytest.mark.parametrize("seed", [0, 5])
def test_viterbi_matches_enumeration(seed, device):
    a, lp, il, tl = _batch(seed, device=device)
    times, log_prob = cb_viterbi(a, lp, il, tl)
    assert times.dtype == torch.long and times.shape == (len(LENGTHS), 4)
    for b, (tb, lb) in enumerate(LENGTHS):
        best, best_lp = ref.cb_best_path(a[b, :tb].detach().cpu(), lp[b, :tb, :lb].detach().cpu())
        assert times[b].tolist() == list(best) + [-1] * (4 - lb)
        assert log_prob[b].item() == pytest.approx(best_lp, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 6])
def test_posteriors_match_enumeration_and_sum_to_one(seed, device):
    a, lp, il, tl = _batch(seed, device=device)
    post = cb_posteriors(a, lp, il, tl).cpu()
    assert post.shape == lp.shape
    for b, (tb, lb) in enumerate(LENGTHS):
        want = ref.cb_posteriors(a[b, :tb].detach().cpu(), lp[b, :tb, :lb].detach().cpu())
        torch.testing.assert_close(post[b, :tb, :lb], want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(post[b, :tb, :lb].sum(0), torch.ones(lb, dtype=F64))
        assert post[b, tb:].abs().sum() == 0 and post[b, :, lb:].abs().sum() == 0


def _history_free_inputs(seed, B, T, V, targets):
    """Eq. (39) setting: P(y_l | t_l, y_<l) = P(y_l | t) from a per-frame softmax over V."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(B, T, generator=g, dtype=F64).requires_grad_()
    scores = torch.randn(B, T, V, generator=g, dtype=F64).requires_grad_()
    label_dist = scores.log_softmax(-1)  # (B, T, V): log P(v | t)
    gathered = label_dist.gather(2, targets[:, None, :].expand(B, T, targets.shape[1]))
    return a, scores, label_dist, gathered  # gathered: (B, T, L)


def test_ctc_relation_no_merge_enumeration():
    # Eqs. (39)-(40): P(y'_t = -) = P(B_t = 0), P(y'_t = v) = P(B_t = 1) P(v | t); the CB
    # marginal is the sum over augmented strings whose blank-removal is y, repeats NOT merged.
    targets = torch.tensor([[1, 1, 0], [2, 2, 2], [0, 1, 2]])
    il, tl = torch.tensor([6, 5, 4]), torch.tensor([3, 3, 2])
    a, _, label_dist, gathered = _history_free_inputs(7, 3, 6, 3, targets)
    nll = cb_marginal_nll(a, gathered, il, tl)
    for b in range(3):
        tb, lb = int(il[b]), int(tl[b])
        want = -ref.no_merge_ctc_log_marginal(
            F.logsigmoid(-a[b, :tb]),
            F.logsigmoid(a[b, :tb])[:, None] + label_dist[b, :tb],
            targets[b, :lb].tolist(),
        )
        torch.testing.assert_close(nll[b], want, rtol=1e-12, atol=1e-12)


def _interleave_forced_blanks(a, label_dist):
    """CTC input over ``2T`` frames: frame ``2t`` is eq. (39)'s augmented distribution written
    as a log-softmax of ``[0, a_t + log P(v | t)]`` (its normaliser is ``1 + e^{a_t}``), frame
    ``2t + 1`` is blank with probability 1. A blank between any two real frames means CTC can
    never merge two emissions, so its alignments are exactly the no-merge strings of eq. (40).
    """
    B, T, V = label_dist.shape
    real = torch.cat([torch.zeros(B, T, 1, dtype=F64), a[:, :, None] + label_dist], dim=2)
    forced = torch.full((B, T, V + 1), float("-inf"), dtype=F64)
    forced[:, :, 0] = 0.0
    frames = torch.stack([real, forced], dim=2).reshape(B, 2 * T, V + 1)  # (B, 2T, V + 1)
    return frames.log_softmax(-1)


def test_ctc_relation_exact_via_torch_ctc_loss():
    # F.ctc_loss as an independent oracle for eqs. (39)-(40), values and gradients, with
    # repeated labels, ragged lengths and L = T.
    targets = torch.tensor([[1, 1, 0, 0], [2, 0, 2, 1], [0, 1, 2, 2]])
    il, tl = torch.tensor([6, 5, 4]), torch.tensor([4, 2, 4])
    a, scores, label_dist, gathered = _history_free_inputs(8, 3, 6, 3, targets)
    cb = cb_marginal_nll(a, gathered, il, tl)
    ctc = ctc_nll(_interleave_forced_blanks(a, label_dist), targets + 1, 2 * il, tl, blank=0)
    torch.testing.assert_close(cb, ctc, rtol=1e-12, atol=1e-12)
    g_cb = torch.autograd.grad(cb.sum(), (a, scores), retain_graph=True)
    g_ctc = torch.autograd.grad(ctc.sum(), (a, scores))
    torch.testing.assert_close(g_cb, g_ctc, rtol=1e-10, atol=1e-12)


def test_differs_from_standard_ctc_which_merges_repeats():
    # Without the forced blanks, CTC also counts alignments where one label spans several
    # frames (and needs a blank between repeats): the sums differ.
    targets = torch.tensor([[1, 1]])
    a, _, label_dist, gathered = _history_free_inputs(9, 1, 4, 2, targets)
    cb = cb_marginal_nll(a, gathered, torch.tensor([4]), torch.tensor([2]))
    augmented = torch.cat([torch.zeros(1, 4, 1, dtype=F64), a[:, :, None] + label_dist], 2)
    ctc = ctc_nll(augmented.log_softmax(-1), targets + 1, torch.tensor([4]), torch.tensor([2]))
    assert abs(cb.item() - ctc.item()) > 1e-3


def test_batch_and_padding_invariance():
    # NaN in every padded position: values and gradients must equal each utterance alone,
    # and padded positions get exactly zero gradient.
    a, lp, il, tl = _batch(10, pad_value=float("nan"))
    nll = cb_marginal_nll(a, lp, il, tl)
    ga, glp = torch.autograd.grad(nll.sum(), (a, lp))
    assert torch.isfinite(ga).all() and torch.isfinite(glp).all()
    for b, (tb, lb) in enumerate(LENGTHS):
        a1 = a[b : b + 1, :tb].detach().clone().requires_grad_()
        lp1 = lp[b : b + 1, :tb, :lb].detach().clone().requires_grad_()
        one = cb_marginal_nll(a1, lp1, torch.tensor([tb]), torch.tensor([lb]))
        g1a, g1lp = torch.autograd.grad(one.sum(), (a1, lp1))
        torch.testing.assert_close(nll[b : b + 1], one, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ga[b, :tb], g1a[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(glp[b, :tb, :lb], g1lp[0], rtol=1e-12, atol=1e-12)
        assert ga[b, tb:].abs().sum() == 0
        assert glp[b, tb:].abs().sum() == 0 and glp[b, :, lb:].abs().sum() == 0


def test_float32_long_utterances_are_stable(lattice):
    skip_interpreted(lattice, "T = 2000 frames")
    # T = 2000, L = 400: finite, and close to the float64 value and gradients.
    g = torch.Generator().manual_seed(11)
    B, T, L = 2, 2000, 400
    a64 = torch.randn(B, T, generator=g, dtype=F64)
    lp64 = 3 * torch.randn(B, T, L, generator=g, dtype=F64).log_softmax(-1)
    il, tl = torch.tensor([2000, 1700]), torch.tensor([400, 350])
    out = {}
    for dtype in (torch.float32, F64):
        a = a64.to(dtype).requires_grad_()
        lp = lp64.to(dtype).requires_grad_()
        nll = cb_marginal_nll(a, lp, il, tl)
        out[dtype] = (nll, *torch.autograd.grad(nll.sum(), (a, lp)))
    nll32, ga32, glp32 = out[torch.float32]
    nll64, ga64, glp64 = out[F64]
    assert torch.isfinite(nll32).all() and torch.isfinite(ga32).all()
    assert torch.isfinite(glp32).all()
    torch.testing.assert_close(nll32.double(), nll64, rtol=1e-6, atol=0)
    # Gradients are posteriors in [0, 1]; torch's float32 CTC is off by about 8e-3 at this size.
    torch.testing.assert_close(ga32.double(), ga64, rtol=0, atol=5e-3)
    torch.testing.assert_close(glp32.double(), glp64, rtol=0, atol=5e-3)


def test_more_labels_than_frames_gives_inf_and_zero_gradient_when_asked():
    a, lp, _, _ = _batch(12, lengths=[(5, 4), (5, 4)])
    il, tl = torch.tensor([5, 3]), torch.tensor([4, 4])  # utterance 1: L = 4 > T = 3
    nll = cb_marginal_nll(a, lp, il, tl, impossible="inf")
    assert torch.isfinite(nll[0]) and nll[1].item() == float("inf")
    ga, glp = torch.autograd.grad(nll.sum(), (a, lp))
    assert torch.isfinite(ga).all() and torch.isfinite(glp).all()
    assert ga[1].abs().sum() == 0 and glp[1].abs().sum() == 0
    assert ga[0].abs().sum() > 0
    times, best = cb_viterbi(a, lp, il, tl)
    assert times[1].tolist() == [-1] * 4 and best[1].item() == float("-inf")
    assert cb_posteriors(a, lp, il, tl)[1].abs().sum() == 0


def test_zero_probability_labels_give_inf_and_zero_gradient():
    a, lp, il, tl = _batch(13, lengths=[(4, 2)])
    impossible = lp.detach().clone()
    impossible[0, :, 1] = float("-inf")  # label 1 has probability 0 at every frame
    impossible.requires_grad_()
    nll = cb_marginal_nll(a, impossible, il, tl)
    assert nll.item() == float("inf")
    ga, glp = torch.autograd.grad(nll.sum(), (a, impossible))
    assert ga.abs().sum() == 0 and glp.abs().sum() == 0


def test_more_labels_than_frames_raises_by_default_naming_the_utterance():
    a, lp, _, _ = _batch(14, lengths=[(5, 4), (5, 4)])
    with pytest.raises(ValueError, match=r"target_lengths\[1\] = 4 > input_lengths\[1\] = 3"):
        cb_marginal_nll(a, lp, torch.tensor([5, 3]), torch.tensor([4, 4]))
    with pytest.raises(ValueError, match="impossible"):
        cb_marginal_nll(a, lp, torch.tensor([5, 5]), torch.tensor([4, 4]), impossible="nan")


def test_empty_target_is_probability_of_no_emission():
    a, lp, il, tl = _batch(15, lengths=[(5, 0), (3, 2)])
    nll = cb_marginal_nll(a, lp, il, tl)
    torch.testing.assert_close(nll[0], -F.logsigmoid(-a[0, :5]).sum())


def test_length_dtypes_layouts_mixed_precision_and_empty_batches(device):
    a, lp, il, tl = _batch(20, device=device)
    want = cb_marginal_nll(a, lp, il, tl)
    torch.testing.assert_close(cb_marginal_nll(a, lp, il.int(), tl.int()), want, rtol=0, atol=0)
    narrow = cb_marginal_nll(a, lp, il.to(torch.uint8), tl.to(torch.uint8))
    torch.testing.assert_close(narrow, want, rtol=0, atol=0)
    both = torch.stack([il, tl], dim=1)  # lengths as strided columns of one tensor
    torch.testing.assert_close(cb_marginal_nll(a, lp, both[:, 0], both[:, 1]), want)
    shared = torch.tensor([4], device=il.device).expand(len(il))  # one length, broadcast
    short = cb_marginal_nll(a, lp, shared, tl.clamp(max=4))
    for b in range(len(il)):
        one = cb_marginal_nll(a[b : b + 1], lp[b : b + 1], shared[:1], tl[b : b + 1].clamp(max=4))
        torch.testing.assert_close(short[b : b + 1], one, rtol=1e-12, atol=0)
    mixed = cb_marginal_nll(a.float(), lp, il, tl)  # computed in the wider dtype
    assert mixed.dtype == F64
    torch.testing.assert_close(mixed, want, rtol=1e-6, atol=0)
    ga, glp = torch.autograd.grad(mixed.sum(), (a, lp))
    assert ga.dtype == F64 and torch.isfinite(glp).all()
    none = cb_marginal_nll(a[:0], lp[:0], il[:0], tl[:0])
    assert none.shape == (0,)
    none.sum().backward()  # no utterance, no error


def test_extreme_logits_without_labels_are_exact(device):
    # L = 0, one frame each: -log P(y) = softplus(a), to the last bits also where it is tiny
    values = [-40.0, -20.0, -12.0, -9.3, -9.2, -9.0, -7.0, -1e-3, 0.0, 1e-5, 3.0, 20.0, 40.0]
    a = torch.tensor(values, dtype=F64)[:, None].to(device).requires_grad_()
    n = len(values)
    ones, zeros = torch.ones(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    nll = cb_marginal_nll(a, a.new_zeros(n, 1, 0), ones, zeros)
    torch.testing.assert_close(nll, F.softplus(a.detach())[:, 0], rtol=4e-16, atol=0)
    (grad,) = torch.autograd.grad(nll.sum(), a)
    torch.testing.assert_close(grad, torch.sigmoid(a.detach()), rtol=1e-15, atol=1e-300)


def test_shape_and_length_errors_name_the_argument():
    a, lp, il, tl = _batch(16, lengths=[(5, 3), (4, 2)])
    with pytest.raises(ValueError, match="label_log_probs must have shape"):
        cb_marginal_nll(a, lp[:, :4], il, tl)
    with pytest.raises(ValueError, match="label_log_probs must have shape"):
        cb_marginal_nll(a, lp[:1], il, tl)
    with pytest.raises(ValueError, match="emit_logits must have shape"):
        cb_marginal_nll(a[:, :, None], lp, il, tl)
    with pytest.raises(ValueError, match=r"input_lengths\[0\] = 6"):
        cb_marginal_nll(a, lp, torch.tensor([6, 4]), tl)
    with pytest.raises(ValueError, match=r"target_lengths\[1\] = 4"):
        cb_posteriors(a, lp, il, torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="input_lengths must have shape"):
        cb_viterbi(a, lp, torch.tensor([5]), tl)
    with pytest.raises(ValueError, match="target_lengths must hold integers"):
        cb_marginal_nll(a, lp, il, tl.double())


@on_triton_keep(lambda case: case["seed"] < 5)  # each kernel path: the other seeds repeat it
@pytest.mark.parametrize("seed", range(20))
def test_random_sizes_match_enumeration(seed):
    # Wider sweep than the default suite: random ragged batches up to T = 7, L = 4, values,
    # gradients, best paths and posteriors.
    g = torch.Generator().manual_seed(100 + seed)
    lengths = []
    for _ in range(4):
        tb = int(torch.randint(1, 8, (1,), generator=g))
        lengths.append((tb, int(torch.randint(0, min(tb, 4) + 1, (1,), generator=g))))
    a, lp, il, tl = _batch(seed, lengths=lengths)
    nll = cb_marginal_nll(a, lp, il, tl)
    ga, glp = torch.autograd.grad(nll.sum(), (a, lp))
    times, best = cb_viterbi(a, lp, il, tl)
    post = cb_posteriors(a, lp, il, tl)
    for b, (tb, lb) in enumerate(lengths):
        ra = a[b].detach().clone().requires_grad_()
        rlp = lp[b].detach().clone().requires_grad_()
        want = -ref.cb_log_marginal(ra[:tb], rlp[:tb, :lb])
        want_ga, want_glp = torch.autograd.grad(want, (ra, rlp), allow_unused=True)
        want_glp = torch.zeros_like(rlp) if want_glp is None else want_glp
        torch.testing.assert_close(nll[b], want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ga[b], want_ga, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(glp[b], want_glp, rtol=1e-10, atol=1e-12)
        path, path_lp = ref.cb_best_path(ra.detach()[:tb], rlp.detach()[:tb, :lb])
        assert times[b, :lb].tolist() == list(path)
        assert best[b].item() == pytest.approx(path_lp, abs=1e-12)
        want_post = ref.cb_posteriors(ra.detach()[:tb], rlp.detach()[:tb, :lb])
        torch.testing.assert_close(post[b, :tb, :lb], want_post, rtol=1e-10, atol=1e-12)
