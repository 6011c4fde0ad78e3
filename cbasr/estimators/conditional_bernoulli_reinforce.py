"""CB REINFORCE estimators: global (eq. 21), ID-checking (eq. 23), bounded (eq. 28) and
marginal bounded (eq. 29), CB paper section 2.2.

All four estimate the gradient of ``R = log P(L) + E_{b|L}[sum_l R_{t_l}]`` (eq. 19) with
samples ``b ~ P(b | L)`` of the Conditional Bernoulli. ``d log P(L)`` is exact; the rewards'
own gradient (``d R_{t_l}``, the pathwise term) is averaged over samples; they differ in the
score-function term, i.e. which step log probabilities the returns multiply:

- ``"global"``, eq. (21): ``(sum_l R_{t_l}) d log P(b | L)``.
- ``"idb"``, eq. (23): ``sum_t (sum_{t' >= t} R_{t'}) d log P(b_t | b_<t, L - l_{t-1})``, the
  ID-checking steps of eq. (11).
- ``"bb"``, eq. (28): ``sum_l (sum_{l' >= l} R_{t_l'}) d log P(t_l | t_{l-1}, L - l)``, the
  Bounded Bernoulli steps of eq. (13). Per sample it equals ``"idb"`` exactly.
- ``"mbb"``, eq. (29): ``sum_l R_{t_l} d log P(t_l | L - l)``, the marginals of eq. (15).
  Unbiased only for memoryless rewards (eq. 31), so it refuses a reward callable.

The paper proves var(eq. 23) <= var(eq. 21) (eqs. 24-27) and, for memoryless rewards,
var(eq. 29) <= var(eq. 23) (eqs. 30-31); ``recipes/toy`` measures them.
"""

import torch

from cbasr.checks import one_read
from cbasr.distributions import (
    ConditionalBernoulli,
    PoissonBinomial,
    bounded_bernoulli_log_probs,
    bounded_bernoulli_marginals,
    bounded_bernoulli_sample,
    id_checking_log_probs,
    id_checking_sample,
    sequence_to_times,
    times_to_sequence,
)
from cbasr.estimators._common import (
    Estimate,
    Rewards,
    check_inputs,
    emitted_before,
    frame_rewards,
    label_mask,
    label_rewards,
    masked_logits,
    pad_times,
    reward_to_go,
    score_surrogate,
)
from cbasr.estimators.baselines import baseline_values

__all__ = ["ESTIMATORS", "cb_reinforce", "cb_reinforce_from_samples"]

ESTIMATORS = ("global", "idb", "bb", "mbb")


def cb_reinforce(
    emit_logits: torch.Tensor,
    total: torch.Tensor,
    rewards: Rewards,
    input_lengths: torch.Tensor,
    estimator: str,
    num_samples: int,
    baseline=None,
    generator: torch.Generator | None = None,
) -> Estimate:
    """REINFORCE estimate of ``d/d theta [log P(L) + E_{b|L}[sum_l R_{t_l}]]`` (eq. 19).

    Draws ``M = num_samples`` CB samples per utterance (ID-checking sampler for
    ``"global"``/``"idb"``, bounded sampler for ``"bb"``/``"mbb"``; all are exact) and
    returns the estimator of :func:`cb_reinforce_from_samples` at them.

    Args:
        emit_logits: ``(B, T)`` emission log odds ``log w_t`` (eq. 4).
        total: ``(B,)`` int64 number of labels ``L_b <= input_lengths[b]``.
        rewards: a tensor ``(B, T, L)``, ``L >= max(total)``, of memoryless rewards
            ``R[b, t, l] = log P(y_l | t_l = t, y_<l)``; or a callable mapping emission times
            ``(M, B, L)`` (``L = max(total)``, -1 past ``total``) to per-label rewards
            ``(M, B, L)``, for rewards that depend on earlier emission times.
        input_lengths: ``(B,)`` int64 number of frames.
        estimator: ``"global"`` (eq. 21), ``"idb"`` (eq. 23), ``"bb"`` (eq. 28) or ``"mbb"``
            (eq. 29; tensor rewards only).
        num_samples: ``M >= 1``.
        baseline: None, ``"loo"`` (needs ``M >= 2``), a
            :class:`~cbasr.estimators.RunningMeanBaseline`, or a ``(B,)`` tensor of
            per-label reward predictions (a learned baseline); see
            :mod:`cbasr.estimators.baselines`.
        generator: source of randomness for the samples.

    Returns:
        :class:`~cbasr.estimators.Estimate`; ``loss (B,)`` has value ``-value`` and gradient
        minus the estimate.
    """
    L = check_inputs(emit_logits, total, rewards, input_lengths)
    _check_estimator(estimator, rewards)
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1; got {num_samples}")
    emit_logits = masked_logits(emit_logits, input_lengths)
    total = total.to(emit_logits.device).long()
    with one_read():  # the sampler's check joins the estimate's (see _estimate)
        with torch.no_grad():
            args = (emit_logits.detach(), total, input_lengths, (num_samples,), generator)
            if estimator in ("global", "idb"):
                samples = id_checking_sample(*args, max_total=L)
                times = sequence_to_times(samples, L)  # (M, B, L), -1 past each total
            else:
                times = bounded_bernoulli_sample(*args, max_total=L)
                times = pad_times(times, L)  # (M, B, min(L, T)) -> (M, B, L)
        return _estimate(emit_logits, total, rewards, input_lengths, estimator, times, baseline)


