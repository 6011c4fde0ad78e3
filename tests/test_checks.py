"""The argument checks: one read of the device per ``one_read`` block, with each check's own
error, and the losses' value checks made that way."""

import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cbasr import checks
from cbasr.checks import check_label_ids, check_lengths, check_range, check_that, one_read
from cbasr.distributions import ConditionalBernoulli, PoissonBinomial
from cbasr.losses import (
    cb_marginal_nll,
    cb_marginal_nll_windowed,
    ctc_nll,
    hat_nll,
    hat_nll_from_logits,
    prune_ranges,
    pruned_transducer_nll,
    rnnt_lattice_nll,
    rnnt_nll,
    simple_transducer_nll,
    transducer_lattice_nll,
    trivial_joint_log_probs,
)
from tests.backends import on_triton_keep
from tests.device_reads import DeviceReads

LENGTHS = torch.tensor([3, 0, 5])
TARGETS = torch.tensor([[1, 2, 9], [7, 0, 0], [1, 1, 1]])  # row 1 is all padding
TARGET_LENGTHS = torch.tensor([2, 0, 3])


def _error(fn) -> str:
    with pytest.raises(ValueError) as info:
        fn()
    return str(info.value)


@pytest.mark.parametrize(
    "check",
    [
        lambda: check_lengths("lens", LENGTHS, 3, 4),  # 5 > 4
        lambda: check_lengths("lens", LENGTHS, 3, 5, min_len=1),  # 0 < 1
        lambda: check_range("values", TARGETS, 0, 8),  # the 9, as a flattened index
        lambda: check_label_ids("targets", TARGETS, TARGET_LENGTHS, 2),  # the 2
        lambda: check_label_ids("targets", TARGETS, TARGET_LENGTHS, 3, blank=1),  # the 1s
        lambda: check_label_ids("targets", -TARGETS, TARGET_LENGTHS, 10),  # negative ids
    ],
)
def test_a_deferred_check_raises_its_own_error_at_the_end_of_the_block(check, reads):
    alone = _error(check)
    with pytest.raises(ValueError) as info:
        with one_read():
            check()  # queued: nothing raised yet
            reached = True
    assert reached and str(info.value) == alone and reads[0] == 1


def test_passing_checks_raise_nothing_and_read_once(reads):
    with one_read():
        check_lengths("lens", LENGTHS, 3, 5)
        check_range("values", TARGETS, 0, 9)
        check_label_ids("targets", TARGETS, TARGET_LENGTHS, 10, blank=0)  # padding 0s skipped
        check_label_ids("targets", TARGETS, TARGET_LENGTHS, 3)  # the 9 is padding
        check_that(LENGTHS >= 0, lambda: pytest.fail("check_that failed"))
        check_range("empty", torch.zeros(0, dtype=torch.long), 0, 0)  # nothing to read
    assert reads[0] == 1


def test_the_first_failing_check_in_order_raises(reads):
    def fail():
        raise ValueError("check_that's own error")

    with pytest.raises(ValueError, match=r"lens\[2\] = 5 is outside \[0, 4\]"):
        with one_read():
            check_label_ids("targets", TARGETS, TARGET_LENGTHS, 10)  # passes
            check_lengths("lens", LENGTHS, 3, 4)  # fails first
            check_that(LENGTHS > 10, fail)  # fails too
    with pytest.raises(ValueError, match="check_that's own error"):
        with one_read():
            check_that(LENGTHS > 10, fail)
            check_lengths("lens", LENGTHS, 3, 4)
    assert reads[0] == 2


def test_an_inner_block_leaves_the_reading_to_the_outer_one(reads):
    with pytest.raises(ValueError, match=r"lens\[2\]"):
        with one_read():
            with one_read():
                check_lengths("lens", LENGTHS, 3, 4)
            assert reads[0] == 0  # the inner block's end read nothing
    assert reads[0] == 1


