"""Training a toy learner ``Q`` with one estimator (CB paper section 5.1).

Each step draws ``N`` fresh sequences from the population and takes one Adam step on the
chosen method's loss. Methods (a literal table, :data:`METHODS`):

- ``"exact"``: the exact marginal ``-log Q(y)`` of eq. (38) (:func:`cbasr.losses.cb_marginal_nll`).
- ``"expected"``: the exact REINFORCE bound of eq. (19)
  (:func:`cbasr.estimators.cb_expected_reward`).
- ``"global"``, ``"idb"``, ``"bb"``, ``"mbb"``: :func:`cbasr.estimators.cb_reinforce` (eqs. 21, 23,
  28, 29) with ``M`` samples.
- ``"forced_suffix"``: Luo et al.'s eq. (1) with forced-suffix samples.
- ``"straight_through"``: eq. (37) on the ID-checking relaxation.
- ``"relax"``: eq. (36) with a learned REBAR control variate on the ID-checking steps.
- ``"elbo_fs"``, ``"elbo_bin"``: the bound of eq. (46) with proposals eq. (48) / eq. (51).

The REINFORCE-style methods use the baseline named by ``ToyConfig.baseline``.
"""

import copy
import time
from dataclasses import dataclass, field

import torch

from cbasr.estimators import (
    RebarControlVariate,
    RunningMeanBaseline,
    cb_expected_reward,
    cb_monte_carlo_marginal,
    cb_reinforce,
    forced_suffix_reinforce,
    relax_cb,
    straight_through_cb,
    variational_lower_bound,
)
from cbasr.losses import cb_marginal_nll
from cbasr.toy.population import (
    ToyBatch,
    ToyParameters,
    initial_learner,
    label_rewards,
    parameter_mse,
    random_population,
    sample_batch,
)

__all__ = ["ToyConfig", "METHODS", "MethodState", "method_loss", "train"]


@dataclass(frozen=True)
class ToyConfig:
    """One toy experiment (section 5.1's hyperparameters T, N, M and sigma, and the rest)."""

    num_frames: int = 16  # T
    vocab: int = 4
    batch_size: int = 16  # N
    num_samples: int = 4  # M
    sigma: float = 1.0  # spread of the population parameters
    emit_rate: float = 0.3  # centre of the population's emission probabilities
    steps: int = 300
    learning_rate: float = 0.05
    baseline: str = "running"  # "none", "loo" or "running"
    entropy_weight: float = 0.0  # forced suffix only
    temperature: float = 0.5  # straight-through and the RELAX control variate's start
    eval_size: int = 256
    log_every: int = 10
    variance_every: int = 50
    variance_draws: int = 16


METHODS = {
    "exact": "exact marginal, eq. (38)",
    "expected": "exact REINFORCE bound, eqs. (19), (15)",
    "global": "global REINFORCE, eq. (21)",
    "idb": "ID-checking REINFORCE, eq. (23)",
    "bb": "bounded REINFORCE, eq. (28)",
    "mbb": "marginal bounded REINFORCE, eq. (29)",
    "mc": "Monte Carlo marginal log P(L) + log mean_m P(y | b_m), VIMCO gradient",
    "forced_suffix": "forced-suffix REINFORCE, eq. (1)",
    "straight_through": "straight-through CB, eq. (37)",
    "relax": "RELAX on ID-checking steps, eq. (36)",
    "elbo_fs": "ELBO eq. (46) with Q_FS, eq. (48)",
    "elbo_bin": "ELBO eq. (46) with Q_Bin, eq. (51)",
}


@dataclass
class MethodState:
    """What a method keeps between steps: a running-mean baseline, a control variate."""

    baseline: RunningMeanBaseline = field(default_factory=RunningMeanBaseline)
    control_variate: RebarControlVariate | None = None
    control_optimizer: torch.optim.Optimizer | None = None
    control_gradients: list[torch.Tensor] | None = None

    def step_control_variate(self) -> None:
        """Apply the control variate's pending gradients (after the learner's backward pass,
        whose graph still holds the control variate's parameters)."""
        if self.control_optimizer is None or self.control_gradients is None:
            return
        for parameter, gradient in zip(self.control_variate.parameters(), self.control_gradients):
            parameter.grad = gradient
        self.control_optimizer.step()
        self.control_gradients = None

    def frozen(self) -> "MethodState":
        """A copy whose state does not move (for repeated gradient draws)."""
        control = copy.deepcopy(self.control_variate)
        if control is not None:
            control.requires_grad_(False)
        return MethodState(copy.deepcopy(self.baseline), control, None)


def new_state(method: str, config: ToyConfig) -> MethodState:
    state = MethodState()
    if method == "relax":
        state.control_variate = RebarControlVariate(
            eta=1.0, temperature=config.temperature
        ).double()
        state.control_optimizer = torch.optim.Adam(
            state.control_variate.parameters(), lr=config.learning_rate
        )
    return state


def _baseline(config: ToyConfig, state: MethodState):
    if config.baseline == "none":
        return None
    if config.baseline == "loo":
        return "loo" if config.num_samples >= 2 else None
    if config.baseline == "running":
        return state.baseline
    raise ValueError(f"baseline must be 'none', 'loo' or 'running'; got {config.baseline!r}")


