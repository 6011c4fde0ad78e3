"""The toy problem of CB paper section 5.1: a population of emission sequences and labels.

``T`` independent Bernoulli emissions ``B^_t ~ P_t(b^_t)``; whenever ``B^_t = 1`` the next
label is drawn from a per-frame transition ``P_t(y | y_{l-1})`` (``y_0`` is a start state).
A sequence ``y`` of ``L = sum_t b^_t`` labels then has probability

    P(y, b^) = prod_t P_t(y_{l_t} | y_{l_t - 1})^{b^_t} P_t(b^_t).

The learner ``Q`` has the same form (:class:`ToyParameters`), so the distance between
population and learner is a mean squared error over their probabilities. Its rewards are
memoryless in the emission times: ``R[t, l] = log Q_t(y_l | y_{l-1})``.
"""

from typing import NamedTuple

import torch

__all__ = [
    "ToyParameters",
    "ToyBatch",
    "random_population",
    "initial_learner",
    "sample_batch",
    "label_rewards",
    "parameter_mse",
]


class ToyParameters(NamedTuple):
    """Parameters of a population or a learner.

    Attributes:
        emit_logits: ``(T,)`` log odds of ``P_t(b_t = 1)``.
        label_logits: ``(T, V + 1, V)`` logits of ``P_t(y | previous)``; previous ``V`` is the
            start state.
    """

    emit_logits: torch.Tensor
    label_logits: torch.Tensor


class ToyBatch(NamedTuple):
    """``N`` sequences drawn from the population.

    Attributes:
        labels: ``(N, T)`` int64 label ids, -1 past ``total``.
        total: ``(N,)`` int64 ``L`` per sequence.
        lengths: ``(N,)`` int64 ``T`` (every sequence has all frames).
    """

    labels: torch.Tensor
    total: torch.Tensor
    lengths: torch.Tensor


def random_population(
    num_frames: int, vocab: int, sigma: float, emit_rate: float, generator: torch.Generator
) -> ToyParameters:
    """Population parameters: emission logits ``N(logit(emit_rate), sigma^2)``, label logits
    ``N(0, sigma^2)`` (float64)."""
    centre = torch.logit(torch.tensor(emit_rate, dtype=torch.float64))
    emit = centre + sigma * torch.randn(num_frames, generator=generator, dtype=torch.float64)
    labels = sigma * torch.randn(
        num_frames, vocab + 1, vocab, generator=generator, dtype=torch.float64
    )
    return ToyParameters(emit, labels)


def initial_learner(num_frames: int, vocab: int) -> ToyParameters:
    """The learner's start: every ``Q_t(b_t = 1) = 1/2`` and uniform labels, as leaf tensors."""
    emit = torch.zeros(num_frames, dtype=torch.float64, requires_grad=True)
    labels = torch.zeros(num_frames, vocab + 1, vocab, dtype=torch.float64, requires_grad=True)
    return ToyParameters(emit, labels)


@torch.no_grad()
def sample_batch(population: ToyParameters, size: int, generator: torch.Generator) -> ToyBatch:
    """Draw ``size`` sequences ``y`` (the emissions ``b^`` are latent and dropped)."""
    T, V = population.emit_logits.shape[0], population.label_logits.shape[-1]
    probs = torch.sigmoid(population.emit_logits).expand(size, T)
    emits = torch.bernoulli(probs, generator=generator).bool()  # (N, T)
    label_probs = torch.softmax(population.label_logits, -1)  # (T, V + 1, V)
    previous = torch.full((size,), V, dtype=torch.long)  # start state
    labels = torch.full((size, T), -1, dtype=torch.long)
    count = torch.zeros(size, dtype=torch.long)
    for t in range(T):
        drawn = torch.multinomial(label_probs[t, previous], 1, generator=generator).squeeze(1)
        rows = emits[:, t].nonzero().squeeze(1)
        labels[rows, count[rows]] = drawn[rows]
        previous = torch.where(emits[:, t], drawn, previous)
        count += emits[:, t].long()
    return ToyBatch(labels, count, torch.full((size,), T, dtype=torch.long))


def label_rewards(learner: ToyParameters, batch: ToyBatch) -> torch.Tensor:
    """Memoryless rewards ``R[n, t, l] = log Q_t(y_l | y_{l-1})``: ``(N, T, L)``, L = max(total).

    Entries past ``total`` hold the reward of label 0 (they are padding). Differentiable w.r.t.
    ``learner.label_logits``.
    """
    V = learner.label_logits.shape[-1]
    L = max(int(batch.total.max()), 1)
    labels = batch.labels[:, :L].clamp(min=0)  # (N, L)
    previous = torch.cat([torch.full_like(labels[:, :1], V), labels[:, :-1]], 1)  # y_{l-1}
    log_probs = torch.log_softmax(learner.label_logits, -1)  # (T, V + 1, V)
    rewards = log_probs[:, previous, labels]  # (T, N, L)
    return rewards.permute(1, 0, 2)  # (T, N, L) -> (N, T, L)


@torch.no_grad()
def parameter_mse(population: ToyParameters, learner: ToyParameters) -> tuple[float, float]:
    """Mean squared errors between probabilities: emissions ``P_t(b_t = 1)`` over ``t`` and
    label transitions ``P_t(y | y')`` over ``(t, y', y)``."""
    emit = (torch.sigmoid(population.emit_logits) - torch.sigmoid(learner.emit_logits)) ** 2
    labels = (
        torch.softmax(population.label_logits, -1) - torch.softmax(learner.label_logits, -1)
    ) ** 2
    return float(emit.mean()), float(labels.mean())
