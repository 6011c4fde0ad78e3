"""CB and transducer decoders: step-by-step decoding equals the teacher-forced forward pass,
padding and batch never change a result, and the monotonic windows equal a direct softmax."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cbasr.config.schema import LabelContextConfig
from cbasr.losses import cb_marginal_nll_windowed
from cbasr.modules.decoders import (
    AttentionEmissionDecoder,
    AutoregressiveDecoder,
    LabelOrder,
    MonotonicAttentionDecoder,
    PointwiseDecoder,
    TransducerDecoder,
)

D, V = 6, 7  # encoder width, vocabulary with blank
LABEL = LabelContextConfig(embed_dim=4, hidden=5)  # the small decoders' label network

CB_DECODERS = {
    "pointwise": lambda: PointwiseDecoder(D, V, hidden=5),
    "attention_emission": lambda: AttentionEmissionDecoder(D, V, label=LABEL, joint_dim=6),
    "monotonic": lambda: MonotonicAttentionDecoder(D, V, window=3, attention_dim=4, label=LABEL),
    "monotonic_variable": lambda: MonotonicAttentionDecoder(
        D, V, window=4, variable=True, attention_dim=4, label=LABEL
    ),
    "autoregressive": lambda: AutoregressiveDecoder(D, V, label=LABEL, emission_hidden=3),
    "autoregressive_luo": lambda: AutoregressiveDecoder(D, V, label=LABEL, emission="decoder"),
}


def _times(T: int, L: int, gap: int | None = None, seed: int = 0) -> list[int]:
    """Increasing emission times in [0, T), consecutive gaps (from -1) at most ``gap``."""
    rng = torch.Generator().manual_seed(seed)
    while True:
        times = sorted(torch.randperm(T, generator=rng)[:L].tolist())
        gaps = [b - a for a, b in zip([-1] + times, times)]
        if gap is None or max(gaps) <= gap:
            return times


def _stepwise(decoder, h, lens, targets, times):
    """Teacher-force ``targets`` at ``times`` through begin/candidates/commit: per-frame emission
    logits ``(B, T)`` and the label log probabilities at the emission times ``(B, L)``."""
    B, T, _ = h.shape
    state = decoder.begin(h, lens)
    emit, labels = torch.zeros(B, T), torch.zeros(B, targets.shape[1])
    for t in range(T):
        a, log_probs = decoder.candidates(state, t)
        emit[:, t] = a
        emitted = torch.zeros(B, dtype=torch.bool)
        for b in range(B):
            if t in times[b]:
                l = times[b].index(t)
                labels[b, l] = log_probs[b, targets[b, l] - 1]
                emitted[b] = True
        chosen = torch.tensor(
            [targets[b, times[b].index(t)] if t in times[b] else 1 for b in range(B)]
        )
        state = decoder.commit(state, t, emitted, chosen)
    return emit, labels


@pytest.mark.parametrize("name", sorted(CB_DECODERS))
def test_step_by_step_equals_teacher_forced(name):
    torch.manual_seed(0)
    decoder = CB_DECODERS[name]().eval()
    B, T, L = 2, 9, 4
    h, lens = torch.randn(B, T, D), torch.tensor([T, T])
    targets = torch.randint(1, V, (B, L))
    gap = decoder.window if getattr(decoder, "variable", False) else None
    times = [_times(T, L, gap, seed=b) for b in range(B)]
    emit, labels = _stepwise(decoder, h, lens, targets, times)
    idx = torch.tensor(times)  # (B, L)
    if decoder.order is LabelOrder.HISTORY:
        expected = decoder.label_log_probs(h, targets, idx.unsqueeze(0))[0]
        if not decoder.autoregressive_emissions:
            emit_logits, rewards = decoder.reward_fn(h, lens, targets, torch.tensor([L, L]))
            torch.testing.assert_close(emit, emit_logits)
            torch.testing.assert_close(rewards(idx.unsqueeze(0))[0], expected)
    else:
        emit_logits, terms = decoder.cb_terms(h, lens, targets, torch.tensor([L, L]))
        torch.testing.assert_close(emit, emit_logits)
        rows = torch.arange(B).unsqueeze(1)
        if decoder.order is LabelOrder.MEMORYLESS:
            expected = terms[rows, idx, torch.arange(L)]  # (B, L)
        else:
            gaps = idx - torch.cat([torch.full((B, 1), -1), idx[:, :-1]], dim=1)  # t_l - t_{l-1}
            expected = terms[rows, idx, gaps - 1, torch.arange(L)]
    torch.testing.assert_close(labels, expected, atol=1e-5, rtol=1e-5)


def test_luo_emissions_depend_on_the_decoder_state():
    torch.manual_seed(0)
    decoder = CB_DECODERS["autoregressive_luo"]().eval()
    h = torch.randn(1, 5, D)
    state = decoder.begin(h, torch.tensor([5]))
    a0, _ = decoder.candidates(state, 1)
    state = decoder.commit(state, 1, torch.tensor([True]), torch.tensor([3]))
    a1, _ = decoder.candidates(state, 1)  # same frame, after an emission
    assert not torch.allclose(a0, a1)
    with pytest.raises(TypeError, match="depend on the decoder state"):
        decoder.reward_fn(h, torch.tensor([5]), torch.tensor([[1]]), torch.tensor([1]))


@pytest.mark.parametrize(
    "name", ["pointwise", "attention_emission", "monotonic", "monotonic_variable"]
)
def test_padding_and_batch_never_change_a_result(name):
    torch.manual_seed(0)
    decoder = CB_DECODERS[name]().eval()
    lens, target_lens = torch.tensor([9, 6]), torch.tensor([4, 2])
    h = torch.randn(2, 11, D)
    targets = torch.randint(1, V, (2, 5))
    emit, terms = decoder.cb_terms(h, lens, targets, target_lens)
    for b in range(2):
        T, L = int(lens[b]), int(target_lens[b])
        e1, t1 = decoder.cb_terms(
            h[b : b + 1, :T], lens[b : b + 1], targets[b : b + 1, :L], target_lens[b : b + 1]
        )
        torch.testing.assert_close(emit[b, :T], e1[0])
        torch.testing.assert_close(terms[b, :T, ..., :L], t1[0], atol=1e-5, rtol=1e-5)


def _direct_window(decoder, h, g, first, t):
    """Softmax attention over frames first..t by its definition, then the output distribution."""
    keys, values, q = (
        decoder.key(h[first : t + 1]),
        decoder.value(h[first : t + 1]),
        decoder.query(g),
    )
    weights = torch.softmax(keys @ q / math.sqrt(q.shape[-1]), dim=0)
    return decoder._output(weights @ values, decoder.label_proj(g))


@pytest.mark.parametrize("variable", [False, True])
def test_monotonic_windows_equal_a_direct_softmax(variable):
    """Every label term the lattice can read is the softmax attention over its window by the
    definition (the variable window's folded projections and per-row softmax included); the
    variable window's unreachable cells are 0."""
    torch.manual_seed(0)
    W, T, L = 3, 7, 3
    decoder = MonotonicAttentionDecoder(
        D, V, window=W, variable=variable, attention_dim=4, label=LABEL
    ).eval()
    h, targets = torch.randn(1, T, D), torch.randint(1, V, (1, L))
    with torch.no_grad():
        g = decoder.label_context(targets)[0, :L]  # (L, H)
        _, terms = decoder.cb_terms(h, torch.tensor([T]), targets, torch.tensor([L]))
        for t in range(T):
            for l in range(L):
                y = int(targets[0, l]) - 1
                if not variable:
                    direct = _direct_window(decoder, h[0], g[l], max(0, t - W + 1), t)
                    torch.testing.assert_close(terms[0, t, l], direct[y])
                    continue
                for d in range(W):
                    reachable = l <= t <= T - L + l and (
                        d == min(t, W - 1) if l == 0 else t - T + L - l <= d <= t - l
                    )
                    if reachable:  # d = W - 1 also stands for longer gaps: the last W frames
                        direct = _direct_window(decoder, h[0], g[l], t - d, t)
                        torch.testing.assert_close(terms[0, t, d, l], direct[y])
                    else:
                        assert terms[0, t, d, l] == 0.0


def test_variable_window_keeps_the_last_w_frames_of_a_longer_gap_when_decoding():
    """A gap beyond W = 4 has the label distribution of gap W ending at the same frame: the
    teacher-forced term at d = W - 1 (here for the first label, previous emission frame -1)."""
    decoder = CB_DECODERS["monotonic_variable"]().eval()
    W, T = decoder.window, 9
    h, targets = torch.randn(1, T, D), torch.tensor([[2]])
    state = decoder.begin(h, torch.tensor([T]))
    with torch.no_grad():
        _, terms = decoder.cb_terms(h, torch.tensor([T]), targets, torch.tensor([1]))
        for t in (3, 4, 7):  # gaps 4 (= W), 5 and 8 from t = -1
            _, log_probs = decoder.candidates(state, t)
            assert torch.isfinite(log_probs).all()
            torch.testing.assert_close(log_probs[0, 1], terms[0, t, min(t, W - 1), 0])


@pytest.mark.parametrize(
    "joint,blank_joint", [("rnnt", "tanh"), ("hat", "tanh"), ("hat", "linear")]
)
@pytest.mark.parametrize("context", [-1, 0, 2])
def test_transducer_frame_scores_equal_the_teacher_forced_lattice(joint, blank_joint, context):
    torch.manual_seed(0)
    decoder = TransducerDecoder(
        D,
        V,
        joint=joint,
        label=LabelContextConfig(embed_dim=4, hidden=5, context=context),
        joint_dim=6,
        blank_joint=blank_joint,
    ).eval()
    B, T, U = 2, 5, 3
    h, lens, targets = torch.randn(B, T, D), torch.tensor([T, T]), torch.randint(1, V, (B, U))
    out = decoder(h, lens, targets)
    if joint == "rnnt":
        log_probs = out.log_softmax(-1)  # (B, T, U + 1, V)
        blank_ref, label_ref = log_probs[..., 0], log_probs[..., 1:]
    else:
        blank_logits, label_log_probs = out
        blank_ref = torch.nn.functional.logsigmoid(blank_logits)
        label_ref = torch.nn.functional.logsigmoid(-blank_logits).unsqueeze(-1) + label_log_probs
    state = decoder.begin(h, lens)
    for u in range(U + 1):  # walk up the label axis at every frame
        for t in range(T):
            blank, labels = decoder.frame_scores(state, t)
            torch.testing.assert_close(blank, blank_ref[:, t, u])
            torch.testing.assert_close(labels, label_ref[:, t, u])
        if u < U:
            state = decoder.commit(state, torch.ones(B, dtype=torch.bool), targets[:, u])


@pytest.mark.parametrize("blank_joint", ["tanh", "linear"])
def test_hat_internal_lm_drops_the_encoder(blank_joint):
    torch.manual_seed(0)
    decoder = TransducerDecoder(
        D, V, joint="hat", label=LABEL, joint_dim=6, blank_joint=blank_joint
    ).eval()
    targets = torch.randint(1, V, (2, 3))
    ilm = decoder.internal_lm_log_probs(targets)  # (B, U + 1, V - 1)
    g2 = decoder.joint.label_proj(decoder.prediction(targets))
    label_units = decoder.joint.out(g2)[..., -(V - 1) :]  # the tanh blank is unit 0, not a label
    torch.testing.assert_close(ilm, label_units.log_softmax(-1))
    # the label units are the ones the joint's label distribution uses with the encoder side
    h = torch.zeros(2, 1, D)
    with torch.no_grad():
        decoder.joint.encoder_proj.weight.zero_()
        decoder.joint.encoder_proj.bias.zero_()
    torch.testing.assert_close(decoder(h, torch.tensor([1, 1]), targets)[1][:, 0], ilm)
    torch.testing.assert_close(ilm.exp().sum(-1), torch.ones(2, 4))
    with pytest.raises(TypeError, match="HAT joint only"):
        TransducerDecoder(D, V, joint="rnnt").internal_lm_log_probs(targets)


def test_pointwise_serves_ctc_and_cb_from_one_output_layer():
    torch.manual_seed(0)
    decoder = PointwiseDecoder(D, V)
    h = torch.randn(2, 5, D)
    ctc = decoder(h, torch.tensor([5, 5]))
    out = decoder.net(h)
    torch.testing.assert_close(ctc, out.log_softmax(-1))
    emit, terms = decoder.cb_terms(
        h, torch.tensor([5, 5]), torch.tensor([[2, 5]] * 2), torch.tensor([2, 2])
    )
    torch.testing.assert_close(emit, out[..., 0])
    torch.testing.assert_close(terms[..., 1], out[..., 1:].log_softmax(-1)[..., 4])


LABEL_NETWORKS = {  # decoder -> its label-history network
    "attention_emission": lambda label: AttentionEmissionDecoder(D, V, label=label).label_context,
    "monotonic": lambda label: MonotonicAttentionDecoder(D, V, label=label).label_context,
    "transducer": lambda label: TransducerDecoder(D, V, label=label).prediction,
    "autoregressive": lambda label: AutoregressiveDecoder(D, V, label=label),
}


@pytest.mark.parametrize("name", sorted(LABEL_NETWORKS))
def test_the_label_network_is_built_as_decoder_label_says(name):
    """``label`` sizes the embedding and the LSTM; None builds the schema's defaults."""
    for label, sizes in (
        (LabelContextConfig(embed_dim=3, hidden=7, num_layers=2), (3, 7, 2)),
        (None, (64, 128, 1)),
    ):
        net = LABEL_NETWORKS[name](label)
        assert (net.embedding.embedding_dim, net.rnn.hidden_size, net.rnn.num_layers) == sizes


@pytest.mark.parametrize("name", ["attention_emission", "monotonic"])
def test_the_label_side_of_a_cb_joint_has_no_bias_of_its_own(name):
    """``W_o tanh(W_h h + b + W_g g)``: the joint's one bias is the encoder (or context) side's,
    so a checkpoint's parameters are the decoder's."""
    decoder = CB_DECODERS[name]()
    assert decoder.label_proj.bias is None and decoder.label_proj.in_features == 5


@pytest.mark.parametrize("blank_joint", ["tanh", "linear"])
def test_the_hat_blank_joint_builds_its_blank_logit(blank_joint):
    """tanh: the blank is unit 0 of the joint (V units); linear: ``w . (f1 + g1) + b`` apart,
    the joint's V - 1 units the labels."""
    joint = TransducerDecoder(D, V, joint="hat", label=LABEL, blank_joint=blank_joint).joint
    assert joint.linear_blank == (blank_joint == "linear")
    assert joint.out[-1].out_features == (V - 1 if blank_joint == "linear" else V)
    assert hasattr(joint, "blank_encoder") == (blank_joint == "linear")


def test_bad_options_are_named():
    """From Python, past the schema: the schema's own checks (tests/config/test_checks.py)
    and choices refuse what would otherwise run."""
    with pytest.raises(ValueError, match="decoder.window must be >= 1"):
        MonotonicAttentionDecoder(D, V, window=0)
    with pytest.raises(ValueError, match="'both' is not a valid Emission"):
        AutoregressiveDecoder(D, V, emission="both")
    with pytest.raises(ValueError, match="decoder.label.context must be -1 for the autoregressive"):
        AutoregressiveDecoder(D, V, label=LabelContextConfig(context=2))
    for cb_decoder in (AttentionEmissionDecoder, MonotonicAttentionDecoder):
        with pytest.raises(ValueError, match="decoder.label.context must be -1 for the"):
            cb_decoder(D, V, label=LabelContextConfig(context=2))
    with pytest.raises(ValueError, match="'ctc' is not a valid Joint"):
        TransducerDecoder(D, V, joint="ctc")
    with pytest.raises(ValueError, match="'sigmoid' is not a valid BlankJoint"):
        TransducerDecoder(D, V, joint="hat", blank_joint="sigmoid")
    with pytest.raises(ValueError, match="decoder.durations must include 1"):
        TransducerDecoder(D, V, joint="tdt", durations=(0, 2))


@pytest.mark.parametrize("variable", [False, True])
def test_monotonic_windows_are_stable_for_large_energies(variable):
    torch.manual_seed(0)
    decoder = MonotonicAttentionDecoder(
        D, V, window=4, variable=variable, attention_dim=4, label=LABEL
    ).eval()
    with torch.no_grad():
        decoder.key.weight.mul_(
            3000.0
        )  # energies of several hundred: exp overflows without a running max
        h, targets = torch.randn(1, 7, D), torch.randint(1, V, (1, 3))
        g = decoder.label_context(targets)[0, :3]
        _, terms = decoder.cb_terms(h, torch.tensor([7]), targets, torch.tensor([3]))
        assert torch.isfinite(terms).all()
        t, l = 5, 1
        got = terms[0, t, 3, l] if variable else terms[0, t, l]
        direct = _direct_window(decoder, h[0], g[l], t - 3, t)
        torch.testing.assert_close(got, direct[int(targets[0, l]) - 1])


@pytest.mark.parametrize("name", sorted(CB_DECODERS))
def test_reordered_states_decode_like_the_rows_they_copy(name):
    """Beam search copies hypotheses with ``reorder``: a reordered state must give the scores of
    the rows it was taken from, before and after a commit."""
    torch.manual_seed(0)
    decoder = CB_DECODERS[name]().eval()
    h, lens = torch.randn(3, 6, D), torch.tensor([6, 6, 6])
    state = decoder.begin(h, lens)
    decoder.candidates(state, 0)
    state = decoder.commit(state, 0, torch.tensor([True, False, True]), torch.tensor([2, 1, 5]))
    index = torch.tensor([2, 0, 0, 1])
    moved = decoder.reorder(state, index)
    a, log_probs = decoder.candidates(state, 2)
    a_moved, log_probs_moved = decoder.candidates(moved, 2)
    torch.testing.assert_close(a_moved, a[index])
    torch.testing.assert_close(log_probs_moved, log_probs[index])
    labels = torch.tensor([3, 4, 6, 2])
    moved = decoder.commit(moved, 2, torch.tensor([True, True, False, True]), labels)
    _, after = decoder.candidates(moved, 3)
    for row, source in enumerate(index.tolist()):  # replay each row alone
        single = decoder.reorder(state, torch.tensor([source]))
        decoder.candidates(single, 2)
        single = decoder.commit(single, 2, torch.tensor([row != 2]), labels[row : row + 1])
        torch.testing.assert_close(decoder.candidates(single, 3)[1], after[row : row + 1])


@pytest.mark.parametrize("blank_joint", ["tanh", "linear"])
@pytest.mark.parametrize("context", [-1, 2])
def test_reordered_transducer_states_score_like_their_rows(context, blank_joint):
    torch.manual_seed(0)
    decoder = TransducerDecoder(
        D,
        V,
        joint="hat",
        label=LabelContextConfig(embed_dim=4, hidden=5, context=context),
        joint_dim=6,
        blank_joint=blank_joint,
    ).eval()
    h = torch.randn(3, 4, D)
    state = decoder.commit(
        decoder.begin(h, torch.tensor([4, 4, 4])),
        torch.tensor([True, False, True]),
        torch.tensor([2, 1, 5]),
    )
    index = torch.tensor([1, 2, 2])
    moved = decoder.reorder(state, index)
    for got, want in zip(decoder.frame_scores(moved, 1), decoder.frame_scores(state, 1)):
        torch.testing.assert_close(got, want[index])


def test_variable_window_gradients_are_finite_with_padding_and_a_wide_band():
    """Utterances of different lengths and label counts: the band of the shortest-label one
    reaches past the padded length T; no NaN may reach any gradient."""
    torch.manual_seed(0)
    decoder = MonotonicAttentionDecoder(D, V, window=4, variable=True, attention_dim=4, label=LABEL)
    h = torch.randn(3, 9, D, requires_grad=True)
    lens, target_lens = torch.tensor([9, 9, 6]), torch.tensor([6, 1, 3])
    targets = torch.randint(1, V, (3, 6))
    emit, terms = decoder.cb_terms(h, lens, targets, target_lens)
    nll = cb_marginal_nll_windowed(emit, terms, lens, target_lens)
    assert torch.isfinite(nll).all()
    nll.sum().backward()
    assert torch.isfinite(h.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in decoder.parameters() if p.grad is not None)


class _Gathers(TorchDispatchMode):
    """Counts ``index_select`` calls: the variable window gathers two per block of its band."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func.overloadpacket.__name__ == "index_select"
        return func(*args, **(kwargs or {}))


def test_variable_window_blocks_of_any_size_give_the_same_terms_and_gradients(monkeypatch):
    """The band computed one diagonal per block (also when the budget is smaller than one),
    three per block and all at once: as many blocks as the budget says, the same label terms,
    and the same gradients for the encoder and every parameter (float64, a batch of unequal
    lengths, dropout off)."""
    torch.manual_seed(0)
    decoder = (
        MonotonicAttentionDecoder(D, V, window=4, variable=True, attention_dim=4, label=LABEL)
        .double()
        .eval()
    )
    h = torch.randn(3, 11, D, dtype=torch.float64, requires_grad=True)
    lens, target_lens = torch.tensor([11, 8, 10]), torch.tensor([4, 2, 1])
    targets = torch.randint(1, V, (3, 4))
    cotangent = torch.randn(3, 11, 4, 4, dtype=torch.float64)
    width = max(decoder.context_proj.out_features, V - 1, 4)  # the block's widest entry
    one = 3 * 4 * 4 * width  # B L W width: the entries of one diagonal
    results = []
    # K = 10 diagonals (11 - 1 + 1 for the third utterance)
    for budget, blocks in ((1, 10), (one, 10), (3 * one, 4), (100 * one, 1)):
        monkeypatch.setattr(decoder, "band_elements", {"cpu": budget})
        h.grad = None
        decoder.zero_grad()
        with _Gathers() as gathers:
            _, terms = decoder.cb_terms(h, lens, targets, target_lens)
        assert gathers.calls == 2 * blocks, (budget, gathers.calls)
        (terms * cotangent).sum().backward()
        grads = [p.grad.clone() for p in decoder.parameters() if p.grad is not None]
        results.append((terms.detach(), h.grad.clone(), grads))
    for terms, h_grad, grads in results[1:]:
        torch.testing.assert_close(terms, results[0][0], rtol=0, atol=1e-12)
        torch.testing.assert_close(h_grad, results[0][1], rtol=0, atol=1e-12)
        for got, want in zip(grads, results[0][2], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert results[0][0].abs().sum() > 0


def test_variable_window_has_no_reachable_cell_for_more_labels_than_frames():
    """A batch whose one utterance has 5 labels in 3 frames (which the dataset skips): no
    emission path, so every label term is 0, and none is NaN."""
    decoder = CB_DECODERS["monotonic_variable"]().eval()
    with torch.no_grad():
        _, terms = decoder.cb_terms(
            torch.randn(1, 3, D), torch.tensor([3]), torch.randint(1, V, (1, 5)), torch.tensor([5])
        )
    assert terms.shape == (1, 3, 4, 5) and torch.equal(terms, torch.zeros_like(terms))


def test_variable_window_dropout_scales_the_joint_by_its_keep_rate(monkeypatch):
    """Training with dropout 0.25 and every unit kept: the joint is scaled by 1 / 0.75, as an
    output layer with its weight so scaled gives in evaluation; the mask has one entry per
    (frame, label, unit), shared by the cell's window sizes."""
    torch.manual_seed(0)
    decoder = MonotonicAttentionDecoder(
        D, V, window=4, variable=True, attention_dim=4, label=LABEL, dropout=0.25
    ).double()
    h, targets = torch.randn(2, 9, D, dtype=torch.float64), torch.randint(1, V, (2, 3))
    lens, target_lens = torch.tensor([9, 7]), torch.tensor([3, 2])
    shapes = []

    def kept(p):  # every unit kept: the scaling alone
        shapes.append(tuple(p.shape))
        return torch.ones_like(p)

    monkeypatch.setattr(torch, "bernoulli", kept)
    decoder.label_context.eval()  # the label embeddings' dropout is not this test's
    decoder.out.train()
    with torch.no_grad():
        trained = decoder.cb_terms(h, lens, targets, target_lens)[1]
        decoder.eval()
        decoder.out[-1].weight /= 0.75
        scaled = decoder.cb_terms(h, lens, targets, target_lens)[1]
    assert shapes and all(shape[-2] == 1 for shape in shapes), shapes
    torch.testing.assert_close(trained, scaled, rtol=0, atol=1e-12)
    assert trained.abs().sum() > 0


@pytest.mark.parametrize(
    "joint,blank_joint", [("rnnt", "tanh"), ("hat", "tanh"), ("hat", "linear")]
)
def test_a_checkpoint_from_before_the_joint_classes_loads(joint, blank_joint):
    """The joint's parameters once lived on the decoder (``out.2.weight``, ``blank_encoder.bias``);
    such a state dict loads strictly into ``joint.*`` and gives the same outputs."""
    torch.manual_seed(0)
    new = TransducerDecoder(D, V, joint=joint, label=LABEL, blank_joint=blank_joint)
    old_layout = {k.removeprefix("joint."): v for k, v in new.state_dict().items()}
    assert "out.2.weight" in old_layout
    again = TransducerDecoder(D, V, joint=joint, label=LABEL, blank_joint=blank_joint)
    again.load_state_dict(old_layout)
    h, targets = torch.randn(2, 3, D), torch.randint(1, V, (2, 2))
    for a, b in zip(
        new.eval()(h, torch.tensor([3, 3]), targets), again.eval()(h, torch.tensor([3, 3]), targets)
    ):
        torch.testing.assert_close(a, b)


def test_history_noise_draws_uniform_labels_at_its_rate():
    """Each history label is replaced with probability history_noise by one of the V - 1
    labels, uniformly (so it is changed with probability p (V - 2) / (V - 1)); only in training."""
    torch.manual_seed(0)
    decoder = TransducerDecoder(D, V, joint="hat", label=LABEL, history_noise=0.3)
    read = []
    decoder.prediction.register_forward_pre_hook(lambda _, args: read.append(args[0]))
    targets = torch.full((200, 100), 3)
    decoder.history(targets)
    counts = torch.bincount(read[0].flatten(), minlength=V).double() / targets.numel()
    assert counts[0] == 0  # never the blank / start symbol
    others = [counts[k] for k in range(1, V) if k != 3]
    for share in others:  # 0.3 / 6 each: 0.05, standard deviation 0.0015
        assert abs(share - 0.3 / (V - 1)) < 0.006
    assert abs(counts[3] - (0.7 + 0.3 / (V - 1))) < 0.01
    decoder.eval()
    decoder.history(targets)
    torch.testing.assert_close(read[1], targets)
    with pytest.raises(ValueError, match="history_noise"):
        TransducerDecoder(D, V, history_noise=1.0)


def test_history_repeat_reads_the_next_label_at_its_rate_never_padding():
    """history_repeat: each history label is replaced with probability q by the true label
    after it (so g_u reads y_{u+1}), never by padding (0), and the last label is kept; only
    in training. With history_noise too, the repeat copies the true label, not a noisy one."""
    torch.manual_seed(0)
    decoder = TransducerDecoder(D, V, joint="rnnt", label=LABEL, history_repeat=0.25)
    read = []
    decoder.prediction.register_forward_pre_hook(lambda _, args: read.append(args[0]))
    targets = torch.randint(1, V, (400, 50))
    targets[:200, 30:] = 0  # padding after 30 labels in half the rows
    decoder.history(targets)
    history = read[0]
    assert history.shape == targets.shape
    copied = (history != targets) & (history == torch.roll(targets, -1, dims=1))
    changed = history != targets
    assert bool((changed == copied).all())  # every change is the next label
    torch.testing.assert_close(history[:, -1], targets[:, -1])
    torch.testing.assert_close(history[:200, 29:], targets[:200, 29:])  # never padding copied
    # among the labels whose successor differs, a share q is replaced
    differs = (targets[:, :-1] != targets[:, 1:]) & (targets[:, 1:] > 0)
    share = changed[:, :-1][differs].double().mean()
    assert abs(float(share) - 0.25) < 0.01  # standard deviation about 0.002
    decoder.eval()
    decoder.history(targets)
    torch.testing.assert_close(read[1], targets)

    both = TransducerDecoder(D, V, joint="rnnt", label=LABEL, history_noise=0.5, history_repeat=0.5)
    both.prediction.register_forward_pre_hook(lambda _, args: read.append(args[0]))
    targets = torch.tensor([[1, 2, 3, 4, 5, 6] * 500])
    both.history(targets)
    history = read[-1][0]
    after = targets[0, 1:]
    is_next = history[:-1] == after
    assert 0.4 < float(is_next.double().mean()) < 0.7  # q plus what the noise draws
    targets = torch.randint(1, V, (2000, 2))
    both.history(targets)  # the last label has no successor: noise still reaches it
    changed = float((read[-1][:, -1] != targets[:, -1]).double().mean())
    assert abs(changed - 0.5 * (V - 2) / (V - 1)) < 0.04
    with pytest.raises(ValueError, match="history_repeat"):
        TransducerDecoder(D, V, history_repeat=1.0)
    with pytest.raises(ValueError, match="history_repeat"):
        TransducerDecoder(D, V, history_repeat=-0.1)
