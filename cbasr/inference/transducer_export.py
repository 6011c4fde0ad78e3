"""RNN-T and HAT models exported as the three parts a runtime loops over, and a greedy search
over the exported parts.

A transducer's search calls its network once per step, so it does not export as one graph
(:mod:`cbasr.inference.export`). It exports as three, each checked against the eager model:

- the **encoder** (``<out>``): ``(feats (B, T, F), lens (B,)) -> (enc (B, T', J),
  out_lens (B,))``, the joint's encoder side already projected (:meth:`Joint.prepare`); a HAT
  joint with the linear blank (``decoder.blank_joint=linear``) also outputs its blank term
  ``blank_enc (B, T')`` before ``out_lens``;
- the **predictor** (``<out stem>.predictor<suffix>``): one step of the prediction network,
  ``(labels (B,), *state) -> (g (B, H), *state)``; the state is the LSTM's ``h, c`` ``(layers,
  B, H)`` (zeros before the first label), or the last ``c`` labels ``(B, c)`` of a limited
  context (the start symbol 0 before the first), or none for ``decoder.label.context=0``; the
  search starts by stepping the start symbol 0;
- the **joint** (``<out stem>.joint<suffix>``): one frame for the current prefixes,
  ``(enc_t (B, J), [blank_enc_t (B,),] g (B, H)) -> (blank (B,), labels (B, V - 1))``, the log
  probability of the blank and of each label ``1 .. V - 1`` (HAT eq. 4; RNN-T's softmax).

A model with a streaming encoder (:func:`~cbasr.inference.streaming.streamable`) exports a
fourth part, the **encoder step** (``<out stem>.encoder_step<suffix>``): one block of encoder
inputs (after the front end's frame stacking, which a runtime does itself: ``<out>.json``'s
``stream.front_end``) with the encoder's state, ``(x (B, n, F'), *state) -> (enc (B, n, J),
[blank_enc (B, n),] *state)``, ``n`` at most ``stream.block`` frames. Its state has a fixed
shape, zeros before the first block: a unidirectional recurrent encoder's ``(h, c)``; a chunked
Conformer's, per layer, the attention inputs of the last ``left_chunks`` chunks (``keys_i (B,
left_chunks * chunk, D)``, the newest last, of which ``filled (B,)`` are real: the rest is
masked out of the attention) and the depthwise convolution's last inputs (``conv_i``:
``kernel_size - 1`` of them, ``(kernel_size - 1) / 2`` with ``encoder.chunk_conv=chunk``). A
Conformer with unbounded left context (``left_chunks = -1``) has no fixed-size state and
exports no step. :meth:`TransducerRuntime.stream_greedy` runs the greedy search block by block
over it.

``<out>.json`` describes the parts, their inputs, outputs and initial state, the greedy rule
and the most labels per frame. :class:`TransducerRuntime` loads them (TorchScript or ONNX) and
runs the transducers' greedy search on them (frame by frame: emit the best label where it
beats the blank, by the model's rule (:func:`~cbasr.models.transducer_greedy.best_label`), at
most ``max_symbols`` times per frame); its hypotheses are the eager model's.
"""

import json
from pathlib import Path

import torch
from torch import nn

from cbasr.models.transducer_greedy import best_label
from cbasr.modules.encoders import FrameStacking
from cbasr.modules.label_context import START

__all__ = ["TransducerParts", "TransducerRuntime", "part_paths"]

PARTS = ("encoder", "predictor", "joint")
STEP = "encoder_step"  # the fourth part of a streaming model


def part_paths(out: Path) -> dict[str, Path]:
    """The files of the parts: the encoder at ``out``, the others (the encoder step of a
    streaming model among them) beside it."""
    return {
        "encoder": out,
        **{name: out.with_name(f"{out.stem}.{name}{out.suffix}") for name in (*PARTS[1:], STEP)},
    }


class _Encoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.encoder, self.joint = model.encoder, model.decoder.joint
        self.linear_blank = bool(getattr(self.joint, "linear_blank", False))

    def forward(self, feats: torch.Tensor, lens: torch.Tensor):
        h, out_lens = self.encoder(feats, lens)
        side = self.joint.prepare(h)
        if self.linear_blank:
            return side["enc"], side["blank_enc"], out_lens
        return side["enc"], out_lens


def _encoder_outputs(joint, linear_blank: bool, h: torch.Tensor) -> list[torch.Tensor]:
    """The joint's encoder side of ``h``: ``[enc]``, or ``[enc, blank_enc]``."""
    side = joint.prepare(h)
    return [side["enc"], side["blank_enc"]] if linear_blank else [side["enc"]]


