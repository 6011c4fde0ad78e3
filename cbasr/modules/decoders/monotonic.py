"""Monotonic attention decoder with fixed or variable windows (CB paper section 5.2, decoder 3).

The emission times ``t_l`` play the role of MoChA's hard monotonic attention (Chiu and Raffel,
2018): label ``l`` is read from a soft attention over a window of encoder states that ends at
its emission frame. The query is a label-history state ``g_l``
(:class:`~cbasr.modules.label_context.LabelContext`) that never sees the encoder:

    e(s, l) = <W_k h_s, W_q g_l> / sqrt(d)        c = sum_{s in window} softmax_s(e) W_v h_s
    P(y_l | window, y_<l) = softmax(W_o tanh(W_c c + W_g g_l))

- ``variable=False``: the window is the ``window`` frames ending at ``t_l`` (MoChA's chunk;
  frames before 0 are left out). The label term depends on ``t_l`` only: memoryless, so the
  exact marginal of eq. (38) applies, ``(B, T, L)``.
- ``variable=True``: the window is ``t_{l-1} + 1 .. t_l``, of ``d = t_l - t_{l-1}`` frames,
  ``1 <= d <= window`` (the first label's window starts at frame 0). The label term depends on
  the current and the previous emission time: second order, ``(B, T, W, L)`` for
  :func:`cbasr.losses.cb_marginal_nll_windowed`, where gaps beyond ``window`` have probability 0.
  All ``W`` window sizes ending at each frame come from one online-softmax pass over the
  window (running maximum, rescaled sums: exact and stable, no differences of large sums).
"""

import math

import torch
from torch import nn

from cbasr.modules.decoders.base import CBDecoder, EmissionHead, gather_targets
from cbasr.modules.label_context import START, LabelContext

__all__ = ["MonotonicAttentionDecoder"]

_NEG_INF = float("-inf")


def _shifted(x: torch.Tensor, j: int, fill: float) -> torch.Tensor:
    """``x[:, t - j]`` at position ``t`` (``fill`` for ``t < j``): ``(B, T, ...)``."""
    if j == 0:
        return x
    pad = x.new_full((x.shape[0], j) + x.shape[2:], fill)
    return torch.cat([pad, x[:, : x.shape[1] - j]], dim=1)


