"""Utterances with features and target ids, checked once, and their padded batches.

Features come from a cached feature directory (:class:`~cbasr.data.features.FeatureStore`)
or are computed on the fly from the audio. A training dataset may augment them (speed
perturbation, SpecAugment; :mod:`cbasr.data.augment`), deterministically per
``(seed, epoch, utterance)``; a dataset without an :class:`Augmentation` (validation, by
default) returns the features as stored.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from cbasr.data.audio import AudioError, read_segment
from cbasr.data.augment import (
    Augmentation,
    perturbed_frames,
    resample_frames,
    speed_perturb_waveform,
    utterance_generator,
)
from cbasr.data.features import (
    FbankOptions,
    FeatureStore,
    compute_fbank,
    frames_of,
    normalise,
)
from cbasr.data.manifest import audio_path, read_manifest
from cbasr.data.source_tokens import TokenStore, open_store
from cbasr.data.vocab import Vocabulary, tokens_of

__all__ = ["Batch", "AsrDataset", "collate"]

log = logging.getLogger(__name__)

# Decides whether an utterance is usable: (num_frames, target ids) -> reason to skip or None.
UtteranceCheck = Callable[[int, list[int]], str | None]


@dataclass
class Batch:
    ids: list[str]
    feats: torch.Tensor  # (B, T, F), zero beyond feat_lens
    feat_lens: torch.Tensor  # (B,)
    targets: torch.Tensor  # (B, L), zero beyond target_lens
    target_lens: torch.Tensor  # (B,)
    # (B, L): each label's gold end in seconds of the (perturbed) features, NaN where unknown
    # and beyond target_lens; only from a dataset with ``label_times``
    label_ends: torch.Tensor | None = None

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return self._map(lambda x: x.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        """Page-locked copies, for asynchronous host-to-GPU transfer (the data loader calls this)."""
        return self._map(torch.Tensor.pin_memory)

    def _map(self, f) -> "Batch":
        tensors = (self.feats, self.feat_lens, self.targets, self.target_lens)
        ends = None if self.label_ends is None else f(self.label_ends)
        return Batch(self.ids, *map(f, tensors), ends)

    def label_end_frames(self, period: float) -> torch.Tensor:
        """``(B, L)`` long: the frame of ``period`` seconds that holds each label's gold end
        (its segment's last instant: frame ``ceil(end / period) - 1``), -1 where unknown."""
        if self.label_ends is None:
            raise ValueError("this batch has no label times (a dataset without label_times)")
        frames = torch.ceil(self.label_ends / period) - 1
        return torch.nan_to_num(frames, nan=-1.0).long()


class AsrDataset(torch.utils.data.Dataset):
    """The usable utterances of one split.

    An utterance is skipped, by id and with its reason in :attr:`skipped` and the log, when
    its features are missing (unreadable audio), its transcript is empty, it has a token
    outside the vocabulary, or ``check`` rejects it (e.g. fewer frames than labels).

    Args:
        manifest: the split's JSONL manifest.
        feature_dir: the split's feature directory (see :mod:`cbasr.data.features`); unused
            when ``fbank`` is given.
        units: which target field to use (see :func:`tokens_of`).
        cmvn: ``(mean (F,), std (F,))`` applied to every utterance, or None.
        utterance_mean: then each utterance's own mean subtracted too
            (:func:`~cbasr.data.features.normalise`).
        fbank: compute features on the fly from the audio with these options (lengths for
            batching then come from the manifest's durations), instead of reading them from
            ``feature_dir``.
        augmentation: speed perturbation and SpecAugment for training; None: off.
        seed: with ``augmentation``, the seed of every utterance's draws (with the epoch, see
            :meth:`set_epoch`, and the utterance's index).
        label_times: each item also carries its labels' gold end times (seconds, scaled by
            its speed perturbation; NaN where unknown), which this function reads from a
            record and its token count (None where the record has none, e.g.
            :func:`cbasr.evaluation.delay.gold_ends`); an utterance without them is counted
            and logged, a manifest with none is an error.
    """

    def __init__(
        self,
        manifest: str | Path,
        feature_dir: str | Path | None,
        vocab: Vocabulary,
        units: str,
        cmvn: tuple[torch.Tensor, torch.Tensor] | None = None,
        check: UtteranceCheck | None = None,
        fbank: FbankOptions | None = None,
        augmentation: Augmentation | None = None,
        seed: int = 0,
        label_times: Callable[[dict, int], list[float | None] | None] | None = None,
        utterance_mean: bool = False,
    ):
        self.manifest = Path(manifest)
        self.fbank = fbank
        self.store = None if fbank is not None else open_store(feature_dir)
        if (
            isinstance(self.store, TokenStore)
            and augmentation is not None
            and (augmentation.speed_factors or augmentation.masks)
        ):
            raise ValueError(
                "data.speed_perturb and data.spec_augment apply to audio features, not to the "
                f"source tokens in {feature_dir}: turn them off for text input"
            )
        if utterance_mean and cmvn is None:
            raise ValueError(
                "data.mean_norm=utterance normalises filterbank features, not the source tokens "
                f"in {feature_dir}"
            )
        self.cmvn, self.utterance_mean = cmvn, utterance_mean
        self.augmentation = augmentation
        self.seed, self.epoch = seed, 0
        self.records, self.targets, self.skipped, self.num_frames = [], [], [], []
        for record in read_manifest(manifest):
            targets, reason = self._targets(record, vocab, units)
            frames = self._num_frames(record) if reason is None else 0
            if reason is None and check is not None:
                reason = check(frames, targets)
            if reason is None:
                self.records.append(record)
                self.targets.append(targets)
                self.num_frames.append(frames)
            else:
                self.skipped.append((record["id"], reason))
        for utt_id, reason in self.skipped[:20]:
            log.warning("skipping %s: %s", utt_id, reason)
        if self.skipped:
            log.warning(
                "%s: skipped %d of %d utterances",
                manifest,
                len(self.skipped),
                len(self.skipped) + len(self.records),
            )
        self.target_lens = [len(t) for t in self.targets]
        self.label_ends = None if label_times is None else self._label_ends(label_times, units)
        # Faster speech has fewer frames: an utterance that would then fail ``check`` keeps speed 1.
        fastest = max(augmentation.speed_factors, default=1.0) if augmentation is not None else 1.0
        margin = 1 if fbank is not None else 0  # on the fly, resampled audio may lose a frame
        self._may_speed_up = [
            fastest <= 1.0
            or check is None
            or check(perturbed_frames(n, fastest) - margin, y) is None
            for n, y in zip(self.num_frames, self.targets)
        ]

    def _label_ends(self, label_times, units: str) -> list[torch.Tensor]:
        ends = [label_times(r, len(y)) for r, y in zip(self.records, self.targets)]
        missing = [r["id"] for r, e in zip(self.records, ends) if e is None]
        if self.records and len(missing) == len(self.records):
            raise ValueError(
                f"{self.manifest}: no utterance has gold {units} times (phone_starts or "
                "word_ends matching its transcript), which the label times need"
            )
        if missing:
            log.warning(
                "%s: %d of %d utterances have no gold %s times (their labels are not "
                "bounded), e.g. %s",
                self.manifest,
                len(missing),
                len(self.records),
                units,
                missing[:3],
            )
        nan = float("nan")
        return [
            torch.tensor([nan if v is None else v for v in e or [None] * len(y)])
            for y, e in zip(self.targets, ends)
        ]

    def _num_frames(self, record: dict) -> int:
        if self.store is not None:
            return self.store.num_frames(record["id"])
        return frames_of(float(record["duration"]), self.fbank)

    def _targets(self, record: dict, vocab: Vocabulary, units: str) -> tuple[list[int], str | None]:
        if self.store is not None and record["id"] not in self.store:
            return [], "no features (audio missing or unreadable at extraction)"
        if self.store is None and not audio_path(record, self.manifest).is_file():
            return [], f"audio not found: {audio_path(record, self.manifest)}"
        if isinstance(self.store, FeatureStore) and not self.store.finite(record["id"]):
            return [], "non-finite stored features (NaN or Inf)"
        tokens = tokens_of(record, units)
        if not tokens:
            return [], "empty transcript"
        unknown = [t for t in tokens if t not in vocab]
        if unknown:
            return [], f"tokens not in the vocabulary: {sorted(set(unknown))}"
        return vocab.encode(tokens), None

    def set_epoch(self, epoch: int) -> None:
        """Augmentation draws of this epoch (set before the epoch's data loader starts its workers)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.records)

    def _features(self, i: int, speed: float) -> torch.Tensor | None:
        """``(T, F)`` features of utterance ``i`` at speed ``speed``; None for unreadable audio."""
        record = self.records[i]
        if isinstance(self.store, TokenStore):
            return self.store[record["id"]]  # (T,) source ids: text input
        if self.store is not None:
            return resample_frames(self.store[record["id"]], speed)
        path = audio_path(record, self.manifest)
        try:
            samples, sample_rate = read_segment(
                path, record.get("start"), record.get("duration"), record.get("channel", 0)
            )
        except AudioError as e:
            log.warning("skipping %s: %s", record["id"], e)
            return None
        waveform = speed_perturb_waveform(torch.from_numpy(samples), sample_rate, speed)
        feats = compute_fbank(waveform, sample_rate, self.fbank)
        if feats.shape[0] == 0:
            log.warning("skipping %s: audio %s shorter than one frame", record["id"], path)
            return None
        if not torch.isfinite(feats).all():
            log.warning("skipping %s: non-finite features (NaN or Inf) from %s", record["id"], path)
            return None
        return feats

    def __getitem__(self, i: int) -> tuple | None:
        """``(id, feats (T, F), targets (L,))`` (with ``label_times``, and the labels' end times
        ``(L,)``), or None when the audio cannot be read (on the fly)."""
        aug = self.augmentation
        generator = utterance_generator(self.seed, self.epoch, i) if aug is not None else None
        speed = aug.draw_speed(generator) if aug is not None else 1.0
        if speed > 1.0 and not self._may_speed_up[i]:
            speed = 1.0
        feats = self._features(i, speed)
        if feats is None:
            return None
        if self.cmvn is not None:
            feats = normalise(feats, *self.cmvn, self.utterance_mean)
        if aug is not None:
            feats = aug.mask(feats, generator)
        item = self.records[i]["id"], feats, torch.tensor(self.targets[i], dtype=torch.long)
        if self.label_ends is None:
            return item
        return *item, self.label_ends[i] / speed  # faster speech: earlier ends


def collate(items: list[tuple | None]) -> Batch:
    """Zero-padded batch of :meth:`AsrDataset.__getitem__` items (None items, unreadable audio,
    left out); label end times, where the items carry them, NaN-padded."""
    items = [item for item in items if item is not None]
    ids = [item[0] for item in items]
    if not items:
        empty = torch.zeros(0, dtype=torch.long)
        return Batch([], torch.zeros(0, 0, 0), empty, torch.zeros(0, 0, dtype=torch.long), empty)
    pad = torch.nn.utils.rnn.pad_sequence
    feats = pad([item[1] for item in items], batch_first=True)
    targets = pad([item[2] for item in items], batch_first=True)
    feat_lens = torch.tensor([item[1].shape[0] for item in items], dtype=torch.long)
    target_lens = torch.tensor([item[2].shape[0] for item in items], dtype=torch.long)
    ends = None
    if len(items[0]) > 3:
        ends = pad([item[3] for item in items], batch_first=True, padding_value=float("nan"))
    return Batch(ids, feats, feat_lens, targets, target_lens, ends)
