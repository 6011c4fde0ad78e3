"""Transducer models: RNN-T (torchaudio's loss) and HAT (HAT paper eq. 4)."""

import torch

from cbasr.losses import hat_internal_lm_score, hat_nll_from_logits, rnnt_lattice_nll, rnnt_nll
from cbasr.models.base import AsrModel, LossOutput
from cbasr.modules.decoders import TransducerDecoder

__all__ = ["TransducerModel"]


class TransducerModel(AsrModel):
    """Encoder + prediction network + joint, trained on the whole transducer lattice.

    Args:
        encoder, decoder: the modules; ``decoder`` a :class:`TransducerDecoder` whose joint
            matches ``criterion``.
        criterion: ``"rnnt"`` or ``"hat"``.
        max_symbols: most labels greedy search emits on one frame.
    """

    def __init__(self, encoder, decoder, criterion: str = "rnnt", max_symbols: int = 4):
        super().__init__(encoder, decoder)
        reason = self.supports(decoder, criterion=criterion)
        if reason:
            raise ValueError(reason)
        if max_symbols < 1:
            raise ValueError(f"max_symbols must be >= 1, got {max_symbols}")
        self.criterion, self.max_symbols = criterion, max_symbols

    @classmethod
    def supports(cls, decoder, criterion: str = "rnnt", **loss_options):
        if not isinstance(decoder, TransducerDecoder):
            return f"the {criterion} loss needs a transducer decoder (prediction network + joint)"
        if decoder.joint.name != criterion:
            return (
                f"the {criterion} loss needs joint={criterion!r}; "
                f"this decoder has joint={decoder.joint.name!r}"
            )
        return None

    def check_utterance(self, num_frames: int, targets: list[int]) -> str | None:
        """A transducer emits any number of labels per frame: it needs one frame."""
        if self.output_frames(num_frames) < 1:
            return f"{num_frames} frames leave no frame after subsampling"
        return None

    def loss(self, feats, feat_lens, targets, target_lens):
        h, lens = self.encoder(feats, feat_lens)
        if self.criterion == "rnnt":
            logits = self.decoder(h, lens, targets)
            # the same loss: torchaudio's CUDA kernel on a GPU; on a CPU the fused-gather
            # lattice, several times faster than torchaudio's CPU code and half its memory
            loss = rnnt_nll if logits.is_cuda else rnnt_lattice_nll
            nll = loss(logits, targets, lens, target_lens)
            return LossOutput(nll, nll.detach(), {})
        blank_logits, units = self.decoder.hat_scores(h, targets)
        nll = hat_nll_from_logits(
            blank_logits, units, (targets - 1).clamp(min=0), lens, target_lens
        )
        return LossOutput(nll, nll.detach(), {})

    @torch.no_grad()
    def internal_lm_score(self, targets: torch.Tensor, target_lens: torch.Tensor) -> torch.Tensor:
        """``log P_ILM(y)`` of HAT paper eq. (8), ``(B,)``."""
        ilm = self.decoder.internal_lm_log_probs(targets)
        return hat_internal_lm_score(ilm, (targets - 1).clamp(min=0), target_lens)

    @torch.no_grad()
    def greedy_decode(self, feats, feat_lens):
        """Per frame, emit the best label while it beats the blank, at most ``max_symbols`` times."""
        h, lens = self.encoder(feats, feat_lens)
        state = self.decoder.begin(h, lens)
        hyps: list[list[int]] = [[] for _ in range(h.shape[0])]
        for t in range(int(lens.max()) if lens.numel() else 0):
            active = t < lens
            for _ in range(self.max_symbols):
                blank, labels = self.decoder.frame_scores(state, t)  # (B,), (B, V - 1)
                best, index = labels.max(dim=-1)
                emitted = active & (best > blank)
                if not bool(emitted.any()):
                    break
                state = self.decoder.commit(state, emitted, index + 1)
                for b in emitted.nonzero().flatten().tolist():
                    hyps[b].append(int(index[b]) + 1)
                active = emitted
        return hyps
