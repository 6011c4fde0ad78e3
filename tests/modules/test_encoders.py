import pytest
import torch
from torch import nn

from cbasr.modules import encoders
from cbasr.modules.encoders import (
    ConformerEncoder,
    Conv2dSubsampling,
    FrameStacking,
    RNNEncoder,
    TokenEmbedding,
)


def test_frame_stacking_concatenates_in_time_order():
    x = torch.arange(2 * 7 * 2, dtype=torch.float).reshape(2, 7, 2)
    lens = torch.tensor([7, 5])
    y, out_lens = FrameStacking(2, stack=3, stride=3)(x, lens)
    assert out_lens.tolist() == [3, 2] and y.shape == (2, 3, 6)
    assert y[0, 1].tolist() == x[0, 3:6].flatten().tolist()
    assert y[0, 2].tolist() == x[0, 6].tolist() + [0.0] * 4  # zero beyond the end
    assert y[1, 1].tolist() == x[1, 3:5].flatten().tolist() + [0.0, 0.0]  # padding is zeroed


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(subsampling="stack", stack=3, stride=3),
        dict(subsampling="stack", stack=4, stride=2),
        dict(subsampling="conv"),
        dict(subsampling="none", rnn_type="gru", bidirectional=False),
    ],
)
def test_padding_never_changes_a_result(kwargs):
    torch.manual_seed(0)
    enc = RNNEncoder(input_dim=20, hidden=8, num_layers=2, **kwargs).eval()
    _check_padding(enc)


@pytest.mark.parametrize("subsampling", ["conv", "stack", "none"])
def test_conformer_padding_never_changes_a_result(subsampling):
    torch.manual_seed(0)
    enc = ConformerEncoder(
        20,
        d_model=16,
        num_heads=2,
        ffn_dim=32,
        num_layers=2,
        kernel_size=5,
        subsampling=subsampling,
    ).eval()
    _check_padding(enc)


def test_conformer_needs_the_padding_mask(monkeypatch):
    # Without masking before the depthwise convolutions, padded frames leak into valid ones.
    monkeypatch.setattr(encoders._MaskPadding, "forward", lambda self, x: x)
    torch.manual_seed(0)
    enc = ConformerEncoder(
        20, d_model=16, num_heads=2, ffn_dim=32, num_layers=2, kernel_size=5
    ).eval()
    with pytest.raises(AssertionError):
        _check_padding(enc)


def _check_padding(enc):
    utts = [torch.randn(t, 20) for t in (31, 17, 24)]
    lens = torch.tensor([u.shape[0] for u in utts])
    padded = torch.nn.utils.rnn.pad_sequence(utts, batch_first=True)
    padded = torch.cat([padded, torch.randn(3, 9, 20)], dim=1)  # extra garbage padding
    h, out_lens = enc(padded, lens)
    assert out_lens.tolist() == enc.output_lengths(lens).tolist()
    for i, u in enumerate(utts):
        alone, n = enc(u.unsqueeze(0), lens[i : i + 1])
        assert int(n) == int(out_lens[i])
        torch.testing.assert_close(h[i, :n], alone[0, :n], atol=1e-5, rtol=1e-5)


def test_conv_subsampling_lengths_match_convolution_arithmetic():
    conv = Conv2dSubsampling(40)
    for t in (7, 8, 9, 100, 101):
        y, n = conv(torch.randn(1, t, 40), torch.tensor([t]))
        assert y.shape[1] == int(n) == ((t - 1) // 2 - 1) // 2
    assert conv.output_dim == y.shape[2]


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="subsampling must be"):
        RNNEncoder(10, subsampling="pool")
    with pytest.raises(ValueError, match="rnn_type must be"):
        RNNEncoder(10, rnn_type="transformer")