def test_read_carries_the_checks_queued_before_it(reads):
    """``read`` copies its values with the block's queued checks, runs them (a failing one
    raises its own error, not the value), and the block's end reads only what came after."""
    with one_read():
        check_lengths("lens", LENGTHS, 3, 5)  # passes
        assert checks.read(LENGTHS.max(), LENGTHS.sum()) == [5, 8]
        assert reads[0] == 1
    assert reads[0] == 1  # nothing queued after the read: the end copies nothing
    with pytest.raises(ValueError, match=r"lens\[2\] = 5 is outside \[0, 4\]"):
        with one_read():
            check_lengths("lens", LENGTHS, 3, 4)
            checks.read(LENGTHS.max())
            pytest.fail("read returned past a failing check")
    assert reads[0] == 2
    with pytest.raises(ValueError, match=r"lens\[0\] = 3 is outside \[0, 2\]"):
        with one_read():
            assert checks.read(LENGTHS.min()) == [0]
            check_lengths("lens", LENGTHS, 3, 2)  # queued after the read: the end reads it
    assert reads[0] == 4


def test_a_failing_check_s_error_is_raised_at_once_inside_read():
    """A failing check's own error may run further checks (as ``check_total`` does): inside
    ``read`` they raise at once instead of joining the block's queue."""
    with pytest.raises(ValueError, match=r"x\[0\] = 5 is outside \[0, 3\]"):
        with one_read():
            check_that(LENGTHS > 10, lambda: check_range("x", torch.tensor([5]), 0, 3))
            checks.read(LENGTHS.max())


def test_read_keeps_integers_exact_beside_floats(reads):
    big = torch.tensor(2**30 + 1)  # rounded to 2**30 in a float32 stack
    assert checks.read(big, torch.tensor(0.5)) == [2**30 + 1, 0.5]
    assert checks.read(big, torch.tensor(True)) == [2**30 + 1, 1]
    assert checks.read() == [] and reads[0] == 2


def test_an_error_inside_the_block_drops_its_queue(reads):
    with pytest.raises(RuntimeError, match="elsewhere"):
        with one_read():
            check_lengths("lens", LENGTHS, 3, 4)  # would fail
            raise RuntimeError("elsewhere")
    with one_read():  # a fresh block: the failed check above is gone
        check_lengths("lens", LENGTHS, 3, 5)
    assert reads[0] == 1
    check_lengths("lens", LENGTHS, 3, 5)  # and outside a block checks run at once
    with pytest.raises(ValueError):
        check_lengths("lens", LENGTHS, 3, 4)


class _ImmediateChecks(TorchDispatchMode):
    """Counts the value reads that argument checks make on their own (outside a block)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.nonzero, torch.ops.aten._local_scalar_dense):
            if any(f.filename.endswith("cbasr/checks.py") for f in traceback.extract_stack()):
                self.count += 1
        return func(*args, **(kwargs or {}))


def _transducer_inputs(B=2, T=5, U=3, V=6, S=3):
    g = torch.Generator().manual_seed(0)
    targets = torch.randint(1, V, (B, U), generator=g)
    lens, tlens = torch.tensor([T, T - 1]), torch.tensor([U, U - 1])
    am, lm = torch.randn(B, T, V, generator=g), torch.randn(B, U + 1, V, generator=g)
    starts = torch.zeros(B, T, dtype=torch.long)
    return {
        "trivial_joint": lambda: trivial_joint_log_probs(am, lm, targets, tlens),
        "simple": lambda: simple_transducer_nll(am, lm, targets, lens, tlens, S, hat=True),
        "pruned": lambda: pruned_transducer_nll(
            torch.randn(B, T, S, V, generator=g), starts, targets, lens, tlens, hat=True
        ),
        "prune_ranges": lambda: prune_ranges(torch.rand(B, T, U + 1), lens, tlens, S),
        "lattice": lambda: transducer_lattice_nll(
            torch.randn(B, T, U + 1).log_softmax(-1), torch.randn(B, T, U), lens, tlens
        ),
        "rnnt_lattice": lambda: rnnt_lattice_nll(
            torch.randn(B, T, U + 1, V, generator=g), targets, lens, tlens
        ),
        "hat": lambda: hat_nll(
            torch.randn(B, T, U + 1),
            torch.randn(B, T, U + 1, V).log_softmax(-1),
            targets,
            lens,
            tlens,
        ),
        "hat_from_logits": lambda: hat_nll_from_logits(
            None, torch.randn(B, T, U + 1, V, generator=g), targets - 1, lens, tlens
        ),
        "ctc": lambda: ctc_nll(torch.randn(B, T, V).log_softmax(-1), targets, lens, tlens),
        "cb": lambda: cb_marginal_nll(torch.randn(B, T), torch.randn(B, T, U), lens, tlens),
        "cb_windowed": lambda: cb_marginal_nll_windowed(
            torch.randn(B, T), torch.randn(B, T, 2, U), lens, tlens
        ),
    }


@pytest.mark.parametrize("loss", sorted(_transducer_inputs()))
def test_a_loss_reads_its_checked_values_once(loss, reads):
    """On a GPU every read waits for the device: a loss's value checks (lengths, label ids,
    whether the labels fit) share one read, and none reads on its own."""
    call = _transducer_inputs()[loss]
    with _ImmediateChecks() as immediate:
        call()
    assert (reads[0], immediate.count) == (1, 0)


def test_a_distribution_validates_with_one_read_per_call(reads):
    """``ConditionalBernoulli`` and ``PoissonBinomial`` check torch's argument constraints and
    theirs in one read at construction, and a value's support in one read in ``log_prob``."""
    logits, total = torch.randn(2, 5), torch.tensor([2, 1])
    with _ImmediateChecks() as immediate:
        cb = ConditionalBernoulli(logits, total, torch.tensor([5, 3]), validate_args=True)
        assert reads[0] == 1
        cb.log_prob(torch.tensor([[1.0, 1, 0, 0, 0], [0, 0, 1, 0, 0]]))
        assert reads[0] == 2
        PoissonBinomial(logits, torch.tensor([5, 3]), validate_args=True)
        assert reads[0] == 3
    assert immediate.count == 0


