"""Transducer decoders: prediction network + joint, for RNN-T, HAT and TDT.

The prediction network is a :class:`~cbasr.modules.label_context.LabelContext` (an LSTM, or a
finite label context as an embedding lookup: HAT paper Table 2), giving ``g_{0:U}``. With
encoder states ``f_{1:T}`` (HAT paper section 2, RNNT):

Each joint is a small class behind one interface (:class:`Joint`: the whole lattice for the
loss, one frame for the search):

- ``joint="rnnt"`` (:class:`RnntJoint`): ``S = J(f_t + g_u)`` over the ``V`` classes, blank included, with
  ``J(x) = W_o tanh(x)`` after projecting both sides to ``joint_dim``; trained with
  :func:`cbasr.losses.rnnt_nll`.
- ``joint="hat"`` (:class:`HatJoint`, HAT paper section 3.1): a blank Bernoulli ``b_{t,u} = sigmoid(logit)``
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

- ``joint="tdt"`` (:class:`TdtJoint`; Xu et al. 2023, "Efficient Sequence Transduction by
  Jointly Predicting Tokens and Durations", arXiv:2304.06795): the RNN-T joint with ``|D|``
  more output units, a distribution over how many frames the token covers (``durations``,
  e.g. 0-4), normalised apart from the tokens (eq. 5); trained with
  :func:`cbasr.losses.tdt.tdt_nll`.
"""

import abc

import torch
from torch import nn

from cbasr.config.schema import (
    TDT_DURATIONS,
    BlankJoint,
    LabelContextConfig,
    TransducerDecoderConfig,
    check_durations,
    check_history_shares,
)
from cbasr.config.schema import Joint as JointName
from cbasr.modules.decoders.base import reorder_state
from cbasr.modules.dropout import Dropout
from cbasr.modules.label_context import START, LabelContext

__all__ = [
    "TransducerDecoder",
    "Joint",
    "RnntJoint",
    "HatJoint",
    "TdtJoint",
    "JOINTS",
    "at_frames",
    "per_row",
]


def at_frames(x: torch.Tensor, t: int | torch.Tensor) -> torch.Tensor:
    """Frames ``t`` of the rows of ``x (B, T, ...)``: ``x[:, t]`` for an int; for a tensor
    ``t (B, ...)`` of frames per row (a search whose rows are on frames of their own, or look
    at several frames at once), ``x[b, t[b, ...]]``, ``(B, ..., ...)``. Frames past ``T - 1``
    read frame ``T - 1`` (a value the search never uses)."""
    if isinstance(t, int):
        return x[:, t]
    rows = torch.arange(x.shape[0], device=x.device).view(-1, *[1] * (t.dim() - 1))
    return x[rows, t.clamp(max=max(x.shape[1] - 1, 0))]


def per_row(v: torch.Tensor, t: int | torch.Tensor) -> torch.Tensor:
    """A per-row value ``v (B, ...)`` shaped to broadcast against :func:`at_frames`'s
    ``(B, ..., ...)`` for frames ``t``: the prefix is the same on every frame a row looks at."""
    if isinstance(t, int) or t.dim() < 2:
        return v
    return v.view(v.shape[0], *[1] * (t.dim() - 1), *v.shape[1:])


