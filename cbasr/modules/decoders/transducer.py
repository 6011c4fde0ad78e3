"""Transducer decoders: prediction network + joint, for RNN-T and for HAT.

The prediction network is a :class:`~cbasr.modules.label_context.LabelContext` (an LSTM, or a
finite label context as an embedding lookup: HAT paper Table 2), giving ``g_{0:U}``. With
encoder states ``f_{1:T}`` (HAT paper section 2, RNNT):

- ``joint="rnnt"``: ``S = J(f_t + g_u)`` over the ``V`` classes, blank included, with
  ``J(x) = W_o tanh(x)`` after projecting both sides to ``joint_dim``; trained with
  :func:`cbasr.losses.rnnt_nll`.
- ``joint="hat"`` (HAT paper section 3.1): a blank Bernoulli ``b_{t,u} = sigmoid(logit)``
  and the label distribution ``P_{t,u}(y) = softmax(J(f2_t + g2_u))`` over the ``V - 1`` labels
  (eqs. 6-7); trained with :func:`cbasr.losses.hat_nll`. The internal LM drops the encoder
  side, ``softmax(J(g2_u))`` over the label units (section 3.2; eq. 8 sums its log
  probabilities). The blank logit (``blank_joint``):

  - ``"tanh"`` (default): one more output unit of the joint, ``w_b . tanh(f2_t + g2_u) + b``,
    beside the label units, as deployed HAT joints build it (NeMo's HAT joint, for one). The
    blank then depends on the frame and the label context together, so it can fall where
    label ``u + 1`` is due at frame ``t``.
  - ``"linear"``: the literal reading of eq. (5), ``w . (f1_t + g1_u) + b`` with separate
    projections ``f1``, ``g1``: a frame term plus a label-context term with no interaction,
    so ``b_{t,u}`` cannot tell whether this frame has already produced label ``u``. Kept for
    ablation; on the synthetic corpus it trains far worse (``recipes/synth/RESULTS.md``).
"""

import torch
from torch import nn

from cbasr.config.schema import TransducerDecoderConfig
from cbasr.modules.decoders.base import reorder_state
from cbasr.modules.label_context import START, LabelContext

__all__ = ["TransducerDecoder", "JOINTS", "BLANK_JOINTS"]

JOINTS = ("rnnt", "hat")
BLANK_JOINTS = ("tanh", "linear")


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
        blank_joint: HAT only: ``"tanh"`` (the blank logit is an output unit of the joint) or
            ``"linear"`` (eq. 5 read literally); see the module docstring.
    """

    def __init__(
        self,
        input_dim: int,
        vocab_size: int,
        joint: str = TransducerDecoderConfig.joint.value,
        embed_dim: int = TransducerDecoderConfig.embed_dim,
        hidden: int = TransducerDecoderConfig.hidden,
        num_layers: int = TransducerDecoderConfig.num_layers,
        context: int = TransducerDecoderConfig.context,
        joint_dim: int = TransducerDecoderConfig.joint_dim,
        dropout: float = TransducerDecoderConfig.dropout,
        blank_joint: str = TransducerDecoderConfig.blank_joint.value,
    ):
        super().__init__()
        if joint not in JOINTS:
            raise ValueError(f"joint must be one of {JOINTS}, got {joint!r}")
        if blank_joint not in BLANK_JOINTS:
            raise ValueError(f"blank_joint must be one of {BLANK_JOINTS}, got {blank_joint!r}")
        self.joint = joint
        # Which unit of ``out`` holds the blank logit: unit 0 for RNN-T and the tanh HAT blank;
        # none for the linear HAT blank, whose logit comes from its own projections.
        self.linear_blank = joint == "hat" and blank_joint == "linear"
        self.prediction = LabelContext(vocab_size, embed_dim, hidden, num_layers, context, dropout)
        self.encoder_proj = nn.Linear(input_dim, joint_dim)  # f (RNN-T) or f2 (HAT)
        self.label_proj = nn.Linear(hidden, joint_dim, bias=False)  # g or g2
        # RNN-T: blank + V - 1 labels; HAT tanh: blank logit + V - 1 labels; HAT linear: labels.
        outputs = vocab_size - 1 if self.linear_blank else vocab_size
        self.out = nn.Sequential(nn.Tanh(), nn.Dropout(dropout), nn.Linear(joint_dim, outputs))
        if self.linear_blank:
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
        if self.linear_blank:
            blank = self.blank_encoder(h) + self.blank_label(g).transpose(
                1, 2
            )  # (B, T, 1) + (B, 1, U + 1)
            return blank, scores.log_softmax(dim=-1)
        return scores[..., 0], scores[..., 1:].log_softmax(dim=-1)  # blank unit, label units

    def internal_lm_log_probs(self, targets: torch.Tensor) -> torch.Tensor:
        """HAT internal LM: ``log softmax(J(g2_u))``, ``(B, U + 1, V - 1)`` (section 3.2)."""
        return self.internal_lm_step(self.prediction(targets))

    def internal_lm_step(self, g: torch.Tensor) -> torch.Tensor:
        """HAT internal LM from prediction-network outputs ``g (..., H)``: ``log softmax`` over
        the label units of ``J(g2)`` (the blank unit, if any, is not a label), ``(..., V - 1)``."""
        if self.joint != "hat":
            raise TypeError("the internal language model is defined for the HAT joint only")
        scores = self.out(self.label_proj(g))
        return (scores if self.linear_blank else scores[..., 1:]).log_softmax(dim=-1)

    # --- decoding --------------------------------------------------------------------------
    def begin(self, h: torch.Tensor, lens: torch.Tensor) -> dict:
        B = h.shape[0]
        state = self.prediction.initial_state(B, h.device)
        g, state = self.prediction.step(
            torch.full((B,), START, dtype=torch.long, device=h.device), state
        )
        out = {"enc": self.encoder_proj(h), "g": g, "context": state}
        if self.linear_blank:
            out["blank_enc"] = self.blank_encoder(h).squeeze(-1)  # (B, T)
        return out

    def frame_scores(self, state: dict, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log P(blank) (B,), log P(label, not blank) (B, V - 1))`` at frame ``t``, current prefix."""
        scores = self.out(state["enc"][:, t] + self.label_proj(state["g"]))  # (B, V or V - 1)
        if self.joint == "rnnt":
            log_probs = scores.log_softmax(dim=-1)
            return log_probs[:, 0], log_probs[:, 1:]
        if self.linear_blank:
            blank = state["blank_enc"][:, t] + self.blank_label(state["g"]).squeeze(-1)  # (B,)
        else:
            blank, scores = scores[:, 0], scores[:, 1:]  # blank unit, label units
        labels = nn.functional.logsigmoid(-blank).unsqueeze(1) + scores.log_softmax(
            dim=-1
        )  # eq. (4)
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
