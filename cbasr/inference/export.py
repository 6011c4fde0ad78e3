"""Export a trained acoustic model (encoder + the frame-level outputs the search needs) to
TorchScript or ONNX, for use without cbasr.

Families that export are those whose search needs only frame-level outputs:

- CTC (pointwise decoder): ``(feats (B, T, F), lens (B,)) -> (log_probs (B, T', V),
  out_lens (B,))``, id 0 the blank.
- CB with the pointwise decoder: ``-> (emit_logits (B, T'), label_log_probs (B, T', V - 1),
  out_lens (B,))``: frame ``t`` emits with probability ``sigmoid(emit_logits)``, and label id
  ``i + 1`` with ``label_log_probs[..., i]`` (the CB paper's memoryless decomposition, eq. 38's
  terms).

- RNN-T and HAT (their search calls the network once per step): three parts a runtime loops
  over, the encoder, one step of the prediction network and one frame of the joint, with
  :class:`~cbasr.inference.transducer_export.TransducerRuntime`, the greedy search over the
  exported parts (:mod:`cbasr.inference.transducer_export`).

Other decoders whose outputs read the label history (attention and monotonic CB decoders, TDT)
do not export.
The input is normalised filterbank features (``features.json`` and ``cmvn.json`` of the
experiment, written beside the model into ``<out>.json`` with the token inventory).
TorchScript uses ``torch.jit.trace``, ONNX the TorchScript-based exporter (opset 17) with
dynamic batch and time axes; both are checked against the eager model on a padded batch of
another size and length than the one traced.
"""

import json
import logging
import warnings
from pathlib import Path

import torch
from torch import nn

from cbasr.data.features import FEATURE_SETTINGS, utterance_mean_of
from cbasr.inference.experiment import Experiment, subsampling_stride
from cbasr.inference.transducer_export import (
    STEP,
    LoadedPart,
    TransducerParts,
    TransducerRuntime,
    _split,
    part_paths,
)
from cbasr.models import CBModel, CTCModel, TransducerModel
from cbasr.modules.decoders import PointwiseDecoder
from cbasr.modules.label_context import START
from cbasr.storage.files import write_json

__all__ = ["FORMATS", "AcousticModel", "exportable", "export_model", "check_export"]

log = logging.getLogger(__name__)

FORMATS = ("torchscript", "onnx")


def exportable(model: nn.Module) -> str | None:
    """Why ``model`` does not export (as one graph, or as a transducer's parts), or None."""
    if isinstance(model, CTCModel):
        return None
    if isinstance(model, CBModel) and type(model.decoder) is PointwiseDecoder:
        return None
    if isinstance(model, TransducerModel) and model.criterion in ("rnnt", "hat"):
        return None
    decoder = type(getattr(model, "decoder", None)).__name__
    return (
        f"{type(model).__name__} with {decoder}"
        + (f" ({model.criterion})" if isinstance(model, TransducerModel) else "")
        + ": its search reads the label history step by step; CTC, CB with the pointwise "
        "decoder, RNN-T and HAT export"
    )


class AcousticModel(nn.Module):
    """The exported computation: features and lengths to the frame-level outputs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        why = exportable(model)
        if why:
            raise TypeError(why)
        self.model = model
        self.family = "ctc" if isinstance(model, CTCModel) else "cb_pointwise"

    @property
    def output_names(self) -> list[str]:
        if self.family == "ctc":
            return ["log_probs", "out_lens"]
        return ["emit_logits", "label_log_probs", "out_lens"]

    def forward(self, feats: torch.Tensor, lens: torch.Tensor):
        h, out_lens = self.model.encoder(feats, lens)
        if self.family == "ctc":
            return self.model.decoder(h, out_lens), out_lens
        emit_logits, label_log_probs = self.model.decoder.frame_outputs(h)
        return emit_logits, label_log_probs, out_lens


def _example(dim: int, lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded batch of random features with these lengths."""
    generator = torch.Generator().manual_seed(seed)
    feats = torch.randn(len(lengths), max(lengths), dim, generator=generator)
    lens = torch.tensor(lengths)
    return feats * (torch.arange(max(lengths)) < lens[:, None]).unsqueeze(-1), lens


