"""The Poisson-Binomial distribution, CB paper eq. (5).

``K = sum_t B_t`` for independent ``B_t ~ Bernoulli(sigmoid(logit_t))``: the prior ``P(L)``
of the number of highs in eq. (18), and the normaliser that turns eq. (6) into eq. (4).
"""

import torch
import torch.nn.functional as F
from torch.distributions import Distribution, constraints

from cbasr import _backends
from cbasr.checks import check_range, check_that, one_read, read
from cbasr.distributions._arguments import (
    broadcast_arguments,
    check_arguments,
    frame_mask,
    value_rows,
)
from cbasr.distributions._dispatch import count_table, log_normaliser, tilt_for_total
from cbasr.distributions._tables import bernoulli_log_weights, gather_states

__all__ = ["PoissonBinomial"]


class PoissonBinomial(Distribution):
    """Number of highs ``K`` among independent Bernoulli trials (eq. 5).

    ``log_prob`` runs the count recursion on the trials' log probabilities (values in
    ``(-inf, 0]``, so float32 stays accurate): O(B * T * k_max) work for the largest queried
    ``k``, T serial steps.

    Args:
        logits: ``(*, T)`` log odds of the trials; ``+-inf`` allowed.
        lengths: ``(*,)`` number of existing trials; trials ``t >= lengths`` are ignored.
        validate_args: check arguments and that values are integers in ``{0, ..., T}``
            (counts above ``lengths`` have log probability ``-inf``).
    """

    arg_constraints = {
        "logits": constraints.independent(constraints.real, 1),
        "lengths": constraints.nonnegative_integer,
    }
    has_enumerate_support = True

    def __init__(self, logits, lengths=None, validate_args=None):
        args = broadcast_arguments(logits, None, lengths)
        T = logits.shape[-1]
        self.logits = args.logits.reshape(args.batch_shape + (T,))  # (B, T) -> (*, T)
        self.lengths = args.lengths.reshape(args.batch_shape)
        super().__init__(args.batch_shape, validate_args=False)
        if validate_args is None:  # torch's default, read at each use as torch reads it
            del self._validate_args
        else:
            self._validate_args = validate_args
        if self._validate_args:
            with one_read():  # torch's checks of arg_constraints and ours, in one read
                check_arguments(self)
                check_range("lengths", args.lengths, 0, T)

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        # {0..T} for every row, as enumerate_support needs one set for the whole batch;
        # counts above a row's lengths are in it with probability 0.
        return constraints.integer_interval(0, self.logits.shape[-1])

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(PoissonBinomial, _instance)
        batch_shape = torch.Size(batch_shape)
        new.logits = self.logits.expand(batch_shape + self.logits.shape[-1:])
        new.lengths = self.lengths.expand(batch_shape)
        super(PoissonBinomial, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _probs(self) -> torch.Tensor:
        """``(*, T)`` trial probabilities, 0 on padding."""
        T = self.logits.shape[-1]
        valid = frame_mask(self.lengths.reshape(-1), T).reshape(self.logits.shape)
        return torch.where(valid, torch.sigmoid(self.logits), 0.0)

    @property
    def mean(self) -> torch.Tensor:
        """``sum_t p_t``: ``(*,)``."""
        return self._probs().sum(-1)

    @property
    def variance(self) -> torch.Tensor:
        """``sum_t p_t (1 - p_t)``: ``(*,)``."""
        probs = self._probs()
        return (probs * (1 - probs)).sum(-1)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """``log P(K = value)`` (eq. 5) for ``value (*sample, *)``; ``-inf`` outside the support.

        Reads the device once (:func:`cbasr.checks.read`): the states its counts need, for a
        kernel whether every logit is finite, and, validating, whether the values are in the
        support (with the checks of an enclosing :func:`cbasr.checks.one_read` block).
        """
        with one_read():
            if self._validate_args:
                self._validate_sample(value)
            return self._log_prob(value)

    def _log_prob(self, value: torch.Tensor) -> torch.Tensor:
        args = broadcast_arguments(self.logits, None, self.lengths)
        T = args.logits.shape[-1]
        value = torch.as_tensor(value, device=self.logits.device)
        rows, row_index, shape = value_rows(value.unsqueeze(-1), self.batch_shape)  # (N, 1)
        rows = rows.double()
        count = torch.where(rows == rows.floor(), rows, -1).long()  # non-integers are impossible
        valid = frame_mask(args.lengths, T)
        kernel = _backends.backend(args.logits) != "torch" and len(rows) == len(args.logits)
        # one read: the states the counts need and, for the kernel, whether every logit is
        # finite (an infinite one is left to the table, which handles it)
        stats = [count.max().clamp(0, T) if count.numel() else count.new_zeros(())]
        if kernel:
            stats.append(torch.where(valid, args.logits, 0.0).isfinite().all())
        highest, *finite = read(*stats)
        num_states = int(highest) + 1
        if kernel and finite[0]:
            one_per_row = _tilted_log_prob(
                args.logits, valid, count[:, 0], args.lengths, num_states
            )
            if one_per_row is not None:
                return one_per_row.reshape(shape)
        log_off, log_on = bernoulli_log_weights(args.logits, valid)
        final = count_table(log_off, log_on, num_states)[T]  # (B, V): log P(K = v)
        return gather_states(final[row_index], count).reshape(shape)

    def _validate_sample(self, value: torch.Tensor) -> None:
        """torch's checks of a value, in its words; the support's with
        :func:`cbasr.checks.check_that`, so that in a block it joins the block's read."""
        if not isinstance(value, torch.Tensor):
            raise ValueError("The value argument to log_prob must be a Tensor")
        try:
            torch.broadcast_shapes(value.shape, self.batch_shape)
        except RuntimeError:
            raise ValueError(
                "Value is not broadcastable with batch_shape+event_shape: "
                f"{value.size()} vs {self.batch_shape}."
            ) from None
        support = self.support

        def outside():
            raise ValueError(
                f"Expected value argument ({type(value).__name__} of shape "
                f"{tuple(value.shape)}) to be within the support ({support!r}) of the "
                f"distribution {self!r}, but found invalid values:\n{value}"
            )

        check_that(support.check(value), outside)

    def sample(
        self, sample_shape=torch.Size(), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Counts of independent Bernoulli draws: ``(*sample_shape, *)`` float."""
        shape = torch.Size(sample_shape) + self.logits.shape
        with torch.no_grad():
            draws = torch.bernoulli(self._probs().expand(shape), generator=generator)
        return draws.sum(-1)

    def enumerate_support(self, expand: bool = True) -> torch.Tensor:
        """``0..T`` shaped ``(T + 1, *)`` (or ``(T + 1, 1, ...)``); values above ``lengths``
        have probability 0."""
        T = self.logits.shape[-1]
        values = torch.arange(T + 1, dtype=self.logits.dtype, device=self.logits.device)
        values = values.view((-1,) + (1,) * len(self.batch_shape))  # (T + 1,) -> (T + 1, 1, ...)
        if expand:
            values = values.expand((-1,) + self.batch_shape)
        return values


def _tilted_log_prob(logits, valid, count, lengths, num_states) -> torch.Tensor | None:
    """``log P(K = count)``, one count per parameter row, by a kernel
    (:func:`cbasr.distributions._dispatch.log_normaliser`: numba on CPU, triton on CUDA) on the
    tilted trials (:func:`cbasr.distributions._tables.tilt_for_total`) of finite ``logits``,
    counting up to ``num_states - 1`` (at least the largest possible count); None where the
    backend has no kernel for the dtype (left to the table).

    With ``w_t = exp(x_t)`` and the tilt ``lambda``, ``P(K = k) = C(k; w) / prod_t (1 + w_t)``
    and ``C(k; w) = exp(k lambda) P_lambda(K = k) prod_t (1 + w_t exp(-lambda))`` (eq. 8
    under a constant shift of the logits), so
    ``log P(K = k) = k lambda + log P_lambda(K = k) + sum_t [softplus(x_t - lambda) -
    softplus(x_t)]``, the sum taken in float64.
    """
    possible = (count >= 0) & (count <= lengths)
    total = torch.where(possible, count, 0)
    tilt = tilt_for_total(logits, total, valid)
    log_off, log_on = bernoulli_log_weights(logits, valid, tilt)
    tilted = log_normaliser(log_off, log_on, total, lengths, num_states)
    if tilted is None:  # no kernel for this backend and dtype
        return None
    x, lam = torch.where(valid, logits, 0.0).double(), tilt.double().unsqueeze(-1)
    shift = torch.where(valid, F.softplus(x - lam) - F.softplus(x), 0.0).sum(-1)
    log_prob = total * lam.squeeze(-1) + tilted.double() + shift
    return torch.where(possible, log_prob, float("-inf")).to(logits.dtype)
