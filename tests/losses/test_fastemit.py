"""FastEmit (Yu et al. 2021, arXiv:2010.11148): the label edges' gradient is 1 + lambda times
the NLL's, the blank edges' unchanged, the value the NLL; against enumeration of every path."""

import pytest
import torch
import torch.nn.functional as F

from cbasr import builder
from cbasr._backends import use_backend
from cbasr.losses import hat_nll, hat_nll_from_logits, rnnt_lattice_nll, transducer_lattice_nll
from tests.backends import BACKENDS, on_triton_keep
from tests.reference import lattice_enumeration as ref
from tests.search import tiny

F64 = torch.float64
UTTERANCES = [(5, [1, 2, 2]), (4, [2]), (3, [])]  # (T_b, targets)
LAMBDA = 0.7


@pytest.fixture(autouse=True, params=BACKENDS)
def lattice(request):
    with use_backend(request.param):
        yield request.param


def _lengths():
    frames = torch.tensor([t for t, _ in UTTERANCES])
    labels = torch.tensor([len(y) for _, y in UTTERANCES])
    return frames, labels


def _enumerated_gradients(blank, emit, monotonic, lam=LAMBDA):
    """``d(-log P)/d blank`` and ``d(-log P)/d emit`` of each utterance by enumeration, the
    label edges' times ``1 + lam``: FastEmit's gradient by its definition."""
    grads = [torch.zeros_like(blank), torch.zeros_like(emit)]
    for b, (T, y) in enumerate(UTTERANCES):
        U = len(y)
        bl = blank[b, :T, : U + 1].detach().requires_grad_()
        em = emit[b, :T, :U].detach().requires_grad_()
        (-ref.transducer_log_marginal(bl, em, monotonic)).backward()
        grads[0][b, :T, : U + 1] = bl.grad
        if U:
            grads[1][b, :T, :U] = (1 + lam) * em.grad
    return grads


@pytest.mark.parametrize("monotonic", [False, True])
def test_the_label_edges_gradient_is_one_plus_lambda_times_the_nll_s(monotonic):
    g = torch.Generator().manual_seed(0)
    frames, labels = _lengths()
    blank = F.logsigmoid(torch.randn(3, 5, 4, generator=g, dtype=F64)).requires_grad_()
    emit = F.logsigmoid(torch.randn(3, 5, 3, generator=g, dtype=F64)).requires_grad_()
    nll = transducer_lattice_nll(blank, emit, frames, labels, monotonic, fastemit=LAMBDA)
    plain = transducer_lattice_nll(blank, emit, frames, labels, monotonic)
    torch.testing.assert_close(nll, plain)  # the value is the NLL
    nll.sum().backward()
    want_blank, want_emit = _enumerated_gradients(blank, emit, monotonic)
    torch.testing.assert_close(blank.grad, want_blank)
    torch.testing.assert_close(emit.grad, want_emit)
    assert emit.grad.abs().max() > 0.1
    blank.grad, emit.grad = None, None  # without the option: the NLL's gradient
    plain.sum().backward()
    torch.testing.assert_close(blank.grad, want_blank)
    torch.testing.assert_close(emit.grad, want_emit / (1 + LAMBDA))


def test_rnnt_logits_get_the_scaled_edges_gradient_through_the_softmax():
    g = torch.Generator().manual_seed(1)
    frames, labels = _lengths()
    logits = torch.randn(3, 5, 4, 3, generator=g, dtype=F64).requires_grad_()
    targets = torch.tensor([[1, 2, 2], [2, 0, 0], [0, 0, 0]])
    rnnt_lattice_nll(logits, targets, frames, labels, fastemit=LAMBDA).sum().backward()
    fastemit_grad, logits.grad = logits.grad, None
    rnnt_lattice_nll(logits, targets, frames, labels).sum().backward()
    for lam, got in ((LAMBDA, fastemit_grad), (0.0, logits.grad)):  # the default: no FastEmit
        leaf = logits.detach().requires_grad_()
        log_probs = leaf.log_softmax(dim=-1)
        blank = log_probs[..., 0]
        index = targets[:, None, :, None].expand(3, 5, 3, 1)
        emit = log_probs[:, :, :-1].gather(-1, index)[..., 0]
        want_blank, want_emit = _enumerated_gradients(blank, emit, False, lam)
        torch.autograd.backward([blank, emit], [want_blank, want_emit])
        torch.testing.assert_close(got, leaf.grad)


