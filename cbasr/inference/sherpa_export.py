"""A trained experiment as a sherpa-onnx model directory (``cbasr-export --format sherpa-onnx``).

sherpa-onnx (k2-fsa's onnxruntime runtime, no libtorch) computes Kaldi filterbanks from the
waveform itself and runs models laid out as icefall exports them. What this module writes
follows the readers of sherpa-onnx 2.0.1 (k2-fsa/sherpa-onnx, ``sherpa-onnx/csrc/``:
``offline-zipformer-ctc-model.cc``, ``offline-recognizer-ctc-impl.h``,
``offline-ctc-greedy-search-decoder.cc``, ``offline-transducer-model.cc``,
``offline-transducer-greedy-search-decoder.cc``, ``online-lstm-transducer-model.cc``,
``online-conformer-transducer-model.cc``, ``online-transducer-greedy-search-decoder.cc``,
``offline-stream.cc``, ``features.h``, ``symbol-table.cc``) and the names of k2-fsa/icefall's
``egs/librispeech/ASR/zipformer/export-onnx-ctc.py`` and
``egs/librispeech/ASR/lstm_transducer_stateless2/export-onnx.py``.

Every directory holds ``tokens.txt`` (``<symbol> <id>`` per line, the vocabulary in id order:
``<blk>`` at 0, which is where sherpa-onnx's CTC search looks the blank up and where its
transducer search hard-codes it; a ``<unk>`` token, which the transducer searches skip like
the blank, is warned about), ``feature_config.json`` (the keyword arguments of
``sherpa_onnx.FeatureExtractorConfig`` that reproduce cbasr's features) and ``export.json``
(what was exported and the check's result). Then, by family:

- **CTC**: ``model.onnx`` in the "zipformer2 ctc" layout (``OfflineRecognizer.from_zipformer_ctc``),
  ``(x (N, T, F) filterbanks, x_lens (N,) int64) -> (log_probs (N, T', V), log_probs_len (N,)
  int64)``, metadata ``model_type=zipformer2_ctc``; sherpa reads ``V`` from the output's shape.
  It was chosen over NeMo's CTC layout, whose runtime replaces the front end (below), and
  WeNet's, whose runtime turns dither on.
- **RNN-T and HAT**: icefall's offline transducer (``model_type="transducer"``):
  ``encoder.onnx`` ``(x, x_lens) -> (encoder_out (N, T', J), encoder_out_lens (N,))``, the
  joint's encoder side already projected (HAT's linear blank term appended as a last channel);
  ``decoder.onnx`` ``y (N, context_size) int64 -> decoder_out (N, H)``, metadata
  ``context_size`` and ``vocab_size``; ``joiner.onnx`` ``(encoder_out (N, J), decoder_out (N,
  H)) -> logit (N, V)``. The decoder is icefall's stateless one: sherpa feeds it the last
  ``context_size`` labels of the hypothesis, ``-1`` before the start symbol ``0`` (cbasr's
  start symbol is the blank too, :data:`~cbasr.modules.label_context.START`). A limited label
  context ``c >= 1`` is ``context_size = c`` (``-1`` read as the start symbol, as cbasr pads);
  ``c = 0`` is ``context_size = 1``, ignored; the LSTM prediction network reads a window of the
  last ``history`` labels, from the start symbol on, through the LSTM from its zero state: its
  output is the LSTM's while a hypothesis holds fewer than ``history`` labels (later it starts
  from the window's first label; each decoder call costs ``history`` LSTM steps). The joiner's
  ``logit`` are log probabilities, the blank at 0: RNN-T's softmax, HAT's eq. 4 (Variani et
  al. 2020, "Hybrid Autoregressive Transducer (HAT)", arXiv:2003.07705: the blank from a
  sigmoid, the labels renormalised), so sherpa's greedy search (``LogSoftmax``, which leaves
  them unchanged, then the arg max) emits the best label where it beats the blank: cbasr's
  ``greedy=label`` rule. For ``greedy=emission`` every label's score is raised by ``logsumexp -
  max`` of the labels, so the best one beats the blank where the labels' total does (a beam
  search then reads those scores renormalised). sherpa-onnx emits at most one label per frame:
  cbasr's greedy search with ``loss.max_symbols=1`` (the monotonic topology's).
- **Streaming** (a unidirectional recurrent encoder, or a chunked Conformer with bounded left
  context: :func:`~cbasr.inference.streaming.streamable`): also ``streaming-encoder.onnx``
  for ``OnlineRecognizer.from_transducer`` with the same decoder and joiner, a chunk of ``T``
  feature frames every ``decode_chunk_len`` with the encoder's state. An LSTM (or GRU, whose
  ``c`` passes unchanged) is icefall's "lstm" layout, ``(x (N, T, F), h (L, N, H), c (L, N,
  H)) -> (encoder_out (N, k, J), h, c)``, metadata ``num_encoder_layers``, ``d_model``,
  ``rnn_hidden_size``, ``T``, ``decode_chunk_len``; a chunked Conformer is its "conformer"
  layout, ``(x, attn (L, left_context, N, D), conv (L, cnn_module_kernel - 1, N, D),
  processed_frames (N,)) -> (encoder_out, attn, conv)``, ``k`` its chunk, metadata
  ``left_context``, ``encoder_dim``, ``cnn_module_kernel``, ``pad_length`` too. The frame
  stacking runs inside the chunk: ``T = stride * (k - 1) + stack``. sherpa decodes a chunk once
  a frame past it has arrived: an utterance's last frames need trailing silence.

**Features.** sherpa-onnx computes Kaldi filterbanks with kaldi-native-fbank; cbasr's are
torchaudio's (:func:`~cbasr.data.features.compute_fbank`). Both use a Povey window,
pre-emphasis 0.97, DC removal, no dither, no energy, a 20 Hz low edge and the power spectrum;
sherpa's defaults differ in ``high_freq`` (-400: 400 Hz below Nyquist; torchaudio's 0 is
Nyquist), ``snip_edges`` (false: frames centred on the shifts, the edges reflected) and the
sample scale (``normalize_samples``: the samples in [-1, 1]; cbasr scales them to int16's
range), so ``feature_config.json`` sets those three. ``OfflineRecognizer.from_transducer`` and
``from_zipformer_ctc`` take none of them (build the ``OfflineRecognizerConfig``;
``OnlineRecognizer.from_transducer`` takes them), and
sherpa-onnx's command-line tools cannot set ``snip_edges`` or ``normalize_samples``: there,
these models get other frames. The global CMVN of ``cmvn.json`` and the float16 rounding of a
model trained from the feature cache are folded into each encoder. Delta features, a window
or shift other than 25 ms and 10 ms (which sherpa's Python configuration cannot set) are
refused. Audio at another rate is resampled by sherpa's own resampler, not torchaudio's.
sherpa-onnx's offline timestamps take the subsampling to be 4 (``SubsamplingFactor`` of both
offline layouts): another stride's are scaled wrong; the hypotheses are not affected.

**Not exported.** TDT: sherpa-onnx decodes durations only in its NeMo transducer layout
(``offline-transducer-nemo-model.cc``), whose runtime overrides the front end with NeMo's
(``offline-recognizer-transducer-nemo-impl.h``, ``PostInit``: low frequency 0, librosa's mel
filters, no DC removal): not the Kaldi filterbanks the model was trained on (the same holds
for NeMo's stateful-decoder layouts, which is why the LSTM prediction network goes through the
window above). CB and the label-history decoders: sherpa-onnx has a CTC search (which merges
repeated labels) and transducer searches only.
"""