def test_unidirectional_encoder_is_causal():
    torch.manual_seed(0)
    enc = RNNEncoder(
        input_dim=20, hidden=8, num_layers=2, bidirectional=False, subsampling="stack"
    ).eval()
    x = torch.randn(1, 30, 20)
    y = x.clone()
    y[:, 15:] = torch.randn(1, 15, 20)  # change the future from input frame 15 (stacked frame 5) on
    hx, _ = enc(x, torch.tensor([30]))
    hy, _ = enc(y, torch.tensor([30]))
    torch.testing.assert_close(hx[:, :5], hy[:, :5])
    assert not torch.allclose(hx[:, 5], hy[:, 5])


def test_token_embedding_front_end_reads_ids():
    torch.manual_seed(0)
    enc = RNNEncoder(
        input_dim=11, hidden=4, num_layers=1, subsampling="embed", embedding_dim=6
    ).eval()
    ids, lens = torch.tensor([[3, 4, 5, 9], [2, 7, 0, 0]]), torch.tensor([4, 2])
    h, out_lens = enc(ids, lens)
    assert h.shape == (2, 4, 8) and out_lens.tolist() == [4, 2]
    alone, _ = enc(ids[1:, :2], lens[1:])
    torch.testing.assert_close(h[1, :2], alone[0])
    with pytest.raises(TypeError, match="token ids"):
        TokenEmbedding(11, 6)(torch.randn(1, 4, 3), torch.tensor([4]))
    conformer = ConformerEncoder(
        11,
        d_model=8,
        num_heads=2,
        ffn_dim=16,
        num_layers=1,
        kernel_size=3,
        subsampling="embed",
        embedding_dim=6,
    ).eval()
    assert conformer(ids, lens)[0].shape == (2, 4, 8)


@pytest.mark.parametrize(
    "rnn_type, bidirectional, num_layers",
    [("lstm", True, 2), ("lstm", False, 3), ("gru", True, 2), ("gru", False, 1)],
)
def test_padded_rnn_equals_the_packed_rnn(rnn_type, bidirectional, num_layers):
    # The CPU path (fused kernel on the padded batch, the reverse direction run on each
    # utterance reversed within its length) against PyTorch's packed stack: outputs and every
    # gradient, in float64, in training mode (no dropout, so both are deterministic).
    torch.manual_seed(0)
    enc = RNNEncoder(
        input_dim=6,
        hidden=5,
        num_layers=num_layers,
        bidirectional=bidirectional,
        rnn_type=rnn_type,
        dropout=0.0,
        subsampling="none",
    ).double()
    lens = torch.tensor([9, 4, 1, 7])
    x = torch.randn(4, 11, 6, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(4, 11, enc.output_dim, dtype=torch.float64)
    outputs, grads = [], []
    for run in (enc._run_packed, enc._run_padded):
        h = run(x, lens)
        outputs.append(h)
        grads.append(torch.autograd.grad((h * weights).sum(), [x, *enc.parameters()]))
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-12, rtol=1e-10)
    for packed, padded in zip(*grads):
        torch.testing.assert_close(padded, packed, atol=1e-12, rtol=1e-10)


# The chunked (streaming) Conformer


def _chunked(**options) -> ConformerEncoder:
    torch.manual_seed(0)
    kwargs = dict(d_model=16, num_heads=2, ffn_dim=32, num_layers=2, kernel_size=5)
    kwargs.update(subsampling="none", dropout=0.0, chunk_size=4, left_chunks=1)
    return _trained_norms(ConformerEncoder(20, **{**kwargs, **options}).eval())


def _trained_norms(enc: ConformerEncoder) -> ConformerEncoder:
    """Running statistics away from a fresh BatchNorm's (mean 0, variance 1: the identity in
    evaluation), so that a convolution module that skipped its norm would show."""
    g = torch.Generator().manual_seed(7)
    for module in enc.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            module.running_mean.copy_(torch.randn(module.num_features, generator=g))
            module.running_var.copy_(torch.rand(module.num_features, generator=g) + 0.5)
    return enc


