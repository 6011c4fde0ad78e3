"""What every Conditional Bernoulli decoder provides, and the pieces they share.

A CB decoder turns encoder states ``h (B, T, D)`` into the two factors of CB paper eq. (38):

- the emission logits ``a_t`` of ``P(B_t = 1)`` (:class:`EmissionHead`, from the encoder only,
  so that ``B`` is a product of independent Bernoullis and ``P(L)`` is Poisson-Binomial);
- the label terms ``log P(y_l | t_l = t, ...)``, whose dependence on the emission times is the
  decoder's :attr:`CBDecoder.order`, a :class:`LabelOrder`:

  ``MEMORYLESS``: on the current emission time only, ``(B, T, L)``: the exact marginal
  (eq. 38), Viterbi, every REINFORCE estimator including MBB (eq. 29);
  ``SECOND_ORDER``: on the current time and the gap to the previous one, ``(B, T, W, L)``: the
  windowed second-order marginal (the extension after eq. 40);
  ``HISTORY``: on every earlier emission time: sampling estimators only, through
  :meth:`CBDecoder.reward_fn`.

A decoder whose emission logits also read the decoder state (Luo et al.'s) says so with
:attr:`CBDecoder.autoregressive_emissions`: only forced-suffix sampling trains it.

Labels are vocabulary ids ``1 .. V-1`` (0 is the blank, which CB models do not use); label
distributions have ``V - 1`` entries, entry ``i`` for id ``i + 1``.

Decoding runs frame by frame (the time-synchronous search of CB paper footnote 5): at frame
``t`` a decoder's :meth:`~CBDecoder.candidates` give the emission logit and the distribution
of the next label if it is emitted at ``t``; :meth:`~CBDecoder.commit` advances the state of
the utterances that emitted. Step-wise scores equal the teacher-forced ones (tested).
"""

import abc
import enum
from collections.abc import Callable

import torch
from torch import nn

__all__ = [
    "CBDecoder",
    "EmissionHead",
    "gather_targets",
    "gather_frames",
    "reorder_state",
    "LabelOrder",
]


class LabelOrder(enum.Enum):
    """How a CB decoder's label terms depend on the emission times (module docstring)."""

    MEMORYLESS = "memoryless"
    SECOND_ORDER = "second_order"
    HISTORY = "history"