import logging
import shutil
from pathlib import Path

import torch
from torch import nn

from cbasr.data.features import FeatureSettings, load_feature_settings
from cbasr.inference.experiment import Experiment
from cbasr.inference.export import _example, _save
from cbasr.inference.streaming import streamable
from cbasr.inference.transducer_export import _ConformerStep, _RecurrentStep
from cbasr.models import CTCModel, TransducerModel
from cbasr.modules.encoders import ConformerEncoder
from cbasr.storage.files import write_json, write_text

__all__ = ["SHERPA_ONNX", "sherpa_exportable", "feature_config", "export_sherpa"]

log = logging.getLogger(__name__)

SHERPA_ONNX = "sherpa-onnx"
FEATURE_CONFIG = "feature_config.json"


def sherpa_exportable(model: nn.Module, settings: FeatureSettings | None = None) -> str | None:
    """Why ``model`` (with features ``settings``) does not export to sherpa-onnx, or None."""
    if isinstance(model, TransducerModel) and model.criterion == "tdt":
        return (
            "TDT: sherpa-onnx decodes durations only in its NeMo transducer layout, whose "
            "runtime replaces the Kaldi filterbanks the model was trained on with NeMo's features"
        )
    if not isinstance(model, (CTCModel, TransducerModel)):
        return (
            f"{type(model).__name__} with {type(getattr(model, 'decoder', None)).__name__}: "
            "sherpa-onnx has CTC and transducer (RNN-T, HAT) searches only"
        )
    if settings is not None:
        fbank = settings.fbank
        if fbank.deltas:
            return "delta features: sherpa-onnx gives the model filterbanks only (not folded)"
        if (fbank.frame_length_ms, fbank.frame_shift_ms) != (25.0, 10.0):
            return "sherpa-onnx's Python feature configuration fixes 25 ms windows every 10 ms"
        if settings.utterance_mean:
            return (
                "data.mean_norm=utterance: each utterance's own mean needs the whole utterance, "
                "which sherpa-onnx's encoders (streaming ones included) do not see (not folded)"
            )
    return None