def test_the_chunk_mask_is_its_definition():
    for T, chunk, left in [(10, 3, 1), (10, 3, -1), (7, 1, 0), (9, 4, 2), (5, 0, 1)]:
        mask = encoders.chunk_attention_mask(T, chunk, left)
        for t in range(T):
            for s in range(T):
                if chunk == 0:
                    want = True
                else:
                    back = t // chunk - s // chunk
                    want = back >= 0 and (left < 0 or back <= left)
                assert bool(mask[t, s]) == want, (T, chunk, left, t, s)


def test_one_chunk_over_the_utterance_is_the_full_context_layer():
    """One layer, a pointwise convolution (causal or not alike): with a chunk longer than the
    utterance, the chunked forward is torchaudio's full-context layer's."""
    enc = _chunked(num_layers=1, kernel_size=1, chunk_size=50, left_chunks=-1)
    x, lens = torch.randn(2, 13, 20), torch.tensor([13, 9])
    h, _ = enc(x, lens)
    layer = enc.conformer.conformer_layers[0]
    for b, n in enumerate(lens.tolist()):
        z = enc.proj(x[b : b + 1, :n]).transpose(0, 1)
        want = layer(z, None).transpose(0, 1)
        torch.testing.assert_close(h[b, :n], want[0], atol=1e-5, rtol=1e-5)


