"""Recognise audio with a trained experiment directory, outside any recipe.

    from cbasr import Recognizer

    recognizer = Recognizer.from_pretrained("recipes/synth/exp/blstm_ctc")
    for result in recognizer.transcribe(["a.wav", "b.flac"], timestamps=True):
        print(result.source, result.text, result.times)

The experiment directory alone is enough: the model's checkpoint and configuration, its token
inventory (``vocab.txt``), the normalisation statistics (``cmvn.json``) and the feature
extraction settings (``features.json``). Audio of any format libsndfile or the SPHERE reader
opens is read by content, resampled to the model's rate and reduced to its first channel (both
logged); features are computed as in training, rounded to float16 when the model was trained
from the feature cache, so a file's hypothesis equals the recipe's decoding of the same audio.
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cbasr.data.audio import read_audio_channels
from cbasr.data.batching import BucketBatchSampler
from cbasr.data.features import FeatureSettings, load_feature_settings
from cbasr.data.vocab import tokens_to_words
from cbasr.devices import select_device
from cbasr.inference.alignment import Alignment, align_batch
from cbasr.inference.decode import decode_batch
from cbasr.inference.experiment import MAX_FRAMES, Experiment, subsampling_stride
from cbasr.search import BeamSearchOptions, LabelScorer, check_options, load_language_model

__all__ = ["Recognizer", "RecognizerStream", "Transcription", "AudioInput"]

log = logging.getLogger(__name__)

AudioInput = str | Path | torch.Tensor | np.ndarray


@dataclass
class Transcription:
    """One recognised input: ``tokens`` (the model's units), ``text`` (words for character and
    sentencepiece models, the tokens joined by spaces otherwise) and, when asked for, ``times``:
    ``(start, duration)`` in seconds per token, from the model's alignment of its own output."""

    source: str
    tokens: list[str]
    text: str
    times: list[tuple[float, float]] | None = None


