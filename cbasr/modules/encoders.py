"""Acoustic encoders. Every encoder maps ``(x (B, T, F), lens (B,))`` to ``(h (B, T', D), lens' (B,))``."""

import torch
from torch import nn

__all__ = ["FrameStacking", "Conv2dSubsampling", "RNNEncoder"]


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
        need = (t_out - 1) * self.stride + self.stack
        x = nn.functional.pad(x, (0, 0, 0, max(0, need - x.shape[1])))
        x = x.unfold(1, self.stack, self.stride)  # (B, T', F, stack)
        x = x[:, :t_out].transpose(2, 3).flatten(2)  # (B, T', stack * F), frames in time order
        return x, out_lens


class Conv2dSubsampling(nn.Module):
    """Two 3x3 convolutions with stride 2 over (time, frequency): T' = ((T - 1) // 2 - 1) // 2.

    Without padding in time, each output frame sees only real input frames.
    """

    def __init__(self, input_dim: int, channels: int = 32):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, channels, 3, stride=2), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2), nn.ReLU(),
        )
        self.output_dim = channels * (((input_dim - 1) // 2 - 1) // 2)

    def output_lengths(self, lens: torch.Tensor) -> torch.Tensor:
        return torch.clamp(((lens - 1) // 2 - 1) // 2, min=0)

    def forward(self, x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.conv(_zero_padding(x, lens).unsqueeze(1))  # (B, T, F) -> (B, C, T', F')
        x = x.transpose(1, 2).flatten(2)  # (B, C, T', F') -> (B, T', C * F')
        return x, self.output_lengths(lens)


class RNNEncoder(nn.Module):
    """(B)LSTM or GRU stack after optional frame stacking or convolutional subsampling.

    Args:
        input_dim: feature dimension F.
        hidden: units per direction.
        subsampling: ``"none"``, ``"stack"`` (:class:`FrameStacking` with ``stack``/``stride``)
            or ``"conv"`` (:class:`Conv2dSubsampling`, factor 4).
    """

    def __init__(self, input_dim: int, hidden: int = 256, num_layers: int = 3,
                 bidirectional: bool = True, rnn_type: str = "lstm", dropout: float = 0.0,
                 subsampling: str = "stack", stack: int = 3, stride: int = 3):
        super().__init__()
        if subsampling == "stack":
            self.subsampling = FrameStacking(input_dim, stack, stride)
        elif subsampling == "conv":
            self.subsampling = Conv2dSubsampling(input_dim)
        elif subsampling == "none":
            self.subsampling = None
        else:
            raise ValueError(f"subsampling must be none, stack or conv, got {subsampling!r}")
        rnn_dim = input_dim if self.subsampling is None else self.subsampling.output_dim
        rnns = {"lstm": nn.LSTM, "gru": nn.GRU}
        if rnn_type not in rnns:
            raise ValueError(f"rnn_type must be one of {sorted(rnns)}, got {rnn_type!r}")
        self.rnn = rnns[rnn_type](rnn_dim, hidden, num_layers=num_layers, batch_first=True,
                                  bidirectional=bidirectional, dropout=dropout if num_layers > 1 else 0.0)
        self.dropout = nn.Dropout(dropout)
        self.output_dim = hidden * (2 if bidirectional else 1)

    def output_lengths(self, lens: torch.Tensor) -> torch.Tensor:
        return lens if self.subsampling is None else self.subsampling.output_lengths(lens)

    def forward(self, x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.subsampling is not None:
            x, lens = self.subsampling(x, lens)
        packed = nn.utils.rnn.pack_padded_sequence(x, lens.clamp(min=1).cpu(), batch_first=True,
                                                   enforce_sorted=False)
        h, _ = self.rnn(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True, total_length=x.shape[1])
        return self.dropout(h), lens
