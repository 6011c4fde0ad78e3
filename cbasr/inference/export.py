"""Export a trained acoustic model (encoder + the frame-level outputs the search needs) to
TorchScript or ONNX, for use without cbasr.

Families that export are those whose search needs only frame-level outputs:

- CTC (pointwise decoder): ``(feats (B, T, F), lens (B,)) -> (log_probs (B, T', V),
  out_lens (B,))``, id 0 the blank.
- CB with the pointwise decoder: ``-> (emit_logits (B, T'), label_log_probs (B, T', V - 1),
  out_lens (B,))``: frame ``t`` emits with probability ``sigmoid(emit_logits)``, and label id
  ``i + 1`` with ``label_log_probs[..., i]`` (the CB paper's memoryless decomposition, eq. 38's
  terms).

Decoders whose outputs read the label history (transducers, attention and monotonic CB
decoders) run a search that calls the network once per step; they do not export as one graph.
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

from cbasr.data.features import FEATURE_SETTINGS
from cbasr.inference.experiment import Experiment, subsampling_stride
from cbasr.models import CBModel, CTCModel
from cbasr.modules.decoders import PointwiseDecoder
from cbasr.storage.files import write_json

__all__ = ["FORMATS", "AcousticModel", "exportable", "export_model", "check_export"]

log = logging.getLogger(__name__)

FORMATS = ("torchscript", "onnx")


def exportable(model: nn.Module) -> str | None:
    """Why ``model`` does not export as one graph, or None."""
    if isinstance(model, CTCModel):
        return None
    if isinstance(model, CBModel) and type(model.decoder) is PointwiseDecoder:
        return None
    decoder = type(getattr(model, "decoder", None)).__name__
    return (
        f"{type(model).__name__} with {decoder}: its search reads the label history step by "
        "step; only CTC and CB with the pointwise decoder export"
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
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracers' deprecation and constant-folding notes
        if fmt == "torchscript":
            torch.jit.trace(acoustic, (feats, lens), check_trace=False).save(str(tmp))
        else:
            axes = {"feats": {0: "batch", 1: "frames"}, "lens": {0: "batch"}}
            axes.update({name: {0: "batch", 1: "out_frames"} for name in acoustic.output_names})
            axes["out_lens"] = {0: "batch"}
            torch.onnx.export(
                acoustic,
                (feats, lens),
                str(tmp),
                input_names=["feats", "lens"],
                output_names=acoustic.output_names,
                dynamic_axes=axes,
                opset_version=17,
                dynamo=False,
            )
    return check_export(acoustic, tmp, fmt, dim)


def export_model(exp: Experiment, fmt: str, out: str | Path, tolerance: float = 1e-5) -> dict:
    """Export ``exp``'s model to ``out`` and ``<out>.json`` (what a decoder needs besides the
    network); returns that description with the measured largest difference from the eager
    model.

    Raises:
        TypeError: a model family that does not export (:func:`exportable`).
        RuntimeError: the exported model differs from the eager one by more than ``tolerance``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if exp.cmvn is None:
        raise TypeError(f"{exp.exp_dir}: the model reads text (source tokens); export needs audio")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model = exp.model.to("cpu").eval()
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
    settings = json.loads((exp.exp_dir / FEATURE_SETTINGS).read_text())
    mean, std = exp.cmvn
    description = {
        "format": fmt,
        "family": acoustic.family,
        "inputs": ["feats (B, T, F) normalised filterbanks", "lens (B,) int64"],
        "outputs": acoustic.output_names,
        "tokens": exp.vocab.tokens,
        "units": exp.units,
        "features": settings,
        "cmvn": {"mean": mean.tolist(), "std": std.tolist()},
        "subsampling": subsampling_stride(model),
        "checkpoint": exp.checkpoint,
        "epoch": exp.epoch,
        "max_abs_difference": worst,
    }
    write_json(out.with_name(out.name + ".json"), description)
    return description
