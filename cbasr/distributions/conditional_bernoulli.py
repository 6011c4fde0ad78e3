"""The Conditional Bernoulli distribution, CB paper eq. (4).

``P(b | sum_t b_t = k; w) = prod_t w_t^b_t / C(k, I; w)``: independent Bernoulli trials with
odds ``w_t = exp(logit_t)``, conditioned on exactly ``k`` highs. With padding, only frames
``t < lengths`` exist, and they hold all ``k`` highs.
"""

import torch
from torch.distributions import Distribution, constraints
from torch.distributions.utils import lazy_property

from cbasr.checks import check_at_least, check_none, check_range, check_that, one_read
from cbasr.distributions._arguments import (
    broadcast_arguments,
    check_total,
    constraint_error,
    flat_values,
    frame_mask,
)
from cbasr.distributions._dispatch import (
    conditional_normaliser,
    conditional_tables,
    fused_log_prob,
    log_prob_of_rows,
)
from cbasr.distributions._tables import ConditionalTables, inclusion_probabilities
from cbasr.distributions.samplers import (
    bounded_bernoulli_sample,
    draft_sample,
    id_checking_sample,
    times_to_sequence,
)

__all__ = ["ConditionalBernoulli", "SAMPLERS"]

SAMPLERS = ("id_checking", "bounded", "draft")
_NEG_INF = float("-inf")


def _inside(lengths: torch.Tensor, num_frames: int) -> torch.Tensor:
    """``(*,)`` lengths -> ``(*, T)`` bool frame mask."""
    mask = frame_mask(lengths.reshape(-1), num_frames)  # (B, T)
    return mask.reshape(lengths.shape + (num_frames,))  # (B, T) -> (*, T)


def _raiser(message: str):
    """A function that raises ``ValueError(message)``."""

    def fail():
        raise ValueError(message)

    return fail


class _ExactlyTotalHighs(constraints.Constraint):
    """Binary sequences ``(*, T)`` with exactly ``total`` highs, none at ``t >= lengths``."""

    is_discrete = True
    event_dim = 1

    def __init__(self, total: torch.Tensor, lengths: torch.Tensor):
        self.total = total
        self.lengths = lengths
        super().__init__()

    def check(self, value: torch.Tensor) -> torch.Tensor:
        binary = ((value == 0) | (value == 1)).all(-1)
        inside = _inside(self.lengths, value.shape[-1])
        in_padding = ((value != 0) & ~inside).any(-1)
        return binary & ~in_padding & ((value != 0).sum(-1) == self.total)

    def __repr__(self) -> str:
        return "ExactlyTotalHighs(binary, sum == total, no high at t >= lengths)"


