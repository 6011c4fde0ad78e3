"""Conditional Bernoulli models: independent emission Bernoullis and a label decoder.

``P(y | x) = sum_b P(b) P(y | b)`` with ``P(b) = prod_t P(B_t = b_t)`` (CB paper eqs. 17-18):
the decoder gives the emission logits and the label terms (see
:mod:`cbasr.modules.decoders.base`), the criterion turns them into a loss:

- ``"cb_marginal"``: the exact ``-log P(y)`` of eq. (38) for a memoryless decoder, or its
  windowed second-order extension for a second-order one.

Greedy decoding is frame-synchronous: at each frame the model emits the best next label when
``log P(B_t = 1) + max_y log P(y | ...)`` beats ``log P(B_t = 0)``.
"""

import torch
import torch.nn.functional as F

from cbasr.losses import cb_marginal_nll, cb_marginal_nll_windowed
from cbasr.models.base import AsrModel, LossOutput
from cbasr.modules.decoders import CBDecoder

__all__ = ["CBModel", "emission_rate_stats"]


def emission_rate_stats(emit_logits: torch.Tensor, lens: torch.Tensor, target_lens: torch.Tensor) -> dict:
    """Mean ``P(B_t = 1)`` over valid frames against the label rate ``L / T`` (CB paper section 1)."""
    valid = torch.arange(emit_logits.shape[1], device=lens.device) < lens.unsqueeze(1)  # (B, T)
    frames = valid.sum().clamp(min=1)
    rate = (torch.sigmoid(emit_logits.detach()) * valid).sum() / frames
    return {"emission_rate": float(rate), "label_rate": float(target_lens.sum() / frames)}


class CBModel(AsrModel):
    """Encoder + CB decoder with the exact marginal likelihood.

    Args:
        encoder, decoder: the modules; ``decoder`` is a :class:`CBDecoder`.
    """

    @classmethod
    def supports(cls, decoder, **loss_options):
        if not isinstance(decoder, CBDecoder):
            return "the CB losses need a decoder with an emission head (a CB decoder)"
        if decoder.order == "history":
            return ("the label terms depend on every earlier emission time, so there is no exact "
                    "marginal; use a sampling estimator")
        return None

    def terms(self, feats, feat_lens, targets, target_lens):
        """``(emit_logits (B, T'), label terms, lens (B,))`` from the encoder and decoder."""
        h, lens = self.encoder(feats, feat_lens)
        emit_logits, label_terms = self.decoder.cb_terms(h, lens, targets, target_lens)
        return emit_logits, label_terms, lens

    def loss(self, feats, feat_lens, targets, target_lens):
        emit_logits, label_terms, lens = self.terms(feats, feat_lens, targets, target_lens)
        marginal = cb_marginal_nll if self.decoder.order == "memoryless" else cb_marginal_nll_windowed
        nll = marginal(emit_logits, label_terms, lens, target_lens)
        return LossOutput(nll, nll.detach(), emission_rate_stats(emit_logits, lens, target_lens))

    @torch.no_grad()
    def greedy_decode(self, feats, feat_lens):
        h, lens = self.encoder(feats, feat_lens)
        state = self.decoder.begin(h, lens)
        hyps: list[list[int]] = [[] for _ in range(h.shape[0])]
        for t in range(int(lens.max()) if lens.numel() else 0):
            emit_logit, log_probs = self.decoder.candidates(state, t)  # (B,), (B, V - 1)
            best, index = log_probs.max(dim=-1)
            emitted = (F.logsigmoid(emit_logit) + best > F.logsigmoid(-emit_logit)) & (t < lens)
            labels = index + 1  # label distribution entry i is id i + 1
            state = self.decoder.commit(state, t, emitted, labels)
            for b in emitted.nonzero().flatten().tolist():
                hyps[b].append(int(labels[b]))
        return hyps