class _RecurrentStep(nn.Module):
    """The next frames of a unidirectional recurrent encoder from its ``(h, c)`` (or GRU ``h``),
    with the joint's encoder side."""

    def __init__(self, model):
        super().__init__()
        self.encoder, self.joint = model.encoder, model.decoder.joint
        self.linear_blank = bool(getattr(self.joint, "linear_blank", False))
        self.lstm = isinstance(self.encoder.rnn, nn.LSTM)

    def forward(self, x: torch.Tensor, *state: torch.Tensor):
        if self.lstm:
            h, (hn, cn) = self.encoder.rnn(x, (state[0], state[1]))
            new = [hn, cn]
        else:
            h, hn = self.encoder.rnn(x, state[0])
            new = [hn]
        return (*_encoder_outputs(self.joint, self.linear_blank, self.encoder.dropout(h)), *new)


class _ConformerStep(nn.Module):
    """One chunk of a chunked Conformer from a fixed-size state (module docstring), with the
    joint's encoder side: :meth:`ConformerEncoder.stream_step`'s computation, the left context
    a buffer of ``keep`` frames of which the last ``filled`` are attended."""

    def __init__(self, model):
        super().__init__()
        self.encoder, self.joint = model.encoder, model.decoder.joint
        self.linear_blank = bool(getattr(self.joint, "linear_blank", False))
        self.keep = self.encoder.left_chunks * self.encoder.chunk_size

    def forward(self, x: torch.Tensor, filled: torch.Tensor, *state: torch.Tensor):
        encoder = self.encoder
        x = encoder.proj(x)
        n = x.shape[1]
        keys = torch.arange(self.keep + n, device=x.device)
        allowed = keys.unsqueeze(0) >= self.keep - filled.unsqueeze(1)  # (B, keep + n)
        allowed = allowed[:, None, None, :]  # every query of the chunk: the same keys
        new = []
        for i, layer in enumerate(encoder.conformer.conformer_layers):
            x, inputs, conv = encoder._layer(
                layer, x, allowed, state[2 * i], state[2 * i + 1], encoder.chunk_size
            )
            new += [inputs[:, inputs.shape[1] - self.keep :], conv]
        filled = torch.clamp(filled + n, max=self.keep)
        return (*_encoder_outputs(self.joint, self.linear_blank, x), filled, *new)


