"""An LSTM token language model, for shallow fusion and HAT's eq. (9).

The vocabulary is the recogniser's: id 0 (the blank, which is never a label) is the sentence
boundary, read as ``<s>`` and predicted as ``</s>``; ids ``1 .. V-1`` are the tokens. So

    log P_LM(y) = sum_{u=1}^{U} log P(y_u | <s> y_{<u}) + log P(</s> | <s> y_{1:U})

and :meth:`LSTMLanguageModel.step` gives the next-token distributions a search needs, equal to
the teacher-forced :meth:`LSTMLanguageModel.forward` (tested).
"""

import torch
from torch import nn

from cbasr.modules.dropout import Dropout

__all__ = ["LSTMLanguageModel", "BOUNDARY"]

BOUNDARY = 0  # <s> as input, </s> as output


class LSTMLanguageModel(nn.Module):
    """Embedding -> LSTM -> linear over the ``V`` ids.

    Args:
        vocab_size: ``V``, the boundary id 0 included.
        embed_dim: token embedding width.
        hidden: LSTM units.
        num_layers: LSTM layers.
        dropout: on the embeddings, between LSTM layers and before the output layer.
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 64,
        hidden: int = 256,
        num_layers: int = 2,
        dropout: float = 0.1,
    ):
        super().__init__()
        if vocab_size < 2:
            raise ValueError(
                f"vocab_size must be >= 2 (the boundary and one token), got {vocab_size}"
            )
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.dropout = Dropout(dropout)
        self.rnn = nn.LSTM(
            embed_dim,
            hidden,
            num_layers=num_layers,
            batch_first=True,
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, targets: torch.Tensor) -> torch.Tensor:
        """Teacher-forced next-token log probabilities.

        Args:
            targets: ``(B, U)`` token ids ``1 .. V-1`` (padding: any id in range).

        Returns:
            ``(B, U + 1, V)``: row ``u`` is ``log P(. | <s> y_{1:u})``; it depends on
            ``targets[:, :u]`` only, so padding changes no valid row.
        """
        start = targets.new_full((targets.shape[0], 1), BOUNDARY)
        inputs = torch.cat([start, targets], dim=1)  # (B, U + 1)
        x, _ = self.rnn(self.dropout(self.embedding(inputs)))  # (B, U + 1, H)
        return self.out(self.dropout(x)).log_softmax(dim=-1)

    def sequence_log_probs(self, targets: torch.Tensor, target_lens: torch.Tensor) -> torch.Tensor:
        """``log P_LM(y)`` with the end of sentence, ``(B,)``.

        Args:
            targets: ``(B, U)``; target_lens: ``(B,)``.
        """
        log_probs = self.forward(targets)  # (B, U + 1, V)
        U = targets.shape[1]
        positions = torch.arange(U + 1, device=targets.device)
        lens = target_lens.to(targets.device)
        # The token predicted at each row: y_{u+1} for u < U_b, </s> at u = U_b.
        # (B, U + 1)
        nxt = torch.cat([targets, targets.new_full((targets.shape[0], 1), BOUNDARY)], dim=1)
        nxt = torch.where(positions[None, :] == lens[:, None], BOUNDARY, nxt)
        picked = log_probs.gather(2, nxt.unsqueeze(-1)).squeeze(-1)  # (B, U + 1)
        return torch.where(positions[None, :] <= lens[:, None], picked, 0.0).sum(dim=1)

    def step(self, labels: torch.Tensor, state=None) -> tuple[torch.Tensor, tuple]:
        """Read one token per row: ``labels (N,)`` -> ``(log P(next) (N, V), LSTM state)``.

        Start with ``state=None`` and :data:`BOUNDARY`; states are ``(h, c)``, batched on dim 1.
        """
        x, state = self.rnn(self.dropout(self.embedding(labels.unsqueeze(1))), state)  # (N, 1, H)
        return self.out(self.dropout(x.squeeze(1))).log_softmax(dim=-1), state
