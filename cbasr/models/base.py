"""What training and inference ask of every model, whatever its loss.

A model is ``encoder -> decoder -> loss``. It takes plain tensors (never a data-layer batch)
and answers four questions:

- :meth:`AsrModel.loss`: a :class:`LossOutput` for a padded batch;
- :meth:`AsrModel.greedy_decode`: one label sequence (ids) per utterance
  (:meth:`AsrModel.validate_batch`: both, for validation);
- :meth:`AsrModel.check_utterance`: whether an utterance can be trained on at all (e.g. more
  labels than frames), so the data layer can skip it by id with the reason;
- :meth:`AsrModel.supports` (a class method): whether the loss can train a given decoder, and
  if not, why; the builder turns a refusal into a config error at start.
"""

import abc
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["AsrModel", "LossOutput", "subsampling_stride"]


@dataclass
class LossOutput:
    """Per-utterance training quantities.

    Attributes:
        loss: ``(B,)`` what the optimiser minimises (summed and divided by the label count);
            for REINFORCE estimators a surrogate whose gradient is the estimate.
        nll: ``(B,)`` detached ``-log P(y | x)``, or for sampled objectives the negated
            estimate of the objective; what logs and validation report.
        stats: scalar diagnostics for TensorBoard (e.g. the emission rate of CB models):
            floats, or 0-d tensors, which the trainer reads with the step's other values (one
            wait for the device per step, not one per statistic).
    """

    loss: torch.Tensor
    nll: torch.Tensor
    stats: dict[str, float | torch.Tensor]


class AsrModel(nn.Module, metaclass=abc.ABCMeta):
    """Encoder and decoder; subclasses add the loss and the search."""

    # whether training hands :meth:`loss` each label's gold end frame (``label_ends``)
    needs_label_ends = False

    def __init__(self, encoder: nn.Module, decoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    @classmethod
    @abc.abstractmethod
    def supports(cls, decoder: nn.Module, **loss_options) -> str | None:
        """None if this loss can train ``decoder``; otherwise the reason it cannot."""

    @abc.abstractmethod
    def loss(
        self,
        feats: torch.Tensor,
        feat_lens: torch.Tensor,
        targets: torch.Tensor,
        target_lens: torch.Tensor,
    ) -> LossOutput:
        """``feats (B, T, F)`` (or token ids ``(B, T)``), ``targets (B, L)`` ids ``>= 1``."""

    def forward(
        self,
        feats: torch.Tensor,
        feat_lens: torch.Tensor,
        targets: torch.Tensor,
        target_lens: torch.Tensor,
        **extra,
    ) -> LossOutput:
        """The training forward pass is :meth:`loss` (with a model's own ``extra`` inputs,
        e.g. a transducer's ``label_ends``), so that wrappers that hook ``forward``
        (``DistributedDataParallel``, ``torch.compile``) see the whole step."""
        return self.loss(feats, feat_lens, targets, target_lens, **extra)

    @abc.abstractmethod
    def greedy_decode(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> list[list[int]]:
        """Best label sequence per utterance (ids, blank never included)."""

    @torch.no_grad()
    def validate_batch(
        self,
        feats: torch.Tensor,
        feat_lens: torch.Tensor,
        targets: torch.Tensor,
        target_lens: torch.Tensor,
    ) -> tuple[LossOutput, list[list[int]]]:
        """:meth:`loss` and :meth:`greedy_decode` of one batch, the two things validation asks
        (in evaluation mode). Models whose two answers start from the same encoder pass
        override it to run the encoder once."""
        return self.loss(feats, feat_lens, targets, target_lens), self.greedy_decode(
            feats, feat_lens
        )

    def output_frames(self, num_frames: int) -> int:
        """Encoder frames for an utterance of ``num_frames`` input frames."""
        return int(self.encoder.output_lengths(torch.tensor([num_frames]))[0])

    def check_utterance(self, num_frames: int, targets: list[int]) -> str | None:
        """Why ``targets`` cannot be trained on with ``num_frames`` input frames, or None.

        The default asks for one frame per label (the CB lattice's condition, eq. 38).
        """
        frames = self.output_frames(num_frames)
        if frames < len(targets):
            return f"{num_frames} frames ({frames} after subsampling) cannot hold {len(targets)} labels"
        return None


def subsampling_stride(model, probe: int = 3000) -> int:
    """Input frames per encoder frame, from the encoder's output lengths."""
    return max(1, round(probe / max(model.output_frames(probe), 1)))