class _Predictor(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.prediction = model.decoder.prediction
        self.context = self.prediction.context

    def forward(self, labels: torch.Tensor, *state: torch.Tensor):
        if self.context == -1:  # the LSTM's (h, c)
            g, (h, c) = self.prediction.step(labels, (state[0], state[1]))
            return g, h, c
        if self.context == 0:  # a constant: no state
            return (self.prediction.step(labels, None)[0],)
        g, window = self.prediction.step(labels, state[0])
        return g, window


class _Joint(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.joint = model.decoder.joint
        self.linear_blank = bool(getattr(self.joint, "linear_blank", False))

    def forward(self, enc_t: torch.Tensor, *rest: torch.Tensor):
        side = {"enc": enc_t.unsqueeze(1)}
        if self.linear_blank:
            side["blank_enc"] = rest[0].unsqueeze(1)
        return self.joint.frame(side, 0, rest[-1])


class TransducerParts:
    """The three parts of an RNN-T or HAT model (module docstring), with their names, example
    inputs and initial state."""

    def __init__(self, model):
        self.model = model
        self.modules = {"encoder": _Encoder(model), "predictor": _Predictor(model)}
        self.modules["joint"] = _Joint(model)
        for module in self.modules.values():
            module.eval()
        linear = self.modules["encoder"].linear_blank
        prediction = model.decoder.prediction
        self.context = prediction.context
        if self.context == -1:
            rnn = prediction.rnn
            shape = [rnn.num_layers, "batch", rnn.hidden_size]
            self.state = [
                {"name": name, "shape": shape, "dtype": "float32", "init": 0.0}
                for name in ("h", "c")
            ]
        elif self.context == 0:
            self.state = []
        else:
            width = max(self.context, 1)
            self.state = [
                {"name": "window", "shape": ["batch", width], "dtype": "int64", "init": START}
            ]
        self.step_state, self.stream = self._stream_part(model)
        enc_names = ["enc", "blank_enc"] if linear else ["enc"]
        self.names = {
            "encoder": (
                ["feats", "lens"],
                ["enc", "blank_enc", "out_lens"] if linear else ["enc", "out_lens"],
            ),
            "predictor": (
                ["labels", *[s["name"] for s in self.state]],
                ["g", *[s["name"] + "_out" for s in self.state]],
            ),
            "joint": (["enc_t", *(["blank_enc_t"] if linear else []), "g"], ["blank", "labels"]),
        }
        if self.stream is not None:
            names = [s["name"] for s in self.step_state]
            self.names[STEP] = (["x", *names], [*enc_names, *[f"{n}_out" for n in names]])

    @property
    def exported(self) -> tuple[str, ...]:
        """The parts this model exports: :data:`PARTS`, and the encoder step if it streams."""
        return PARTS if self.stream is None else (*PARTS, STEP)

    def _stream_part(self, model) -> tuple[list[dict], dict | None]:
        """The encoder step's state and ``stream`` description (``block``, ``front_end``), with
        its module in :attr:`modules`; ``([], None)`` where the model does not stream (the
        description's ``stream_unavailable`` says why)."""
        from cbasr.inference.streaming import streamable
        from cbasr.modules.encoders import ConformerEncoder

        encoder = model.encoder
        self.why_not_streamed = streamable(model)
        if self.why_not_streamed is None and isinstance(encoder, ConformerEncoder):
            if encoder.left_chunks < 0:
                self.why_not_streamed = (
                    "a chunked Conformer with unbounded left context (encoder.left_chunks=-1) "
                    "has no fixed-size state to export"
                )
        if self.why_not_streamed is not None:
            return [], None
        if isinstance(encoder, ConformerEncoder):
            module = _ConformerStep(model)
            D, keep = encoder.output_dim, module.keep
            state = [{"name": "filled", "shape": ["batch"], "dtype": "int64", "init": 0}]
            for i in range(len(encoder.conformer.conformer_layers)):
                state.append(_zeros(f"keys_{i}", ["batch", keep, D]))
                state.append(_zeros(f"conv_{i}", ["batch", D, encoder.conv_context]))
        else:
            module = _RecurrentStep(model)
            shape = [encoder.rnn.num_layers, "batch", encoder.rnn.hidden_size]
            names = ("enc_h", "enc_c") if module.lstm else ("enc_h",)
            state = [_zeros(name, shape) for name in names]
        self.modules[STEP] = module.eval()
        front = encoder.subsampling
        stream = {
            "block": encoder.stream_block,
            "front_end": None if front is None else {"stack": front.stack, "stride": front.stride},
        }
        return state, stream

    def initial_state(self, batch: int) -> list[torch.Tensor]:
        """The predictor's state before the start symbol, for ``batch`` rows."""
        return [_initial(s, batch) for s in self.state]

    def step_inputs(self, feats: torch.Tensor, lens: torch.Tensor) -> tuple:
        """The encoder step's first block of ``feats`` (after the front end) with the initial
        state: an example of its inputs."""
        encoder = self.model.encoder
        with torch.no_grad():
            x = feats if encoder.subsampling is None else encoder.subsampling(feats, lens)[0]
        block = self.stream["block"] if self.stream["block"] > 1 else min(x.shape[1], 4)
        return (x[:, :block], *[_initial(s, x.shape[0]) for s in self.step_state])

    def examples(self, feats: torch.Tensor, lens: torch.Tensor) -> dict[str, tuple]:
        """Example inputs of each part, made by running the eager parts on a batch."""
        with torch.no_grad():
            encoded = self.modules["encoder"](feats, lens)
            B = feats.shape[0]
            labels = torch.arange(B) % self.model.decoder.prediction.embedding.num_embeddings
            predictor = (labels, *self.initial_state(B))
            g = self.modules["predictor"](*predictor)[0]
            joint = (encoded[0][:, 0], *([encoded[1][:, 0]] if len(encoded) == 3 else []), g)
        examples = {"encoder": (feats, lens), "predictor": predictor, "joint": joint}
        if self.stream is not None:
            examples[STEP] = self.step_inputs(feats, lens)
        return examples


def _zeros(name: str, shape: list) -> dict:
    return {"name": name, "shape": shape, "dtype": "float32", "init": 0.0}


def _initial(spec: dict, batch: int) -> torch.Tensor:
    shape = [batch if d == "batch" else d for d in spec["shape"]]
    dtype = torch.int64 if spec["dtype"] == "int64" else torch.float32
    return torch.full(shape, spec["init"], dtype=dtype)


class LoadedPart:
    """One exported part, called on tensors, returning tensors."""

    def __init__(self, path: Path, fmt: str, inputs: list[str]):
        self.fmt, self.inputs = fmt, inputs
        if fmt == "torchscript":
            self.module = torch.jit.load(str(path))
        else:
            import onnxruntime

            self.session = onnxruntime.InferenceSession(
                str(path), providers=["CPUExecutionProvider"]
            )

    def __call__(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        if self.fmt == "torchscript":
            out = self.module(*tensors)
            return [t.detach() for t in (out if isinstance(out, (tuple, list)) else (out,))]
        feed = {name: t.numpy() for name, t in zip(self.inputs, tensors)}
        return [torch.from_numpy(o) for o in self.session.run(None, feed)]


class TransducerRuntime:
    """The greedy search of an exported RNN-T or HAT model, over its parts: what a runtime
    written from ``<out>.json`` does, in Python.

    Args:
        path: the encoder file ``cbasr-export`` wrote (``<out>``), ``<out>.json`` beside it.
        files: instead of the files the description names, these (by part).
        description: instead of ``<out>.json``'s, this.
    """

    def __init__(
        self, path: str | Path, files: dict | None = None, description: dict | None = None
    ):
        path = Path(path)
        if description is None:
            description = json.loads(path.with_name(path.name + ".json").read_text())
        self.description = description
        fmt, parts = description["format"], description["parts"]
        files = files or {name: path.with_name(part["file"]) for name, part in parts.items()}
        self.parts = {name: LoadedPart(files[name], fmt, parts[name]["inputs"]) for name in parts}
        self.state = self.description["state"]
        self.stream = self.description.get("stream")
        self.rule = self.description["greedy"]
        self.max_symbols = self.description["max_symbols"]

    def greedy(self, feats: torch.Tensor, lens: torch.Tensor) -> list[list[int]]:
        """Label ids (``1 .. V - 1``) of each utterance of a padded batch of normalised
        features, one utterance at a time."""
        encoded = self.parts["encoder"](feats, lens)
        out_lens = encoded[-1]
        hyps = []
        for b, frames in enumerate(out_lens.tolist()):
            search = _Search(self)
            search.frames([e[b : b + 1, :frames] for e in encoded[:-1]])
            hyps.append(search.hyp)
        return hyps

    def stream_greedy(self, feats: torch.Tensor) -> list[int]:
        """The label ids of one utterance's normalised features ``(T, F)``, decoded block by
        block over the encoder step (a streaming model's fourth part): what a streaming
        runtime does as the frames arrive (the frame stacking is local: a stacked frame needs
        ``stack`` frames, the last ones zero-padded at the end, as the offline front end
        pads them)."""
        if self.stream is None:
            why = self.description.get("stream_unavailable", "no encoder step was exported")
            raise ValueError(f"this model exports no encoder step: {why}")
        front = self.stream["front_end"]
        if front is None:
            x = feats
        else:  # the encoder's own front end, from the description's numbers
            stacking = FrameStacking(feats.shape[1], front["stack"], front["stride"])
            x = stacking(feats[None], torch.tensor([feats.shape[0]]))[0][0]
        step = self.parts[STEP]
        state = [_initial(s, 1) for s in self.stream["state"]]
        search = _Search(self)
        block = self.stream["block"]
        for start in range(0, x.shape[0], block):
            *encoded, state = _split(step(x[None, start : start + block], *state), len(state))
            search.frames(encoded)
        return search.hyp


def _split(outputs: list[torch.Tensor], count: int) -> list:
    """The encoder step's outputs as ``[*encoded, state]`` (the last ``count`` are the state)."""
    return [*outputs[: len(outputs) - count], outputs[len(outputs) - count :]]


class _Search:
    """The greedy search of one utterance over the exported predictor and joint, frame by
    frame as the encoder's frames come (all at once, or a block at a time)."""

    def __init__(self, runtime: "TransducerRuntime"):
        self.runtime = runtime
        self.state = [_initial(s, 1) for s in runtime.state]
        self.g, *self.state = runtime.parts["predictor"](torch.tensor([START]), *self.state)
        self.hyp: list[int] = []

    def frames(self, encoded: list[torch.Tensor]) -> None:
        """Search the frames of ``encoded``: ``[enc (1, n, J)]`` or with ``blank_enc (1,
        n)``."""
        runtime = self.runtime
        for t in range(encoded[0].shape[1]):
            side = [e[:, t] for e in encoded]
            for _ in range(runtime.max_symbols):
                blank, labels = runtime.parts["joint"](*side, self.g)
                emit, index = best_label(labels[0], runtime.rule)
                if not bool(emit > blank[0]):
                    break
                self.hyp.append(int(index) + 1)
                self.g, *self.state = runtime.parts["predictor"](
                    torch.tensor([int(index) + 1]), *self.state
                )