def test_a_chunk_sees_its_own_chunk_and_its_left_context_only():
    """One layer, a pointwise convolution: a frame's output moves with any frame of its
    chunk (the look-ahead within the chunk) or of the chunk before it (left context 1), and
    with nothing else."""
    enc = _chunked(num_layers=1, kernel_size=1, chunk_size=4, left_chunks=1)
    for changed, moved in _moved_outputs(enc, 16):
        chunk = changed // 4
        assert moved == [t // 4 in (chunk, chunk + 1) for t in range(16)], changed


def _moved_outputs(enc: ConformerEncoder, T: int):
    """``(s, [whether output t moved for t < T])`` for each input frame ``s`` nudged."""
    x = torch.randn(1, T, 20)
    h, _ = enc(x, torch.tensor([T]))
    for changed in range(T):
        y = x.clone()
        y[0, changed] += 1.0
        g, _ = enc(y, torch.tensor([T]))
        yield changed, ((g - h).abs().amax(-1)[0] > 1e-6).tolist()


@pytest.mark.parametrize("conv", ["causal", "chunk"])
@pytest.mark.parametrize("left", [-1, 0, 2])
def test_no_output_depends_on_a_later_chunk(left, conv):
    """Every layer, causal or chunk-wise convolutions: changing the input from a chunk on
    leaves every earlier chunk's output as it was, and changes that chunk's."""
    enc = _chunked(left_chunks=left, chunk_conv=conv)
    x = torch.randn(1, 20, 20)
    h, _ = enc(x, torch.tensor([20]))
    for start in (4, 8, 13):
        y = x.clone()
        y[0, start:] = torch.randn(20 - start, 20)
        g, _ = enc(y, torch.tensor([20]))
        first = start // 4 * 4
        torch.testing.assert_close(g[:, :first], h[:, :first])
        assert not torch.allclose(g[:, first], h[:, first])


@pytest.mark.parametrize("conv", ["causal", "chunk"])
@pytest.mark.parametrize("left", [-1, 1])
@pytest.mark.parametrize("subsampling", ["stack", "none"])
def test_chunked_padding_never_changes_a_result(left, subsampling, conv):
    _check_padding(_chunked(left_chunks=left, subsampling=subsampling, chunk_conv=conv))


@pytest.mark.parametrize("conv", ["causal", "chunk"])
@pytest.mark.parametrize("left", [-1, 0, 1, 3])
def test_chunk_by_chunk_with_the_carried_state_is_the_whole_utterance(left, conv):
    """Chunk by chunk, the last one of 2 frames or of 1 (fewer than the chunk-wise kernel's
    2 later taps), the outputs are the whole utterance's."""
    enc = _chunked(left_chunks=left, chunk_size=3, chunk_conv=conv)
    for T in (23, 22):
        x = torch.randn(1, T, 20)
        whole, _ = enc(x, torch.tensor([T]))
        state, pieces = enc.stream_begin(), []
        with torch.no_grad():
            for start in range(0, T, 3):
                h, state = enc.stream_step(x[:, start : start + 3], state)
                pieces.append(h)
        torch.testing.assert_close(torch.cat(pieces, 1), whole, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="at most one chunk"):
        enc.stream_step(x[:, :4], enc.stream_begin())


def test_chunk_wise_convolutions_read_their_kernel_up_to_the_chunk_s_end():
    """One layer, no attention across chunks (left context 0), kernel 5: a frame's output
    moves with every frame of its chunk, with the chunk before it only where its kernel
    reaches back into it (the first two frames of a chunk), and with nothing later; a causal
    kernel of 5 reaches back from every frame but the last."""
    for conv, back in (("chunk", 2), ("causal", 4)):
        enc = _chunked(num_layers=1, kernel_size=5, chunk_size=4, left_chunks=0, chunk_conv=conv)
        for changed, moved in _moved_outputs(enc, 16):
            c = changed // 4
            want = [t // 4 == c or (t // 4 == c + 1 and t % 4 < back) for t in range(16)]
            assert moved == want, (conv, changed)
    assert _chunked(kernel_size=5, chunk_conv="chunk").conv_context == 2
    assert _chunked(kernel_size=5).conv_context == 4


@pytest.mark.parametrize("subsampling", ["stack", "none"])
def test_chunk_wise_convolutions_at_the_full_context_are_torchaudio_s(subsampling):
    """A dynamic-chunk encoder with chunk-wise convolutions evaluated at the full context
    (chunk_size 0) is the full-context encoder with the same weights: the chunk-wise kernel
    is the full-context one, cut only at a chunk's end."""
    full = _chunked(chunk_size=0, left_chunks=-1, subsampling=subsampling)
    dynamic = _chunked(chunk_size=0, dynamic_chunks=4, chunk_conv="chunk", subsampling=subsampling)
    dynamic.load_state_dict(full.state_dict())
    x, lens = torch.randn(3, 26, 20), torch.tensor([26, 11, 17])
    h, n = full(x, lens)
    g, m = dynamic(x, lens)
    assert m.tolist() == n.tolist()
    torch.testing.assert_close(g, h, atol=1e-5, rtol=1e-5)


def test_dynamic_chunks_draw_in_training_and_evaluation_uses_the_chunk():
    enc = _chunked(chunk_size=4, dynamic_chunks=6).train()
    torch.manual_seed(1)
    draws = [enc.current_chunk() for _ in range(400)]
    assert set(draws) == set(range(7))  # 0: the full context
    assert 150 < draws.count(0) < 250
    assert enc.eval().current_chunk() == 4
    assert _chunked(chunk_size=4).train().current_chunk() == 4
    assert _chunked(chunk_size=0, dynamic_chunks=3).stream_block is None


def test_bad_chunk_options_are_named():
    with pytest.raises(ValueError, match="encoder.chunk_conv must be causal or chunk"):
        _chunked(chunk_conv="lookahead")
    with pytest.raises(ValueError, match="cannot stream"):
        _chunked(chunk_size=0, dynamic_chunks=3).stream_step(torch.randn(1, 2, 20), [])


@pytest.mark.parametrize("subsampling", ["stack", "none"])
def test_the_full_context_layers_are_torchaudio_s_conformer(subsampling):
    """The encoder runs torchaudio's layers itself (so that a trace serves any length): on
    the valid frames, torchaudio's own Conformer forward, with the padding masked before each
    depthwise convolution."""
    torch.manual_seed(0)
    enc = ConformerEncoder(
        20, d_model=16, num_heads=2, ffn_dim=32, num_layers=2, kernel_size=5, dropout=0.0,
        subsampling=subsampling,
    ).eval()  # fmt: skip
    _trained_norms(enc)
    x, lens = torch.randn(3, 26, 20), torch.tensor([26, 11, 17])
    h, out_lens = enc(x, lens)
    z, n = (x, lens) if enc.subsampling is None else enc.subsampling(x, lens)
    z = enc.proj(z[:, : int(n.max())])
    valid = torch.arange(z.shape[1]) < n.unsqueeze(1)
    for mask in enc.masks:
        mask.mask = valid.unsqueeze(1).float()
    want, _ = enc.conformer(z, n)
    for b, m in enumerate(out_lens.tolist()):
        torch.testing.assert_close(h[b, :m], want[b, :m], atol=1e-5, rtol=1e-5)
    assert (h[1, out_lens[1] :] == 0).all()


@pytest.mark.parametrize("conv", ["causal", "chunk"])
@pytest.mark.parametrize("chunk", [0, 4])
def test_a_traced_conformer_serves_other_lengths(chunk, conv):
    enc = _chunked(chunk_size=chunk, left_chunks=1, subsampling="stack", chunk_conv=conv)
    traced = torch.jit.trace(enc, (torch.randn(2, 30, 20), torch.tensor([30, 21])))
    x, lens = torch.randn(3, 47, 20), torch.tensor([47, 12, 33])
    h, n = enc(x, lens)
    got, got_n = traced(x, lens)
    assert got_n.tolist() == n.tolist()
    torch.testing.assert_close(got, h)


@pytest.mark.parametrize("context", [0, 1, 2, 3])
def test_chunk_wise_convolution_by_rows_of_chunks_is_the_tap_by_tap_one(context):
    """``_chunk_conv``'s later taps, one convolution over the frames a chunk to a row, against
    the tap-by-tap products a trace takes (``_chunk_conv_taps``): values and gradients, for
    lengths that are and are not a multiple of the chunk, chunks of one frame, of the whole
    row and longer, and one chunk (0, None)."""
    from cbasr.modules.encoders import _chunk_conv, _chunk_conv_taps

    conv = nn.Conv1d(3, 3, 2 * context + 1, groups=3).double()
    w = conv.weight
    for T in (1, 5, 7, 12):
        for chunk in (None, 0, 1, 2, 3, 4, 12, 20):
            y = torch.randn(2, 3, context + T, dtype=torch.float64, requires_grad=True)
            got = _chunk_conv(conv, y, context, chunk)
            past = nn.functional.conv1d(y, w[:, :, : context + 1], conv.bias, groups=3)
            want = past + _chunk_conv_taps(w, y[:, :, context:], context, chunk)
            torch.testing.assert_close(got, want)
            probe = torch.randn_like(want)
            grads = [torch.autograd.grad((z * probe).sum(), (y, w)) for z in (got, want)]
            for a, b in zip(*grads):
                torch.testing.assert_close(a, b)


def test_a_traced_chunk_wise_convolution_serves_other_lengths():
    """Traced (``cbasr-export``), the chunk-wise convolution takes the tap-by-tap products,
    which do no arithmetic on sizes: a trace of one chunk (3 frames) gives the eager result
    at 11 and 7 (the rows of chunks would have been traced as one row)."""
    from cbasr.modules.encoders import _chunk_conv

    class Chunked(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(3, 3, 5, groups=3)

        def forward(self, y):
            return _chunk_conv(self.conv, y, 2, 3)

    chunked = Chunked()
    with torch.no_grad():
        traced = torch.jit.trace(chunked, torch.randn(1, 3, 2 + 3), check_trace=False)
        for T in (11, 7):
            y = torch.randn(2, 3, 2 + T)
            torch.testing.assert_close(traced(y), chunked(y))