def cb_reinforce_from_samples(
    emit_logits: torch.Tensor,
    total: torch.Tensor,
    rewards: Rewards,
    input_lengths: torch.Tensor,
    estimator: str,
    times: torch.Tensor,
    baseline=None,
) -> Estimate:
    """The estimator of :func:`cb_reinforce` at given CB samples (e.g. for exact expectations).

    Args:
        times: ``(M, B, L)`` int64 increasing emission frames, exactly ``total[b]`` of them
            per row (the rest -1), all before ``input_lengths[b]``; ``L`` as for the rewards.
        Others: as :func:`cb_reinforce`.
    """
    L = check_inputs(emit_logits, total, rewards, input_lengths)
    _check_estimator(estimator, rewards)
    emit_logits = masked_logits(emit_logits, input_lengths)
    total = total.to(emit_logits.device).long()
    _check_times(times, total, input_lengths, L)
    return _estimate(emit_logits, total, rewards, input_lengths, estimator, times, baseline)


def _check_estimator(estimator: str, rewards: Rewards) -> None:
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}; got {estimator!r}")
    if estimator == "mbb" and not isinstance(rewards, torch.Tensor):
        raise ValueError(
            "estimator='mbb' (eq. 29) needs memoryless rewards as a tensor (B, T, L); got a "
            "callable: with rewards that depend on earlier emission times it is biased "
            "(CB paper, after eq. 31). Use 'idb' or 'bb'."
        )


def _check_times(times: torch.Tensor, total, input_lengths, L: int) -> None:
    if times.dim() != 3 or times.shape[1:] != (len(total), L) or times.is_floating_point():
        raise ValueError(
            f"times must be int64 (M, B, L) = (*, {len(total)}, {L}); got {tuple(times.shape)}"
        )
    active = label_mask(total.to(times.device), L)
    previous = torch.nn.functional.pad(times[..., :-1], (1, 0), value=-1)
    ok = (times > previous) & (times < input_lengths.to(times.device)[:, None])
    if not bool(torch.where(active, ok, times == -1).all()):
        raise ValueError(
            "times must hold total[b] increasing frames below input_lengths[b], then -1"
        )


def _estimate(emit_logits, total, rewards, input_lengths, estimator, times, baseline) -> Estimate:
    """The surrogate of the chosen estimator at ``times (M, B, L)``, whose ``L`` the checks
    have found at least every total: the CB tables are sized by it (``max_total``), and every
    value check of the distributions joins the one read of the device that PoissonBinomial's
    ``log_prob`` makes (:func:`cbasr.checks.read`)."""
    with one_read():
        return _surrogate(emit_logits, total, rewards, input_lengths, estimator, times, baseline)