@pytest.mark.parametrize("distribution", [ConditionalBernoulli, PoissonBinomial])
def test_torchs_argument_constraints_are_still_checked(distribution):
    logits = torch.randn(2, 5)
    logits[1, 2] = float("nan")  # constraints.real: not NaN
    rest = (torch.tensor([2, 1]),) if distribution is ConditionalBernoulli else ()
    with pytest.raises(ValueError, match=r"Expected parameter logits .* to satisfy the constraint"):
        distribution(logits, *rest, validate_args=True)
    distribution(logits, *rest, validate_args=False)  # not checked
    lengths = torch.tensor([5, -1])  # nonnegative_integer, before the range check's message
    with pytest.raises(ValueError, match=r"Expected parameter lengths"):
        distribution(torch.randn(2, 5), *rest, lengths, validate_args=True)


def test_float_values_and_an_empty_vocabulary_are_checked_at_once(reads):
    """Floats (NaN among them) are not queued, so no integer check shares a stack with them
    (which would round it); nor are label ids against no class at all."""
    with pytest.raises(ValueError, match=r"lens\[0\] = 2049 is outside \[0, 2048\]"):
        with one_read():
            check_range("x", torch.tensor([0.5, float("nan")], dtype=torch.float16), 0, 2048)
            check_lengths("lens", torch.tensor([2049]), 1, 2048)
    with pytest.raises(ValueError, match=r"x \(flattened index 1\) = 3 is outside"):
        with one_read():
            check_range("x", torch.tensor([[1.0, 3.0]]), 0, 2)
            raise AssertionError("not reached: the float check raises at once")
    with one_read():  # all padding, no class: nothing to check, as outside a block
        check_label_ids("targets", torch.zeros(2, 3, dtype=torch.long), torch.zeros(2), 0)
    assert reads[0] == 1


def test_validate_args_none_follows_torchs_default_at_each_use():
    cb = ConditionalBernoulli(torch.randn(1, 4), torch.tensor([2]))  # validate_args=None
    bad = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # 3 highs, total 2
    with pytest.raises(ValueError, match="3 highs but total is 2"):
        cb.log_prob(bad)
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        assert cb.log_prob(bad).item() == float("-inf")  # unchecked, as torch's own
    finally:
        torch.distributions.Distribution.set_default_validate_args(True)


def test_narrow_length_dtypes_do_not_overflow():
    # uint8 lengths: 150 labels fit in 100 frames of windows of 5 (up to 4 a frame: 400 > 255)
    occupancy = torch.rand(1, 100, 151)
    lens, tlens = torch.tensor([100], dtype=torch.uint8), torch.tensor([150], dtype=torch.uint8)
    assert prune_ranges(occupancy, lens, tlens, 5).shape == (1, 100)