class Recognizer:
    """A trained model with its feature pipeline and search, ready for audio.

    Args:
        experiment: the loaded experiment (model, vocabulary, configuration).
        features: the experiment's feature settings.
        options: beam search options, or None for the model's greedy search.
        lm: an external LM for shallow fusion (beam search only).
    """

    def __init__(
        self,
        experiment: Experiment,
        features: FeatureSettings,
        options: BeamSearchOptions | None = None,
        lm: LabelScorer | None = None,
    ):
        if options is not None:
            check_options(experiment.model, options, lm)
        elif lm is not None:
            raise ValueError("LM fusion needs a beam search: give BeamSearchOptions")
        self.experiment, self.features, self.options, self.lm = experiment, features, options, lm
        self.max_frames = MAX_FRAMES
        self._noted: set[str] = set()

    @classmethod
    def from_pretrained(
        cls,
        exp_dir: str | Path,
        checkpoint: str = "best",
        device: str | torch.device = "cpu",
        beam: int = 0,
        lm: str | Path | None = None,
        lm_weight: float = 0.5,
        lm_words: bool = False,
        **search: object,
    ) -> "Recognizer":
        """Load ``exp_dir`` (a ``cbasr-train`` experiment directory).

        Args:
            checkpoint: ``best``, ``last``, ``averaged``, another name in ``checkpoints/``, or a
                ``.pt`` file.
            device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
            beam: beam width; 0 (default) is the model's greedy search.
            lm: an external LM for shallow fusion: a ``cbasr-train-lm`` directory or an ARPA
                file (needs ``beam >= 1``).
            lm_words: ``lm`` is an ARPA word model for a character or piece recogniser,
                scored at word ends (:class:`~cbasr.search.WordArpaScorer`).
            search: further :class:`~cbasr.search.BeamSearchOptions` fields (``label_bonus``,
                ``ilm_weight``, ...).
        """
        device = select_device(str(device))
        exp = Experiment(exp_dir, checkpoint, device)
        if exp.cmvn is None:
            raise ValueError(f"{exp_dir}: the model reads text (source tokens), not audio")
        features = load_feature_settings(exp.exp_dir, exp.cfg)
        if beam < 0:
            raise ValueError(f"beam must be 0 (greedy) or a width >= 1, got {beam}")
        if beam == 0 and (lm is not None or search):
            raise ValueError("an LM and search options need a beam search: give beam >= 1")
        if lm_words and lm is None:
            raise ValueError("lm_words needs lm (an ARPA word model)")
        options = None
        if beam > 0:
            options = BeamSearchOptions(
                beam=beam, lm_weight=lm_weight if lm is not None else 0.0, **search
            )
        scorer = (
            load_language_model(lm, exp.vocab.tokens, exp.device, lm_words, exp.units)
            if lm is not None
            else None
        )
        return cls(exp, features, options, scorer)

    @property
    def sample_rate(self) -> int:
        """The rate the model's features are computed at; other rates are resampled."""
        return self.features.fbank.sample_rate

    def _note(self, message: str) -> None:
        if message not in self._noted:
            self._noted.add(message)
            log.info("%s", message)

    def _waveform(self, item: AudioInput, sample_rate: int | None) -> tuple[torch.Tensor, int]:
        """``(mono waveform (N,), its rate)``: a file's first channel, or a given waveform."""
        if isinstance(item, (str, Path)):
            samples, rate = read_audio_channels(item)
            if samples.shape[1] > 1:
                self._note(
                    f"{item}: {samples.shape[1]} channels: recognising the first (channel 1)"
                )
            waveform = torch.from_numpy(np.ascontiguousarray(samples[:, 0]))
        else:
            if sample_rate is None:
                raise ValueError("waveforms need their sample_rate")
            waveform = torch.as_tensor(item, dtype=torch.float32)
            if waveform.dim() == 2:  # (C, N)
                if waveform.shape[0] > 1:
                    self._note(f"{waveform.shape[0]}-channel waveform: recognising channel 1")
                waveform = waveform[0]
            if waveform.dim() != 1:
                raise ValueError(
                    f"a waveform is (N,) or (channels, N), got shape {tuple(item.shape)}"
                )
            rate = sample_rate
        if rate != self.sample_rate:
            self._note(f"resampling {rate} Hz audio to the model's {self.sample_rate} Hz")
        return waveform, rate

    def features_of(self, item: AudioInput, sample_rate: int | None = None) -> torch.Tensor:
        """``(T, F)`` normalised features of a file or waveform, as the model was trained on."""
        waveform, rate = self._waveform(item, sample_rate)
        feats = self.features(waveform, rate)
        if feats.shape[0] == 0:
            raise ValueError(f"{_name(item, 0)}: audio shorter than one feature frame")
        return feats

    @torch.no_grad()
    def transcribe(
        self,
        inputs: AudioInput | Sequence[AudioInput],
        sample_rate: int | None = None,
        timestamps: bool = False,
        progress: Callable | None = None,
    ) -> list[Transcription]:
        """Recognise files (paths) or waveforms (``(N,)`` or ``(channels, N)`` floats in
        [-1, 1] at ``sample_rate``), in batches of similar length.

        Args:
            timestamps: also align each hypothesis (CB Viterbi, CTC forced alignment or the
                transducer's best path) and return token times.
            progress: wraps the per-input feature computation (e.g. a ``tqdm`` factory).

        Returns:
            One :class:`Transcription` per input, in input order.

        Raises:
            cbasr.data.audio.AudioError: an unreadable file, naming it.
        """
        single = isinstance(inputs, (str, Path, torch.Tensor, np.ndarray))
        items = [inputs] if single else list(inputs)
        iterator = progress(items) if progress is not None else items
        feats = [self.features_of(item, sample_rate) for item in iterator]
        return self.recognize(feats, [_name(item, i) for i, item in enumerate(items)], timestamps)

    @torch.no_grad()
    def recognize(
        self,
        feats: list[torch.Tensor],
        names: list[str],
        timestamps: bool = False,
        progress: Callable | None = None,
    ) -> list[Transcription]:
        """Search (and align) normalised ``(T, F)`` features (:meth:`features_of`), in batches of
        similar length; one :class:`Transcription` per input, in input order. ``progress``
        wraps the list of batches (e.g. a ``tqdm`` factory)."""
        exp = self.experiment
        tokens: list[list[int]] = [[] for _ in feats]
        times: list[list[tuple[float, float]] | None] = [None for _ in feats]
        lengths = [f.shape[0] for f in feats]
        period = subsampling_stride(exp.model) * self.features.fbank.frame_shift_ms / 1000.0
        batches = list(BucketBatchSampler(lengths, self.max_frames, shuffle=False))
        for indices in progress(batches) if progress is not None else batches:
            batch = [feats[i].to(exp.device) for i in indices]
            best = decode_batch(exp, batch, self.options, self.lm)
            for i, hyp in zip(indices, best):
                tokens[i] = list(hyp)
            if timestamps:
                for i, alignment in zip(indices, self._align(batch, best)):
                    times[i] = [
                        (s * period, n * period) for s, n in zip(alignment.start, alignment.frames)
                    ]
        out = []
        for name, ids, spans in zip(names, tokens, times):
            units = exp.vocab.decode(ids)
            text = " ".join(tokens_to_words(units, exp.units))
            out.append(Transcription(name, units, text, spans))
        return out

    def stream(self, name: str = "stream") -> "RecognizerStream":
        """A streaming recognition of one utterance (:class:`RecognizerStream`): feed it audio
        pieces, read the partial hypothesis after each, and the final one at the end. Needs
        a transducer with a streaming encoder (a unidirectional recurrent one,
        ``encoder=ulstm``, or a chunked Conformer, ``encoder.chunk_size > 0``), greedy search
        and features without deltas."""
        return RecognizerStream(self, name)

    def _align(self, batch: list[torch.Tensor], hyps: list[list[int]]) -> list:
        """Alignments of each utterance's own hypothesis (empty ones need none)."""
        keep = [j for j, h in enumerate(hyps) if h]
        aligned = [Alignment([], []) for _ in hyps]
        if keep:
            feats = torch.nn.utils.rnn.pad_sequence([batch[j] for j in keep], batch_first=True)
            lens = torch.tensor([batch[j].shape[0] for j in keep], device=feats.device)
            try:
                result = align_batch(
                    self.experiment.model, feats, lens, [list(hyps[j]) for j in keep]
                )[0]
            except (TypeError, ValueError) as e:
                raise ValueError(f"no timestamps for this model: {e}") from None
            for j, alignment in zip(keep, result):
                aligned[j] = alignment
        return aligned