def method_loss(
    method: str,
    learner: ToyParameters,
    batch: ToyBatch,
    config: ToyConfig,
    state: MethodState,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The method's loss ``(N,)`` (gradient: minus its estimate) and value estimate ``(N,)``.

    For RELAX, leaves the control variate's gradients in ``state`` when it has an optimizer
    (:meth:`MethodState.step_control_variate` applies them).
    """
    N = batch.total.shape[0]
    emit = learner.emit_logits.expand(N, -1)  # (T,) -> (N, T)
    rewards = label_rewards(learner, batch)  # (N, T, L)
    M = config.num_samples
    if method == "exact":
        loss = cb_marginal_nll(emit, rewards, batch.lengths, batch.total)
        return loss, -loss.detach()
    if method == "expected":
        value = cb_expected_reward(emit, batch.total, rewards, batch.lengths)
        return -value, value.detach()
    if method in ("global", "idb", "bb", "mbb"):
        est = cb_reinforce(
            emit,
            batch.total,
            rewards,
            batch.lengths,
            method,
            M,
            _baseline(config, state),
            generator,
        )
    elif method == "mc":  # VIMCO's leave-one-out baseline, whatever config.baseline says
        est = cb_monte_carlo_marginal(emit, batch.total, rewards, batch.lengths, M, generator)
    elif method == "forced_suffix":
        est = forced_suffix_reinforce(
            emit,
            batch.total,
            rewards,
            batch.lengths,
            M,
            _baseline(config, state),
            config.entropy_weight,
            generator,
        )
    elif method == "straight_through":
        est = straight_through_cb(
            emit,
            batch.total,
            rewards,
            batch.lengths,
            "id_checking",
            config.temperature,
            M,
            generator,
        )
    elif method == "relax":
        est = relax_cb(
            emit,
            batch.total,
            rewards,
            batch.lengths,
            state.control_variate,
            "id_checking",
            M,
            _baseline(config, state),
            generator,
        )
        if state.control_optimizer is not None and est.control_variate_loss is not None:
            params = list(state.control_variate.parameters())
            state.control_gradients = torch.autograd.grad(
                est.control_variate_loss.mean(), params, retain_graph=True
            )
    elif method in ("elbo_fs", "elbo_bin"):
        proposal = "forced_suffix" if method == "elbo_fs" else "binomial"
        baseline = "loo" if config.baseline == "loo" and M >= 2 else None
        est = variational_lower_bound(
            emit, batch.total, rewards, batch.lengths, proposal, M, baseline, generator=generator
        )
    else:
        raise ValueError(f"method must be one of {sorted(METHODS)}; got {method!r}")
    return est.loss, est.value


def flat_gradient(
    loss: torch.Tensor, learner: ToyParameters, retain_graph: bool = False
) -> torch.Tensor:
    """``d loss.mean() / d (emit_logits, label_logits)`` flattened: ``(P,)``."""
    grads = torch.autograd.grad(loss.mean(), list(learner), retain_graph=retain_graph)
    return torch.cat([g.reshape(-1) for g in grads])


def gradient_variance(method, learner, batch, config, state, generator, draws) -> float:
    """Total variance ``sum_p Var(g_p)`` of ``draws`` gradient estimates at fixed parameters
    and a fixed batch (0 for the exact methods)."""
    frozen = state.frozen()
    grads = torch.stack(
        [
            flat_gradient(
                method_loss(method, learner, batch, config, frozen, generator)[0], learner
            )
            for _ in range(draws)
        ]
    )
    return float(grads.var(0).sum())


def train(config: ToyConfig, method: str, seed: int) -> dict:
    """Train one learner; return its history (lists of per-step records) and summary."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}; got {method!r}")
    T, V = config.num_frames, config.vocab
    population = random_population(
        T, V, config.sigma, config.emit_rate, torch.Generator().manual_seed(seed)
    )
    data = torch.Generator().manual_seed(seed + 1_000)
    noise = torch.Generator().manual_seed(seed + 2_000)
    held_out = sample_batch(
        population, config.eval_size, torch.Generator().manual_seed(seed + 3_000)
    )
    learner = initial_learner(T, V)
    optimizer = torch.optim.Adam(list(learner), lr=config.learning_rate)
    state = new_state(method, config)
    history = {
        "step": [],
        "log_likelihood": [],
        "bound": [],
        "emission_mse": [],
        "label_mse": [],
        "variance_step": [],
        "variance": [],
        "reward_step": [],
        "reward": [],
    }
    start = time.perf_counter()
    for step in range(config.steps + 1):
        batch = sample_batch(population, config.batch_size, data)
        if step % config.log_every == 0 or step == config.steps:
            _evaluate(population, learner, held_out, step, history)
        if step % config.variance_every == 0 or step == config.steps:
            variance = gradient_variance(
                method, learner, batch, config, state, noise, config.variance_draws
            )
            history["variance_step"].append(step)
            history["variance"].append(variance)
        if step == config.steps:
            break
        loss, value = method_loss(method, learner, batch, config, state, noise)
        optimizer.zero_grad()
        loss.mean().backward()
        optimizer.step()
        state.step_control_variate()
        history["reward_step"].append(step)
        history["reward"].append(float(value.mean()))
    return {
        "method": method,
        "seed": seed,
        "config": config.__dict__,
        "history": history,
        "seconds": time.perf_counter() - start,
    }


@torch.no_grad()
def _evaluate(population, learner, held_out, step, history) -> None:
    """Held-out ``log Q(y)`` (eq. 38) and bound (eq. 19) per sequence, and the parameter MSEs."""
    N = held_out.total.shape[0]
    emit = learner.emit_logits.expand(N, -1)
    rewards = label_rewards(learner, held_out)
    history["step"].append(step)
    history["log_likelihood"].append(
        float(-cb_marginal_nll(emit, rewards, held_out.lengths, held_out.total).mean())
    )
    history["bound"].append(
        float(cb_expected_reward(emit, held_out.total, rewards, held_out.lengths).mean())
    )
    emission, labels = parameter_mse(population, learner)
    history["emission_mse"].append(emission)
    history["label_mse"].append(labels)
