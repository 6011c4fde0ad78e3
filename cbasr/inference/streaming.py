"""Streaming greedy decoding of a transducer with a streaming encoder.

A :class:`TransducerStream` takes an utterance's normalised features piece by piece (as audio
arrives) and returns the hypothesis so far after each piece: the front end stacks the frames
that are complete, the encoder runs on them block by block from the state the last block left
(:meth:`stream_step`: a unidirectional recurrent encoder frame by frame, carrying its
``(h, c)``; a chunked Conformer chunk by chunk, carrying each layer's attention context and
convolution history), and the transducer's greedy search (frame by frame: emit the best label
while it beats the blank, by the model's rule, at most ``max_symbols`` times a frame) goes on
from the prediction network's state. Nothing already decided is revised, so each piece only
extends the hypothesis. At the end the stream pads the last frames as the offline encoder does,
and the final hypothesis is the offline greedy search's on the whole utterance
(``tests/inference/test_streaming.py``). Each label is returned with the encoder frame on which
it was emitted; a streaming user sees it once that frame's block has been computed.

Served: RNN-T and HAT (every joint and label context, either topology) over encoders with a
streaming step (:func:`streamable`): a unidirectional
:class:`~cbasr.modules.encoders.RNNEncoder` (``encoder=ulstm``) or a chunked
:class:`~cbasr.modules.encoders.ConformerEncoder` (``encoder.chunk_size > 0``), with frame
stacking or no front end.
"""

import torch

from cbasr.models.transducer import TransducerModel
from cbasr.models.transducer_greedy import best_label
from cbasr.modules.encoders import FrameStacking

__all__ = ["TransducerStream", "streamable", "emission_seconds"]


def streamable(model) -> str | None:
    """Why ``model`` cannot be decoded as a stream, or None."""
    if not isinstance(model, TransducerModel) or model.criterion not in ("rnnt", "hat"):
        return f"{type(model).__name__}: streaming decodes RNN-T and HAT models"
    encoder = model.encoder
    if getattr(encoder, "stream_block", None) is None:
        return (
            f"{type(encoder).__name__}: streaming needs a unidirectional recurrent encoder "
            "(encoder=ulstm) or a chunked Conformer (encoder.chunk_size > 0)"
        )
    if encoder.subsampling is not None and not isinstance(encoder.subsampling, FrameStacking):
        return (
            f"{type(encoder.subsampling).__name__}: streaming needs frame stacking "
            "(encoder.subsampling=stack) or no front end"
        )
    return None


def emission_seconds(
    model, frames: list[int], length: int, shift: float, window: float, duration: float
) -> list[float]:
    """When a streaming user sees each label emitted on the encoder ``frames`` of an
    utterance of ``length`` encoder frames: once the encoder has computed the frame's block
    (its chunk; a recurrent encoder's frame), i.e. once the last feature frame that block
    reads (through the front end's stacking) is complete, feature frame ``j`` at
    ``j * shift + window`` seconds; at most the utterance's ``duration``."""
    encoder = model.encoder
    block, front = encoder.stream_block, encoder.subsampling
    out = []
    for t in frames:
        last = min((t // block + 1) * block, length) - 1  # the block's last encoder frame
        if front is not None:
            last = last * front.stride + front.stack - 1
        out.append(min(duration, last * shift + window))
    return out


class TransducerStream:
    """One utterance decoded as its features arrive (module docstring).

    Args:
        model: an RNN-T or HAT model with a streaming encoder (:func:`streamable`), in eval
            mode.
    """

    def __init__(self, model):
        why = streamable(model)
        if why:
            raise ValueError(why)
        self.model = model
        self.encoder, self.decoder = model.encoder, model.decoder
        self.front = self.encoder.subsampling
        self.pending: torch.Tensor | None = None  # frames not yet stacked
        self.block = self.encoder.stream_block
        self.waiting: torch.Tensor | None = None  # encoder inputs short of a block
        self.encoder_state = self.encoder.stream_begin()
        self.state: dict | None = None  # the prediction network's, and the joint's frames
        self.emissions: list[tuple[int, int]] = []  # (label id, encoder frame)
        self.frames = 0  # encoder frames decoded
        self.finished = False

    @property
    def hypothesis(self) -> list[int]:
        """The label ids emitted so far."""
        return [label for label, _ in self.emissions]

    @torch.no_grad()
    def accept(self, feats: torch.Tensor) -> list[int]:
        """Decode the next piece of normalised features ``(n, F)``; the hypothesis so far."""
        if self.finished:
            raise RuntimeError("this stream is finished: start a new one for the next utterance")
        pending = feats if self.pending is None else torch.cat([self.pending, feats])
        stack, stride = (self.front.stack, self.front.stride) if self.front else (1, 1)
        ready = (pending.shape[0] - stack) // stride + 1 if pending.shape[0] >= stack else 0
        if ready:  # output frame j reads frames j * stride .. j * stride + stack - 1
            used = (ready - 1) * stride + stack
            self._decode(self._stacked(pending[:used], ready))
        self.pending = pending[ready * stride :]
        return self.hypothesis

    @torch.no_grad()
    def finish(self) -> list[int]:
        """Decode what is left (the last frames zero-padded, as the offline encoder pads
        them); the final hypothesis."""
        if not self.finished:
            x = None
            if self.pending is not None and self.pending.shape[0]:
                left = self.pending.shape[0]
                count = -(-left // self.front.stride) if self.front else left
                x = self._stacked(self.pending, count)
            self._decode(x, last=True)
        self.finished = True
        self.pending = None
        return self.hypothesis

    def _stacked(self, frames: torch.Tensor, count: int) -> torch.Tensor:
        """The first ``count`` encoder input frames of ``frames (n, F)``: ``(1, count, D)``."""
        x = frames.unsqueeze(0)
        if self.front is not None:
            x, _ = self.front(x, torch.tensor([frames.shape[0]]))
        return x[:, :count]

    def _decode(self, x: torch.Tensor | None, last: bool = False) -> None:
        """Encode and search the encoder inputs ``x (1, n, F')`` in whole blocks (the rest
        waits for the next piece), all of them if ``last``."""
        if self.waiting is not None:
            x = self.waiting if x is None else torch.cat([self.waiting, x], 1)
        if x is None:
            return
        whole = x.shape[1] if last else x.shape[1] // self.block * self.block
        self.waiting = x[:, whole:]
        for start in range(0, whole, self.block):
            self._search(x[:, start : start + self.block])

    def _search(self, x: torch.Tensor) -> None:
        h, self.encoder_state = self.encoder.stream_step(x, self.encoder_state)
        if self.state is None:
            self.state = self.decoder.begin(h, torch.tensor([h.shape[1]]))
        else:
            self.state.update(self.decoder.joint.prepare(h))
        rule, most = self.model.greedy, self.model.max_symbols
        for t in range(h.shape[1]):
            for _ in range(most):
                blank, labels = self.decoder.frame_scores(self.state, t)
                emit, index = best_label(labels, rule)
                if not bool(emit[0] > blank[0]):
                    break
                label = int(index[0]) + 1
                self.emissions.append((label, self.frames + t))
                self.state = self.decoder.commit(self.state, torch.tensor([True]), index + 1)
        self.frames += h.shape[1]