def test_rnnt_nll_takes_an_empty_batch():
    logits = torch.randn(0, 3, 2, 4, requires_grad=True)
    empty = torch.zeros(0, dtype=torch.long)
    nll = rnnt_nll(logits, torch.zeros(0, 1, dtype=torch.long), empty + 1, empty)
    assert nll.shape == (0,)
    nll.sum().backward()


def test_the_pruned_loss_reads_no_values_the_simple_loss_checked(reads):
    """A model's pruned loss (``values_checked=True``, after the simple loss on the same labels)
    reads nothing; its shapes are still checked, and alone it checks its values."""
    B, T, U, V, S = 2, 5, 3, 6, 3
    targets = torch.tensor([[1, 2, 3], [4, 5, 0]])
    lens, tlens = torch.tensor([T, T - 1]), torch.tensor([U, U - 1])
    units, starts = torch.randn(B, T, S, V), torch.zeros(B, T, dtype=torch.long)
    checked = pruned_transducer_nll(units, starts, targets, lens, tlens, values_checked=True)
    assert reads[0] == 0
    assert torch.equal(checked, pruned_transducer_nll(units, starts, targets, lens, tlens))
    assert reads[0] == 1
    with pytest.raises(ValueError, match="starts must have shape"):
        pruned_transducer_nll(units, starts[:1], targets, lens, tlens, values_checked=True)
    with pytest.raises(ValueError, match=r"targets\[0, 2\] = 6"):
        pruned_transducer_nll(units, starts, targets * 2, lens, tlens)


def test_the_simple_loss_with_values_checked_reads_nothing_and_alone_names_each_value(reads):
    """``simple_transducer_nll(values_checked=True)`` (dual mode's second pass) reads nothing
    and gives the checked call's loss and windows; alone it names a length of 0 or past the
    frames, a label id outside the vocabulary and labels without windows."""
    B, T, U, V, S = 2, 5, 3, 6, 3
    g = torch.Generator().manual_seed(0)
    targets = torch.randint(1, V, (B, U), generator=g)
    lens, tlens = torch.tensor([T, T - 1]), torch.tensor([U, U - 1])
    am, lm = torch.randn(B, T, V, generator=g), torch.randn(B, U + 1, V, generator=g)
    checked = simple_transducer_nll(am, lm, targets, lens, tlens, S, values_checked=True)
    assert reads[0] == 0
    for a, b in zip(checked, simple_transducer_nll(am, lm, targets, lens, tlens, S)):
        assert torch.equal(a, b)
    assert reads[0] == 1
    for bad_lens, message in ((lens - T, r"input_lengths\[0\] = 0"), (lens + 1, r"= 6 is outside")):
        with pytest.raises(ValueError, match=message):
            simple_transducer_nll(am, lm, targets, bad_lens, tlens, S)
    outside = targets.clone()
    outside[1, 0] = V
    with pytest.raises(ValueError, match=r"targets\[1, 0\] = 6"):
        simple_transducer_nll(am, lm, outside, lens, tlens, S)
    with pytest.raises(ValueError, match="prune_range"):
        simple_transducer_nll(am, lm, targets, lens.clamp(max=1), tlens, S)


