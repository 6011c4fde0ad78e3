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
  context (the start symbol 0 before the first), or none for ``decoder.context=0``; the search
  starts by stepping the start symbol 0;
- the **joint** (``<out stem>.joint<suffix>``): one frame for the current prefixes,
  ``(enc_t (B, J), [blank_enc_t (B,),] g (B, H)) -> (blank (B,), labels (B, V - 1))``, the log
  probability of the blank and of each label ``1 .. V - 1`` (HAT eq. 4; RNN-T's softmax).

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
from cbasr.modules.label_context import START

__all__ = ["TransducerParts", "TransducerRuntime", "part_paths"]

PARTS = ("encoder", "predictor", "joint")


def part_paths(out: Path) -> dict[str, Path]:
    """The files of the three parts: the encoder at ``out``, the others beside it."""
    return {
        "encoder": out,
        "predictor": out.with_name(f"{out.stem}.predictor{out.suffix}"),
        "joint": out.with_name(f"{out.stem}.joint{out.suffix}"),
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

    def initial_state(self, batch: int) -> list[torch.Tensor]:
        """The predictor's state before the start symbol, for ``batch`` rows."""
        return [_initial(s, batch) for s in self.state]

    def examples(self, feats: torch.Tensor, lens: torch.Tensor) -> dict[str, tuple]:
        """Example inputs of each part, made by running the eager parts on a batch."""
        with torch.no_grad():
            encoded = self.modules["encoder"](feats, lens)
            B = feats.shape[0]
            labels = torch.arange(B) % self.model.decoder.prediction.embedding.num_embeddings
            predictor = (labels, *self.initial_state(B))
            g = self.modules["predictor"](*predictor)[0]
            joint = (encoded[0][:, 0], *([encoded[1][:, 0]] if len(encoded) == 3 else []), g)
        return {"encoder": (feats, lens), "predictor": predictor, "joint": joint}


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
        files = files or {name: path.with_name(parts[name]["file"]) for name in PARTS}
        self.parts = {name: LoadedPart(files[name], fmt, parts[name]["inputs"]) for name in PARTS}
        self.state = self.description["state"]
        self.rule = self.description["greedy"]
        self.max_symbols = self.description["max_symbols"]

    def greedy(self, feats: torch.Tensor, lens: torch.Tensor) -> list[list[int]]:
        """Label ids (``1 .. V - 1``) of each utterance of a padded batch of normalised
        features, one utterance at a time."""
        encoded = self.parts["encoder"](feats, lens)
        enc, out_lens = encoded[0], encoded[-1]
        blank_enc = encoded[1] if len(encoded) == 3 else None
        hyps = []
        for b, frames in enumerate(out_lens.tolist()):
            state = [_initial(s, 1) for s in self.state]
            g, *state = self.parts["predictor"](torch.tensor([START]), *state)
            hyp: list[int] = []
            for t in range(frames):
                side = [
                    enc[b : b + 1, t],
                    *([] if blank_enc is None else [blank_enc[b : b + 1, t]]),
                ]
                for _ in range(self.max_symbols):
                    blank, labels = self.parts["joint"](*side, g)
                    emit, index = best_label(labels[0], self.rule)
                    if not bool(emit > blank[0]):
                        break
                    hyp.append(int(index) + 1)
                    g, *state = self.parts["predictor"](torch.tensor([int(index) + 1]), *state)
            hyps.append(hyp)
        return hyps