class ConditionalBernoulli(Distribution):
    """Conditional Bernoulli over binary sequences ``(*, T)`` with exactly ``total`` highs (eq. 4).

    All quantities come from tilted prefix/suffix count tables (see
    :mod:`cbasr.distributions._tables`): O(B * T * k) work and memory, T serial steps, stable
    in float32 for long sequences and extreme logits, and twice differentiable. ``log_prob``
    needs ``P(K = k)`` alone (on CPU a compiled kernel computes it and its gradient without
    keeping a table); ``mean`` (eqs. 15-16) and ``entropy`` need both tables, computed
    together in one pass. ``+-inf`` logits are allowed (a frame that always / never fires).

    Args:
        logits: ``(*, T)`` log odds ``log w_t`` of the unconditioned Bernoulli trials.
        total: ``(*,)`` (or int) number of highs ``k``.
        lengths: ``(*,)`` number of existing frames; default ``T``. Frames ``t >= lengths``
            are padding: never high, and they change no result.
        sampler: ``"id_checking"`` (eq. 11, serial depth T, the fastest on CPU; default),
            ``"bounded"`` (Bounded Bernoulli steps, eq. 13, serial depth k after the T-step
            table) or ``"draft"`` (eqs. 9-10, in draw order). All draw from this distribution.
        validate_args: check arguments and values (ValueError for ``total < 0``,
            ``total > lengths``, or a value that is not in the support). Without it, such a
            value has log probability ``-inf``.
        max_total: a bound on every total that the caller knows (its rewards' label columns,
            say): the tables are sized by it, and the largest total is not read from the
            device; a total above it is an error, checked at each use.
    """

    arg_constraints = {
        "logits": constraints.independent(constraints.real, 1),
        "total": constraints.nonnegative_integer,
        "lengths": constraints.nonnegative_integer,
    }
    has_rsample = False

    def __init__(
        self, logits, total, lengths=None, sampler="id_checking", validate_args=None, max_total=None
    ):
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        args = broadcast_arguments(logits, total, lengths)
        T = logits.shape[-1]
        self.logits = args.logits.reshape(args.batch_shape + (T,))  # (B, T) -> (*, T)
        self.total = args.total.reshape(args.batch_shape)
        self.lengths = args.lengths.reshape(args.batch_shape)
        self.sampler = sampler
        self.max_total = max_total
        super().__init__(args.batch_shape, torch.Size((T,)), validate_args=False)
        if validate_args is None:  # torch's default, read at each use as torch reads it
            del self._validate_args
        else:
            self._validate_args = validate_args
        if self._validate_args:
            with one_read():  # arg_constraints (as torch words them) and ours, in one read
                self._check_arguments(total, args, T)

    def _check_arguments(self, total, args, num_frames: int) -> None:
        """``arg_constraints`` (logits not NaN; ``total`` integers, which a float ``total``
        must be before it is made int64, and ``lengths``), ``lengths <= T`` and ``0 <= total <=
        lengths``: five reductions on the device for the enclosing
        :func:`~cbasr.checks.one_read`."""
        check_none(args.logits.isnan(), constraint_error(self, "logits", self.logits))
        total = torch.as_tensor(total)
        if total.is_floating_point():
            check_that(total == total.round(), constraint_error(self, "total", total))
        check_at_least(args.lengths, 0, constraint_error(self, "lengths", self.lengths))
        check_range("lengths", args.lengths, 0, num_frames)
        check_total(args.total, args.lengths)

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return _ExactlyTotalHighs(self.total, self.lengths)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(ConditionalBernoulli, _instance)
        batch_shape = torch.Size(batch_shape)
        new.logits = self.logits.expand(batch_shape + self.event_shape)
        new.total = self.total.expand(batch_shape)
        new.lengths = self.lengths.expand(batch_shape)
        new.sampler = self.sampler
        new.max_total = self.max_total
        super(ConditionalBernoulli, new).__init__(
            batch_shape, self.event_shape, validate_args=False
        )
        new._validate_args = self._validate_args
        return new

    # ---- tables ------------------------------------------------------------------------

    def _arguments(self):
        return broadcast_arguments(self.logits, self.total, self.lengths, self.max_total)

    @lazy_property
    def _normaliser_tables(self) -> ConditionalTables:
        return conditional_normaliser(self._arguments())

    @lazy_property
    def _tables(self) -> ConditionalTables:
        return conditional_tables(self._arguments())

    # ---- distribution interface ------------------------------------------------------------

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """``log P(b | k)`` of eq. (4) for ``value (*sample, *, T)`` -> ``(*sample, *)``.

        Computed as ``sum_t log P(b_t) - log P(K = k)`` under the tilted Bernoulli trials
        (eq. 6 rearranged), which is eq. (4) with the shift cancelled.
        """
        if self._validate_args:
            self._check_shape(value)
        rows, shape = flat_values(value, self.batch_shape)  # (N, T)
        fused = fused_log_prob(self._arguments(), rows)
        if fused is None:
            if self._validate_args:
                self._check_value(value)
            return log_prob_of_rows(self._normaliser_tables, rows).reshape(shape)
        log_prob, codes = fused  # the kernel says which rows are outside the support
        if self._validate_args:
            check_at_least(-codes, 0, lambda: self._check_value(value))
        return log_prob.reshape(shape)

    def _check_shape(self, value: torch.Tensor) -> None:
        """Raise a ValueError unless ``value`` has this distribution's event shape and
        broadcasts with its batch shape."""
        if value.shape[-1:] != self.event_shape:
            raise ValueError(
                f"value must have shape (*, {self.event_shape[0]}), got {tuple(value.shape)}"
            )
        try:
            torch.broadcast_shapes(value.shape, self.batch_shape + self.event_shape)
        except RuntimeError:
            raise ValueError(
                f"value of shape {tuple(value.shape)} does not broadcast with the batch and "
                f"event shape {tuple(self.batch_shape + self.event_shape)}"
            ) from None

    def _check_value(self, value: torch.Tensor) -> None:
        """Raise a ValueError that says what is wrong with ``value``."""
        self._check_shape(value)
        count = (value != 0).sum(-1)
        wrong = count != self.total

        def wrong_count():
            index = tuple(int(i) for i in wrong.nonzero()[0])
            total = self.total.expand(wrong.shape)[index]
            raise ValueError(
                f"value has {int(count[index])} highs but total is {int(total)} (at index {index})"
            )

        with one_read():  # the support (_ExactlyTotalHighs), each way out of it with its error
            check_that((value == 0) | (value == 1), _raiser("value must be binary (0 or 1)"))
            inside = _inside(self.lengths, value.shape[-1])
            check_that(
                (value == 0) | inside,
                _raiser("value has a high at a padding frame (t >= lengths)"),
            )
            check_that(~wrong, wrong_count)

    @property
    def mean(self) -> torch.Tensor:
        """Inclusion probabilities ``P(B_t = 1 | k)``, eq. (16): ``(*, T)``."""
        return self._inclusion().reshape(self.batch_shape + self.event_shape)

    def _inclusion(self) -> torch.Tensor:
        """``(B, T)`` ``P(B_t = 1 | k)`` from the (twice differentiable) tables."""
        t = self._tables
        return inclusion_probabilities(t.log_on, t.prefix, t.suffix, t.total, t.log_normaliser())

    @property
    def variance(self) -> torch.Tensor:
        """Per-frame variance ``P(B_t = 1 | k) (1 - P(B_t = 1 | k))``: ``(*, T)``."""
        mean = self.mean
        return mean * (1 - mean)

    def entropy(self) -> torch.Tensor:
        """``-E[log P(b | k)]`` = ``log P(K = k) - sum_t E[log P(b_t)]``: ``(*,)``.

        Exact, from the inclusion probabilities (eq. 16); ``-inf`` for an impossible total.
        """
        tables = self._tables
        mean = self._inclusion()
        # 0 * log 0 = 0: a frame that never (always) fires contributes nothing.
        on = torch.where(tables.log_on == _NEG_INF, 0.0, tables.log_on)
        off = torch.where(tables.log_off == _NEG_INF, 0.0, tables.log_off)
        expected = (mean * on + (1 - mean) * off).sum(-1)
        return (tables.log_normaliser() - expected).reshape(self.batch_shape)

    def sample(
        self, sample_shape=torch.Size(), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Exact CB samples ``(*sample_shape, *, T)`` of 0./1. with exactly ``total`` highs.

        Uses the sampler chosen at construction; ``generator`` seeds it.
        """
        sample_shape = torch.Size(sample_shape)
        T = self.event_shape[0]
        args = (self.logits, self.total, self.lengths, sample_shape, generator)
        if self.sampler == "id_checking":
            return id_checking_sample(*args, max_total=self.max_total)
        if self.sampler == "bounded":
            times = bounded_bernoulli_sample(*args, max_total=self.max_total)
        else:
            times = draft_sample(*args)
        return times_to_sequence(times, T, dtype=self.logits.dtype)
