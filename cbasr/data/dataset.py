"""Utterances with features and target ids, checked once, and their padded batches."""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from cbasr.data.features import FeatureStore
from cbasr.data.manifest import read_manifest
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

    def to(self, device: torch.device) -> "Batch":
        return Batch(self.ids, self.feats.to(device), self.feat_lens.to(device),
                     self.targets.to(device), self.target_lens.to(device))


class AsrDataset(torch.utils.data.Dataset):
    """The usable utterances of one split.

    An utterance is skipped, by id and with its reason in :attr:`skipped` and the log, when
    its features are missing (unreadable audio), its transcript is empty, it has a token
    outside the vocabulary, or ``check`` rejects it (e.g. fewer frames than labels).

    Args:
        manifest: the split's JSONL manifest.
        feature_dir: the split's feature directory (see :mod:`cbasr.data.features`).
        units: which target field to use (see :func:`tokens_of`).
        cmvn: ``(mean (F,), std (F,))`` applied to every utterance, or None.
    """

    def __init__(self, manifest: str | Path, feature_dir: str | Path, vocab: Vocabulary,
                 units: str, cmvn: tuple[torch.Tensor, torch.Tensor] | None = None,
                 check: UtteranceCheck | None = None):
        self.store = FeatureStore(feature_dir)
        self.cmvn = cmvn
        self.records, self.targets, self.skipped = [], [], []
        for record in read_manifest(manifest):
            targets, reason = self._targets(record, vocab, units)
            if reason is None and check is not None:
                reason = check(self.store.num_frames(record["id"]), targets)
            if reason is None:
                self.records.append(record)
                self.targets.append(targets)
            else:
                self.skipped.append((record["id"], reason))
        for utt_id, reason in self.skipped[:20]:
            log.warning("skipping %s: %s", utt_id, reason)
        if self.skipped:
            log.warning("%s: skipped %d of %d utterances", manifest, len(self.skipped),
                        len(self.skipped) + len(self.records))
        self.num_frames = [self.store.num_frames(r["id"]) for r in self.records]

    def _targets(self, record: dict, vocab: Vocabulary, units: str) -> tuple[list[int], str | None]:
        if record["id"] not in self.store:
            return [], "no features (audio missing or unreadable at extraction)"
        tokens = tokens_of(record, units)
        if not tokens:
            return [], "empty transcript"
        unknown = [t for t in tokens if t not in vocab]
        if unknown:
            return [], f"tokens not in the vocabulary: {sorted(set(unknown))}"
        return vocab.encode(tokens), None

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> tuple[str, torch.Tensor, torch.Tensor]:
        """``(id, feats (T, F), targets (L,))``."""
        utt_id = self.records[i]["id"]
        feats = self.store[utt_id]
        if self.cmvn is not None:
            feats = (feats - self.cmvn[0]) / self.cmvn[1]
        return utt_id, feats, torch.tensor(self.targets[i], dtype=torch.long)


def collate(items: list[tuple[str, torch.Tensor, torch.Tensor]]) -> Batch:
    """Zero-padded batch of :meth:`AsrDataset.__getitem__` items."""
    ids = [utt_id for utt_id, _, _ in items]
    feats = torch.nn.utils.rnn.pad_sequence([f for _, f, _ in items], batch_first=True)
    targets = torch.nn.utils.rnn.pad_sequence([y for _, _, y in items], batch_first=True)
    feat_lens = torch.tensor([f.shape[0] for _, f, _ in items], dtype=torch.long)
    target_lens = torch.tensor([y.shape[0] for _, _, y in items], dtype=torch.long)
    return Batch(ids, feats, feat_lens, targets, target_lens)