def feature_config(settings: FeatureSettings) -> dict:
    """``sherpa_onnx.FeatureExtractorConfig``'s keyword arguments for cbasr's features."""
    return {
        "sampling_rate": settings.fbank.sample_rate,
        "feature_dim": settings.fbank.num_mel_bins,
        "low_freq": 20.0,
        "high_freq": 0.0,
        "dither": 0.0,
        "normalize_samples": False,
        "snip_edges": True,
    }


class _Normalise(nn.Module):
    """What cbasr does to the filterbanks before the model: float16 rounding, CMVN."""

    def __init__(self, settings: FeatureSettings):
        super().__init__()
        self.register_buffer("mean", settings.mean.clone())
        self.register_buffer("std", settings.std.clone())
        self.float16 = settings.float16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x.half().float() if self.float16 else x) - self.mean) / self.std


def _with_blank(outputs) -> torch.Tensor:
    """The joint's encoder side, ``[enc (..., J)]`` or ``[enc, blank_enc (...)]``, as one
    tensor: the linear blank term a last channel."""
    if len(outputs) == 1:
        return outputs[0]
    return torch.cat([outputs[0], outputs[1].unsqueeze(-1)], dim=-1)


class _Offline(nn.Module):
    """``model.onnx`` (CTC) or ``encoder.onnx`` (a transducer's)."""

    def __init__(self, model, settings: FeatureSettings):
        super().__init__()
        self.model, self.norm = model, _Normalise(settings)

    def forward(self, x: torch.Tensor, x_lens: torch.Tensor):
        h, lens = self.model.encoder(self.norm(x), x_lens)
        if isinstance(self.model, CTCModel):
            return self.model.decoder(h, lens), lens
        return _with_blank(list(self.model.decoder.joint.prepare(h).values())), lens


class _Decoder(nn.Module):
    """The prediction network as icefall's stateless decoder (module docstring)."""

    def __init__(self, model, history: int):
        super().__init__()
        self.prediction = model.decoder.prediction
        context = self.prediction.context
        self.context_size = history if context == -1 else max(context, 1)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        prediction, K = self.prediction, y.shape[1]
        if prediction.context == 0:
            return prediction.step(y[:, -1], None)[0]
        if prediction.context > 0:  # the window y itself (step shifts the last label in)
            return prediction.step(y[:, -1].clamp(min=0), y.roll(1, dims=1).clamp(min=0))[0]
        n = (y >= 0).sum(dim=1)  # labels from the start symbol on, right-aligned in y
        first = (torch.arange(K) + (K - n).unsqueeze(1)).clamp(max=K - 1)
        g, _ = prediction.rnn(prediction.embedding(y.clamp(min=0).gather(1, first)))
        return g.gather(1, (n - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, g.shape[2]))[:, 0]


