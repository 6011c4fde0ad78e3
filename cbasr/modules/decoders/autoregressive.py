"""Autoregressive decoder fed the encoder state at each emission (Raffel et al., 2017; CB paper
section 5.2, decoder 2).

At label step ``l`` a recurrent state reads the encoder state at the emission frame and the
previous label, and predicts the label:

    s_l = LSTM([h_{t_l}; E y_{l-1}], s_{l-1})        P(y_l | t_{<=l}, y_<l) = softmax(W_o s_l)

so the label term depends on every earlier emission time (order ``"history"``): no exact
marginal; it trains with the sampling estimators, whose reward callback is
:meth:`AutoregressiveDecoder.reward_fn`, or with forced-suffix REINFORCE.

Emissions come from the encoder alone (``emission="encoder"``: independent Bernoullis, as the
CB estimators need) or, as in Luo et al. (2017), also from the decoder state
(``emission="decoder"``): ``a_t = w . tanh(W_h h_t + W_s s_{l(t)})`` with ``s_{l(t)}`` the state
after the labels emitted before ``t``; the emissions are then autoregressive and only forced
suffix (sampled step by step through :meth:`AutoregressiveDecoder.emission_step`) applies.
"""

import torch
from torch import nn

from cbasr.config.schema import (
    AutoregressiveDecoderConfig,
    Emission,
    LabelContextConfig,
    check_full_history,
)
from cbasr.modules.decoders.base import (
    CBDecoder,
    EmissionHead,
    LabelOrder,
    gather_frames,
    gather_targets,
)
from cbasr.modules.dropout import Dropout
from cbasr.modules.label_context import START

__all__ = ["AutoregressiveDecoder"]


