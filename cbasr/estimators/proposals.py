"""Proposal distributions ``Q(b | L)`` that emit exactly ``L`` highs (CB paper section 3.2).

Each proposal is a sequence of Bernoulli steps ``Q(B_t = 1 | b_<t, L)`` that only looks at
the current (possibly autoregressive) log odds ``log w_t`` and the prefix, and meets
restrictions 1-2 of section 3: a high is forced when the frames left equal the highs left,
and a low when no high is left.

- ``"forced_suffix"``, eq. (48): ``w_t / (1 + w_t)`` unless forced (Luo et al.'s mechanism).
- ``"id_checking"``, eq. (50): the ID-checking step of eq. (11) with the future counted by
  independent log odds ``w'``: log odds ``log w_t + log C(r - 1, (t, T]; w') -
  log C(r, (t, T]; w')`` for ``r`` highs left.
- ``"binomial"``, eq. (51): the future counted by a Binomial with ``p = L / T``: odds
  ``w_t (T - L) r / (L (n - r + 1))`` with ``n`` frames after ``t``.

:class:`ProposalSampler` draws one frame at a time, for emission models whose log odds at
frame ``t`` depend on the sampled prefix; :func:`proposal_sample` runs it over independent
log odds ``(B, T)``. Frames are 0-based; frames ``t >= lengths`` are padding (always low,
log probability 0).
"""

import torch
import torch.nn.functional as F

from cbasr.checks import check_none
from cbasr.distributions import log_count_suffix, logistic_noise

__all__ = ["PROPOSALS", "ProposalSampler", "proposal_sample"]

PROPOSALS = ("forced_suffix", "id_checking", "binomial")

_INF = float("inf")