class RecognizerStream:
    """One utterance recognised as its audio arrives (:meth:`Recognizer.stream`).

    Each :meth:`accept` takes the next samples (``(N,)`` floats in [-1, 1] at the model's
    sample rate), computes the feature frames whose windows they complete (a frame depends on
    its own window's samples only, so they are the frames of the whole file), decodes them
    (:class:`~cbasr.inference.streaming.TransducerStream`: the encoder's and the prediction
    network's states carried) and returns the hypothesis so far; :meth:`finish` returns the
    final one, the recogniser's offline hypothesis of the same audio. ``emissions`` holds each
    token with the time it reached the user (its encoder block complete, as ``cbasr-decode``'s
    ``timing.tsv``).
    """

    def __init__(self, recognizer: Recognizer, name: str = "stream"):
        from cbasr.inference.streaming import TransducerStream, streamable

        exp = recognizer.experiment
        why = streamable(exp.model)
        if why:
            raise ValueError(f"{exp.exp_dir}: {why}")
        if recognizer.options is not None:
            raise ValueError("streaming recognition searches greedily: no beam (beam=0)")
        opts = recognizer.features.fbank
        if opts.deltas:
            raise ValueError(
                f"{exp.exp_dir}: the model reads delta features, which look ahead: not streamed"
            )
        if recognizer.features.utterance_mean:
            raise ValueError(
                f"{exp.exp_dir}: the model subtracts each utterance's mean from its features "
                "(data.mean_norm=utterance), which needs the whole utterance: not streamed"
            )
        self.recognizer, self.name = recognizer, name
        self.decoder = TransducerStream(exp.model)
        self.window = int(opts.sample_rate * opts.frame_length_ms / 1000)
        self.shift = int(opts.sample_rate * opts.frame_shift_ms / 1000)
        self.samples = torch.zeros(0)  # from the first sample of the next frame on
        self.shift_seconds = opts.frame_shift_ms / 1000.0
        self.window_seconds = opts.frame_length_ms / 1000.0
        self.received = 0  # samples

    @torch.no_grad()
    def accept(self, samples: torch.Tensor | np.ndarray) -> Transcription:
        """Decode the next audio samples; the partial transcription."""
        piece = torch.as_tensor(samples, dtype=torch.float32).reshape(-1)
        self.received += piece.numel()
        self.samples = torch.cat([self.samples, piece])
        if self.samples.numel() >= self.window:
            frames = 1 + (self.samples.numel() - self.window) // self.shift
            span = (frames - 1) * self.shift + self.window
            feats = self.recognizer.features(self.samples[:span], self.recognizer.sample_rate)
            self.decoder.accept(feats.to(self.recognizer.experiment.device))
            self.samples = self.samples[frames * self.shift :]
        return self._transcription()

    @torch.no_grad()
    def finish(self) -> Transcription:
        """The final transcription (the audio's last partial frame is dropped, as offline)."""
        self.decoder.finish()
        return self._transcription()

    @property
    def emissions(self) -> list[tuple[str, float]]:
        """``(token, seconds)``: each token and when it reached the user, the audio time at
        which the encoder block of the frame that emitted it was complete
        (:func:`~cbasr.inference.streaming.emission_seconds`), at most the audio received."""
        from cbasr.inference.streaming import emission_seconds

        tokens = self.recognizer.experiment.vocab.decode
        labels, frames = zip(*self.decoder.emissions) if self.decoder.emissions else ((), ())
        seconds = emission_seconds(
            self.recognizer.experiment.model,
            list(frames),
            self.decoder.frames,  # the frames decoded: every block but the last is whole
            self.shift_seconds,
            self.window_seconds,
            self.received / self.recognizer.sample_rate,
        )
        return [(tokens([i])[0], s) for i, s in zip(labels, seconds)]

    def _transcription(self) -> Transcription:
        exp = self.recognizer.experiment
        units = exp.vocab.decode(self.decoder.hypothesis)
        return Transcription(self.name, units, " ".join(tokens_to_words(units, exp.units)))


def _name(item: AudioInput, index: int) -> str:
    return str(item) if isinstance(item, (str, Path)) else f"<waveform {index}>"