def log_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``log sigmoid(x)`` as ``min(x, 0) - log1p(exp(-|x|))``: PyTorch's own formula, written
    out so that an ONNX export keeps it (``logsigmoid`` exports as ``Log(Sigmoid(x))``, which
    onnxruntime computes to -inf from ``x`` of about -20 on: a HAT joint's label scores under a
    confident blank)."""
    return x.clamp(max=0) - torch.log1p(torch.exp(-x.abs()))


class Joint(nn.Module, metaclass=abc.ABCMeta):
    """``J(f_t + g_u)`` with ``J(x) = W_o tanh(x)``: both sides projected to ``joint_dim``.

    Subclasses say what the output units mean: :meth:`lattice` for the loss (every ``(t, u)``),
    :meth:`frame` for the search (one frame, the current prefixes).
    """

    name: str

    def __init__(self, input_dim: int, hidden: int, joint_dim: int, outputs: int, dropout: float):
        super().__init__()
        self.encoder_proj = nn.Linear(input_dim, joint_dim)  # f (RNN-T) or f2 (HAT)
        self.label_proj = nn.Linear(hidden, joint_dim, bias=False)  # g or g2
        self.out = nn.Sequential(nn.Tanh(), Dropout(dropout), nn.Linear(joint_dim, outputs))

    def scores(self, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The output units at every ``(t, u)``: ``h (B, T, D)``, ``g (B, U + 1, H)`` ->
        ``(B, T, U + 1, outputs)``."""
        return self.out(self.encoder_proj(h).unsqueeze(2) + self.label_proj(g).unsqueeze(1))

    def pruned_scores(self, h: torch.Tensor, g: torch.Tensor, starts: torch.Tensor, width: int):
        """The output units on windows of the lattice: ``h (B, T, D)``, ``g (B, U + 1, H)``,
        ``starts (B, T)`` -> ``(B, T, width, outputs)`` at label positions ``starts[b, t] + s``
        (:mod:`cbasr.losses.pruned`). Positions past ``U`` repeat position ``U``."""
        B, T = starts.shape
        positions = (starts[..., None] + torch.arange(width, device=g.device)).clamp(
            max=g.shape[1] - 1
        )
        labels = self.label_proj(g)  # (B, U + 1, J): projected before the gather, U + 1 rows
        picked = labels.gather(1, positions.view(B, T * width, 1).expand(-1, -1, labels.shape[-1]))
        return self.out(self.encoder_proj(h).unsqueeze(2) + picked.view(B, T, width, -1))

    def prepare(self, h: torch.Tensor) -> dict:
        """The encoder side of the search state, computed once per utterance."""
        return {"enc": self.encoder_proj(h)}

    def frame_units(self, state: dict, t: int | torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The output units at frames ``t`` (an int for the batch, or ``(B, ...)`` frames per
        row: :func:`at_frames`) for prefixes with prediction outputs ``g (B, H)``."""
        return self.out(at_frames(state["enc"], t) + per_row(self.label_proj(g), t))

    @abc.abstractmethod
    def lattice(self, h: torch.Tensor, g: torch.Tensor):
        """What the loss reads over the whole lattice (see :meth:`TransducerDecoder.forward`)."""

    @abc.abstractmethod
    def frame(
        self, state: dict, t: int | torch.Tensor, g: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log P(blank) (B,), log P(label, not blank) (B, V - 1))`` at frame ``t`` (an int);
        for frames ``t (B, ...)`` per row (:func:`at_frames`), ``(B, ...)`` and ``(B, ..., V -
        1)``."""


class RnntJoint(Joint):
    """RNN-T: one softmax over the ``V`` classes, blank (unit 0) included."""

    name = "rnnt"

    def __init__(
        self, input_dim: int, hidden: int, vocab_size: int, joint_dim: int, dropout: float
    ):
        super().__init__(input_dim, hidden, joint_dim, vocab_size, dropout)

    def lattice(self, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return self.scores(h, g)  # (B, T, U + 1, V) logits

    def frame(self, state, t, g) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = self.frame_units(state, t, g).log_softmax(dim=-1)
        return log_probs[..., 0], log_probs[..., 1:]


class HatJoint(Joint):
    """HAT: a blank Bernoulli and a label softmax (eqs. 4-7); ``blank_joint`` is the module
    docstring's ``"tanh"`` (unit 0 of the joint) or ``"linear"`` (eq. 5 read literally)."""

    name = "hat"

    def __init__(
        self,
        input_dim: int,
        hidden: int,
        vocab_size: int,
        joint_dim: int,
        dropout: float,
        blank_joint: str = TransducerDecoderConfig.blank_joint.value,
    ):
        # from Python too (an unknown name: a ValueError), as any other would read as tanh
        self.linear_blank = BlankJoint(blank_joint) == "linear"
        # tanh: blank logit + V - 1 labels; linear: the labels only.
        outputs = vocab_size - 1 if self.linear_blank else vocab_size
        super().__init__(input_dim, hidden, joint_dim, outputs, dropout)
        if self.linear_blank:
            self.blank_encoder = nn.Linear(input_dim, 1)  # w . f1_t + b, eq. (5)
            self.blank_label = nn.Linear(hidden, 1, bias=False)  # w . g1_u

    def _split(self, units: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(blank logit or None (linear blank), label units)`` of the joint's output units."""
        return (None, units) if self.linear_blank else (units[..., 0], units[..., 1:])

    def lattice(self, h: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        blank, units = self.lattice_scores(h, g)
        if blank is None:
            blank, units = units[..., 0], units[..., 1:]
        return blank, units.log_softmax(dim=-1)

    def lattice_scores(self, h, g) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Unnormalised, for :func:`cbasr.losses.hat_nll_from_logits`: ``(None, units)`` with
        the blank logit as unit 0 (``tanh``), or ``(blank_logits, label units)`` (``linear``)."""
        units = self.scores(h, g)
        if not self.linear_blank:
            return None, units
        return self.blank_encoder(h) + self.blank_label(g).transpose(1, 2), units  # (B, T, U + 1)

    def prepare(self, h: torch.Tensor) -> dict:
        state = super().prepare(h)
        if self.linear_blank:
            state["blank_enc"] = self.blank_encoder(h).squeeze(-1)  # (B, T)
        return state

    def frame(self, state, t, g) -> tuple[torch.Tensor, torch.Tensor]:
        blank, labels = self._split(self.frame_units(state, t, g))
        if self.linear_blank:
            blank = at_frames(state["blank_enc"], t) + per_row(self.blank_label(g).squeeze(-1), t)
        labels = log_sigmoid(-blank).unsqueeze(-1) + labels.log_softmax(dim=-1)
        return log_sigmoid(blank), labels  # eq. (4)

    def internal_lm(self, g: torch.Tensor) -> torch.Tensor:
        """``log softmax(J(g2))`` over the label units (section 3.2): ``g (..., H)`` ->
        ``(..., V - 1)``; the blank unit, if any, is not a label."""
        return self._split(self.out(self.label_proj(g)))[1].log_softmax(dim=-1)


class TdtJoint(Joint):
    """TDT (Xu et al. 2023, arXiv:2304.06795, eq. 5): the joint's ``V + |D|`` output units are
    token logits (blank at 0) and duration logits over ``durations``, normalised apart."""

    name = "tdt"

    def __init__(
        self,
        input_dim: int,
        hidden: int,
        vocab_size: int,
        joint_dim: int,
        dropout: float,
        durations: tuple[int, ...] = TDT_DURATIONS,
    ):
        self.durations = check_durations(durations)  # from Python too: the search reads them
        self.vocab_size = vocab_size
        super().__init__(input_dim, hidden, joint_dim, vocab_size + len(self.durations), dropout)

    def lattice(self, h: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log P_T (B, T, U + 1, V), log P_D (B, T, U + 1, |D|))``."""
        return self.frame_tokens_durations(self.scores(h, g))

    def frame_tokens_durations(self, units: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Output units ``(..., V + |D|)`` -> ``(log P_T (..., V), log P_D (..., |D|))``, each
        normalised apart (eq. 5)."""
        V = self.vocab_size
        return units[..., :V].log_softmax(dim=-1), units[..., V:].log_softmax(dim=-1)

    def frame(self, state, t, g) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, _ = self.frame_tokens_durations(self.frame_units(state, t, g))
        return tokens[..., 0], tokens[..., 1:]


JOINTS = {"rnnt": RnntJoint, "hat": HatJoint, "tdt": TdtJoint}
# Parameters that lived on the decoder before the joints were classes of their own: a
# checkpoint written then loads into ``joint.<name>``.
_JOINT_PARAMETERS = ("encoder_proj.", "label_proj.", "out.", "blank_encoder.", "blank_label.")


def _upgrade_joint_keys(module, state_dict, prefix, *args) -> None:
    for key in list(state_dict):
        if key.startswith(prefix) and key[len(prefix) :].startswith(_JOINT_PARAMETERS):
            state_dict[prefix + "joint." + key[len(prefix) :]] = state_dict.pop(key)


class TransducerDecoder(nn.Module):
    """Prediction network and joint of an RNN-T or a HAT model.

    Args:
        input_dim: encoder width D.
        vocab_size: V, blank included (id 0, also the start symbol ``<S>``).
        joint: ``"rnnt"`` (:class:`RnntJoint`), ``"hat"`` (:class:`HatJoint`) or ``"tdt"``
            (:class:`TdtJoint`).
        label: the prediction network, a :class:`LabelContext` (None: the schema's defaults;
            ``context = -1``: an LSTM over the whole history; 0, 1, 2, 4, ...: that many
            previous labels).
        joint_dim: width of ``f2 + g2`` (and of ``f + g`` for RNN-T).
        dropout: on the label embeddings and inside the joint.
        blank_joint: HAT only: ``"tanh"`` (the blank logit is an output unit of the joint) or
            ``"linear"`` (eq. 5 read literally); see the module docstring.
        durations: TDT only: the duration set ``D`` (:class:`TdtJoint`).
        history_noise: in training only, the probability that each label of the prediction
            network's input is replaced by one drawn uniformly from the ``V - 1`` labels
            (:meth:`history`). The joint then cannot learn "the last label is the word I hear,
            so this frame is blank", which deletes a word that repeats its predecessor
            (``recipes/digits/RESULTS.md``); it has to find the word boundary in the encoder.
        history_repeat: in training only, the probability that each label of the prediction
            network's input is replaced by the label after it, the one the joint is asked for
            next (:meth:`history`): the joint reads a word followed by itself even when the
            transcripts never repeat one, and has to emit it from the sound.
    """

    def __init__(
        self,
        input_dim: int,
        vocab_size: int,
        joint: str = TransducerDecoderConfig.joint.value,
        label: LabelContextConfig | None = None,
        joint_dim: int = TransducerDecoderConfig.joint_dim,
        dropout: float = TransducerDecoderConfig.dropout,
        blank_joint: str = TransducerDecoderConfig.blank_joint.value,
        history_noise: float = TransducerDecoderConfig.history_noise,
        durations: tuple[int, ...] = TDT_DURATIONS,
        history_repeat: float = TransducerDecoderConfig.history_repeat,
    ):
        super().__init__()
        check_history_shares(history_noise, history_repeat)  # from Python too: 1 or -1 would run
        self.history_noise = history_noise
        self.history_repeat = history_repeat
        self.prediction = LabelContext(vocab_size, label or LabelContextConfig(), dropout)
        hidden = self.prediction.output_dim
        options = {"hat": {"blank_joint": blank_joint}, "tdt": {"durations": durations}}
        joint = JointName(joint).value  # an unknown name: a ValueError
        self.joint = JOINTS[joint](
            input_dim, hidden, vocab_size, joint_dim, dropout, **options.get(joint, {})
        )
        self.register_load_state_dict_pre_hook(_upgrade_joint_keys)

    def forward(self, h: torch.Tensor, lens: torch.Tensor, targets: torch.Tensor):
        """Teacher-forced joint over the whole lattice.

        Args:
            h: ``(B, T, D)`` encoder states; targets: ``(B, U)`` label ids.

        Returns:
            RNN-T: logits ``(B, T, U + 1, V)``.
            HAT: ``(blank_logits (B, T, U + 1), label_log_probs (B, T, U + 1, V - 1))``.
            TDT: ``(token_log_probs (B, T, U + 1, V), duration_log_probs (B, T, U + 1, |D|))``.
        """
        return self.joint.lattice(h, self.history(targets))

    def history(self, targets: torch.Tensor) -> torch.Tensor:
        """The prediction network over the teacher-forced labels, ``targets (B, U)`` (padded
        with 0) -> ``g (B, U + 1, H)``. In training each input label is first replaced, with
        probability ``history_noise``, by a label drawn uniformly from ``1 .. V - 1``; then,
        with probability ``history_repeat``, by the true label after it (never by padding), so
        that ``g_u`` reads ``y_{u+1}`` as the last label. The loss still scores the true
        labels: only what the joint sees of the history changes."""
        if not (self.training and targets.numel()):
            return self.prediction(targets)
        noisy = targets
        if self.history_noise > 0.0:
            vocab = self.prediction.embedding.num_embeddings
            replace = torch.rand(targets.shape, device=targets.device) < self.history_noise
            drawn = torch.randint_like(targets, 1, vocab)
            noisy = torch.where(replace, drawn, noisy)
        if self.history_repeat > 0.0 and targets.shape[1] > 1:
            after = targets[:, 1:]
            repeat = (torch.rand(after.shape, device=targets.device) < self.history_repeat) & (
                after > 0
            )
            noisy = torch.cat([torch.where(repeat, after, noisy[:, :-1]), noisy[:, -1:]], dim=1)
        return self.prediction(noisy)

    def hat_scores(self, h: torch.Tensor, targets: torch.Tensor):
        """HAT's teacher-forced joint unnormalised (:meth:`HatJoint.lattice_scores`): what
        :func:`cbasr.losses.hat_nll_from_logits` reads, with the label softmax fused into it."""
        return self.joint.lattice_scores(h, self.history(targets))

    def internal_lm_log_probs(self, targets: torch.Tensor) -> torch.Tensor:
        """HAT internal LM: ``log softmax(J(g2_u))``, ``(B, U + 1, V - 1)`` (section 3.2)."""
        return self.internal_lm_step(self.prediction(targets))

    def internal_lm_step(self, g: torch.Tensor) -> torch.Tensor:
        """HAT internal LM from prediction-network outputs ``g (..., H)``: ``(..., V - 1)``."""
        if not isinstance(self.joint, HatJoint):
            raise TypeError("the internal language model is defined for the HAT joint only")
        return self.joint.internal_lm(g)

    # --- decoding --------------------------------------------------------------------------
    def begin(self, h: torch.Tensor, lens: torch.Tensor) -> dict:
        B = h.shape[0]
        state = self.prediction.initial_state(B, h.device)
        g, state = self.prediction.step(
            torch.full((B,), START, dtype=torch.long, device=h.device), state
        )
        return {"g": g, "context": state, **self.joint.prepare(h)}

    def frame_scores(self, state: dict, t: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log P(blank) (B,), log P(label, not blank) (B, V - 1))`` at frame ``t`` (an int,
        or ``(B,)``: each row's own frame), current prefix."""
        return self.joint.frame(state, t, state["g"])

    def commit(self, state: dict, emitted: torch.Tensor, labels: torch.Tensor) -> dict:
        """Extend the prefixes of the utterances with ``emitted (B,)`` by ``labels (B,)`` (ids)."""
        rows = emitted.nonzero().squeeze(1)
        if rows.numel():
            g, state["context"] = self.prediction.step_rows(labels, state["context"], rows)
            state["g"] = state["g"].index_copy(0, rows, g)
        return state

    def commit_masked(self, state: dict, emitted: torch.Tensor, labels: torch.Tensor) -> dict:
        """:meth:`commit` with no read of ``emitted`` on the host: every row is stepped and
        the rows not emitted keep their state (:meth:`LabelContext.step_masked`), so a loop
        on the device never waits for the host to learn which rows emitted."""
        g, state["context"] = self.prediction.step_masked(labels, state["context"], emitted)
        state["g"] = torch.where(emitted.unsqueeze(1), g, state["g"])
        return state

    def reorder(self, state: dict, index: torch.Tensor) -> dict:
        """The decoding state of rows ``index (N,)`` (beam search)."""
        return reorder_state(state, index)
