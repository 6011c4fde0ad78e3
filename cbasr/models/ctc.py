"""CTC: a pointwise decoder's blank-augmented frame posteriors, summed over alignments."""

import torch

from cbasr.losses import ctc_nll
from cbasr.models.base import AsrModel, LossOutput
from cbasr.modules.decoders import PointwiseDecoder

__all__ = ["CTCModel"]


class CTCModel(AsrModel):
    """Encoder + frame-wise decoder trained with CTC (blank id 0)."""

    @classmethod
    def supports(cls, decoder, **loss_options):
        if not isinstance(decoder, PointwiseDecoder):
            return "CTC needs frame-wise posteriors from a pointwise decoder"
        return None

    def log_probs(
        self, feats: torch.Tensor, feat_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``feats (B, T, F) -> (log_probs (B, T', V), lens (B,))``."""
        h, lens = self.encoder(feats, feat_lens)
        return self.decoder(h, lens), lens

    def loss(self, feats, feat_lens, targets, target_lens):
        log_probs, lens = self.log_probs(feats, feat_lens)
        nll = ctc_nll(log_probs, targets, lens, target_lens)
        return LossOutput(nll, nll.detach(), {})

    def check_utterance(self, num_frames: int, targets: list[int]) -> str | None:
        """CTC needs one frame per label plus one blank between each pair of repeated labels."""
        frames = self.output_frames(num_frames)
        repeats = sum(a == b for a, b in zip(targets, targets[1:]))
        if frames < len(targets) + repeats:
            return (
                f"{num_frames} frames ({frames} after subsampling) cannot hold "
                f"{len(targets)} labels with {repeats} repeats"
            )
        return None

    @torch.no_grad()
    def greedy_decode(self, feats, feat_lens):
        """Best-path decoding: frame-wise argmax, repeats merged, blanks removed."""
        return self._best_paths(*self.log_probs(feats, feat_lens))

    @torch.no_grad()
    def validate_batch(self, feats, feat_lens, targets, target_lens):
        log_probs, lens = self.log_probs(feats, feat_lens)
        nll = ctc_nll(log_probs, targets, lens, target_lens)
        return LossOutput(nll, nll.detach(), {}), self._best_paths(log_probs, lens)

    @staticmethod
    def _best_paths(log_probs: torch.Tensor, lens: torch.Tensor) -> list[list[int]]:
        best = log_probs.argmax(-1)  # (B, T')
        hyps = []
        for path, length in zip(best.tolist(), lens.tolist()):
            path = path[:length]
            hyps.append([c for i, c in enumerate(path) if c != 0 and (i == 0 or c != path[i - 1])])
        return hyps