class EmissionHead(nn.Module):
    """Logits ``a_t`` of ``P(B_t = 1)`` from the encoder state at frame ``t``: ``(B, T, D) -> (B, T)``.

    Args:
        input_dim: encoder width D.
        hidden: width of a tanh hidden layer (0: linear).
        bias_init: initial bias; negative values start the model emitting rarely, as speech
            emits far fewer labels than frames.
    """

    def __init__(self, input_dim: int, hidden: int = 0, bias_init: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = []
        if hidden > 0:
            layers += [nn.Linear(input_dim, hidden), nn.Tanh()]
            input_dim = hidden
        layers.append(nn.Linear(input_dim, 1))
        nn.init.constant_(layers[-1].bias, bias_init)
        self.net = nn.Sequential(*layers)

    @property
    def bias(self) -> torch.Tensor:
        """The output unit's bias ``(1,)``, the parameter itself."""
        return self.net[-1].bias

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.net(h).squeeze(-1)


def gather_targets(log_probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_probs[..., l, targets[b, l] - 1]``: each label's own log probability.

    Args:
        log_probs: ``(B, *, L, V - 1)`` label distributions per label position.
        targets: ``(B, L)`` ids in ``1 .. V-1`` (padding: any id, clamped into range).

    Returns:
        ``(B, *, L)``.
    """
    index = (targets - 1).clamp(0, log_probs.shape[-1] - 1)  # (B, L)
    index = index.view(index.shape[0], *[1] * (log_probs.dim() - 3), index.shape[1], 1)
    index = index.expand(*log_probs.shape[:-1], 1)
    return log_probs.gather(-1, index).squeeze(-1)


def gather_frames(h: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
    """``h[b, times[m, b, l]]``: encoder states at sampled emission times.

    Args:
        h: ``(B, T, D)``.
        times: ``(M, B, L)`` frame indices (clamped into ``[0, T)``).

    Returns:
        ``(M, B, L, D)``.
    """
    M, B, L = times.shape
    # (M, B, L) -> (B, M L)
    index = times.clamp(0, h.shape[1] - 1).permute(1, 0, 2).reshape(B, M * L)
    picked = h.gather(1, index.unsqueeze(-1).expand(B, M * L, h.shape[-1]))  # (B, M L, D)
    return picked.view(B, M, L, -1).transpose(0, 1)  # (B, M, L, D) -> (M, B, L, D)


RewardFn = Callable[[torch.Tensor], torch.Tensor]


def reorder_state(state: dict, index: torch.Tensor) -> dict:
    """Rows ``index (N,)`` of a decoding state.

    Convention of every decoder's state dict: tensors are batched along dim 0; tuples are LSTM
    states ``(h, c)``, batched along dim 1.
    """
    out = {}
    for key, value in state.items():
        if isinstance(value, tuple):
            out[key] = tuple(v.index_select(1, index) for v in value)
        else:
            out[key] = value.index_select(0, index)
    return out


class CBDecoder(nn.Module, metaclass=abc.ABCMeta):
    """Interface of the CB decoders (see the module docstring); subclasses set :attr:`order`
    and, where the emissions read the decoder state, :attr:`autoregressive_emissions`."""

    order: LabelOrder = LabelOrder.MEMORYLESS
    autoregressive_emissions: bool = False

    def emission_bias(self) -> torch.Tensor:
        """The bias of the emission logits ``a_t``, ``(1,)``: the parameter or a view of it, so
        that shifting it under ``torch.no_grad()`` moves every ``P(B_t = 1)`` (the search tests
        and ``scripts/bench_search.py`` set how often a random model emits this way). The
        default is :class:`EmissionHead`'s, as ``self.emission``."""
        return self.emission.bias

    def cb_terms(
        self, h: torch.Tensor, lens: torch.Tensor, targets: torch.Tensor, target_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(emit_logits (B, T), label terms)`` for the exact marginal.

        Label terms are ``(B, T, L)`` for a memoryless decoder and ``(B, T, W, L)`` for a
        second-order one (see :func:`cbasr.losses.cb_marginal_nll_windowed`).
        """
        raise TypeError(
            f"{type(self).__name__} depends on every earlier emission time: "
            "no exact marginal; train it with a sampling estimator"
        )

    def reward_fn(
        self, h: torch.Tensor, lens: torch.Tensor, targets: torch.Tensor, target_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | RewardFn]:
        """``(emit_logits (B, T), rewards)`` for the sampling estimators.

        ``rewards`` is the ``(B, T, L)`` tensor of memoryless label terms, or a function from
        emission times ``(M, B, L)`` to per-label log probabilities ``(M, B, L)``.
        """
        emit_logits, terms = self.cb_terms(h, lens, targets, target_lens)
        return emit_logits, terms

    # --- frame-synchronous decoding ------------------------------------------------------
    @abc.abstractmethod
    def begin(self, h: torch.Tensor, lens: torch.Tensor) -> dict:
        """Decoding state before frame 0 (a dict of batched tensors)."""

    @abc.abstractmethod
    def candidates(self, state: dict, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(emit_logit (B,), next-label log probabilities (B, V - 1))`` at frame ``t``."""

    @abc.abstractmethod
    def commit(self, state: dict, t: int, emitted: torch.Tensor, labels: torch.Tensor) -> dict:
        """Advance the utterances with ``emitted (B,)`` True by ``labels (B,)`` (ids) at frame ``t``."""

    def reorder(self, state: dict, index: torch.Tensor) -> dict:
        """The decoding state of rows ``index (N,)``: beam search copies and reorders hypotheses."""
        return reorder_state(state, index)