def _run_exported(path: Path, fmt: str, feats: torch.Tensor, lens: torch.Tensor) -> list:
    if fmt == "torchscript":
        return [t.detach() for t in torch.jit.load(str(path))(feats, lens)]
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = session.run(None, {"feats": feats.numpy(), "lens": lens.numpy()})
    return [torch.from_numpy(o) for o in outputs]


def check_export(acoustic: AcousticModel, path: Path, fmt: str, dim: int) -> float:
    """Largest difference between the exported and the eager outputs on a padded batch (of
    another batch size and lengths than the traced one), over the valid frames."""
    feats, lens = _example(dim, [310, 47, 180, 95, 12], seed=1)
    with torch.no_grad():
        eager = acoustic(feats, lens)
    exported = _run_exported(path, fmt, feats, lens)
    if not torch.equal(exported[-1].long(), eager[-1].long()):
        raise RuntimeError(f"{path}: the exported model's output lengths differ from the eager")
    worst = 0.0
    for b, length in enumerate(eager[-1].tolist()):
        for ours, theirs in zip(eager[:-1], exported[:-1]):
            worst = max(worst, float((ours[b, :length] - theirs[b, :length]).abs().max()))
    return worst


def _write_export(acoustic, tmp: Path, fmt: str, feats, lens, dim: int) -> float:
    """Trace or export ``acoustic`` into ``tmp``; the largest difference from eager."""
    axes = {"feats": {0: "batch", 1: "frames"}, "lens": {0: "batch"}}
    axes.update({name: {0: "batch", 1: "out_frames"} for name in acoustic.output_names})
    axes["out_lens"] = {0: "batch"}
    names = (["feats", "lens"], acoustic.output_names)
    _save(acoustic, tmp, fmt, (feats, lens), names, axes.__getitem__)
    return check_export(acoustic, tmp, fmt, dim)


