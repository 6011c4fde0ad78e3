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
  at most the last ``window`` (``W``) of them: a gap longer than ``W`` keeps the ``W`` frames
  ending at ``t_l`` (the first label's previous emission is frame -1). The label term depends
  on the current and the previous emission time: second order, ``(B, T, W, L)`` for
  :func:`cbasr.losses.cb_marginal_nll_windowed`, with entry ``W - 1`` for every gap of ``W`` or
  more, so that no gap has probability zero.

Teacher forcing computes only what the lattice reads. The fixed window's contexts come from
one online-softmax pass over the window (running maximum, rescaled sums). The variable
window has ``W`` contexts per ``(t, l)``, so its cost is in the ``B T W L`` cells:

- the value and context projections are folded, ``W_c c + b = sum_s alpha_s (W_c W_v h_s) +
  b`` (the weights sum to 1), so every window's joint input is one batched product of its
  softmax weights with the projected encoder states of the ``W`` frames ending at ``t``;
  each row of weights is a masked softmax with its own maximum (exact and stable);
- only the band ``l <= t <= T_b - L_b + l`` is computed, one diagonal ``t = l + k`` at a
  time, and of it the result keeps the reachable cells, ``t - T_b + L_b - l <= d <= t - l``
  (the previous label needs a frame of its own before ``t - d`` and room for the rest
  after), ``d = t`` for ``l = 0``; the other entries of the ``(B, T, W, L)`` result are 0 and
  never on a complete path;
- dropout on the joint draws one mask per ``(t, l)``, shared by its window sizes (the
  alternatives for one emission), rather than one per cell.
"""

import math

import torch
from torch import nn

from cbasr.config.schema import MonotonicDecoderConfig
from cbasr.modules.decoders.base import CBDecoder, EmissionHead, LabelOrder, gather_targets
from cbasr.modules.dropout import Dropout
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

    def __init__(
        self,
        input_dim: int,
        vocab_size: int,
        window: int = MonotonicDecoderConfig.window,
        variable: bool = MonotonicDecoderConfig.variable,
        attention_dim: int = MonotonicDecoderConfig.attention_dim,
        embed_dim: int = MonotonicDecoderConfig.embed_dim,
        hidden: int = MonotonicDecoderConfig.hidden,
        num_layers: int = MonotonicDecoderConfig.num_layers,
        context: int = MonotonicDecoderConfig.context,
        joint_dim: int = MonotonicDecoderConfig.joint_dim,
        emission_hidden: int = MonotonicDecoderConfig.emission_hidden,
        dropout: float = MonotonicDecoderConfig.dropout,
    ):
        super().__init__()
        if window < 1:
            raise ValueError(f"window must be >= 1 frame, got {window}")
        self.window, self.variable = window, variable
        self.order = LabelOrder.SECOND_ORDER if variable else LabelOrder.MEMORYLESS
        self.label_context = LabelContext(
            vocab_size, embed_dim, hidden, num_layers, context, dropout
        )
        self.emission = EmissionHead(input_dim, emission_hidden)
        self.key = nn.Linear(input_dim, attention_dim, bias=False)
        self.value = nn.Linear(input_dim, attention_dim, bias=False)
        self.query = nn.Linear(hidden, attention_dim, bias=False)
        self.context_proj = nn.Linear(attention_dim, joint_dim)
        self.label_proj = nn.Linear(hidden, joint_dim, bias=False)
        self.out = nn.Sequential(Dropout(dropout), nn.Linear(joint_dim, vocab_size - 1))
        self.dropout = dropout
        self.scale = 1.0 / math.sqrt(attention_dim)

    def _output(self, context: torch.Tensor, lab: torch.Tensor) -> torch.Tensor:
        """``log softmax(W_o tanh(W_c c + W_g g))`` over the ``V - 1`` labels."""
        return self.out(torch.tanh(self.context_proj(context) + lab)).log_softmax(dim=-1)

    def _windows(self, h: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Attention contexts of the fixed windows ending at every frame.

        Args:
            h: ``(B, T, D)``; q: ``(B, L, A)`` queries.

        Returns:
            ``(B, T, L, A)``.
        """
        keys, values = self.key(h), self.value(h)  # (B, T, A)
        energy = torch.einsum("bta,bla->btl", keys, q) * self.scale  # (B, T, L)
        # Online softmax over the frames t, t-1, ..., t-W+1 (window entry j adds frame t - j).
        run_max = energy
        weight_sum = torch.ones_like(energy)  # sum of exp(e - run_max) over the window so far
        weighted = values.unsqueeze(2).expand(-1, -1, energy.shape[2], -1)  # (B, T, L, A)
        for j in range(1, self.window):
            e_j = _shifted(energy, j, _NEG_INF)  # (B, T, L); -inf before frame 0
            v_j = _shifted(values, j, 0.0).unsqueeze(2)  # (B, T, 1, A)
            new_max = torch.maximum(run_max, e_j)  # finite: frame t itself is in every window
            keep, add = torch.exp(run_max - new_max), torch.exp(e_j - new_max)
            weight_sum = weight_sum * keep + add
            weighted = weighted * keep.unsqueeze(-1) + add.unsqueeze(-1) * v_j
            run_max = new_max
        return weighted / weight_sum.unsqueeze(-1)  # (B, T, L, A)

    def _variable_window_terms(self, h, lens, g, targets, target_lens) -> torch.Tensor:
        """Label terms of the variable window at the reachable cells, ``(B, T, W, L)``.

        Label ``l`` can only be emitted at ``t = l + k``, ``0 <= k < T_b - L_b + 1``, so the
        cells are computed along that band, one ``k`` at a time for every label at once: the
        window weights of ``(t = l + k, l)`` times the projected frames ``t - j`` (a slice of
        the frame windows, no copy), then the joint, the output layer and the target's log
        probability. Cells outside the band are never computed.

        Args:
            h: ``(B, T, D)``; g: ``(B, L, H)`` label-history states; targets: ``(B, L)``;
            lens, target_lens: ``(B,)``.
        """
        (B, T, _), L, W = h.shape, targets.shape[1], self.window
        if L == 0:
            return h.new_zeros(B, T, W, 0)
        K = max(int((lens - target_lens.to(lens.device)).max()) + 1, 1)  # band width
        span = max(T, K + L - 1)  # frames t = l + k reach up to K + L - 2
        energy = torch.einsum("bta,bla->btl", self.key(h), self.query(g)) * self.scale  # (B, T, L)
        # Frames past T only serve cells outside every utterance (dropped at the end): finite
        # energies there keep their softmax rows, and so the gradients, free of NaN.
        energy = nn.functional.pad(energy, (0, 0, 0, span - T))  # (B, span, L)
        # W_c W_v h_s: the value and context projections folded into one (D -> J) map.
        folded = self.context_proj.weight @ self.value.weight  # (J, A) @ (A, D) -> (J, D)
        projected = nn.functional.pad(h @ folded.t(), (0, 0, 0, span - T))  # (B, span, J)
        # Window entry j is frame t - j (j = 0 .. W - 1); frames before 0 get -inf energy.
        # (B, span, L, W_j)
        energies = torch.stack([_shifted(energy, j, _NEG_INF) for j in range(W)], dim=-1)
        # (B, span, W_j, J)
        frames = torch.stack([_shifted(projected, j, 0.0) for j in range(W)], dim=2)
        outside = ~torch.ones(W, W, dtype=torch.bool, device=h.device).tril()  # [d, j]: j > d
        bias = (self.context_proj.bias + self.label_proj(g)).unsqueeze(2)  # (B, L, 1, J)
        ids = (targets - 1).clamp(min=0).view(B, L, 1, 1).expand(B, L, W, 1)
        keep = 1.0 - self.dropout
        band = []
        for k in range(K):
            # (t = l + k, l) for every l: the diagonal of rows k .. k + L - 1.
            # (B, W_j, L) -> (B, L, W_j)
            e = energies[:, k : k + L].diagonal(dim1=1, dim2=2).transpose(1, 2)
            # Weights of the window of gap d + 1 (entries j <= d): a masked softmax per row d;
            # every row holds frame t itself (j = 0), so none is all -inf.
            # (B, L, W_d, W_j)
            weights = e.unsqueeze(2).masked_fill(outside, _NEG_INF).softmax(dim=-1)
            # (B, L, W_d, W_j) @ (B, L, W_j, J)
            x = torch.tanh(weights @ frames[:, k : k + L] + bias)
            if self.training and self.dropout > 0:  # one mask per (t, l), shared by its windows
                x = x * (torch.bernoulli(x.new_full((B, L, 1, x.shape[-1]), keep)) / keep)
            log_probs = self.out[-1](x).log_softmax(dim=-1)  # (B, L, W_d, V - 1)
            band.append(log_probs.gather(-1, ids).squeeze(-1))  # (B, L, W_d)
        band = torch.stack(band, dim=1)  # (B, K, L, W_d)
        t = torch.arange(K, device=h.device).view(K, 1) + torch.arange(L, device=h.device)  # (K, L)
        l = torch.arange(L, device=h.device).expand(K, L)
        b = torch.arange(B, device=h.device).view(B, 1, 1)
        terms = band.new_zeros(B, span, L, W).index_put((b, t, l), band)[:, :T]  # (B, T, L, W)
        terms = torch.where(self._reachable(lens, target_lens, T, L), terms, 0.0)
        return terms.permute(0, 1, 3, 2)  # (B, T, L, W) -> (B, T, W, L)

    def _reachable(self, lens, target_lens, T: int, L: int) -> torch.Tensor:
        """``(B, T, L, W)`` bool: cells ``(t, l, d)`` on some emission path of ``L_b`` labels
        in ``T_b`` frames (necessary conditions; see the module docstring)."""
        device = lens.device
        t = torch.arange(T, device=device).view(1, T, 1, 1)
        l = torch.arange(L, device=device).view(1, 1, L, 1)
        d = torch.arange(self.window, device=device).view(1, 1, 1, -1)
        T_b, L_b = lens.view(-1, 1, 1, 1), target_lens.to(device).view(-1, 1, 1, 1)
        band = (l < L_b) & (t >= l) & (t <= T_b - L_b + l)
        first = (l == 0) & (d == t.clamp(max=self.window - 1))  # gaps >= W share d = W - 1
        later = (l > 0) & (d <= t - l) & (d >= t - T_b + L_b - l)
        return band & (first | later)

    def cb_terms(self, h, lens, targets, target_lens):
        """``(emit_logits (B, T), label terms (B, T, L) or (B, T, W, L))``."""
        L = targets.shape[1]
        g = self.label_context(targets)[:, :L]  # (B, L, H): g_l reads y_<l
        if self.variable:
            return self.emission(h), self._variable_window_terms(h, lens, g, targets, target_lens)
        contexts = self._windows(h, self.query(g))  # (B, T, L, A)
        lab = self.label_proj(g).unsqueeze(1)  # (B, L, J) -> (B, 1, L, J), broadcast over T
        return self.emission(h), gather_targets(self._output(contexts, lab), targets)

    # --- decoding --------------------------------------------------------------------------
    def begin(self, h, lens):
        B = h.shape[0]
        state = self.label_context.initial_state(B, h.device)
        g, state = self.label_context.step(
            torch.full((B,), START, dtype=torch.long, device=h.device), state
        )
        return {
            "emit_logits": self.emission(h),
            "keys": self.key(h),
            "values": self.value(h),
            "g": g,
            "context": state,
            "last": torch.full((B,), -1, dtype=torch.long, device=h.device),
        }

    def candidates(self, state, t):
        keys, values = state["keys"], state["values"]
        first = max(0, t - self.window + 1)
        frames = torch.arange(first, t + 1, device=keys.device)  # (w,)
        energy = (
            torch.einsum("bwa,ba->bw", keys[:, first : t + 1], self.query(state["g"])) * self.scale
        )
        inside = torch.ones_like(energy, dtype=torch.bool)
        if self.variable:
            # (B, w): after the previous emission
            inside = frames.unsqueeze(0) > state["last"].unsqueeze(1)
        weights = energy.masked_fill(~inside, _NEG_INF).softmax(dim=-1)  # (B, w)
        # a gap beyond W keeps the W frames ending at t: frame t is always inside
        context = torch.einsum("bw,bwa->ba", weights, values[:, first : t + 1])
        log_probs = self._output(context, self.label_proj(state["g"]))  # (B, V - 1)
        return state["emit_logits"][:, t], log_probs

    def commit(self, state, t, emitted, labels):
        rows = emitted.nonzero().squeeze(1)
        if not rows.numel():
            return state
        g, state["context"] = self.label_context.step_rows(labels, state["context"], rows)
        state["g"] = state["g"].index_copy(0, rows, g)
        state["last"] = torch.where(emitted, torch.full_like(state["last"], t), state["last"])
        return state