class ProposalSampler:
    """Step-wise sampler of a proposal ``Q(b | L)`` (eqs. 48, 50, 51) over ``N`` rows.

    Call :meth:`step` once per frame with that frame's log odds (which may depend on the
    highs drawn so far, :attr:`emitted`); after ``T`` steps every row has exactly ``total``
    highs.

    Args:
        proposal: ``"forced_suffix"``, ``"id_checking"`` or ``"binomial"``.
        total: ``(N,)`` int64 highs to place, ``<= lengths``.
        lengths: ``(N,)`` int64 existing frames.
        num_frames: ``T``.
        independent_logits: ``(N, T)`` the ``log w'`` of eq. (50) (``"id_checking"`` only;
            differentiable: the step log probabilities carry their gradient).
        generator: source of randomness.
    """

    def __init__(
        self,
        proposal: str,
        total: torch.Tensor,
        lengths: torch.Tensor,
        num_frames: int,
        independent_logits: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ):
        if proposal not in PROPOSALS:
            raise ValueError(f"proposal must be one of {PROPOSALS}; got {proposal!r}")
        over = total > lengths

        def too_many():
            b = int(over.nonzero()[0, 0])
            raise ValueError(f"total[{b}] = {int(total[b])} > lengths[{b}] = {int(lengths[b])}")

        check_none(over, too_many)  # (at the end of the caller's one_read block, if any)
        self.proposal = proposal
        self.total = total.long()
        self.lengths = lengths.long()
        self.num_frames = num_frames
        self.generator = generator
        self.t = 0
        self.emitted = torch.zeros_like(self.total)  # highs drawn so far, l_{t-1}
        self._suffix = None
        if proposal == "id_checking":
            if independent_logits is None or independent_logits.shape != (len(total), num_frames):
                raise ValueError(
                    "proposal 'id_checking' (eq. 50) needs independent_logits (N, T) = "
                    f"({len(total)}, {num_frames})"
                )
            K = int(total.max()) if total.numel() else 0
            # log C(v, {t..T-1}; w') for v = 0..K: (N, T + 1, K + 1).
            self._suffix = log_count_suffix(independent_logits, self.lengths, max_count=K)

    def log_odds(self, logits_t: torch.Tensor) -> torch.Tensor:
        """``log Q(B_t = 1) - log Q(B_t = 0)`` at the current frame: ``(N,)``; +-inf if forced."""
        remaining = self.total - self.emitted  # r: highs left, including this frame
        left = self.lengths - self.t  # frames left, including this one
        forced_low = remaining <= 0
        forced_high = ~forced_low & (remaining >= left)
        free = ~(forced_low | forced_high)
        r = torch.where(free, remaining, 1)  # safe values where forced (masked below)
        if self.proposal == "forced_suffix":
            # Forced-suffix proposal, CB paper eq. (48).
            odds = logits_t
        elif self.proposal == "binomial":
            # Binomial proposal, CB paper eq. (51): odds w_t (T - L) r / (L (n - r + 1)).
            n = left - 1  # frames after t
            total, free_lows = self.total.clamp(min=1), (self.lengths - self.total).clamp(min=1)
            ratio = torch.log(r * free_lows) - torch.log(total * (n - r + 1).clamp(min=1))
            odds = logits_t + ratio.to(logits_t.dtype)
        else:
            # ID-checking proposal, CB paper eq. (50): future highs counted with w'.
            after = self._suffix[:, min(self.t + 1, self.num_frames)]  # (N, K + 1)
            with_high = after.gather(1, (r - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
            without = after.gather(1, r.clamp(max=after.shape[1] - 1).unsqueeze(1)).squeeze(1)
            odds = logits_t + torch.where(free, with_high - without, 0.0)
        odds = torch.where(free, odds, 0.0)
        return torch.where(forced_high, _INF, torch.where(forced_low, -_INF, odds))

    def step(self, logits_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw frame ``t``: ``logits_t (N,)`` -> ``(b_t (N,) 0./1., log Q(b_t | b_<t, L) (N,))``.

        The log probability is differentiable w.r.t. ``logits_t`` (and ``independent_logits``);
        forced steps and padding have log probability 0 and no gradient.
        """
        if self.t >= self.num_frames:
            raise RuntimeError(f"all {self.num_frames} frames have been drawn")
        log_odds = self.log_odds(logits_t)
        noise = logistic_noise(log_odds.shape, self.generator, log_odds.dtype, log_odds.device)
        high = (log_odds.detach() + noise) > 0  # eq. (35)'s threshold: an exact Bernoulli draw
        forced = torch.isinf(log_odds)
        finite = torch.where(forced, 0.0, log_odds)
        log_prob = torch.where(high, F.logsigmoid(finite), F.logsigmoid(-finite))
        log_prob = torch.where(forced, 0.0, log_prob)
        self.emitted = self.emitted + high.long()
        self.t += 1
        return high.to(logits_t.dtype), log_prob


def proposal_sample(
    proposal: str,
    logits: torch.Tensor,
    total: torch.Tensor | int,
    lengths: torch.Tensor | None = None,
    num_samples: int = 1,
    generator: torch.Generator | None = None,
    independent_logits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``b ~ Q(b | L)`` for independent log odds, with the step log probabilities.

    Args:
        proposal: ``"forced_suffix"`` (eq. 48), ``"id_checking"`` (eq. 50) or ``"binomial"``
            (eq. 51).
        logits: ``(B, T)`` log odds ``log w_t``.
        total: ``(B,)`` (or int) highs ``L <= lengths``.
        lengths: ``(B,)`` existing frames; default ``T``.
        num_samples: ``M``.
        generator: source of randomness.
        independent_logits: ``(B, T)`` ``log w'`` for ``"id_checking"``; default ``logits``,
            which makes ``Q`` the CB ``P(b | L)`` itself (eq. 50 is then eq. 11).

    Returns:
        ``samples (M, B, T)`` 0./1. with exactly ``total`` highs, and
        ``step_log_probs (M, B, T)`` ``log Q(b_t | b_<t, L)``, differentiable w.r.t.
        ``logits`` (and ``independent_logits``). ``T`` serial steps; the forced suffix, whose
        odds do not depend on the prefix, in a few operations over all frames at once
        (:func:`_forced_suffix_rows`: the same samples as the steps on the same noise).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (B, T); got {tuple(logits.shape)}")
    B, T = logits.shape
    device = logits.device
    total = torch.as_tensor(total, device=device).long().expand(B)
    lengths = torch.full((B,), T, device=device) if lengths is None else lengths.to(device)
    if proposal == "id_checking" and independent_logits is None:
        independent_logits = logits
    M = num_samples
    flat = logits.unsqueeze(0).expand(M, B, T).reshape(M * B, T)  # (M, B, T) -> (N, T)
    if independent_logits is not None:
        independent_logits = independent_logits.unsqueeze(0).expand(M, B, T).reshape(M * B, T)
    sampler = ProposalSampler(
        proposal, total.repeat(M), lengths.long().repeat(M), T, independent_logits, generator
    )
    if proposal == "forced_suffix" and T:  # every frame at once: eq. (48)'s odds are w_t's
        # (T, N): the noise the frame-by-frame steps would draw, in their order
        noise = logistic_noise((T, M * B), generator, flat.dtype, device).t()
        samples, step_log_probs = _forced_suffix_rows(flat, sampler.total, sampler.lengths, noise)
        return samples.reshape(M, B, T), step_log_probs.reshape(M, B, T)
    draws = [sampler.step(column) for column in flat.unbind(1)]
    if not draws:
        empty = logits.new_zeros(M, B, 0)
        return empty, empty
    samples = torch.stack([b for b, _ in draws], -1).reshape(M, B, T)  # (N, T) -> (M, B, T)
    step_log_probs = torch.stack([lp for _, lp in draws], -1).reshape(M, B, T)
    return samples, step_log_probs


def _forced_suffix_rows(
    logits: torch.Tensor, total: torch.Tensor, lengths: torch.Tensor, noise: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forced-suffix proposal (eq. 48) over independent log odds ``logits (N, T)``, every
    frame at once: :class:`ProposalSampler`'s ``T`` steps, given the logistic noise ``(N, T)``
    each step would draw (the same samples and step log probabilities).

    Until the first forced frame ``tau`` each frame is its free draw ``w_t + D_t > 0`` (eq. 35),
    so the highs drawn before ``t`` are a running sum of the free draws, and ``tau`` is the first
    frame where that count forces a step. From ``tau`` on the path is forced throughout: low to
    the end once ``L`` highs are out, or, once the frames left equal the highs left, high to the
    last frame and low in the padding after it.
    """
    N, T = logits.shape
    free_draw = (logits.detach() + noise) > 0  # (N, T)
    drawn = free_draw.long()
    before = drawn.cumsum(1) - drawn  # highs before t, while no frame has been forced
    remaining = total[:, None] - before  # r, this frame's included
    frames = torch.arange(T, device=logits.device)
    left = lengths[:, None] - frames  # frames left, this one's included
    low = remaining <= 0
    high = ~low & (remaining >= left)
    forced = (low | high).long().cumsum(1) > 0  # tau onwards
    # forced high at tau (then low past the length): a count that forces a low at tau keeps
    # forcing lows, as the free draws' running sum never falls, so no later frame is high
    high_run = (high & forced).any(1, keepdim=True)
    samples = torch.where(forced, high_run & (frames < lengths[:, None]), free_draw)
    # a free step's log probability (an infinite log odds decides its step: 0, as if forced)
    infinite = torch.isinf(logits)
    finite = torch.where(infinite, 0.0, logits)
    log_prob = torch.where(free_draw, F.logsigmoid(finite), F.logsigmoid(-finite))
    return samples.to(logits.dtype), torch.where(forced | infinite, 0.0, log_prob)