def _save(module, path: Path, fmt: str, example: tuple, names: tuple, axes) -> None:
    """Trace ``module`` on ``example`` into ``path`` (TorchScript), or export it (ONNX, opset
    17, the axes ``axes(name)`` of each input and output dynamic)."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracers' deprecation and constant-folding notes
        if fmt == "torchscript":
            torch.jit.trace(module, example, check_trace=False).save(str(path))
        else:
            inputs, outputs = names
            torch.onnx.export(
                module,
                example,
                str(path),
                input_names=inputs,
                output_names=outputs,
                dynamic_axes={n: axes(n) for n in inputs + outputs},
                opset_version=17,
                dynamo=False,
            )


# the dynamic axes of the transducer parts' tensors, by name
_TRANSDUCER_AXES = {
    "feats": {0: "batch", 1: "frames"},
    "lens": {0: "batch"},
    "enc": {0: "batch", 1: "out_frames"},
    "blank_enc": {0: "batch", 1: "out_frames"},
    "out_lens": {0: "batch"},
    "labels": {0: "batch"},
    "g": {0: "batch"},
    "h": {1: "batch"},
    "c": {1: "batch"},
    "h_out": {1: "batch"},
    "c_out": {1: "batch"},
    "window": {0: "batch"},
    "window_out": {0: "batch"},
    "enc_t": {0: "batch"},
    "blank_enc_t": {0: "batch"},
    "blank": {0: "batch"},
    # the encoder step of a streaming model: a block of frames, the encoder's state
    "x": {0: "batch", 1: "block_frames"},
    "filled": {0: "batch"},
    "filled_out": {0: "batch"},
    "enc_h": {1: "batch"},
    "enc_c": {1: "batch"},
    "enc_h_out": {1: "batch"},
    "enc_c_out": {1: "batch"},
}


def _axes(name: str) -> dict:
    """The dynamic axes of a transducer part's tensor ``name`` (a Conformer step's per-layer
    state, ``keys_i`` and ``conv_i``: its batch)."""
    if name.startswith(("keys_", "conv_")):
        return {0: "batch"}
    if name in ("enc", "blank_enc"):
        return {0: "batch", 1: "out_frames"}
    return _TRANSDUCER_AXES[name]


def _check_parts(parts: TransducerParts, files: dict, fmt: str, dim: int) -> tuple[float, float]:
    """Largest difference between the exported parts and the eager ones, on inputs of another
    batch size (and lengths) than the traced ones: the encoder over the valid frames, the
    predictor from a random state, the joint on random frames and prefixes; absolute, and
    relative to each output's largest magnitude (at least 1: the joint's logits on random
    inputs reach tens, where float32 kernels differ by more than 1e-5)."""
    feats, lens = _example(dim, [310, 47, 180, 95, 12], seed=1)
    generator = torch.Generator().manual_seed(2)
    inputs = parts.examples(feats, lens)
    vocab = parts.model.decoder.prediction.embedding.num_embeddings
    B = feats.shape[0]
    labels = torch.randint(1, vocab, (B,), generator=generator)
    state = [
        torch.randint(0, vocab, s.shape, generator=generator)
        if s.dtype == torch.int64
        else torch.randn(s.shape, generator=generator)
        for s in parts.initial_state(B)
    ]
    inputs["predictor"] = (labels, *state)
    inputs["joint"] = tuple(torch.randn(x.shape, generator=generator) for x in inputs["joint"])
    worst = relative = 0.0

    def differ(ours: torch.Tensor, theirs: torch.Tensor) -> None:
        nonlocal worst, relative
        if ours.shape != theirs.shape:
            raise RuntimeError(f"an exported part's output has shape {tuple(theirs.shape)}, "
                               f"the eager one {tuple(ours.shape)}")  # fmt: skip
        if not ours.numel():  # (a Conformer step without left context keeps no frames)
            return
        gap = float((ours.double() - theirs.double()).abs().max())
        worst = max(worst, gap)
        relative = max(relative, gap / max(1.0, float(ours.double().abs().max())))

    for name in parts.exported:
        run = LoadedPart(files[name], fmt, parts.names[name][0])
        if name == STEP:  # three blocks in a row, each from the state the last one left
            for ours, theirs in zip(*_step_blocks(parts, run, inputs[STEP])):
                differ(ours, theirs)
            continue
        with torch.no_grad():
            eager = parts.modules[name](*inputs[name])
        eager = eager if isinstance(eager, (tuple, list)) else (eager,)
        exported = run(*inputs[name])
        if name == "encoder":
            if not torch.equal(exported[-1].long(), eager[-1].long()):
                raise RuntimeError(f"{files[name]}: the exported encoder's lengths differ")
            for b, n in enumerate(eager[-1].tolist()):
                for ours, theirs in zip(eager[:-1], exported[:-1]):
                    differ(ours[b, :n], theirs[b, :n])
            continue
        for ours, theirs in zip(eager, exported):
            differ(ours, theirs)
    return worst, relative


def _step_blocks(parts: TransducerParts, run, first: tuple) -> tuple[list, list]:
    """The eager and the exported encoder step's outputs over three blocks of random inputs
    shaped as ``first``'s, each block from the state its own run left."""
    generator = torch.Generator().manual_seed(3)
    x, *state = first
    eager_state, exported_state = list(state), list(state)
    eager_out, exported_out = [], []
    for _ in range(3):
        block = torch.randn(x.shape, generator=generator)
        with torch.no_grad():
            *eager, eager_state = _split(list(parts.modules[STEP](block, *eager_state)), len(state))
        *exported, exported_state = _split(run(block, *exported_state), len(state))
        eager_out += [*eager, *eager_state]
        exported_out += [*exported, *exported_state]
    return eager_out, exported_out


