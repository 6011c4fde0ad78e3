"""Transducer decoders: prediction network + joint, for RNN-T and for HAT.

The prediction network is a :class:`~cbasr.modules.label_context.LabelContext` (an LSTM, or a
finite label context as an embedding lookup: HAT paper Table 2), giving ``g_{0:U}``. With
encoder states ``f_{1:T}`` (HAT paper section 2, RNNT):

- ``joint="rnnt"``: ``S = J(f_t + g_u)`` over the ``V`` classes, blank included, with
  ``J(x) = W_o tanh(x)`` after projecting both sides to ``joint_dim``; trained with
  :func:`cbasr.losses.rnnt_nll`.
- ``joint="hat"`` (HAT paper section 3.1): the blank Bernoulli
  ``b_{t,u} = sigmoid(w . (f1_t + g1_u) + b)`` (eq. 5), linear in separate projections of both
  sides, and the label distribution ``P_{t,u}(y) = softmax(J(f2_t + g2_u))`` over the ``V - 1``
  labels (eqs. 6-7); trained with :func:`cbasr.losses.hat_nll`. The internal LM drops the
  encoder side, ``softmax(J(g2_u))`` (section 3.2; eq. 8 sums its log probabilities).
"""

import torch
from torch import nn

from cbasr.modules.decoders.base import reorder_state
from cbasr.modules.label_context import START, LabelContext

__all__ = ["TransducerDecoder", "JOINTS"]

JOINTS = ("rnnt", "hat")


class TransducerDecoder(nn.Module):
    """Prediction network and joint of an RNN-T or a HAT model.

    Args:
        input_dim: encoder width D.
        vocab_size: V, blank included (id 0, also the start symbol ``<S>``).
        joint: ``"rnnt"`` or ``"hat"``.
        embed_dim, hidden, num_layers, context: the prediction network (``context = -1``: an
            LSTM over the whole history; 0, 1, 2, 4, ...: that many previous labels).
        joint_dim: width of ``f2 + g2`` (and of ``f + g`` for RNN-T).
        dropout: on the label embeddings and inside the joint.
    """

    def __init__(self, input_dim: int, vocab_size: int, joint: str = "rnnt", embed_dim: int = 128,
                 hidden: int = 256, num_layers: int = 1, context: int = -1, joint_dim: int = 256,
                 dropout: float = 0.0):
        super().__init__()
        if joint not in JOINTS:
            raise ValueError(f"joint must be one of {JOINTS}, got {joint!r}")
        self.joint = joint
        self.prediction = LabelContext(vocab_size, embed_dim, hidden, num_layers, context, dropout)
        self.encoder_proj = nn.Linear(input_dim, joint_dim)  # f (RNN-T) or f2 (HAT)
        self.label_proj = nn.Linear(hidden, joint_dim, bias=False)  # g or g2
        outputs = vocab_size if joint == "rnnt" else vocab_size - 1
        self.out = nn.Sequential(nn.Tanh(), nn.Dropout(dropout), nn.Linear(joint_dim, outputs))
        if joint == "hat":
            self.blank_encoder = nn.Linear(input_dim, 1)  # w . f1_t + b, eq. (5)
            self.blank_label = nn.Linear(hidden, 1, bias=False)  # w . g1_u

    def forward(self, h: torch.Tensor, lens: torch.Tensor, targets: torch.Tensor):
        """Teacher-forced joint over the whole lattice.

        Args:
            h: ``(B, T, D)`` encoder states; targets: ``(B, U)`` label ids.

        Returns:
            RNN-T: logits ``(B, T, U + 1, V)``.
            HAT: ``(blank_logits (B, T, U + 1), label_log_probs (B, T, U + 1, V - 1))``.
        """
        g = self.prediction(targets)  # (B, U + 1, H)
        enc = self.encoder_proj(h).unsqueeze(2)  # (B, T, J) -> (B, T, 1, J)
        lab = self.label_proj(g).unsqueeze(1)  # (B, U + 1, J) -> (B, 1, U + 1, J)
        scores = self.out(enc + lab)  # (B, T, U + 1, V or V - 1)
        if self.joint == "rnnt":
            return scores
        blank = self.blank_encoder(h) + self.blank_label(g).transpose(1, 2)  # (B, T, 1) + (B, 1, U + 1)
        return blank, scores.log_softmax(dim=-1)

    def internal_lm_log_probs(self, targets: torch.Tensor) -> torch.Tensor:
        """HAT internal LM: ``log softmax(J(g2_u))``, ``(B, U + 1, V - 1)`` (section 3.2)."""
        if self.joint != "hat":
            raise TypeError("the internal language model is defined for the HAT joint only")
        return self.out(self.label_proj(self.prediction(targets))).log_softmax(dim=-1)

    # --- decoding --------------------------------------------------------------------------
    def begin(self, h: torch.Tensor, lens: torch.Tensor) -> dict:
        B = h.shape[0]
        state = self.prediction.initial_state(B, h.device)
        g, state = self.prediction.step(torch.full((B,), START, dtype=torch.long, device=h.device), state)
        out = {"enc": self.encoder_proj(h), "g": g, "context": state}
        if self.joint == "hat":
            out["blank_enc"] = self.blank_encoder(h).squeeze(-1)  # (B, T)
        return out

    def frame_scores(self, state: dict, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log P(blank) (B,), log P(label, not blank) (B, V - 1))`` at frame ``t``, current prefix."""
        scores = self.out(state["enc"][:, t] + self.label_proj(state["g"]))  # (B, V or V - 1)
        if self.joint == "rnnt":
            log_probs = scores.log_softmax(dim=-1)
            return log_probs[:, 0], log_probs[:, 1:]
        blank = state["blank_enc"][:, t] + self.blank_label(state["g"]).squeeze(-1)  # (B,)
        labels = nn.functional.logsigmoid(-blank).unsqueeze(1) + scores.log_softmax(dim=-1)  # eq. (4)
        return nn.functional.logsigmoid(blank), labels

    def commit(self, state: dict, emitted: torch.Tensor, labels: torch.Tensor) -> dict:
        """Extend the prefixes of the utterances with ``emitted (B,)`` by ``labels (B,)`` (ids)."""
        if bool(emitted.any()):
            g, new = self.prediction.step(labels, state["context"])
            state["context"] = self.prediction.select_state(state["context"], emitted, new)
            state["g"] = torch.where(emitted.unsqueeze(1), g, state["g"])
        return state

    def reorder(self, state: dict, index: torch.Tensor) -> dict:
        """The decoding state of rows ``index (N,)`` (beam search)."""
        return reorder_state(state, index)