class _Joiner(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.joint, self.rule = model.decoder.joint, model.greedy
        self.linear_blank = bool(getattr(self.joint, "linear_blank", False))

    def forward(self, encoder_out: torch.Tensor, decoder_out: torch.Tensor) -> torch.Tensor:
        side = {"enc": encoder_out.unsqueeze(1)}
        if self.linear_blank:
            side = {"enc": encoder_out[:, None, :-1], "blank_enc": encoder_out[:, -1:]}
        blank, labels = self.joint.frame(side, 0, decoder_out)
        if self.rule == "emission":  # the best label scores the labels' total
            labels = labels + (labels.logsumexp(-1, keepdim=True) - labels.amax(-1, keepdim=True))
        return torch.cat([blank.unsqueeze(-1), labels], dim=-1)


class _Streaming(nn.Module):
    """``streaming-encoder.onnx``: one chunk of ``T`` filterbank frames with the encoder's
    state, in icefall's "lstm" or "conformer" online layout (module docstring)."""

    def __init__(self, model, settings: FeatureSettings, chunk: int):
        super().__init__()
        encoder, self.norm = model.encoder, _Normalise(settings)
        front = encoder.subsampling
        self.stack, self.stride = (front.stack, front.stride) if front is not None else (1, 1)
        self.conformer = isinstance(encoder, ConformerEncoder)
        self.step = (_ConformerStep if self.conformer else _RecurrentStep)(model)
        self.k = encoder.chunk_size if self.conformer else max(1, -(-chunk // self.stride))
        T, shift = self.stride * (self.k - 1) + self.stack, self.stride * self.k
        self.meta = {"T": T, "decode_chunk_len": shift}
        if self.conformer:
            L, D, keep = len(encoder.conformer.conformer_layers), encoder.output_dim, self.step.keep
            self.states = {"cached_attn": (L, keep, "N", D)}
            self.states["cached_conv"] = (L, encoder.conv_context, "N", D)
            self.meta.update(model_type="conformer", left_context=keep, encoder_dim=D)
            self.meta.update(cnn_module_kernel=encoder.conv_context + 1, pad_length=T - shift)
        else:
            L, H = encoder.rnn.num_layers, encoder.rnn.hidden_size
            self.states = {"h": (L, "N", H), "c": (L, "N", H)}
            self.meta.update(model_type="lstm", d_model=H, rnn_hidden_size=H)
        self.meta["num_encoder_layers"] = L
        self.names = (
            ["x", *self.states, *(["processed_frames"] if self.conformer else [])],
            ["encoder_out", *[f"next_{name}" for name in self.states]],
        )

    def inputs(self, rows: int, dim: int, gen: torch.Generator) -> tuple:
        """Random inputs of ``rows`` streams (a Conformer's: 0, 1, ... chunks decoded)."""
        states = [[rows if d == "N" else d for d in shape] for shape in self.states.values()]
        done = [torch.arange(rows) * self.meta["decode_chunk_len"]] if self.conformer else []
        x = torch.randn(rows, self.meta["T"], dim, generator=gen)
        return (x, *[torch.randn(shape, generator=gen) for shape in states], *done)

    def forward(self, x: torch.Tensor, *state: torch.Tensor):
        x = self.norm(x)
        span = self.stride * (self.k - 1) + 1
        x = torch.cat([x[:, o : o + span : self.stride] for o in range(self.stack)], dim=-1)
        if not self.conformer:
            h, c = state
            out = self.step(x, h, c) if self.step.lstm else (*self.step(x, h), c)
            return _with_blank(out[:-2]), out[-2], out[-1]
        attn, conv, processed = state
        flat = []
        for keys, history in zip(attn, conv):
            flat += [keys.transpose(0, 1), history.permute(1, 2, 0)]
        filled = torch.clamp(processed // self.stride, max=self.step.keep)
        out = self.step(x, filled, *flat)
        enc, new = out[: len(out) - 1 - len(flat)], out[len(out) - len(flat) :]
        attn = torch.stack([keys.transpose(0, 1) for keys in new[0::2]])
        return _with_blank(enc), attn, torch.stack([c.permute(2, 0, 1) for c in new[1::2]])


def _why_not_streamed(model) -> str | None:
    why = streamable(model)
    if why is None and getattr(model.encoder, "left_chunks", 0) < 0:
        why = "a chunked Conformer with unbounded left context has no fixed-size state"
    return why


def _part(tmp: Path, file: str, module, inputs, names: tuple, axes: dict, meta: dict) -> float:
    """Export ``module`` on ``inputs(3)`` to ``tmp / file`` with metadata ``meta`` (dynamic
    axes: ``axes``, else the first), then run it on ``inputs(7)``: the largest difference of
    its outputs from the eager ones, relative to each output's largest magnitude (at least 1);
    an encoder's (with lengths) over the valid frames."""
    import onnx
    import onnxruntime

    path = tmp / file
    _save(module.eval(), path, "onnx", inputs(3), names, lambda name: axes.get(name, {0: "N"}))
    proto = onnx.load(str(path))
    for key, value in {**meta, "model_author": "cbasr"}.items():
        proto.metadata_props.add(key=key, value=str(value))
    onnx.save(proto, str(path))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, ["CPUExecutionProvider"])
    check = inputs(7)
    theirs = session.run(None, {name: t.numpy() for name, t in zip(names[0], check)})
    theirs = [torch.from_numpy(o) for o in theirs]
    with torch.no_grad():
        ours = module(*check)
    ours = [o.detach() for o in (ours if isinstance(ours, (tuple, list)) else [ours])]
    if names[0][1:] == ["x_lens"]:
        if not torch.equal(theirs[-1], ours[-1]):
            raise RuntimeError(f"{path}: the exported lengths differ from the eager model's")
        lens = ours[-1].tolist()
        ours, theirs = ([torch.cat([o[:n] for o, n in zip(t[0], lens)])] for t in (ours, theirs))
    gaps = [
        float((a - b).abs().max()) / max(1.0, float(a.abs().max()))
        for a, b in zip(ours, theirs)
        if a.numel()  # (a Conformer without left context keeps no frames)
    ]
    return max(gaps, default=0.0)


def export_sherpa(
    exp: Experiment, out: str | Path, history: int = 128, chunk: int = 32, tolerance: float = 1e-4
) -> dict:
    """Write ``exp``'s model as the sherpa-onnx directory ``out`` (module docstring); each file
    is checked against the eager model on inputs of another batch size than the exported ones.

    Args:
        history: the labels an LSTM prediction network reads (exact below that many).
        chunk: a streaming recurrent encoder's chunk, in feature frames (rounded up to whole
            stacked frames); a chunked Conformer's is its own.

    Returns:
        ``export.json``'s description, ``max_abs_difference`` the largest relative difference.

    Raises:
        TypeError: a model or feature front end that does not export (:func:`sherpa_exportable`).
        RuntimeError: an exported file differs from the eager model by more than ``tolerance``.
    """
    if exp.cmvn is None:
        raise TypeError(f"{exp.exp_dir}: the model reads text (source tokens); export needs audio")
    if history < 2:
        raise ValueError(f"history must be at least 2 labels, got {history}")
    settings = load_feature_settings(exp.exp_dir, exp.cfg)
    model = exp.model.to("cpu").eval()
    why = sherpa_exportable(model, settings)
    if why:
        raise TypeError(why)
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    dim, ctc = settings.fbank.num_mel_bins, isinstance(model, CTCModel)

    def utterances(rows: int) -> tuple:  # padded batches, the longest first
        return _example(
            dim, [310, *torch.randint(12, 311, (rows - 1,), generator=gen).tolist()], rows
        )

    family = "ctc" if ctc else f"transducer_{model.criterion}"
    description = {"format": SHERPA_ONNX, "family": family}
    files = {"model": "model.onnx"} if ctc else {"encoder": "encoder.onnx"}
    outputs = ["log_probs", "log_probs_len"] if ctc else ["encoder_out", "encoder_out_lens"]
    axes = {"x": {0: "N", 1: "T"}, outputs[0]: {0: "N", 1: "T"}}
    meta = {"model_type": "zipformer2_ctc" if ctc else "conformer"}  # what sherpa-onnx reads
    try:
        offline = _Offline(model, settings)
        file = next(iter(files.values()))
        worst = _part(tmp, file, offline, utterances, (["x", "x_lens"], outputs), axes, meta)
        if not ctc:
            parts = _transducer(model, tmp, files, history, chunk, settings, description, gen)
            worst = max(worst, parts)
        if worst > tolerance:
            raise RuntimeError(f"the sherpa-onnx export differs from the eager model by "
                               f"{worst:.2e} of the output's scale > {tolerance:g}")  # fmt: skip
        tokens = "".join(f"{t} {i}\n" for i, t in enumerate(exp.vocab.tokens))
        write_text(tmp / "tokens.txt", tokens)
        write_json(tmp / FEATURE_CONFIG, feature_config(settings))
        files.update(tokens="tokens.txt", features=FEATURE_CONFIG)
        description.update(files=files, max_abs_difference=worst)
        description.update(feature_config=feature_config(settings), checkpoint=exp.checkpoint)
        write_json(tmp / "export.json", {**description, "epoch": exp.epoch})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # no partial directory left behind
        raise
    out.mkdir(parents=True, exist_ok=True)
    for path in tmp.iterdir():
        path.replace(out / path.name)
    tmp.rmdir()
    if not ctc and model.max_symbols > 1:
        log.warning("%s: sherpa-onnx emits at most one label per frame: cbasr's greedy search "
                    "with loss.max_symbols=1, not this model's %d", out, model.max_symbols)  # fmt: skip
    if "<unk>" in exp.vocab.tokens:
        log.warning("%s: sherpa-onnx's transducer search reads <unk> as a blank", out)
    return description


def _transducer(model, tmp, files, history, chunk, settings, description, gen) -> float:
    """The decoder, the joiner and a streaming model's encoder step into ``tmp``; the largest
    relative difference from the eager modules (:func:`_part`)."""
    vocab = model.decoder.prediction.embedding.num_embeddings
    decoder, joiner = _Decoder(model, history), _Joiner(model)
    K, columns = decoder.context_size, torch.arange(decoder.context_size)
    J = model.decoder.joint.encoder_proj.out_features + int(joiner.linear_blank)
    H = model.decoder.prediction.output_dim

    def labels(rows: int) -> tuple:  # histories of 0 .. K - 1 labels, -1 before the start
        start = (K - 1 - torch.arange(rows) % K)[:, None]  # the start symbol's column
        y = torch.where(columns == start, 0, torch.randint(1, vocab, (rows, K), generator=gen))
        return (torch.where(columns < start, -1, y),)

    def frames(rows: int) -> tuple:
        return torch.randn(rows, J, generator=gen), torch.randn(rows, H, generator=gen)

    files.update(decoder="decoder.onnx", joiner="joiner.onnx")
    meta = {"context_size": K, "vocab_size": vocab}
    worst = _part(tmp, files["decoder"], decoder, labels, (["y"], ["decoder_out"]), {}, meta)
    names = (["encoder_out", "decoder_out"], ["logit"])
    worst = max(worst, _part(tmp, files["joiner"], joiner, frames, names, {}, {"joiner_dim": J}))
    description.update(context_size=K, greedy=model.greedy, max_symbols=model.max_symbols)
    description["streaming"] = _why_not_streamed(model)
    if description["streaming"] is not None:
        return worst
    stream = _Streaming(model, settings, chunk).eval()
    files["streaming_encoder"] = "streaming-encoder.onnx"
    axes = {}
    for name, shape in stream.states.items():
        axes[name] = axes[f"next_{name}"] = {shape.index("N"): "N"}
    dim = settings.fbank.num_mel_bins
    inputs = lambda rows: stream.inputs(rows, dim, gen)  # noqa: E731
    gap = _part(tmp, files["streaming_encoder"], stream, inputs, stream.names, axes, stream.meta)
    description["stream"] = {k: stream.meta[k] for k in ("model_type", "T", "decode_chunk_len")}
    return max(worst, gap)