def _export_transducer(exp: Experiment, model, fmt: str, out: Path, tolerance: float) -> dict:
    """:func:`export_model` for RNN-T and HAT: the three parts of
    :mod:`cbasr.inference.transducer_export`, each checked, then the greedy search over them
    against the eager model's."""
    parts = TransducerParts(model)
    dim = exp.cmvn[0].numel()
    examples = parts.examples(*_example(dim, [200, 150, 90], seed=0))
    final = part_paths(out)
    files = {name: final[name].with_name(final[name].name + ".tmp") for name in parts.exported}
    for path in files.values():
        path.write_bytes(b"")  # an unwritable destination fails here, naming it
    description = {
        "format": fmt,
        "family": f"transducer_{model.criterion}",
        "parts": {
            name: {
                "file": final[name].name,
                "inputs": parts.names[name][0],
                "outputs": parts.names[name][1],
            }
            for name in parts.exported
        },
        "state": parts.state,
        "start": START,
        "greedy": model.greedy,
        "max_symbols": model.max_symbols,
    }
    if parts.stream is None:
        description["stream"] = None
        description["stream_unavailable"] = parts.why_not_streamed
    else:
        description["stream"] = {**parts.stream, "state": parts.step_state}
    try:
        for name in parts.exported:
            _save(parts.modules[name], files[name], fmt, examples[name], parts.names[name],
                  _axes)  # fmt: skip
        worst, relative = _check_parts(parts, files, fmt, dim)
        if relative > tolerance:
            raise RuntimeError(
                f"the {fmt} export differs from the eager model by {worst:.2e} ({relative:.2e} "
                f"of the output's scale) > {tolerance:g}"
            )
        feats, lens = _example(dim, [310, 47, 180, 95, 12], seed=1)
        runtime = TransducerRuntime(out, files, description)
        with torch.no_grad():
            eager = model.greedy_decode(feats, lens)
            same = runtime.greedy(feats, lens) == eager
            if parts.stream is not None:
                streamed = [runtime.stream_greedy(f[:n]) for f, n in zip(feats, lens.tolist())]
                description["stream_greedy_matches_eager"] = streamed == eager
        if not same or not description.get("stream_greedy_matches_eager", True):
            log.warning("%s: the greedy search over the exported parts differs from the eager "
                        "model's on random features (a near tie?)", out)  # fmt: skip
    except BaseException:
        for path in files.values():
            path.unlink(missing_ok=True)  # no partial file left behind
        raise
    for name in parts.exported:
        files[name].replace(final[name])
    description["outputs"] = [
        f"{name}: {', '.join(parts.names[name][1])}" for name in parts.exported
    ]
    description["max_abs_difference"] = worst
    description["max_relative_difference"] = relative
    description["greedy_matches_eager"] = same
    return description


def export_model(exp: Experiment, fmt: str, out: str | Path, tolerance: float = 1e-5) -> dict:
    """Export ``exp``'s model to ``out`` and ``<out>.json`` (what a decoder needs besides the
    network); returns that description with the measured largest difference from the eager
    model.

    Raises:
        TypeError: a model family that does not export (:func:`exportable`).
        RuntimeError: the exported model differs from the eager one by more than ``tolerance``
            (a transducer's parts: relative to each output's largest magnitude, at least 1).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if exp.cmvn is None:
        raise TypeError(f"{exp.exp_dir}: the model reads text (source tokens); export needs audio")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model = exp.model.to("cpu").eval()
    why = exportable(model)
    if why:
        raise TypeError(why)
    if isinstance(model, TransducerModel):
        description = _export_transducer(exp, model, fmt, out, tolerance)
        return _describe(exp, model, description, out)
    acoustic = AcousticModel(model).eval()
    dim = exp.cmvn[0].numel()
    feats, lens = _example(dim, [200, 150, 90], seed=0)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(b"")  # an unwritable destination fails here, naming it (exporters don't)
    try:
        worst = _write_export(acoustic, tmp, fmt, feats, lens, dim)
        if worst > tolerance:
            raise RuntimeError(
                f"the {fmt} export differs from the eager model by {worst:.2e} > {tolerance:g}"
            )
    except BaseException:
        tmp.unlink(missing_ok=True)  # no partial file left behind
        raise
    tmp.replace(out)
    description = {
        "format": fmt,
        "family": acoustic.family,
        "outputs": acoustic.output_names,
        "max_abs_difference": worst,
    }
    return _describe(exp, model, description, out)


def _describe(exp: Experiment, model, description: dict, out: Path) -> dict:
    """``description`` with what a decoder needs besides the network (tokens, features, CMVN,
    subsampling, the checkpoint), written to ``<out>.json``."""
    settings = json.loads((exp.exp_dir / FEATURE_SETTINGS).read_text())
    mean, std = exp.cmvn
    description = {
        "format": description["format"],
        "family": description["family"],
        "inputs": ["feats (B, T, F) normalised filterbanks", "lens (B,) int64"],
        **description,
        "tokens": exp.vocab.tokens,
        "units": exp.units,
        "features": settings,
        # then, with utterance_mean, each utterance's own mean subtracted (data.mean_norm)
        "cmvn": {
            "mean": mean.tolist(),
            "std": std.tolist(),
            "utterance_mean": utterance_mean_of(exp.cfg),
        },
        "subsampling": subsampling_stride(model),
        "checkpoint": exp.checkpoint,
        "epoch": exp.epoch,
    }
    write_json(out.with_name(out.name + ".json"), description)
    return description
