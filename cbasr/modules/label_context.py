"""Label-history networks: the transducer prediction network and the CB label decoders' state.

A :class:`LabelContext` reads the labels emitted so far, ``y_{0:u}`` with ``y_0 = <S>`` (id 0,
the blank, doubles as the start symbol), and gives one vector ``g_u`` per prefix: ``g(Y) =
g_{0:U}`` in the HAT paper's notation (section 2, RNNT). It never sees the acoustics, so the
decoders built on it stay memoryless in the emission times (CB paper section 5.2, decoder 4).

``context = -1`` is an LSTM over the whole history; ``context = c >= 0`` keeps only the last
``c`` labels and looks their embeddings up (HAT paper Table 2: 0, 1, 2, 4): ``g_u = tanh(W
[e(y_{u-c+1}); ...; e(y_u)])``, positions before the start holding the start symbol; with
``c = 0`` ``g_u`` is one learned vector.

Teacher-forced :meth:`LabelContext.forward` and step-wise :meth:`LabelContext.step` give the
same vectors (tested), so search and training agree.
"""

import torch
from torch import nn

from cbasr.config.schema import LabelContextConfig
from cbasr.modules.dropout import Dropout

__all__ = ["LabelContext", "START"]

START = 0  # the start symbol <S>; shares id 0 with the blank, which is never a label


class LabelContext(nn.Module):
    """``y_{0:U}`` -> ``g_{0:U}``, teacher-forced or one label at a time.

    Args:
        vocab_size: number of ids V, blank / start (id 0) included.
        config: the network (``decoder.label``): ``embed_dim`` the label embedding width,
            ``hidden`` the output width D of ``g_u`` (LSTM units, or the finite-context
            projection), ``num_layers`` the LSTM's layers (``context = -1`` only), ``context``
            -1 for the full history (LSTM) or the number ``c >= 0`` of labels kept.
        dropout: on the embeddings.
    """

    def __init__(self, vocab_size: int, config: LabelContextConfig, dropout: float):
        super().__init__()
        embed_dim, hidden, context = config.embed_dim, config.hidden, config.context
        self.context = context
        self.output_dim = hidden
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.dropout = Dropout(dropout)
        if context == -1:
            self.rnn = nn.LSTM(embed_dim, hidden, num_layers=config.num_layers, batch_first=True)
        elif context == 0:
            self.constant = nn.Parameter(torch.zeros(hidden))
        else:
            self.proj = nn.Linear(context * embed_dim, hidden)

    def forward(self, targets: torch.Tensor) -> torch.Tensor:
        """``targets (B, U)`` label ids (padding: anything in range) -> ``g (B, U + 1, D)``.

        ``g[:, u]`` depends on ``targets[:, :u]`` only, so padded labels change no valid row.
        """
        B, U = targets.shape
        start = targets.new_full((B, 1), START)
        inputs = torch.cat([start, targets], dim=1)  # (B, U + 1): y_0 = <S>, y_1..y_U
        if self.context == 0:
            return self.constant.expand(B, U + 1, -1)
        if self.context == -1:
            g, _ = self.rnn(self.dropout(self.embedding(inputs)))  # (B, U + 1, D)
            return g
        history = torch.cat([targets.new_full((B, self.context - 1), START), inputs], dim=1)
        windows = history.unfold(1, self.context, 1)  # (B, U + 1, c): y_{u-c+1} .. y_u
        return torch.tanh(self.proj(self.dropout(self.embedding(windows)).flatten(2)))

    def initial_state(self, batch_size: int, device: torch.device | None = None):
        """The state before any label; :meth:`step` with the start symbol comes next."""
        if self.context == -1:
            return None  # the LSTM's zero state
        return torch.full(
            (batch_size, max(self.context, 1)), START, dtype=torch.long, device=device
        )

    def step(self, labels: torch.Tensor, state) -> tuple[torch.Tensor, object]:
        """Read one label per utterance: ``labels (B,)`` -> ``(g (B, D), new state)``.

        Start from :meth:`initial_state` and feed :data:`START` first: the outputs are then
        ``g_0, g_1, ...`` of :meth:`forward`. States are batched along dim 0 (dim 1 for the
        LSTM's ``(h, c)``); :meth:`step_rows` advances some rows only.
        """
        if self.context == 0:
            return self.constant.expand(labels.shape[0], -1), state
        if self.context == -1:
            # (B, 1, D)
            g, state = self.rnn(self.dropout(self.embedding(labels.unsqueeze(1))), state)
            return g.squeeze(1), state
        window = torch.cat([state[:, 1:], labels.unsqueeze(1)], dim=1)  # (B, c)
        return torch.tanh(self.proj(self.dropout(self.embedding(window)).flatten(1))), window

    def _explicit(self, state, batch: int):
        """The LSTM's state, its zero state (None) made explicit: the rows a partial step
        leaves out keep it."""
        if state is not None:
            return state
        zeros = self.embedding.weight.new_zeros(self.rnn.num_layers, batch, self.rnn.hidden_size)
        return zeros, zeros

    def step_masked(self, labels: torch.Tensor, state, mask: torch.Tensor):
        """:meth:`step` for the rows where ``mask (B,)`` holds, the others keeping their state,
        with every row computed: ``(g (B, D), new state)``, ``g`` of the unmasked rows
        meaningless. Unlike :meth:`step_rows` it reads nothing on the host (no ``nonzero``),
        for a search whose loop stays on the device."""
        if self.context == 0:
            return self.constant.expand(labels.shape[0], -1), state
        if self.context == -1:
            state = self._explicit(state, labels.shape[0])
            g, new = self.step(labels, state)
            keep = mask.view(1, -1, 1)
            return g, tuple(torch.where(keep, n, s) for s, n in zip(state, new))
        g, new = self.step(labels, state)
        return g, torch.where(mask.unsqueeze(1), new, state)

    def step_rows(self, labels: torch.Tensor, state, rows: torch.Tensor):
        """:meth:`step` for rows ``rows (K,)`` of the batch only, the others left as they are:
        ``labels (B,)`` -> ``(g (K, D) of those rows, the whole new state)``.

        A search extends a few of its rows per step (about one in eight in a transducer's
        beam search): stepping only those costs that fraction of a full :meth:`step`."""
        if self.context == 0:
            return self.constant.expand(rows.shape[0], -1), state
        if self.context == -1:
            state = self._explicit(state, labels.shape[0])
            g, new = self.step(
                labels.index_select(0, rows), tuple(s.index_select(1, rows) for s in state)
            )
            return g, tuple(s.index_copy(1, rows, n) for s, n in zip(state, new))
        g, new = self.step(labels.index_select(0, rows), state.index_select(0, rows))
        return g, state.index_copy(0, rows, new)
