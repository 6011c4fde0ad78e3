import pytest
import torch

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
    with pytest.raises(ValueError, match="num_heads"):
        ConformerEncoder(10, d_model=10, num_heads=4)
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        ConformerEncoder(10, kernel_size=4)


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
