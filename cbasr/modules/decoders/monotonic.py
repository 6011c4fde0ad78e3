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
- only the band ``l <= t <= T_b - L_b + l`` is computed, in blocks of diagonals ``t = l + k``
  (each block's energies and frames gathered by one index), and of it the result keeps the
  reachable cells, ``t - T_b + L_b - l <= d <= t - l`` (the previous label needs a frame of
  its own before ``t - d`` and room for the rest after), ``d = t`` for ``l = 0``; the other
  entries of the ``(B, T, W, L)`` result are 0 and never on a complete path;
- dropout on the joint draws one mask per ``(t, l)``, shared by its window sizes (the
  alternatives for one emission), rather than one per cell.
"""

import math
from typing import ClassVar

import torch
from torch import nn

from cbasr.checks import in_graph_step
from cbasr.config.schema import (
    LabelContextConfig,
    MonotonicDecoderConfig,
    check_full_history,
    check_window,
)
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
        label: the :class:`LabelContext` (None: the schema's defaults).
        joint_dim: width of the output joint.
        emission_hidden: hidden width of the :class:`EmissionHead`.
        dropout: on label embeddings and before the output layer.
    """

    #: The variable window's band is computed in blocks of diagonals whose largest tensor holds
    #: at most this many entries, by device type: on CUDA 256 MB in float32, so that a batch
    #: is a few blocks of a few dozen kernels each (the host queues each one); on a CPU 16 MB,
    #: as tensors that stay in its caches run faster there (recipes/synth/RESULTS.md,
    #: "Measurements behind defaults"). The autograd graph keeps every block's tensors either
    #: way: the blocks bound only the temporaries.
    band_elements: ClassVar[dict[str, int]] = {"cuda": 1 << 26, "cpu": 1 << 22}

    def __init__(
        self,
        input_dim: int,
        vocab_size: int,
        window: int = MonotonicDecoderConfig.window,
        variable: bool = MonotonicDecoderConfig.variable,
        attention_dim: int = MonotonicDecoderConfig.attention_dim,
        label: LabelContextConfig | None = None,
        joint_dim: int = MonotonicDecoderConfig.joint_dim,
        emission_hidden: int = MonotonicDecoderConfig.emission_hidden,
        dropout: float = MonotonicDecoderConfig.dropout,
    ):
        super().__init__()
        check_window(window)  # from Python too: 0 frames would run, training and search apart
        self.window, self.variable = window, variable
        self.order = LabelOrder.SECOND_ORDER if variable else LabelOrder.MEMORYLESS
        label = label or LabelContextConfig()
        check_full_history(label, "monotonic")  # from Python too
        self.label_context = LabelContext(vocab_size, label, dropout)
        hidden = self.label_context.output_dim
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
        cells are computed along that band, as ``(B, k, l)`` blocks of several diagonals ``k``
        at a time (at most :attr:`band_elements` entries in a block's largest tensor): the
        window weights of ``(t = l + k, l)`` times the projected frames ``t - j``, gathered by
        one index, then the joint, the output layer and the target's log probability. Cells
        outside the band are never computed. The number of operators does not grow with the
        band: a GPU's host queues the same few dozen kernels for a short utterance and a long
        one.

        Args:
            h: ``(B, T, D)``; g: ``(B, L, H)`` label-history states; targets: ``(B, L)``;
            lens, target_lens: ``(B,)``.
        """
        (B, T, _), L, W = h.shape, targets.shape[1], self.window
        if L == 0:
            return h.new_zeros(B, T, W, 0)
        if in_graph_step():  # a CUDA graph reads nothing: every frame may start the band
            K = T
        else:
            K = max(int((lens - target_lens.to(lens.device)).max()) + 1, 1)  # band width
        span = max(T, K + L - 1)  # frames t = l + k reach up to K + L - 2
        device = h.device
        energy = torch.einsum("bta,bla->btl", self.key(h), self.query(g)) * self.scale  # (B, T, L)
        # W_c W_v h_s: the value and context projections folded into one (D -> J) map.
        folded = self.context_proj.weight @ self.value.weight  # (J, A) @ (A, D) -> (J, D)
        projected = h @ folded.t()  # (B, T, J)
        energy = energy.flatten(1)  # (B, T * L)
        # Window entry j of cell (t = l + k, l, d) is frame t - j. The entries a reachable cell
        # keeps (j <= d <= t, t < T_b) are frames 0 .. T_b - 1; the clamp only keeps the other
        # entries' gathers inside the tables (finite values: masked below, or in cells outside
        # every utterance, dropped at the end), so no NaN reaches a gradient.
        k_ = torch.arange(K, device=device).view(K, 1, 1)
        l_ = torch.arange(L, device=device).view(1, L, 1)
        j_ = torch.arange(W, device=device).view(1, 1, W)
        rows = (k_ + l_ - j_).clamp(0, T - 1)  # (K, L, W_j): frames t - j
        outside = ~torch.ones(W, W, dtype=torch.bool, device=device).tril()  # [d, j]: j > d
        bias = (self.context_proj.bias + self.label_proj(g)).view(B, 1, L, 1, -1)
        ids = (targets - 1).clamp(min=0).view(B, 1, L, 1, 1)
        keep = 1.0 - self.dropout
        width = max(self.context_proj.out_features, self.out[-1].out_features, W)
        budget = self.band_elements.get(device.type, self.band_elements["cpu"])
        step = max(1, budget // (B * L * W * width))  # diagonals per block
        band = []
        for k0 in range(0, K, step):
            n, r = min(step, K - k0), rows[k0 : k0 + step]  # (n, L, W_j)
            # (B, n, L, W_j): the energies of the window's frames for label l
            e = energy.index_select(1, (r * L + l_).flatten()).view(B, n, L, 1, W)
            # Weights of the window of gap d + 1 (entries j <= d): a masked softmax per row d;
            # every row holds frame t itself (j = 0), so none is all -inf.
            weights = e.masked_fill(outside, _NEG_INF).softmax(dim=-1)  # (B, n, L, W_d, W_j)
            frames = projected.index_select(1, r.flatten()).view(B, n, L, W, -1)  # (.., W_j, J)
            x = torch.tanh(weights @ frames + bias)  # (B, n, L, W_d, J)
            if self.training and self.dropout > 0:  # one mask per (t, l), shared by its windows
                x = x * (torch.bernoulli(x.new_full((B, n, L, 1, x.shape[-1]), keep)) / keep)
            log_probs = self.out[-1](x).log_softmax(dim=-1)  # (B, n, L, W_d, V - 1)
            band.append(log_probs.gather(-1, ids.expand(B, n, L, W, 1)).squeeze(-1))
        band = torch.cat(band, dim=1) if len(band) > 1 else band[0]  # (B, K, L, W_d)
        t = torch.arange(K, device=device).view(K, 1) + torch.arange(L, device=device)  # (K, L)
        l = torch.arange(L, device=device).expand(K, L)
        b = torch.arange(B, device=device).view(B, 1, 1)
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
