"""Acoustic encoders. Every encoder maps ``(x (B, T, F), lens (B,))`` to ``(h (B, T', D), lens' (B,))``."""

import contextlib

import torch
from torch import nn

from cbasr.checks import in_graph_step
from cbasr.config.schema import ConformerEncoderConfig, RNNEncoderConfig
from cbasr.modules.dropout import Dropout, dropout

__all__ = [
    "FrameStacking",
    "Conv2dSubsampling",
    "TokenEmbedding",
    "RNNEncoder",
    "ConformerEncoder",
    "make_front_end",
    "chunk_attention_mask",
]


def _zero_padding(x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """``x (B, T, F)`` with frames at or beyond ``lens`` set to zero."""
    mask = torch.arange(x.shape[1], device=x.device) < lens.unsqueeze(1)  # (B, T)
    return x * mask.unsqueeze(-1)


class FrameStacking(nn.Module):
    """Concatenate ``stack`` consecutive frames, keeping every ``stride``-th (T' = ceil(T / stride)).

    Frames past an utterance's end are zeros, so padding never changes a result. ``stack`` and
    ``stride`` are >= 1 (the encoder schemas check ``encoder.stack`` and ``encoder.stride``).
    """

    def __init__(self, input_dim: int, stack: int = 3, stride: int = 3):
        super().__init__()
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
        if x.is_cuda and not in_graph_step():
            h = self._run_packed(x, lens)
        else:  # (in a CUDA graph's step, packing would read the lengths on the host)
            h = self._run_padded(x, lens)
        return self.dropout(h), lens

    @property
    def stream_block(self) -> int | None:
        """Frames :meth:`stream_step` takes at a time: any number (1) for a unidirectional
        stack, None for a bidirectional one (it cannot stream)."""
        return None if self.rnn.bidirectional else 1

    def stream_begin(self):
        """The state before an utterance's first frame (the zero state)."""
        return None

    def stream_step(self, x: torch.Tensor, state) -> tuple[torch.Tensor, object]:
        """The output of the next frames ``x (B, n, F')`` after the front end, from the
        recurrent state the last call left (a unidirectional stack: frame ``t`` depends on
        frames up to ``t`` only); and the state."""
        if self.rnn.bidirectional:
            raise ValueError("a bidirectional encoder cannot stream")
        h, state = self.rnn(x, state)
        return self.dropout(h), state

    def _run_packed(self, x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """The stack on a packed batch: cuDNN's way (one fused call for every layer)."""
        packed = nn.utils.rnn.pack_padded_sequence(
            x, lens.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
        )
        h, _ = self.rnn(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True, total_length=x.shape[1])
        return h

    def _run_padded(self, x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """The same stack on the padded batch, one layer and direction at a time: on CPU, and
        in a CUDA graph's step (no lengths read on the host).

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
    :class:`_MaskPadding`).

    **Chunked (streaming) mode**, ``chunk_size > 0`` or ``dynamic_chunks > 0``, as icefall's
    and NeMo's streaming Conformers: frame ``t`` of chunk ``c = t // chunk_size`` attends to
    the frames of chunks ``c - left_chunks .. c`` only (its own chunk whole: the look-ahead
    is the rest of the chunk, never past it), and every depthwise convolution is causal
    (``kernel_size - 1`` frames of left padding, none on the right). The output of a chunk
    then depends on no later input, so :meth:`stream_step` computes it as the chunk arrives,
    from a state carried from chunk to chunk: per layer the attention inputs of the last
    ``left_chunks`` chunks and the convolution's last ``kernel_size - 1`` inputs; equal to
    the whole-utterance forward (``tests/modules/test_encoders.py``). With ``chunk_conv="chunk"``
    the convolutions keep the full-context kernel and see the rest of the chunk too, as the
    attention does: frame ``t`` reads ``(kernel_size - 1) / 2`` earlier frames and the later
    ones up to as many, zeros past its chunk's end (the convolution of each chunk with its
    left context: icefall's Zipformer makes its convolutions chunk-causal for the same reason);
    the state then carries ``(kernel_size - 1) / 2`` inputs. With ``dynamic_chunks``
    each training batch draws its chunk size from ``1 .. dynamic_chunks`` frames or, half the
    time, the full context (Zhang et al. 2020, "Unified Streaming and Non-streaming Two-pass
    End-to-end Model for Speech Recognition", arXiv:2012.05481, dynamic chunk training);
    evaluation uses ``chunk_size`` (0: the full context, still with causal convolutions, or with
    ``chunk_conv="chunk"`` the full-context ones).

    Args:
        input_dim: feature dimension F (or source vocabulary size with ``subsampling="embed"``).
        d_model: model width D; ``num_heads`` must divide it.
        ffn_dim: feed-forward hidden width.
        kernel_size: depthwise convolution kernel (odd).
        subsampling: front end, as for :class:`RNNEncoder` (default ``conv``, factor 4).
        chunk_size: attention chunk in output frames, >= 0 (0: full context).
        left_chunks: chunks of left context, >= -1 (-1: all of them).
        dynamic_chunks: the largest chunk a training batch draws, >= 0 (0: always
            ``chunk_size``).
        chunk_conv: a chunked encoder's convolutions, ``causal`` or ``chunk`` (see above).

    The bounds are :class:`~cbasr.config.schema.ConformerEncoderConfig`'s, checked when the
    ``encoder`` group is typed (as :func:`cbasr.builder.build_model` does).
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
        chunk_size: int = ConformerEncoderConfig.chunk_size,
        left_chunks: int = ConformerEncoderConfig.left_chunks,
        dynamic_chunks: int = ConformerEncoderConfig.dynamic_chunks,
        chunk_conv: str = ConformerEncoderConfig.chunk_conv.value,
    ):
        super().__init__()
        from torchaudio.models import Conformer

        self.chunk_size, self.left_chunks = chunk_size, left_chunks
        self.dynamic_chunks = dynamic_chunks
        self.chunked = chunk_size > 0 or dynamic_chunks > 0
        if str(chunk_conv) not in ("causal", "chunk"):
            raise ValueError(f"encoder.chunk_conv must be causal or chunk, got {chunk_conv!r}")
        self.chunk_conv = str(chunk_conv)
        self.kernel_size = kernel_size
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
            if self.chunked:  # causal or chunk-wise: the padding is added by _conv
                layer.conv_module.sequential[3].padding = (0,)
        self.output_dim = d_model

    def output_lengths(self, lens: torch.Tensor) -> torch.Tensor:
        return lens if self.subsampling is None else self.subsampling.output_lengths(lens)

    def forward(self, x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.subsampling is not None:
            x, lens = self.subsampling(x, lens)
        x = self.proj(x)  # (B, T', F') -> (B, T', D)
        if x.shape[1] == 0:
            return x, lens
        # shapes from the input's, none from its values: a trace (cbasr-export) serves any T'
        valid = torch.arange(x.shape[1], device=x.device) < lens.unsqueeze(1)  # (B, T')
        for mask in self.masks:
            mask.mask = valid.unsqueeze(1).to(x.dtype)  # (B, T') -> (B, 1, T')
        try:
            h = self._layers(x, valid)
        finally:
            for mask in self.masks:
                mask.mask = None
        return h * valid.unsqueeze(-1), lens

    @contextlib.contextmanager
    def full_context(self):
        """Within it, the forward attends over the whole utterance (the full-context mode of
        dual-mode training; the convolutions stay as ``chunk_conv`` makes them at chunk 0)."""
        self._full_context = True
        try:
            yield self
        finally:
            self._full_context = False

    def current_chunk(self) -> int:
        """The attention chunk of this forward call: ``chunk_size`` (0: the full context),
        or in training with ``dynamic_chunks`` a draw (class docstring); 0 inside
        :meth:`full_context`."""
        if getattr(self, "_full_context", False):
            return 0
        if not (self.training and self.dynamic_chunks):
            return self.chunk_size
        if torch.rand(()) < 0.5:
            return 0
        return int(torch.randint(1, self.dynamic_chunks + 1, ()))

    def _layers(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Every layer on ``x (B, T, D)`` with ``valid (B, T)``: attention over the valid
        frames (a padded frame's output is never read), within the chunks in chunked mode."""
        chunk = self.current_chunk() if self.chunked else 0
        if chunk == 0:  # the full context: the valid keys (at least one a row)
            first = torch.arange(valid.shape[1], device=x.device) == 0
            allowed = (valid | first)[:, None, None, :]  # (B, 1, 1, T)
        else:
            T = valid.shape[1]
            allowed = chunk_attention_mask(T, chunk, self.left_chunks, x.device)
            # a valid frame attends to valid frames only; a padded one to its chunk (any
            # keys: it is never read, but softmax needs one)
            allowed = allowed & (valid.unsqueeze(1) | ~valid.unsqueeze(2))  # (B, T, T)
            allowed = allowed.unsqueeze(1)  # (B, 1, T, T)
        for layer in self.conformer.conformer_layers:
            x, _, _ = self._layer(layer, x, allowed, chunk=chunk)
        return x

    @property
    def conv_context(self) -> int:
        """The earlier inputs a chunked encoder's depthwise convolution reads (its state)."""
        return self.kernel_size - 1 if self.chunk_conv == "causal" else self.kernel_size // 2

    def _layer(self, layer, x, allowed, keys=None, conv_cache=None, chunk=None):
        """One of torchaudio's Conformer layers (its modules and order) on ``x (B, T, D)``:
        its attention to the keys ``allowed`` (``(B, 1, T or 1, S)``, True: attended; None:
        all), after ``keys`` (the attention inputs of earlier frames, streaming), and in
        chunked mode its convolution causal or chunk-wise (chunks of ``chunk`` frames, 0 or
        None: one) after ``conv_cache``. Returns the output, the attention inputs (``keys``
        and this call's) and the new cache."""
        x = x + 0.5 * layer.ffn1(x)
        a = layer.self_attn_layer_norm(x)
        keys = a if keys is None else torch.cat([keys, a], 1)
        y = self._attend(layer.self_attn, a, keys, allowed)
        x = x + layer.self_attn_dropout(y)
        y, conv_cache = self._conv(layer.conv_module, x, conv_cache, chunk)
        x = x + y
        x = x + 0.5 * layer.ffn2(x)
        return layer.final_layer_norm(x), keys, conv_cache

    def _attend(self, mha: nn.MultiheadAttention, queries, keys, allowed):
        """``mha`` (its projections and dropout) as scaled dot-product attention of
        ``queries (B, T, D)`` over ``keys (B, S, D)`` (also the values), with every shape taken
        from the inputs' (``nn.MultiheadAttention``'s own ONNX export fixes them)."""
        D, H = mha.embed_dim, mha.num_heads
        w, b = mha.in_proj_weight, mha.in_proj_bias

        def heads(t, n):  # (B, L, n D) -> n of (B, H, L, D / H)
            return t.unflatten(-1, (n, H, -1)).permute(2, 0, 3, 1, 4).unbind(0)

        if keys is queries:  # self-attention: the three projections as one product
            q, k, v = heads(nn.functional.linear(queries, w, b), 3)
        else:  # after a stream's earlier frames: the queries', then the keys' and values'
            (q,) = heads(nn.functional.linear(queries, w[:D], b[:D]), 1)
            k, v = heads(nn.functional.linear(keys, w[D:], b[D:]), 2)
        y = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=mha.dropout if self.training else 0.0
        )
        return mha.out_proj(y.transpose(1, 2).flatten(2))

    def _conv(self, module, x, cache, chunk=None):
        """The convolution module; in chunked mode its depthwise convolution reads
        :attr:`conv_context` earlier inputs, ``cache (B, D, conv_context)`` or zeros, and the
        last ``conv_context`` of its inputs are returned as the next call's cache: causal, or
        chunk-wise (``chunk`` frames at a time, the later inputs of a frame's chunk and zeros
        past it; 0 or None: one chunk)."""
        seq = module.sequential  # pointwise, GLU, mask, depthwise, norm, SiLU, pointwise, dropout
        y = seq[2](seq[1](seq[0](module.layer_norm(x).transpose(1, 2))))  # (B, D, T) masked
        if self.chunked:
            context = self.conv_context
            if cache is None:
                cache = y.new_zeros(*y.shape[:2], context)
            y = torch.cat([cache, y], 2)
            cache = y[:, :, y.shape[2] - context :]
            if self.chunk_conv == "causal":
                y = seq[3](y)
            else:
                y = _chunk_conv(seq[3], y, context, chunk)
        else:
            y = seq[3](y)
        for step in seq[4:]:
            y = step(y)
        return y.transpose(1, 2), cache

    # streaming: one chunk at a time (see the class docstring)

    @property
    def stream_block(self) -> int | None:
        """The frames :meth:`stream_step` takes at a time (its chunk), None if this encoder
        cannot stream (full-context attention)."""
        return self.chunk_size if self.chunk_size > 0 else None

    def stream_begin(self) -> list:
        """The state before an utterance's first chunk: per layer, no attention inputs and
        a zero convolution history."""
        return [(None, None) for _ in self.conformer.conformer_layers]

    def stream_step(self, x: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        """The output of the next chunk, ``x (B, n, F')`` after the front end (``n`` frames:
        :attr:`stream_block`, fewer for the utterance's last), in eval mode; and the state."""
        if self.chunk_size <= 0:
            raise ValueError("a full-context Conformer (encoder.chunk_size=0) cannot stream")
        if x.shape[1] > self.chunk_size:
            raise ValueError(f"stream_step takes at most one chunk ({self.chunk_size} frames)")
        x = self.proj(x)
        keep = None if self.left_chunks < 0 else self.left_chunks * self.chunk_size
        out = []
        for layer, (keys, conv_cache) in zip(self.conformer.conformer_layers, state):
            x, keys, conv_cache = self._layer(layer, x, None, keys, conv_cache, self.chunk_size)
            if keep is not None:  # the left context of the next chunk
                keys = keys[:, max(0, keys.shape[1] - keep) :]
            out.append((keys, conv_cache))
        return x, out


def _chunk_conv(conv: nn.Conv1d, y: torch.Tensor, context: int, chunk: int | None):
    """The depthwise convolution ``conv`` (kernel ``2 context + 1``) of ``y (B, D, context +
    T)`` (``context`` earlier inputs, then ``T`` frames whose chunks of ``chunk`` frames start
    at frame 0; 0 or None: one chunk), each frame reading its ``context`` earlier inputs and
    its later ones up to its chunk's end (zeros past it): ``(B, D, T)``.

    The taps on the past are one convolution over ``y``; the taps on the future one more over
    the frames laid out a chunk to a row, each row padded with zeros (a few kernels whatever
    the kernel's size). A trace (``cbasr-export``) takes :func:`_chunk_conv_taps` instead, which
    does no arithmetic on sizes, so that the trace serves any length."""
    w = conv.weight  # (D, 1, 2 context + 1)
    out = nn.functional.conv1d(y, w[:, :, : context + 1], conv.bias, groups=w.shape[0])
    if not context:
        return out
    if torch.jit.is_tracing():
        return out + _chunk_conv_taps(w, y[:, :, context:], context, chunk)
    x = y[:, :, context:]  # the frames
    B, D, T = x.shape
    size = chunk if chunk and chunk < T else T  # (one chunk: the whole row)
    rows = -(-T // size) if T else 0
    if rows > 1:  # (B, D, rows * size) -> (B rows, D, size): a chunk to a row
        x = nn.functional.pad(x, (0, rows * size - T)).unflatten(2, (rows, size))
        x = x.transpose(1, 2).reshape(B * rows, D, size)
    # frame t of a row reads t + 1 .. t + context of that row, zeros past its end
    later = nn.functional.pad(x[:, :, 1:], (0, context))
    ahead = nn.functional.conv1d(later, w[:, :, context + 1 :], groups=D)
    if rows > 1:
        ahead = ahead.unflatten(0, (B, rows)).transpose(1, 2).flatten(2)[:, :, :T]
    return out + ahead


def _chunk_conv_taps(w: torch.Tensor, x: torch.Tensor, context: int, chunk: int | None):
    """The future taps of :func:`_chunk_conv` (its weight ``w``, its frames ``x (B, D, T)``)
    one at a time, each a shifted, masked product: no arithmetic on sizes."""
    t = torch.arange(x.shape[2], device=x.device)
    out = torch.zeros_like(x)
    for j in range(1, context + 1):
        later = nn.functional.pad(x, (0, j))[:, :, j:]  # frame t + j (zeros past the end)
        if chunk:
            later = later * (t % chunk + j < chunk).to(x.dtype)
        out = out + w[:, :, context + j] * later  # (D, 1): a weight per channel
    return out


def chunk_attention_mask(T: int, chunk: int, left_chunks: int, device=None) -> torch.Tensor:
    """``(T, T)`` bool, True where frame ``t`` (row) may attend to frame ``s``: ``s`` in the
    chunks ``c - left_chunks .. c`` of ``t``'s chunk ``c = t // chunk`` (``left_chunks`` -1:
    every earlier chunk). ``chunk`` 0: every frame to every frame."""
    if chunk <= 0:
        return torch.ones(T, T, dtype=torch.bool, device=device)
    c = torch.arange(T, device=device) // chunk
    back = c.unsqueeze(1) - c.unsqueeze(0)  # query chunk - key chunk
    allowed = back >= 0
    if left_chunks >= 0:
        allowed = allowed & (back <= left_chunks)
    return allowed
