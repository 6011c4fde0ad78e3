"""The floor for the LibriSpeech Conformer's training speed: a minimal loop a user could write in
an afternoon, over the recipe's model sizes, built from :class:`torchaudio.models.Conformer`
with :func:`torch.nn.functional.ctc_loss` or :func:`torchaudio.functional.rnnt_loss`.

``scripts/bench_train.py --floor`` trains it on the batches it gave the toolkit's trainer (on
the device already), under the same precision, and reports its frames per second beside the
toolkit's. What it leaves out is what the toolkit adds to a step: SpecAugment, the masking of
padded frames before each depthwise convolution, the checks of the loss and gradient, the
learning-rate schedule, gradient clipping; the transducer's floor runs torchaudio's loss on the
whole lattice where the recipe's HAT runs the pruned loss.
"""

import time

import torch
import torchaudio
from torch import nn

__all__ = ["FloorModel", "floor_backward", "floor_model", "floor_run"]


class FloorModel(nn.Module):
    """Two 3x3 stride-2 convolutions, a projection, torchaudio's Conformer, then a CTC output
    layer (``kind="ctc"``) or an LSTM prediction network and a ``tanh`` joint (``"rnnt"``)."""

    def __init__(self, dim: int, vocab: int, encoder, kind: str, decoder=None):
        super().__init__()
        self.kind = kind
        self.front = nn.Sequential(
            nn.Conv2d(1, 32, 3, stride=2), nn.ReLU(), nn.Conv2d(32, 32, 3, stride=2), nn.ReLU()
        )
        d = encoder.d_model
        self.proj = nn.Sequential(
            nn.Linear(32 * (((dim - 1) // 2 - 1) // 2), d), nn.Dropout(encoder.dropout)
        )
        self.conformer = torchaudio.models.Conformer(
            d,
            encoder.num_heads,
            encoder.ffn_dim,
            encoder.num_layers,
            encoder.kernel_size,
            encoder.dropout,
        )
        if kind == "ctc":
            self.out = nn.Linear(d, vocab)
        else:
            label = decoder.label  # the prediction network's sizes
            self.embed = nn.Embedding(vocab, label.embed_dim)
            self.lstm = nn.LSTM(label.embed_dim, label.hidden, batch_first=True)
            self.enc_proj = nn.Linear(d, decoder.joint_dim)
            self.pred_proj = nn.Linear(label.hidden, decoder.joint_dim)
            self.out = nn.Linear(decoder.joint_dim, vocab)

    def forward(self, feats, lens, targets, target_lens) -> torch.Tensor:
        x = self.front(feats.unsqueeze(1)).transpose(1, 2).flatten(2)
        lens = (((lens - 1) // 2 - 1) // 2).clamp(min=1)
        x = x[:, : int(lens.max())]
        h, lens = self.conformer(self.proj(x), lens)
        if self.kind == "ctc":
            log_probs = self.out(h).float().log_softmax(-1).transpose(0, 1)
            return nn.functional.ctc_loss(
                log_probs, targets, lens, target_lens, reduction="sum", zero_infinity=True
            )
        start = torch.zeros_like(targets[:, :1])  # blank as the start symbol
        g, _ = self.lstm(self.embed(torch.cat([start, targets], 1)))
        joint = self.enc_proj(h).unsqueeze(2) + self.pred_proj(g).unsqueeze(1)
        logits = self.out(torch.tanh(joint)).float()  # (B, T', U + 1, V)
        return torchaudio.functional.rnnt_loss(
            logits, targets.int(), lens.int(), target_lens.int(), blank=0, reduction="sum"
        )


def floor_model(cfg, vocab: int, dim: int) -> FloorModel:
    """The :class:`FloorModel` of ``cfg``'s sizes (CTC for the CTC and CB losses, else RNN-T)
    on ``dim``-dimensional features."""
    kind = "ctc" if cfg.loss.name in ("ctc", "cb_marginal") else "rnnt"
    return FloorModel(dim, vocab, cfg.encoder, kind, cfg.decoder)


def floor_backward(model: FloorModel, batch, precision: str) -> None:
    """The loop's forward (under ``precision``'s autocast) and backward on ``batch``: the loss
    per label."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    device = batch.feats.device.type
    with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = model(batch.feats, batch.feat_lens, batch.targets, batch.target_lens)
    (loss / batch.target_lens.sum()).backward()


def floor_run(cfg, vocab: int, batches, warmup: int, precision: str, device) -> list[float]:
    """Train a :class:`FloorModel` of ``cfg``'s sizes on ``batches`` (``Batch`` on ``device``):
    the seconds of each step after ``warmup``, the device synchronised after each."""
    model = floor_model(cfg, vocab, batches[0].feats.shape[-1]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
    times = []
    for k, batch in enumerate(batches):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        floor_backward(model, batch, precision)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if k >= warmup:
            times.append(time.perf_counter() - start)
    return times
