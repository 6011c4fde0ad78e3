"""Acoustic encoders. Every encoder maps ``(x (B, T, F), lens (B,))`` to ``(h (B, T', D), lens' (B,))``."""

import torch
from torch import nn

from cbasr.config.schema import ConformerEncoderConfig, RNNEncoderConfig
from cbasr.modules.dropout import Dropout, dropout

__all__ = [
    "FrameStacking",
    "Conv2dSubsampling",
    "TokenEmbedding",
    "RNNEncoder",
    "ConformerEncoder",
    "make_front_end",
]


def _zero_padding(x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """``x (B, T, F)`` with frames at or beyond ``lens`` set to zero."""
    mask = torch.arange(x.shape[1], device=x.device) < lens.unsqueeze(1)  # (B, T)
    return x * mask.unsqueeze(-1)


class FrameStacking(nn.Module):
    """Concatenate ``stack`` consecutive frames, keeping every ``stride``-th (T' = ceil(T / stride)).

    Frames past an utterance's end are zeros, so padding never changes a result.
    """

    def __init__(self, input_dim: int, stack: int = 3, stride: int = 3):
        super().__init__()
        if stack < 1 or stride < 1:
            raise ValueError(f"stack and stride must be >= 1, got {stack}, {stride}")
        self.stack, self.stride = stack, stride
        self.output_dim = input_dim * stack

    def output_lengths(self, lens: torch.Tensor) -> torch.Tensor:
        return (lens + self.stride - 1) // self.stride

    def forward(self, x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = _zero_padding(x, lens)
        out_lens = self.output_lengths(lens)
        t_out = (x.shape[1] + self.stride - 1) // self.stride
        # the last window ends at (t_out - 1) * stride + stack <= T + stack - 1: pad that much,
        # always, and take the stack offsets as strided slices (no data-dependent branch or
        # unfold, so the model traces and exports to ONNX)
        x = nn.functional.pad(x, (0, 0, 0, self.stack - 1))
        span = (t_out - 1) * self.stride + 1
        offsets = [x[:, k : k + span : self.stride] for k in range(self.stack)]  # (B, T', F) each
        return torch.cat(offsets, dim=-1), out_lens  # (B, T', stack * F), frames in time order


class Conv2dSubsampling(nn.Module):
    """Two 3x3 convolutions with stride 2 over (time, frequency): T' = ((T - 1) // 2 - 1) // 2.

    Without padding in time, each output frame sees only real input frames.
    """

    def __init__(self, input_dim: int, channels: int = 32):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, channels, 3, stride=2),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2),
            nn.ReLU(),
        )
        self.output_dim = channels * (((input_dim - 1) // 2 - 1) // 2)

    def output_lengths(self, lens: torch.Tensor) -> torch.Tensor:
        return torch.clamp(((lens - 1) // 2 - 1) // 2, min=0)

    def forward(self, x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.conv(_zero_padding(x, lens).unsqueeze(1))  # (B, T, F) -> (B, C, T', F')
        x = x.transpose(1, 2).flatten(2)  # (B, C, T', F') -> (B, T', C * F')
        return x, self.output_lengths(lens)


class TokenEmbedding(nn.Module):
    """Token-embedding front end for text input (Gigaword): ids ``(B, T)`` -> ``(B, T, D)``.

    ``input_dim`` is the source vocabulary size; id 0 is padding and embeds to zeros. No
    subsampling: every source token is a frame (the CB losses then need ``L <= T``).
    """

    def __init__(self, input_dim: int, embedding_dim: int = 256):
        super().__init__()
        self.embedding = nn.Embedding(input_dim, embedding_dim, padding_idx=0)
        self.output_dim = embedding_dim

    def output_lengths(self, lens: torch.Tensor) -> torch.Tensor:
        return lens

    def forward(self, x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dtype.is_floating_point:
            raise TypeError(
                "the embedding front end takes token ids (B, T), not features (B, T, F)"
            )
        mask = torch.arange(x.shape[1], device=x.device) < lens.unsqueeze(1)  # (B, T)
        return self.embedding(x * mask), lens


def make_front_end(
    input_dim: int, subsampling: str, stack: int = 3, stride: int = 3, embedding_dim: int = 256
) -> nn.Module | None:
    """The front end named by ``subsampling``: ``none``, ``stack``, ``conv`` or ``embed`` (text)."""
    if subsampling == "stack":
        return FrameStacking(input_dim, stack, stride)
    if subsampling == "conv":
        return Conv2dSubsampling(input_dim)
    if subsampling == "embed":
        return TokenEmbedding(input_dim, embedding_dim)
    if subsampling == "none":
        return None
    raise ValueError(f"subsampling must be none, stack, conv or embed, got {subsampling!r}")


_RNN_WEIGHTS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


class RNNEncoder(nn.Module):
    """(B)LSTM or GRU stack after optional frame stacking or convolutional subsampling.

    Args:
        input_dim: feature dimension F.
        hidden: units per direction.
        subsampling: ``"none"``, ``"stack"`` (:class:`FrameStacking` with ``stack``/``stride``),
            ``"conv"`` (:class:`Conv2dSubsampling`, factor 4) or ``"embed"``
            (:class:`TokenEmbedding` of ``embedding_dim``; ``input_dim`` is then the source
            vocabulary size).
        bidirectional: False for a unidirectional (online) encoder: frame ``t``'s state then
            depends on frames ``<= t`` only (with ``stack``, on the stacked frames up to ``t``).
    """

    def __init__(
        self,
        input_dim: int,
        hidden: int = RNNEncoderConfig.hidden,
        num_layers: int = RNNEncoderConfig.num_layers,
        bidirectional: bool = RNNEncoderConfig.bidirectional,
        rnn_type: str = RNNEncoderConfig.rnn_type.value,
        dropout: float = RNNEncoderConfig.dropout,
        subsampling: str = RNNEncoderConfig.subsampling.value,
        stack: int = RNNEncoderConfig.stack,
        stride: int = RNNEncoderConfig.stride,
        embedding_dim: int = RNNEncoderConfig.embedding_dim,
    ):
        super().__init__()
        self.subsampling = make_front_end(input_dim, subsampling, stack, stride, embedding_dim)
        rnn_dim = input_dim if self.subsampling is None else self.subsampling.output_dim
        rnns = {"lstm": nn.LSTM, "gru": nn.GRU}
        if rnn_type not in rnns:
            raise ValueError(f"rnn_type must be one of {sorted(rnns)}, got {rnn_type!r}")
        self.rnn = rnns[rnn_type](
            rnn_dim,
            hidden,
            num_layers=num_layers,
            batch_first=True,
            bidirectional=bidirectional,
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.dropout = Dropout(dropout)
        self.output_dim = hidden * (2 if bidirectional else 1)

    def output_lengths(self, lens: torch.Tensor) -> torch.Tensor:
        return lens if self.subsampling is None else self.subsampling.output_lengths(lens)

    def forward(self, x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.subsampling is not None:
            x, lens = self.subsampling(x, lens)
        h = self._run_packed(x, lens) if x.is_cuda else self._run_padded(x, lens)
        return self.dropout(h), lens

    def _run_packed(self, x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """The stack on a packed batch: cuDNN's way (one fused call for every layer)."""
        packed = nn.utils.rnn.pack_padded_sequence(
            x, lens.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
        )
        h, _ = self.rnn(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True, total_length=x.shape[1])
        return h

    def _run_padded(self, x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """The same stack on the padded batch, one layer and direction at a time: on CPU.

        PyTorch's CPU LSTM/GRU runs a packed batch as one small step per frame, and the
        backward of each step's slice of the input projection writes a zero tensor the size of
        the whole batch: quadratic in T, about half of a BLSTM-CTC step at the synth recipe's
        batches. On a padded batch the fused (oneDNN) kernel runs instead. The forward direction
        reads frames ``< lens`` before any padding, so its valid outputs are exact; the reverse
        direction runs forward over each utterance reversed within its length (padding stays at
        the end) and is reversed back. Same parameters, same outputs as the packed stack
        (padded frames are zero, as ``pad_packed_sequence`` leaves them). Under CPU autocast it
        computes in the parameters' precision, as the packed stack does (oneDNN has no mixed
        bfloat16 LSTM).
        """
        with torch.autocast("cpu", enabled=False):
            return self._run_layers(x.to(self.rnn.weight_ih_l0.dtype), lens)

    def _run_layers(self, x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        rnn = self.rnn
        B, T = x.shape[:2]
        steps = torch.arange(T, device=x.device).unsqueeze(0)  # (1, T)
        ends = lens.clamp(min=1).unsqueeze(1)  # (B, 1)
        valid = (steps < ends).unsqueeze(-1)  # (B, T, 1)
        reverse = torch.where(steps < ends, ends - 1 - steps, steps)  # an involution per row

        def flip(t: torch.Tensor) -> torch.Tensor:  # each row reversed within its length
            return t.gather(1, reverse.unsqueeze(-1).expand_as(t))

        run = torch.lstm if isinstance(rnn, nn.LSTM) else torch.gru
        h = x
        for layer in range(rnn.num_layers):
            if layer > 0:
                h = dropout(h, rnn.dropout, self.training)
            outputs = []
            for suffix in ("", "_reverse") if rnn.bidirectional else ("",):
                weights = [getattr(rnn, f"{name}_l{layer}{suffix}") for name in _RNN_WEIGHTS]
                start = h.new_zeros(1, B, rnn.hidden_size)
                state = (start, start) if run is torch.lstm else start
                inputs = flip(h) if suffix else h
                # biases, 1 layer, no dropout inside, train, unidirectional, batch first
                out = run(inputs, state, weights, True, 1, 0.0, self.training, False, True)[0]
                outputs.append(flip(out) if suffix else out)
            h = torch.cat(outputs, -1) if len(outputs) > 1 else outputs[0]
        return h * valid


class _MaskPadding(nn.Module):
    """Zeroes frames at or beyond the lengths set by :class:`ConformerEncoder` for this call.

    Inserted before each Conformer layer's depthwise convolution, so that the convolution
    never reads padded frames: padding then changes no valid output (in eval mode; in
    training mode batch normalisation mixes utterances by design).
    """

    def __init__(self):
        super().__init__()
        self.mask: torch.Tensor | None = None  # (B, 1, T), set per forward call

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T)
        return x if self.mask is None else x * self.mask


class ConformerEncoder(nn.Module):
    """Conformer (Gulati et al., 2020) on :class:`torchaudio.models.Conformer`, after a front end.

    ``front end -> Linear(d_model) -> dropout -> Conformer layers``. torchaudio's layers have
    no positional encoding (position comes from the convolutions) and convolve over padded
    frames; a masking step before each depthwise convolution keeps padding out (see
    :class:`_MaskPadding`). Full-context self-attention: for online recognition use a
    unidirectional :class:`RNNEncoder`.

    Args:
        input_dim: feature dimension F (or source vocabulary size with ``subsampling="embed"``).
        d_model: model width D; ``num_heads`` must divide it.
        ffn_dim: feed-forward hidden width.
        kernel_size: depthwise convolution kernel (odd).
        subsampling: front end, as for :class:`RNNEncoder` (default ``conv``, factor 4).
    """

    def __init__(
        self,
        input_dim: int,
        d_model: int = ConformerEncoderConfig.d_model,
        num_heads: int = ConformerEncoderConfig.num_heads,
        ffn_dim: int = ConformerEncoderConfig.ffn_dim,
        num_layers: int = ConformerEncoderConfig.num_layers,
        kernel_size: int = ConformerEncoderConfig.kernel_size,
        dropout: float = ConformerEncoderConfig.dropout,
        subsampling: str = ConformerEncoderConfig.subsampling.value,
        stack: int = ConformerEncoderConfig.stack,
        stride: int = ConformerEncoderConfig.stride,
        embedding_dim: int = ConformerEncoderConfig.embedding_dim,
    ):
        super().__init__()
        from torchaudio.models import Conformer

        if d_model % num_heads:
            raise ValueError(f"num_heads ({num_heads}) must divide d_model ({d_model})")
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        self.subsampling = make_front_end(input_dim, subsampling, stack, stride, embedding_dim)
        front_dim = input_dim if self.subsampling is None else self.subsampling.output_dim
        self.proj = nn.Sequential(nn.Linear(front_dim, d_model), Dropout(dropout))
        self.conformer = Conformer(d_model, num_heads, ffn_dim, num_layers, kernel_size, dropout)
        self.masks = []
        for layer in self.conformer.conformer_layers:
            mask = _MaskPadding()
            # after pointwise conv + GLU, before depthwise
            layer.conv_module.sequential.insert(2, mask)
            self.masks.append(mask)
        self.output_dim = d_model

    def output_lengths(self, lens: torch.Tensor) -> torch.Tensor:
        return lens if self.subsampling is None else self.subsampling.output_lengths(lens)

    def forward(self, x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.subsampling is not None:
            x, lens = self.subsampling(x, lens)
        total = x.shape[1]
        # torchaudio sizes its attention mask by the longest utterance (at least one frame).
        x = self.proj(x[:, : max(1, int(lens.max()))])  # (B, T', F') -> (B, T'', D)
        valid = torch.arange(x.shape[1], device=x.device) < lens.unsqueeze(1)  # (B, T'')
        for mask in self.masks:
            mask.mask = valid.unsqueeze(1).to(x.dtype)  # (B, T'') -> (B, 1, T'')
        try:
            h, _ = self.conformer(x, lens.clamp(min=1))
        finally:
            for mask in self.masks:
                mask.mask = None
        # back to (B, T', D)
        h = nn.functional.pad(h * valid.unsqueeze(-1), (0, 0, 0, total - h.shape[1]))
        return h, lens