def test_the_auxiliary_ctc_loss_reads_no_values_the_transducer_loss_checked(reads):
    """A transducer's auxiliary CTC loss (``values_checked=True``) reads nothing; its shapes
    are still checked, and alone it checks its values. A transducer model with ``ctc_weight``
    reads its labels and lengths once, in its own loss."""
    B, T, V = 2, 6, 5
    targets, tlens = torch.tensor([[1, 2, 3], [4, 1, 0]]), torch.tensor([3, 2])
    lens = torch.tensor([T, T - 1])
    log_probs = torch.randn(B, T, V).log_softmax(-1)
    checked = ctc_nll(log_probs, targets, lens, tlens, values_checked=True)
    assert reads[0] == 0
    assert torch.equal(checked, ctc_nll(log_probs, targets, lens, tlens))
    assert reads[0] == 1
    with pytest.raises(ValueError, match="targets must have shape"):
        ctc_nll(log_probs, targets[:1], lens, tlens, values_checked=True)
    with pytest.raises(ValueError, match=r"targets\[1, 0\] = 5"):
        ctc_nll(log_probs, targets + 1, lens, tlens)
    with pytest.raises(ValueError, match=r"target_lengths\[0\] = 4 is outside \[0, 3\]"):
        ctc_nll(log_probs, targets, lens, tlens + 1)
    from tests.search import tiny

    for pruned in ({}, {"prune_range": 3}):  # the whole lattice, the pruned loss
        options = {"ctc_weight": 0.3, **pruned}
        model = tiny.build("hat", seed=2, loss_options=options).train()
        feats, flens = torch.randn(B, 3 * T, tiny.FEATS), torch.tensor([3 * T, 3 * T - 2])
        reads[0] = 0
        out = model.loss(feats, flens, targets, tlens)
        assert reads[0] == 1 and out.loss.isfinite().all() and "ctc_loss" in out.stats


def test_check_none_and_check_at_least_raise_their_own_errors_outside_a_block(reads):
    def fail():
        raise ValueError("the caller's own error")

    with pytest.raises(ValueError, match="the caller's own error"):
        checks.check_none(LENGTHS > 4, fail)
    with pytest.raises(ValueError, match="the caller's own error"):
        checks.check_at_least(LENGTHS, 1, fail)  # the 0
    checks.check_none(LENGTHS > 5, fail)
    checks.check_at_least(LENGTHS, 0, fail)
    checks.check_at_least(torch.tensor(2.5), 2.5, fail)  # a 0-d tensor, at the bound
    with pytest.raises(ValueError, match="the caller's own error"):
        checks.check_at_least(torch.tensor([1.0, float("nan")]), 0, fail)  # NaN fails
    assert reads[0] == 0  # outside a block: each reads on its own


def test_one_read_of_one_statistic_launches_no_stack():
    class Operators(TorchDispatchMode):
        names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    least = LENGTHS.amin()
    with Operators() as ops:
        with one_read():
            checks.check_at_least(least, 0, lambda: pytest.fail("0 >= 0"))
    assert "stack" not in ops.names and ops.names.count("_local_scalar_dense") == 1


def test_an_estimator_reads_its_checks_and_its_sampler_s_once(reads):
    """The estimators' argument checks (lengths, labels against frames and reward columns,
    finite rewards) share one read, and the forced-suffix estimator's sampler adds its own
    check to it: its whole call reads the device once."""
    from cbasr.estimators import forced_suffix_reinforce
    from cbasr.estimators._common import check_inputs
    from tests.estimators.cases import ragged_batch

    logits, rewards, total, lengths = ragged_batch(3)
    with DeviceReads(besides_checks=True) as other:
        assert check_inputs(logits, total, rewards, lengths) == rewards.shape[2]
    assert (reads[0], other.count) == (1, 0)
    with DeviceReads(besides_checks=True) as other:
        forced_suffix_reinforce(logits, total, rewards, lengths, 4, "loo", 0.1)
    assert (reads[0], other.count) == (2, 0)
    bad = rewards.detach().clone()
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"rewards\[0, 1, 2\] = nan: rewards must be finite"):
        forced_suffix_reinforce(logits, total, bad, lengths, 4)
    with pytest.raises(ValueError, match=r"total\[3\] = 4 > input_lengths\[3\] = 3"):
        forced_suffix_reinforce(logits, total + 1, rewards, lengths, 4)
    # each check of the block names its argument
    with pytest.raises(ValueError, match="rewards must be a floating-point tensor"):
        check_inputs(logits, total, rewards.detach().long(), lengths)
    with pytest.raises(ValueError, match=r"input_lengths\[0\] = 7 is outside \[0, 6\]"):
        check_inputs(logits, total, rewards, lengths + 1)
    with pytest.raises(ValueError, match=r"total\[1\] = -1 is outside"):
        check_inputs(logits, torch.tensor([1, -1, 0, 0]), rewards, lengths)
    with pytest.raises(ValueError, match=r"total\[0\] = 4 > rewards.shape\[2\] = 3"):
        check_inputs(logits, torch.tensor([4, 0, 0, 0]), rewards, lengths)


