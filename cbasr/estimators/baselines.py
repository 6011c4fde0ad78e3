"""Baselines (control variates) for the REINFORCE estimators of CB paper section 2.2.

A baseline ``c_s`` is subtracted from the return ``A_s`` that multiplies a step's score
``d log q_s``: ``(A_s - c_s) d log q_s``. It leaves the estimate unbiased as long as ``c_s``
does not depend on the step's own outcome or later ones, since
``E[c_s d log q_s | history] = c_s d E[1 | history] = 0`` (the argument of eq. 25). Three
kinds, passed as ``baseline=`` to the estimators:

- ``"loo"``: leave-one-out over the ``M`` samples of an utterance, per label: sample ``m``'s
  step ``s`` gets ``n_{m,s}`` times the other ``M - 1`` samples' reward per covered label at
  the same step, ``sum_{j != m} A_{j,s} / sum_{j != m} n_{j,s}``. The samples are
  independent and ``n_{m,s}`` is fixed before step ``s`` is drawn, so it is unbiased; and
  since it compares rewards per label, a constant reward gives a learning signal of exactly
  0 for every estimator (a plain mean of the others' returns would not, where the samples
  have different numbers of labels left at the same step: the ID-checking estimator's
  frames, the forced suffix's frames).
- :class:`RunningMeanBaseline`: an exponential running mean ``c`` of the per-label reward
  over past batches (Luo et al.'s running-average baseline), scaled by the number of labels
  the return covers (``c * n_s``; ``n_s`` is fixed by the history before step ``s``).
- A learned one: a tensor ``(B,)`` of predicted per-label rewards, e.g. from
  :class:`LearnedBaseline`; it is used detached, scaled by ``n_s`` the same way, and the
  estimator returns a squared-error ``control_variate_loss`` that trains it.
"""

import torch
from torch import nn

__all__ = ["RunningMeanBaseline", "LearnedBaseline"]


class RunningMeanBaseline(nn.Module):
    """Exponential running mean of the per-label reward, ``c <- decay c + (1 - decay) mean R``.

    The estimators read ``c`` before they update it, so the baseline of a batch depends on
    earlier batches only. ``c`` starts at 0 and the first update sets it to the batch mean.

    Args:
        decay: weight of the past, in ``[0, 1)``.
    """

    def __init__(self, decay: float = 0.9):
        super().__init__()
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must lie in [0, 1); got {decay}")
        self.decay = decay
        self.register_buffer("mean", torch.zeros(()))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def update(self, per_label: torch.Tensor, valid: torch.Tensor) -> None:
        """Fold in the rewards ``per_label (M, B, L)`` where ``valid (M, B, L)`` is True."""
        n = valid.sum()
        if int(n) == 0:
            return
        batch_mean = torch.where(valid, per_label.detach(), 0.0).sum() / n
        weight = self.decay if int(self.count) > 0 else 0.0
        self.mean.copy_(weight * self.mean + (1 - weight) * batch_mean.to(self.mean.dtype))
        self.count += 1


class LearnedBaseline(nn.Module):
    """A learned per-label reward predictor ``c(x)``: ``(B, D)`` features -> ``(B,)``.

    A linear map (``hidden = 0``) or a one-hidden-layer tanh network. Pass its output as
    ``baseline=`` and add the estimate's ``control_variate_loss`` (the squared error against
    the sampled per-label rewards) to the training loss; detach the features if they should
    not be trained by it.

    Args:
        num_features: ``D``.
        hidden: hidden units, 0 for a linear map.
    """

    def __init__(self, num_features: int, hidden: int = 0):
        super().__init__()
        if hidden > 0:
            self.net = nn.Sequential(
                nn.Linear(num_features, hidden), nn.Tanh(), nn.Linear(hidden, 1)
            )
        else:
            self.net = nn.Linear(num_features, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).squeeze(-1)  # (B, 1) -> (B,)


def leave_one_out(returns: torch.Tensor) -> torch.Tensor:
    """``(M, B, S)`` -> ``(M, B, S)``: the mean of the other ``M - 1`` samples' returns."""
    M = returns.shape[0]
    if M < 2:
        raise ValueError("baseline='loo' needs num_samples >= 2 (it averages the other samples)")
    return (returns.sum(0, keepdim=True) - returns) / (M - 1)