@pytest.mark.parametrize("lam", [LAMBDA, 1.0, None])
@pytest.mark.parametrize("from_logits", [True, False])
def test_hat_splits_the_scaled_label_edge_into_its_blank_and_label_parts(lam, from_logits):
    """HAT's label edge is ``log sigmoid(-b) + log P(y)``: the blank logit gets the blank
    edge's gradient plus 1 + lambda times the label edge's through ``log sigmoid(-b)``
    (``lam`` None: the option left out, the NLL's gradient)."""
    g = torch.Generator().manual_seed(2)
    frames, labels = _lengths()
    blank_logits = torch.randn(3, 5, 4, generator=g, dtype=F64).requires_grad_()
    units = torch.randn(3, 5, 4, 3, generator=g, dtype=F64).requires_grad_()
    targets = torch.tensor([[1, 2, 2], [2, 0, 0], [0, 0, 0]])
    options = {} if lam is None else {"fastemit": lam}
    if from_logits:
        nll = hat_nll_from_logits(blank_logits, units, targets, frames, labels, **options)
    else:
        log_probs = units.log_softmax(dim=-1)
        nll = hat_nll(blank_logits, log_probs, targets, frames, labels, **options)
    nll.sum().backward()
    b, u = blank_logits.detach().requires_grad_(), units.detach().requires_grad_()
    label_lp = u.log_softmax(dim=-1)[:, :, :-1]
    label_lp = label_lp.gather(-1, targets[:, None, :, None].expand(3, 5, 3, 1))[..., 0]
    blank = F.logsigmoid(b)
    emit = F.logsigmoid(-b[:, :, :-1]) + label_lp
    want_blank, want_emit = _enumerated_gradients(blank, emit, False, lam or 0.0)
    torch.autograd.backward([blank, emit], [want_blank, want_emit])
    valid = torch.zeros(3, 5, 4, dtype=torch.bool)
    for i, (T, y) in enumerate(UTTERANCES):
        valid[i, :T, : len(y) + 1] = True
    torch.testing.assert_close(blank_logits.grad[valid], b.grad[valid])
    torch.testing.assert_close(units.grad, u.grad)


def test_lambda_must_not_be_negative():
    frames, labels = _lengths()
    blank, emit = torch.zeros(3, 5, 4), torch.zeros(3, 5, 3)
    targets, logits = torch.ones(3, 3, dtype=torch.long), torch.zeros(3, 5, 4, 3)
    calls = [
        lambda: transducer_lattice_nll(blank, emit, frames, labels, fastemit=-0.1),
        lambda: rnnt_lattice_nll(logits, targets, frames, labels, fastemit=-0.1),
        lambda: hat_nll(blank, logits, targets, frames, labels, fastemit=-0.1),
        lambda: hat_nll_from_logits(blank, logits, targets, frames, labels, fastemit=-0.1),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="fastemit .* must be >= 0, got -0.1"):
            call()


# the option's way to the loss; the kernels' FastEmit: the tests above, on every backend
@on_triton_keep(lambda case: False)
@pytest.mark.parametrize("prune_range", [0, 3])
@pytest.mark.parametrize("name", ["transducer", "hat"])
def test_the_model_option_scales_the_training_gradient_of_rnnt_and_hat(name, prune_range):
    feats, lens = tiny.batch(seed=3)
    targets = torch.tensor([[1, 2, 2], [3, 1, 0], [4, 0, 0], [2, 0, 0]])
    target_lens = torch.tensor([3, 2, 1, 1])
    grads = {}
    for lam in (0.0, 0.5):
        options = {"fastemit_lambda": lam, "prune_range": prune_range}
        model = tiny.build(name, seed=2, loss_options=options).train()
        torch.manual_seed(0)
        out = model.loss(feats, lens, targets, target_lens)
        out.loss.sum().backward()
        grads[lam] = (out.nll.detach(), model.decoder.joint.out[-1].weight.grad.clone())
    torch.testing.assert_close(grads[0.5][0], grads[0.0][0])  # the same NLL
    assert not torch.allclose(grads[0.5][1], grads[0.0][1])  # a different gradient


def test_on_a_cpu_the_rnnt_model_takes_the_lattice_not_torchaudio(monkeypatch):
    """torchaudio's loss serves only CUDA's standard topology without FastEmit."""
    import cbasr.models.transducer as module

    def refuse(*args, **kwargs):
        raise AssertionError("torchaudio's rnnt_loss on a CPU")

    monkeypatch.setattr(module, "rnnt_nll", refuse)
    model = tiny.build("transducer", seed=2)
    feats, lens = tiny.batch(seed=3)
    targets, target_lens = (
        torch.tensor([[1, 2], [3, 1], [4, 0], [2, 0]]),
        torch.tensor([2, 2, 1, 1]),
    )
    assert torch.isfinite(model.loss(feats, lens, targets, target_lens).nll).all()


def test_the_model_refuses_what_fastemit_does_not_apply_to():
    with pytest.raises(ValueError, match="fastemit_lambda must be >= 0"):
        tiny.build("hat", loss_options={"fastemit_lambda": -1.0})
    with pytest.raises(ValueError, match="fastemit_lambda applies to the rnnt and hat losses"):
        builder.build_model(
            tiny.ENCODER,
            tiny.DECODERS["tdt"],
            {"name": "tdt", "fastemit_lambda": 0.1},
            tiny.FEATS,
            5,
        )