# the Triton samplers of both kinds (idb: ID checking; bb: bounded) and the callable rewards
@on_triton_keep(lambda case: case["estimator"] in ("idb", "bb", "callable"))
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("estimator", ["global", "idb", "bb", "mbb", "monte_carlo", "callable"])
def test_a_sampled_cb_estimator_reads_the_device_twice(estimator, backend, reads):
    """On the CUDA code path: the argument checks once (with the largest total, for callable
    rewards), then the sampler's check, the distributions' checks and PoissonBinomial's
    statistics once (the tables sized by the rewards' columns: no read of the largest total).
    A wrong total is still named: the checks run, only their reads are shared."""
    from cbasr._backends import use_backend
    from cbasr.estimators import cb_monte_carlo_marginal, cb_reinforce
    from tests.estimators.cases import ragged_batch

    logits, rewards, total, lengths = ragged_batch(3)

    def call(logits):
        if estimator == "monte_carlo":
            return cb_monte_carlo_marginal(logits, total, rewards, lengths, 3)
        if estimator == "callable":  # rewards read at the sampled times
            table = rewards.detach()

            def memoryless(times):  # (M, B, L) -> (M, B, L)
                at = times.clamp(min=0).unsqueeze(-1)  # (M, B, L, 1) frames
                picked = table.unsqueeze(0).expand(len(times), -1, -1, -1).transpose(2, 3)
                return picked.gather(-1, at).squeeze(-1)

            return cb_reinforce(logits, total, memoryless, lengths, "idb", 3)
        return cb_reinforce(logits, total, rewards, lengths, estimator, 3)

    with use_backend(backend), DeviceReads(besides_checks=True) as other:
        estimate = call(logits)
        estimate.loss.sum().backward()
    assert (reads[0], other.count) == (2, 0)
    assert estimate.loss.isfinite().all() and logits.grad.isfinite().all()
    logits = logits.detach().clone()
    logits[1, 3] = float("nan")
    with use_backend(backend), pytest.raises(ValueError, match="Expected parameter logits"):
        call(logits)


@pytest.mark.parametrize("backend", ["torch", "numba"])
def test_poisson_binomial_log_prob_reads_once(backend, reads, monkeypatch):
    """``PoissonBinomial.log_prob`` reads the states its counts need, for the kernel whether
    the logits are finite and, validating, whether the values are in the support, in one copy
    (:func:`cbasr.checks.read`); the same values as the table's."""
    from cbasr._backends import use_backend
    from cbasr.distributions import poisson_binomial

    logits, lengths = torch.randn(3, 6, dtype=torch.float64), torch.tensor([6, 4, 5])
    counts = torch.tensor([2.0, 4.0, 0.0])
    with use_backend("torch"):  # the table
        want = PoissonBinomial(logits, lengths).log_prob(counts)
    kernel = []
    tilted = poisson_binomial._tilted_log_prob
    monkeypatch.setattr(
        poisson_binomial, "_tilted_log_prob", lambda *a: kernel.append(1) or tilted(*a)
    )
    for validate in (False, True):
        distribution = PoissonBinomial(logits, lengths, validate_args=validate)
        reads[0] = 0
        with use_backend(backend), DeviceReads(besides_checks=True) as other:
            got = distribution.log_prob(counts)
        assert (reads[0], other.count) == (1, 0)
        torch.testing.assert_close(got, want)
    assert kernel == ([1, 1] if backend == "numba" else [])  # the numba kernel, or the table
    with pytest.raises(ValueError, match=r"Expected value argument .* within the support"):
        PoissonBinomial(logits, lengths, validate_args=True).log_prob(counts + 0.5)
    with pytest.raises(ValueError, match="not broadcastable"):
        PoissonBinomial(logits, lengths, validate_args=True).log_prob(counts[:2])
    with pytest.raises(ValueError, match="The value argument to log_prob must be a Tensor"):
        PoissonBinomial(logits, lengths, validate_args=True).log_prob([2.0, 4.0, 0.0])
    logits[1, 2] = float("inf")  # an infinite logit: left to the table
    with use_backend(backend):
        got = PoissonBinomial(logits, lengths, validate_args=False).log_prob(counts)
    assert torch.isfinite(got).all() and got[1] > want[1]