def leave_one_out_per_label(returns: torch.Tensor, labels_covered: torch.Tensor) -> torch.Tensor:
    """``(M, B, S)`` -> ``(M, B, S)``: ``n_{m,s}`` times the other ``M - 1`` samples' reward per
    covered label at step ``s``, ``sum_{j != m} A_{j,s} / sum_{j != m} n_{j,s}`` (0 where the
    others cover no label); ``labels_covered`` broadcasts to ``(M, B, S)``."""
    if returns.shape[0] < 2:
        raise ValueError("baseline='loo' needs num_samples >= 2 (it averages the other samples)")
    covered = labels_covered.clamp(min=0).to(returns.dtype).expand_as(returns)
    other_returns = returns.sum(0, keepdim=True) - returns  # (M, B, S)
    other_labels = covered.sum(0, keepdim=True) - covered
    per_label = torch.where(other_labels > 0, other_returns / other_labels.clamp(min=1), 0.0)
    return covered * per_label


def vimco_signals(log_weights: torch.Tensor) -> torch.Tensor:
    """VIMCO's learning signals ``L^ - L^_{-m}`` for ``log_weights (M, B)``: ``(M, B)``.

    ``L^ = log mean_m exp(f_m)`` and ``L^_{-m}`` is the same with ``f_m`` replaced by the mean
    of the other ``M - 1`` values (Mnih & Rezende, 2016, "Variational Inference for Monte
    Carlo Objectives", arXiv:1602.06725, eq. 10). Everything is computed relative to the
    per-utterance maximum, so equal ``f_m`` give signals that are exactly 0.
    """
    M = log_weights.shape[0]
    if M < 2:
        raise ValueError("baseline='loo' (VIMCO's leave-one-out) needs num_samples >= 2")
    f = log_weights.detach()
    shifted = f - f.max(dim=0, keepdim=True).values  # (M, B), <= 0; the best sample at 0
    others_mean = (shifted.sum(0, keepdim=True) - shifted) / (M - 1)  # (M, B)
    weights = shifted.exp()
    total = weights.sum(0, keepdim=True)  # >= 1
    # L^ - L^_{-m} = -log(1 + (exp(mean_{-m}) - w_m) / sum w): the sum without w_m still holds
    # the best sample's 1, so nothing underflows, except for the best sample itself ...
    signals = -torch.log1p((others_mean.exp() - weights) / total)
    # ... whose leave-one-out value is a log-sum-exp of its own.
    best = shifted.argmax(dim=0)  # (B,)
    columns = torch.arange(f.shape[1], device=f.device)
    replaced = shifted.clone()
    replaced[best, columns] = others_mean[best, columns]
    signals[best, columns] = torch.logsumexp(shifted, dim=0) - torch.logsumexp(replaced, dim=0)
    return signals


def baseline_values(
    baseline,
    returns: torch.Tensor,
    labels_covered: torch.Tensor,
    per_label: torch.Tensor,
    label_valid: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The baseline of every step, and the learned baseline's loss.

    Args:
        baseline: None, ``"loo"``, a :class:`RunningMeanBaseline`, or a tensor ``(B,)`` of
            predicted per-label rewards.
        returns: ``(M, B, S)`` the returns ``A_s`` (detached inside).
        labels_covered: ``n_s``, broadcastable to ``(M, B, S)``: how many labels the return
            of step ``s`` sums over, fixed before step ``s`` is drawn.
        per_label: ``(M, B, L)`` sampled per-label rewards (for the running mean and the
            learned baseline's loss).
        label_valid: ``(M, B, L)`` bool, ``l < total``.

    Returns:
        ``(M, B, S)`` baseline values (detached), and a ``(B,)`` loss for a learned
        baseline (None otherwise).
    """
    returns = returns.detach()
    if baseline is None:
        return torch.zeros_like(returns), None
    if isinstance(baseline, str):
        if baseline != "loo":
            raise ValueError(
                "baseline must be None, 'loo', a RunningMeanBaseline or a tensor (B,); "
                f"got {baseline!r}"
            )
        return leave_one_out_per_label(returns, labels_covered), None
    if isinstance(baseline, RunningMeanBaseline):
        value = baseline.mean.to(returns.dtype) * labels_covered
        baseline.update(per_label, label_valid)
        return value.expand_as(returns), None
    if isinstance(baseline, torch.Tensor):
        B = returns.shape[1]
        if baseline.shape != (B,):
            raise ValueError(
                f"baseline (a tensor of per-label reward predictions) must have shape (B,) = "
                f"({B},); got {tuple(baseline.shape)}"
            )
        value = baseline.detach()[None, :, None] * labels_covered
        error = torch.where(label_valid, (baseline[None, :, None] - per_label.detach()) ** 2, 0.0)
        loss = error.sum(-1).mean(0)  # (M, B, L) -> (B,)
        return value.expand_as(returns), loss
    raise TypeError(
        "baseline must be None, 'loo', a RunningMeanBaseline or a tensor (B,); got "
        f"{type(baseline).__name__}"
    )
