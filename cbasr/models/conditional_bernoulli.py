"""Conditional Bernoulli models: independent emission Bernoullis and a label decoder.

``P(y | x) = sum_b P(b) P(y | b)`` with ``P(b) = prod_t P(B_t = b_t)`` (CB paper eqs. 17-18):
the decoder gives the emission logits and the label terms (see
:mod:`cbasr.modules.decoders.base`), the criterion turns them into a loss:

- ``"cb_marginal"``: the exact ``-log P(y)`` of eq. (38) for a memoryless decoder, or its
  windowed second-order extension for a second-order one.
- ``"cb_reinforce"``: REINFORCE with exact CB samples of the objective ``log P(L) +
  E_{b|L}[sum_l log P(y_l | ...)]`` (eq. 19), by the global (eq. 21), ID-checking (eq. 23),
  bounded (eq. 28) or marginal bounded (eq. 29) estimator; any decoder whose emissions come
  from the encoder, except the bounded-window second-order one (its samples would need to
  respect the window), MBB for memoryless ones only.
- ``"cb_mc"``: the Monte Carlo marginal ``log P(L) + log (1/M) sum_m P(y | b_m)`` with exact
  CB samples, the sampled criterion the CB paper's experiments train; it tends to the exact
  marginal as ``M`` grows (VIMCO gradient, :mod:`cbasr.estimators.monte_carlo_marginal`). The
  same decoders as ``cb_reinforce``.
- ``"forced_suffix"``: Luo et al.'s REINFORCE with forced-suffix samples (eq. 1), biased for
  the CB objective (section 1), with an entropy penalty on the emissions (Luo et al.).

In training mode the sampled criteria report ``nll`` as minus the Monte Carlo value of their
objective, a stochastic lower bound on ``log P(y)`` (Jensen). In evaluation mode every
criterion reports the exact ``-log P(y)`` (eq. 38, or its second-order form) whenever the
decoder has one, so validation losses compare across criteria; only the autoregressive
decoders, which have no exact marginal, keep the sampled value.

Greedy decoding is frame-synchronous: at each frame the model emits the best next label when
``log P(B_t = 1) + max_y log P(y | ...)`` beats ``log P(B_t = 0)``.
"""

import torch
import torch.nn.functional as F

from cbasr.estimators import (
    ESTIMATORS,
    ProposalSampler,
    RunningMeanBaseline,
    cb_monte_carlo_marginal,
    cb_reinforce,
    forced_suffix_reinforce,
    forced_suffix_reinforce_from_samples,
)
from cbasr.losses import cb_marginal_nll, cb_marginal_nll_windowed
from cbasr.models.base import AsrModel, LossOutput
from cbasr.modules.decoders import CBDecoder, LabelOrder
from cbasr.modules.label_context import START

__all__ = ["CBModel", "default_estimator", "emission_rate_stats", "CRITERIA", "BASELINES"]

CRITERIA = ("cb_marginal", "cb_reinforce", "cb_mc", "forced_suffix")
BASELINES = ("none", "loo", "running_mean")


def emission_rate_stats(
    emit_logits: torch.Tensor, lens: torch.Tensor, target_lens: torch.Tensor
) -> dict:
    """Mean ``P(B_t = 1)`` over valid frames against the label rate ``L / T`` (CB paper section
    1), as 0-d tensors on ``emit_logits``' device: the trainer reads them with the step's other
    values, without waiting for the device here."""
    device = emit_logits.device
    valid = torch.arange(emit_logits.shape[1], device=device) < lens.to(device).unsqueeze(1)
    frames = valid.sum().clamp(min=1)  # valid: (B, T)
    rate = (torch.sigmoid(emit_logits.detach()) * valid).sum() / frames
    return {"emission_rate": rate, "label_rate": target_lens.to(device).sum() / frames}


def default_estimator(decoder) -> str:
    """``cb_reinforce``'s estimator when none is named: the marginal bounded estimator (eq. 29)
    for memoryless label terms, where it is unbiased, otherwise the ID-checking one (eq. 23).

    Both with the leave-one-out baseline: the lowest-variance pairs measured at shared
    parameters (recipes/toy/RESULTS.md, "Gradient variance and bias at shared parameters")."""
    memoryless = isinstance(decoder, CBDecoder) and decoder.order is LabelOrder.MEMORYLESS
    return "mbb" if memoryless else "idb"