class MonotonicAttentionDecoder(CBDecoder):
    """Soft attention over a window ending at the emission frame.

    Args:
        input_dim: encoder width D.
        vocab_size: V, blank included.
        window: fixed window size, or the largest gap ``W`` with ``variable``.
        variable: window from the previous emission (second order) instead of a fixed size.
        attention_dim: key, query and value width.
        embed_dim, hidden, num_layers, context: the :class:`LabelContext`.
        joint_dim: width of the output joint.
        emission_hidden: hidden width of the :class:`EmissionHead`.
        dropout: on label embeddings and before the output layer.
    """

    def __init__(self, input_dim: int, vocab_size: int, window: int = 4, variable: bool = False,
                 attention_dim: int = 64, embed_dim: int = 128, hidden: int = 256, num_layers: int = 1,
                 context: int = -1, joint_dim: int = 256, emission_hidden: int = 0, dropout: float = 0.0):
        super().__init__()
        if window < 1:
            raise ValueError(f"window must be >= 1 frame, got {window}")
        self.window, self.variable = window, variable
        self.order = "second_order" if variable else "memoryless"
        self.label_context = LabelContext(vocab_size, embed_dim, hidden, num_layers, context, dropout)
        self.emission = EmissionHead(input_dim, emission_hidden)
        self.key = nn.Linear(input_dim, attention_dim, bias=False)
        self.value = nn.Linear(input_dim, attention_dim, bias=False)
        self.query = nn.Linear(hidden, attention_dim, bias=False)
        self.context_proj = nn.Linear(attention_dim, joint_dim)
        self.label_proj = nn.Linear(hidden, joint_dim, bias=False)
        self.out = nn.Sequential(nn.Dropout(dropout), nn.Linear(joint_dim, vocab_size - 1))
        self.scale = 1.0 / math.sqrt(attention_dim)

    def _output(self, context: torch.Tensor, lab: torch.Tensor) -> torch.Tensor:
        """``log softmax(W_o tanh(W_c c + W_g g))`` over the ``V - 1`` labels."""
        return self.out(torch.tanh(self.context_proj(context) + lab)).log_softmax(dim=-1)

    def _windows(self, h: torch.Tensor, lens: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Attention contexts of the windows ending at every frame.

        Args:
            h: ``(B, T, D)``; q: ``(B, L, A)`` queries.

        Returns:
            ``(B, T, L, A)`` for a fixed window; ``(B, T, W, L, A)`` for a variable one, entry
            ``d`` covering frames ``t - d .. t``.
        """
        keys, values = self.key(h), self.value(h)  # (B, T, A)
        energy = torch.einsum("bta,bla->btl", keys, q) * self.scale  # (B, T, L)
        # Online softmax over the frames t, t-1, ..., t-W+1 (window entry j adds frame t - j).
        run_max = energy
        weight_sum = torch.ones_like(energy)  # sum of exp(e - run_max) over the window so far
        weighted = values.unsqueeze(2).expand(-1, -1, energy.shape[2], -1)  # (B, T, L, A)
        contexts = [weighted]  # the window of frame t alone: its own value
        for j in range(1, self.window):
            e_j = _shifted(energy, j, _NEG_INF)  # (B, T, L); -inf before frame 0
            v_j = _shifted(values, j, 0.0).unsqueeze(2)  # (B, T, 1, A)
            new_max = torch.maximum(run_max, e_j)  # finite: frame t itself is in every window
            keep, add = torch.exp(run_max - new_max), torch.exp(e_j - new_max)
            weight_sum = weight_sum * keep + add
            weighted = weighted * keep.unsqueeze(-1) + add.unsqueeze(-1) * v_j
            run_max = new_max
            if self.variable:
                contexts.append(weighted / weight_sum.unsqueeze(-1))
        if self.variable:
            return torch.stack(contexts, dim=2)  # W x (B, T, L, A) -> (B, T, W, L, A)
        return weighted / weight_sum.unsqueeze(-1)  # (B, T, L, A)

    def cb_terms(self, h, lens, targets, target_lens):
        """``(emit_logits (B, T), label terms (B, T, L) or (B, T, W, L))``."""
        L = targets.shape[1]
        g = self.label_context(targets)[:, :L]  # (B, L, H): g_l reads y_<l
        contexts = self._windows(h, lens, self.query(g))
        lab = self.label_proj(g)  # (B, L, J)
        lab = lab.view(lab.shape[0], *[1] * (contexts.dim() - 3), L, -1)  # broadcast over T (and W)
        return self.emission(h), gather_targets(self._output(contexts, lab), targets)

    # --- decoding --------------------------------------------------------------------------
    def begin(self, h, lens):
        B = h.shape[0]
        state = self.label_context.initial_state(B, h.device)
        g, state = self.label_context.step(torch.full((B,), START, dtype=torch.long, device=h.device), state)
        return {"emit_logits": self.emission(h), "keys": self.key(h), "values": self.value(h), "g": g,
                "context": state, "last": torch.full((B,), -1, dtype=torch.long, device=h.device)}

    def candidates(self, state, t):
        keys, values = state["keys"], state["values"]
        first = max(0, t - self.window + 1)
        frames = torch.arange(first, t + 1, device=keys.device)  # (w,)
        energy = torch.einsum("bwa,ba->bw", keys[:, first : t + 1], self.query(state["g"])) * self.scale
        inside = torch.ones_like(energy, dtype=torch.bool)
        if self.variable:
            inside = frames.unsqueeze(0) > state["last"].unsqueeze(1)  # (B, w): after the previous emission
        weights = energy.masked_fill(~inside, _NEG_INF).softmax(dim=-1)  # (B, w)
        weights = torch.nan_to_num(weights, nan=0.0)  # a gap beyond the window: no frame in it
        context = torch.einsum("bw,bwa->ba", weights, values[:, first : t + 1])
        log_probs = self._output(context, self.label_proj(state["g"]))  # (B, V - 1)
        if self.variable:  # a gap beyond W has probability 0
            log_probs = log_probs.masked_fill((t - state["last"] > self.window).unsqueeze(1), _NEG_INF)
        return state["emit_logits"][:, t], log_probs

    def commit(self, state, t, emitted, labels):
        if not bool(emitted.any()):
            return state
        g, new = self.label_context.step(labels, state["context"])
        state["context"] = self.label_context.select_state(state["context"], emitted, new)
        state["g"] = torch.where(emitted.unsqueeze(1), g, state["g"])
        state["last"] = torch.where(emitted, torch.full_like(state["last"], t), state["last"])
        return state
