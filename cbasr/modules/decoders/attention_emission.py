"""Label decoder and emission joint of Wu et al. (CB paper section 5.2, decoder 4).

An autoregressive label decoder whose state ``g_l`` reads only the labels ``y_<l``
(:class:`~cbasr.modules.label_context.LabelContext`, never the encoder), combined with the
encoder state at the emission frame by a feed-forward joint:

    P(y_l | t_l = t, y_<l) = softmax(W_o tanh(W_h h_t + W_g g_l))

The label term depends on the emission times only through the current one, so the exact
marginal (eq. 38), Viterbi and every REINFORCE estimator (MBB included) apply. The joint has
the transducer's shape ``(B, T, L, V - 1)``.
"""

import torch
from torch import nn

from cbasr.config.schema import (
    AttentionEmissionDecoderConfig,
    LabelContextConfig,
    check_full_history,
)
from cbasr.modules.decoders.base import CBDecoder, EmissionHead, LabelOrder, gather_targets
from cbasr.modules.dropout import Dropout
from cbasr.modules.label_context import START, LabelContext

__all__ = ["AttentionEmissionDecoder"]


class AttentionEmissionDecoder(CBDecoder):
    """Label-history decoder + encoder-state joint (Wu et al.).

    Args:
        input_dim: encoder width D.
        vocab_size: V, blank included.
        label: the :class:`LabelContext` (None: the schema's defaults).
        joint_dim: width of the tanh joint.
        emission_hidden: hidden width of the :class:`EmissionHead` (0: linear).
        dropout: on the label embeddings and the joint.
    """

    order = LabelOrder.MEMORYLESS

    def __init__(
        self,
        input_dim: int,
        vocab_size: int,
        label: LabelContextConfig | None = None,
        joint_dim: int = AttentionEmissionDecoderConfig.joint_dim,
        emission_hidden: int = AttentionEmissionDecoderConfig.emission_hidden,
        dropout: float = AttentionEmissionDecoderConfig.dropout,
    ):
        super().__init__()
        label = label or LabelContextConfig()
        check_full_history(label, "attention_emission")  # from Python too
        self.label_context = LabelContext(vocab_size, label, dropout)
        self.emission = EmissionHead(input_dim, emission_hidden)
        self.encoder_proj = nn.Linear(input_dim, joint_dim)
        self.label_proj = nn.Linear(self.label_context.output_dim, joint_dim, bias=False)
        self.out = nn.Sequential(Dropout(dropout), nn.Linear(joint_dim, vocab_size - 1))

    def _joint(self, enc: torch.Tensor, lab: torch.Tensor) -> torch.Tensor:
        """``W_o tanh(enc + lab)`` log-softmaxed over the ``V - 1`` labels."""
        return self.out(torch.tanh(enc + lab)).log_softmax(dim=-1)

    def cb_terms(self, h, lens, targets, target_lens):
        """``(emit_logits (B, T), log P(y_l | t_l = t, y_<l) (B, T, L))``."""
        L = targets.shape[1]
        g = self.label_context(targets)[:, :L]  # (B, L + 1, H) -> (B, L, H): g_l reads y_<l
        enc = self.encoder_proj(h).unsqueeze(2)  # (B, T, J) -> (B, T, 1, J)
        lab = self.label_proj(g).unsqueeze(1)  # (B, L, J) -> (B, 1, L, J)
        # (B, T, L, V-1) -> (B, T, L)
        return self.emission(h), gather_targets(self._joint(enc, lab), targets)

    def begin(self, h, lens):
        B = h.shape[0]
        state = self.label_context.initial_state(B, h.device)
        g, state = self.label_context.step(
            torch.full((B,), START, dtype=torch.long, device=h.device), state
        )
        return {
            "emit_logits": self.emission(h),
            "enc": self.encoder_proj(h),
            "lab": self.label_proj(g),
            "context": state,
        }

    def candidates(self, state, t):
        return state["emit_logits"][:, t], self._joint(state["enc"][:, t], state["lab"])

    def commit(self, state, t, emitted, labels):
        rows = emitted.nonzero().squeeze(1)
        if not rows.numel():
            return state
        g, state["context"] = self.label_context.step_rows(labels, state["context"], rows)
        state["lab"] = state["lab"].index_copy(0, rows, self.label_proj(g))
        return state
