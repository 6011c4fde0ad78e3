"""An ASR model: encoder -> decoder -> loss, with the queries training and decoding need."""

import torch
from torch import nn

from cbasr.data.dataset import Batch
from cbasr.losses import ctc_nll

__all__ = ["CTCModel"]


class CTCModel(nn.Module):
    """Encoder + frame-wise decoder trained with CTC (blank id 0)."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``feats (B, T, F) -> (log_probs (B, T', V), lens (B,))``."""
        h, lens = self.encoder(feats, feat_lens)
        return self.decoder(h, lens), lens

    def loss(self, batch: Batch) -> torch.Tensor:
        """``(B,)`` negative log likelihoods."""
        log_probs, lens = self(batch.feats, batch.feat_lens)
        return ctc_nll(log_probs, batch.targets, lens, batch.target_lens)

    def check_utterance(self, num_frames: int, targets: list[int]) -> str | None:
        """Why CTC cannot align ``targets`` to ``num_frames`` input frames, or None if it can.

        CTC needs one frame per label plus one blank between each pair of repeated labels.
        """
        frames = int(self.encoder.output_lengths(torch.tensor([num_frames]))[0])
        repeats = sum(a == b for a, b in zip(targets, targets[1:]))
        if frames < len(targets) + repeats:
            return (f"{num_frames} frames ({frames} after subsampling) cannot hold "
                    f"{len(targets)} labels with {repeats} repeats")
        return None

    @torch.no_grad()
    def greedy_decode(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> list[list[int]]:
        """Best-path decoding: frame-wise argmax, repeats merged, blanks removed."""
        log_probs, lens = self(feats, feat_lens)
        best = log_probs.argmax(-1)  # (B, T')
        hyps = []
        for path, length in zip(best.tolist(), lens.tolist()):
            path = path[:length]
            hyps.append([c for i, c in enumerate(path) if c != 0 and (i == 0 or c != path[i - 1])])
        return hyps