class AutoregressiveDecoder(CBDecoder):
    """Recurrent label decoder with the emission frame's encoder state as input.

    Args:
        input_dim: encoder width D.
        vocab_size: V, blank (= start symbol) included.
        label: the LSTM (None: the schema's defaults): ``embed_dim`` the label embedding width,
            ``hidden`` its units H, ``num_layers`` its layers; ``context`` must be -1.
        emission: ``"encoder"`` or ``"decoder"`` (see the module docstring).
        emission_hidden: hidden width of the emission network.
        dropout: on the label embeddings and before the output layer.
    """

    order = LabelOrder.HISTORY

    def __init__(
        self,
        input_dim: int,
        vocab_size: int,
        label: LabelContextConfig | None = None,
        emission: str = AutoregressiveDecoderConfig.emission.value,
        emission_hidden: int = AutoregressiveDecoderConfig.emission_hidden,
        dropout: float = AutoregressiveDecoderConfig.dropout,
    ):
        super().__init__()
        label = label or LabelContextConfig()
        # from Python too: another context would be ignored
        check_full_history(label, "autoregressive")
        self.emission_source = Emission(emission).value  # an unknown name: a ValueError
        embed_dim, hidden, num_layers = label.embed_dim, label.hidden, label.num_layers
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.dropout = Dropout(dropout)
        self.rnn = nn.LSTM(input_dim + embed_dim, hidden, num_layers=num_layers, batch_first=True)
        self.out = nn.Sequential(Dropout(dropout), nn.Linear(hidden, vocab_size - 1))
        if self.emission_source == "encoder":
            self.emission = EmissionHead(input_dim, emission_hidden)
        else:
            self.emission_encoder = nn.Linear(input_dim, emission_hidden)
            self.emission_state = nn.Linear(hidden, emission_hidden, bias=False)
            self.emission_out = nn.Linear(emission_hidden, 1)
        self.hidden, self.num_layers = hidden, num_layers

    @property
    def autoregressive_emissions(self) -> bool:
        return self.emission_source == "decoder"

    def emission_bias(self) -> torch.Tensor:
        """The emission logit's bias ``(1,)``, of the encoder's or of Luo et al.'s network."""
        return self.emission_out.bias if self.autoregressive_emissions else self.emission.bias

    def emission_logits(self, h: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` emission logits from the encoder (``emission="encoder"`` only)."""
        if self.autoregressive_emissions:
            raise TypeError(
                "with emission='decoder' the emission logits depend on the decoder state: "
                "use emission_step"
            )
        return self.emission(h)

    def emission_step(self, h_t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Luo et al.'s emission logit: ``h_t (N, D)``, top-layer state ``s (N, H)`` -> ``(N,)``."""
        if not self.autoregressive_emissions:
            return self.emission(h_t)
        return self.emission_out(
            torch.tanh(self.emission_encoder(h_t) + self.emission_state(s))
        ).squeeze(-1)

    def label_step(self, h_t: torch.Tensor, prev_labels: torch.Tensor, state):
        """One label step: ``h_t (N, D)``, ``prev_labels (N,)`` ids (START first) ->
        ``(log P(. | ...) (N, V - 1), top state s (N, H), LSTM state)``."""
        # (N, 1, D + E)
        x = torch.cat([h_t, self.dropout(self.embedding(prev_labels))], dim=-1).unsqueeze(1)
        s, state = self.rnn(x, state)
        s = s.squeeze(1)  # (N, 1, H) -> (N, H)
        return self.out(s).log_softmax(dim=-1), s, state

    def label_log_probs(
        self, h: torch.Tensor, targets: torch.Tensor, times: torch.Tensor
    ) -> torch.Tensor:
        """``log P(y_l | t_{<=l}, y_<l)`` for emission times ``times (M, B, L)`` -> ``(M, B, L)``.

        Teacher-forced over the labels, batched over the ``M`` samples.
        """
        M, B, L = times.shape
        picked = gather_frames(h, times)  # (M, B, L, D)
        # (B, L): y_{l-1}
        prev = torch.cat([targets.new_full((B, 1), START), targets[:, :-1]], dim=1)
        emb = self.dropout(self.embedding(prev)).unsqueeze(0).expand(M, -1, -1, -1)  # (M, B, L, E)
        x = torch.cat([picked, emb], dim=-1).flatten(0, 1)  # (M, B, L, D + E) -> (M B, L, D + E)
        s, _ = self.rnn(x)  # (M B, L, H)
        log_probs = self.out(s).log_softmax(dim=-1).view(M, B, L, -1)  # (M, B, L, V - 1)
        return gather_targets(log_probs.transpose(0, 1), targets).transpose(0, 1)  # (M, B, L)

    def reward_fn(self, h, lens, targets, target_lens):
        """``(emit_logits (B, T), times (M, B, L) -> log P(y_l | t_{<=l}, y_<l) (M, B, L))``."""
        return self.emission_logits(h), lambda times: self.label_log_probs(h, targets, times)

    # --- decoding --------------------------------------------------------------------------
    def begin(self, h, lens):
        B = h.shape[0]
        zeros = h.new_zeros(self.num_layers, B, self.hidden)
        state = {
            "h": h,
            "lstm": (zeros, zeros.clone()),
            "s": h.new_zeros(B, self.hidden),
            "prev": torch.full((B,), START, dtype=torch.long, device=h.device),
        }
        if not self.autoregressive_emissions:
            state["emit_logits"] = self.emission(h)
        return state

    def candidates(self, state, t):
        h_t = state["h"][:, t]
        log_probs, s, lstm = self.label_step(h_t, state["prev"], state["lstm"])
        state["pending_s"], state["pending_lstm"] = s, lstm  # what committing a label at t gives
        if self.autoregressive_emissions:
            return self.emission_step(h_t, state["s"]), log_probs
        return state["emit_logits"][:, t], log_probs

    def commit(self, state, t, emitted, labels):
        s, (hx, cx) = state["pending_s"], state["pending_lstm"]
        keep = emitted.view(1, -1, 1)
        state["lstm"] = (
            torch.where(keep, hx, state["lstm"][0]),
            torch.where(keep, cx, state["lstm"][1]),
        )
        state["s"] = torch.where(emitted.unsqueeze(1), s, state["s"])
        state["prev"] = torch.where(emitted, labels, state["prev"])
        return state