def _surrogate(emit_logits, total, rewards, input_lengths, estimator, times, baseline):
    M, B, L = times.shape
    samples = times_to_sequence(times, emit_logits.shape[1], dtype=emit_logits.dtype)  # (M, B, T)
    per_label = label_rewards(rewards, times, total)  # (M, B, L), differentiable
    label_valid = label_mask(total, L).expand(M, B, L)
    fixed = per_label.detach()
    steps, returns, covered, valid = _score_terms(
        estimator, emit_logits, total, input_lengths, samples, times, fixed
    )
    base, control_variate_loss = baseline_values(baseline, returns, covered, fixed, label_valid)
    score = score_surrogate(steps, returns - base, valid)  # (B,), zero in value
    log_prior = PoissonBinomial(emit_logits, input_lengths).log_prob(total)  # (B,), exact
    pathwise = per_label.sum(-1).mean(0)  # (B,)
    value = (log_prior + pathwise).detach()
    loss = -(log_prior + pathwise + score)
    return Estimate(loss, value, samples, times, control_variate_loss)


def _score_terms(estimator, emit_logits, total, input_lengths, samples, times, fixed):
    """What the estimator's score term is made of, for ``S`` steps per sample.

    Returns:
        ``steps (M, B, S)`` the sampled steps' log probabilities (differentiable),
        ``returns (M, B, S)`` what multiplies them, ``covered`` (broadcastable) the number of
        labels each return sums over (for the baselines), ``valid (M, B, S)`` the steps that
        exist.
    """
    M, B, L = times.shape
    T = emit_logits.shape[1]
    if estimator == "global":
        # Global REINFORCE, CB paper eq. (21): the whole return times d log P(b | L).
        cb = ConditionalBernoulli(emit_logits, total, input_lengths, max_total=L)
        steps = cb.log_prob(samples).unsqueeze(-1)  # (M, B, 1)
        valid = torch.ones_like(steps, dtype=torch.bool)
        return steps, fixed.sum(-1, keepdim=True), total[None, :, None], valid
    if estimator == "idb":
        # ID-checking REINFORCE, CB paper eq. (23): reward-to-go times each frame's step (eq. 11).
        steps = id_checking_log_probs(emit_logits, total, samples, input_lengths, max_total=L)
        returns = reward_to_go(frame_rewards(fixed, times, T))
        covered = total[None, :, None] - emitted_before(samples).long()
        valid = (torch.arange(T, device=times.device) < input_lengths[:, None]).expand(M, B, T)
        return steps, returns, covered, valid
    label_valid = label_mask(total, L).expand(M, B, L)
    if estimator == "bb":
        # Bounded Bernoulli REINFORCE, CB paper eq. (28): reward-to-go times each draft (eq. 13).
        steps = bounded_bernoulli_log_probs(
            emit_logits, total, times, input_lengths, max_total=L
        )  # (M, B, L)
        covered = total[None, :, None] - torch.arange(L, device=times.device)
        return steps, reward_to_go(fixed), covered, label_valid
    # Marginal Bounded Bernoulli REINFORCE, CB paper eq. (29): each label's own reward times
    # the log marginal of its emission time (eq. 15).
    log_marginals = bounded_bernoulli_marginals(
        emit_logits, total, input_lengths, log=True, max_total=L
    )
    K = log_marginals.shape[1]  # min(L, T)
    # log_marginals[b, l, times[m, b, l]] by a flat index into (B, K, T): a gather from the
    # marginals expanded over samples would write an (M, B, K, T) gradient in its backward.
    rows = torch.arange(B * K, device=times.device).view(B, K) * T  # (B, K)
    steps = log_marginals.reshape(-1).take(rows + times[..., :K].clamp(min=0))  # (M, B, K)
    covered = torch.ones((), dtype=torch.long, device=times.device)
    return _pad_steps(steps, L), fixed, covered, label_valid


def _pad_steps(steps: torch.Tensor, L: int) -> torch.Tensor:
    """``(M, B, K)`` per-label steps -> ``(M, B, L)``, zero-padded."""
    return torch.nn.functional.pad(steps, (0, L - steps.shape[-1]))