class CBModel(AsrModel):
    """Encoder + CB decoder, trained by the exact marginal or a sampling estimator.

    Args:
        encoder, decoder: the modules; ``decoder`` is a :class:`CBDecoder`.
        criterion: ``"cb_marginal"``, ``"cb_reinforce"``, ``"cb_mc"`` or ``"forced_suffix"``.
        estimator: for ``cb_reinforce``: ``"global"``, ``"idb"``, ``"bb"``, ``"mbb"`` or ``"auto"``
            (:func:`default_estimator`: ``"mbb"`` where it is unbiased, else ``"idb"``).
        num_samples: Monte Carlo samples per utterance (sampled criteria; >= 1, ``cb_mc``: >= 2).
        baseline: ``"none"``, ``"loo"`` (leave one out; ``num_samples >= 2``) or
            ``"running_mean"`` (``cb_reinforce`` and ``forced_suffix``; ``cb_mc`` always uses
            VIMCO's leave-one-out baseline).
        entropy_weight: ``forced_suffix`` only: weight of the emission entropy bonus, >= 0.

    The loss schemas (:mod:`cbasr.config.schema`) check ``num_samples`` and ``entropy_weight``
    when the ``loss`` group is typed; the estimators refuse them at the first step otherwise.
    """

    def __init__(
        self,
        encoder,
        decoder,
        criterion: str = "cb_marginal",
        estimator: str = "auto",
        num_samples: int = 4,
        baseline: str = "loo",
        entropy_weight: float = 0.0,
    ):
        super().__init__(encoder, decoder)
        if estimator == "auto":
            estimator = default_estimator(decoder)
        reason = self.supports(decoder, criterion, estimator)
        if reason:
            raise ValueError(reason)
        if criterion != "cb_marginal" and baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
        self.criterion, self.estimator = criterion, estimator
        self.num_samples, self.entropy_weight = num_samples, entropy_weight
        self.baseline = RunningMeanBaseline() if baseline == "running_mean" else baseline

    @classmethod
    def supports(
        cls, decoder, criterion: str = "cb_marginal", estimator: str = "auto", **loss_options
    ):
        if criterion not in CRITERIA:
            return f"criterion must be one of {CRITERIA}, got {criterion!r}"
        if not isinstance(decoder, CBDecoder):
            return "the CB losses need a decoder with an emission head (a CB decoder)"
        if criterion == "cb_marginal" and decoder.order is LabelOrder.HISTORY:
            return (
                "the label terms depend on every earlier emission time, so there is no exact "
                "marginal; use a sampling estimator"
            )
        if decoder.autoregressive_emissions and criterion != "forced_suffix":
            return (
                "emissions that read the decoder state are not independent Bernoullis: only "
                "forced-suffix REINFORCE (sampled frame by frame) applies"
            )
        if criterion != "cb_marginal" and decoder.order is LabelOrder.SECOND_ORDER:
            return (
                "the second-order (variable-window) label terms, one per gap up to the window, "
                "are read by the exact lattice only: train it with the exact cb_marginal"
            )
        if criterion == "cb_reinforce":
            if estimator == "auto":
                estimator = default_estimator(decoder)
            if estimator not in ESTIMATORS:
                return f"estimator must be one of {ESTIMATORS}, got {estimator!r}"
            if estimator == "mbb" and decoder.order is not LabelOrder.MEMORYLESS:
                return (
                    "the marginal bounded estimator (eq. 29) is unbiased for memoryless label terms only: "
                    "use loss.estimator=idb or auto"
                )
        return None

    def terms(self, feats, feat_lens, targets, target_lens):
        """``(emit_logits (B, T'), label terms, lens (B,))`` from the encoder and decoder."""
        h, lens = self.encoder(feats, feat_lens)
        emit_logits, label_terms = self.decoder.cb_terms(h, lens, targets, target_lens)
        return emit_logits, label_terms, lens

    def loss(self, feats, feat_lens, targets, target_lens):
        h, lens = self.encoder(feats, feat_lens)
        return self._loss(h, lens, targets, target_lens)

    @torch.no_grad()
    def greedy_decode(self, feats, feat_lens):
        return self._greedy(*self.encoder(feats, feat_lens))

    @torch.no_grad()
    def validate_batch(self, feats, feat_lens, targets, target_lens):
        h, lens = self.encoder(feats, feat_lens)
        return self._loss(h, lens, targets, target_lens), self._greedy(h, lens)

    def _loss(self, h, lens, targets, target_lens) -> LossOutput:
        """The loss from the encoder's output ``h (B, T', D)``, ``lens (B,)``."""
        exact_available = (
            self.decoder.order is not LabelOrder.HISTORY
            and not self.decoder.autoregressive_emissions
        )
        if self.criterion == "cb_marginal" or (exact_available and not self.training):
            emit_logits, label_terms = self.decoder.cb_terms(h, lens, targets, target_lens)
            marginal = (
                cb_marginal_nll
                if self.decoder.order is LabelOrder.MEMORYLESS
                else cb_marginal_nll_windowed
            )
            nll = marginal(emit_logits, label_terms, lens, target_lens)
            return LossOutput(
                nll, nll.detach(), emission_rate_stats(emit_logits, lens, target_lens)
            )
        baseline = None if self.baseline == "none" else self.baseline
        if self.decoder.autoregressive_emissions:
            return self._autoregressive_forced_suffix(h, lens, targets, target_lens, baseline)
        emit_logits, rewards = self.decoder.reward_fn(h, lens, targets, target_lens)
        if self.criterion == "cb_reinforce":
            estimate = cb_reinforce(
                emit_logits, target_lens, rewards, lens, self.estimator, self.num_samples, baseline
            )
        elif self.criterion == "cb_mc":
            estimate = cb_monte_carlo_marginal(
                emit_logits, target_lens, rewards, lens, self.num_samples
            )
        else:
            estimate = forced_suffix_reinforce(
                emit_logits,
                target_lens,
                rewards,
                lens,
                self.num_samples,
                baseline,
                self.entropy_weight,
            )
        return LossOutput(
            estimate.loss, -estimate.value, emission_rate_stats(emit_logits, lens, target_lens)
        )

    def _greedy(self, h, lens) -> list[list[int]]:
        """Frame by frame, the more probable of emitting the best label and not emitting."""
        state = self.decoder.begin(h, lens)
        hyps: list[list[int]] = [[] for _ in range(h.shape[0])]
        for t in range(int(lens.max()) if lens.numel() else 0):
            emit_logit, log_probs = self.decoder.candidates(state, t)  # (B,), (B, V - 1)
            best, index = log_probs.max(dim=-1)
            emitted = (F.logsigmoid(emit_logit) + best > F.logsigmoid(-emit_logit)) & (t < lens)
            labels = index + 1  # label distribution entry i is id i + 1
            state = self.decoder.commit(state, t, emitted, labels)
            for b in emitted.nonzero().flatten().tolist():
                hyps[b].append(int(labels[b]))
        return hyps

    def _autoregressive_forced_suffix(self, h, lens, targets, target_lens, baseline) -> LossOutput:
        """Luo et al.'s training of autoregressive emissions (CB paper section 1, eq. 1): each
        frame's emission logit reads the decoder state after the labels emitted so far, so the
        forced-suffix samples (eq. 48) are drawn frame by frame, ``M`` samples side by side,
        the label reward ``log P(y_l | s_l)`` computed at each emission."""
        decoder, M = self.decoder, self.num_samples
        (B, T, _), L = h.shape, targets.shape[1]
        h_rows = h.repeat(M, 1, 1)  # (B, T, D) -> (M B, T, D), sample-major
        y_rows, total_rows = targets.repeat(M, 1), target_lens.repeat(M)
        sampler = ProposalSampler("forced_suffix", total_rows, lens.repeat(M), T)
        zeros = h.new_zeros(decoder.num_layers, M * B, decoder.hidden)
        lstm, s = (zeros, zeros), h.new_zeros(M * B, decoder.hidden)
        prev = torch.full((M * B,), START, dtype=torch.long, device=h.device)
        emitted_count = torch.zeros(M * B, dtype=torch.long, device=h.device)
        logits, highs, steps, rewards = [], [], [], h.new_zeros(M * B, L)
        columns = torch.arange(L, device=h.device)
        # Every frame takes a label step, its results kept where a row emits: no read of the
        # device to skip the frames where none does (rare in a batch of M B rows).
        for t in range(T):
            a_t = decoder.emission_step(h_rows[:, t], s)  # (M B,)
            high, step = sampler.step(a_t)
            logits.append(a_t), highs.append(high), steps.append(step)
            emitted = high.bool()
            position = emitted_count.clamp(max=L - 1)
            label = y_rows.gather(1, position.unsqueeze(1)).squeeze(1)  # y_l, the next label
            log_probs, s_new, (hx, cx) = decoder.label_step(h_rows[:, t], prev, lstm)
            reward = log_probs.gather(1, (label - 1).clamp(min=0).unsqueeze(1)).squeeze(1)  # (M B,)
            at = (columns == position.unsqueeze(1)) & emitted.unsqueeze(1)  # (M B, L)
            rewards = rewards + torch.where(at, reward.unsqueeze(1), 0.0)
            keep = emitted.view(1, -1, 1)
            lstm = (torch.where(keep, hx, lstm[0]), torch.where(keep, cx, lstm[1]))
            s = torch.where(emitted.unsqueeze(1), s_new, s)
            prev = torch.where(emitted, label, prev)
            emitted_count = emitted_count + emitted.long()
        shape = (M, B, T)
        estimate = forced_suffix_reinforce_from_samples(
            torch.stack(logits, -1).view(shape),
            torch.stack(highs, -1).view(shape),
            torch.stack(steps, -1).view(shape),
            rewards.view(M, B, L),
            target_lens,
            lens,
            baseline,
            self.entropy_weight,
        )
        emit_logits = torch.stack(logits, -1).view(shape)[0]
        return LossOutput(
            estimate.loss, -estimate.value, emission_rate_stats(emit_logits, lens, target_lens)
        )
