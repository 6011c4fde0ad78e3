"""Byte-compile the modules cbasr's commands import, by importing them: ``make install`` runs it.

    PYTHONDONTWRITEBYTECODE= .venv/bin/python scripts/precompile.py

Python writes a module's bytecode (``__pycache__/*.pyc``) when it first imports it, unless
``PYTHONDONTWRITEBYTECODE`` is set; where it is set, every process compiles every module it
imports again, torch's included. Compiling the whole environment at install time (uv's
``--compile-bytecode``) compiles every file, most of which no command imports (sympy,
networkx, torch's compiler stack); importing what the commands import compiles those only. A
module left out still works: it is compiled when imported, as before.

It then compiles the CPU kernels (the loops numba compiles for the ``numba`` backend, cached
on disk beside their modules: ``cache=True``) in float32 and float64, by calling each on a
tiny batch, once, where every process that first calls a kernel would compile it (the two
test workers of a test run compiling the same kernels side by side). A kernel left out is
compiled on first use, as before. What each step costs and saves: recipes/synth/RESULTS.md,
"Measurements behind defaults".
"""

import importlib
import pkgutil

import numba

import cbasr

# imported inside functions: the training curves, TensorBoard, the compiled loops' code
# generation, the Conformer, and torch's compiler stack (about 900 modules: torch.optim imports
# torch._dynamo when it builds the first optimizer, 2.8 s to compile again in every training
# process); and what the tests import (the `test` extra, when installed)
LAZY = (
    "matplotlib.pyplot",
    "torch.utils.tensorboard",
    "llvmlite.ir",
    "torchaudio.models",
    "torch._dynamo",
    "matplotlib.backends.backend_agg",
)
# packages whose modules Hydra finds at run time (its launcher, sweeper and config sources)
PLUGINS = ("hydra._internal.core_plugins",)
OPTIONAL = ("pytest", "onnx", "onnxruntime")


def main() -> None:
    for module in pkgutil.walk_packages(cbasr.__path__, "cbasr."):
        importlib.import_module(module.name)
    for name in LAZY:
        importlib.import_module(name)
    for name in PLUGINS:
        for module in pkgutil.walk_packages(importlib.import_module(name).__path__, name + "."):
            importlib.import_module(module.name)
    for name in OPTIONAL:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    # numba imports its compiler (about 1,000 modules) on the first compilation
    numba.njit(lambda x: x + 1)(1)
    try:
        compile_cpu_kernels()
    except Exception as error:  # (an install stands without them: compiled on first use)
        print(f"scripts/precompile.py: the CPU kernels were not compiled ahead: {error!r}")


def compile_cpu_kernels() -> None:
    """Call every CPU kernel once per float dtype (tiny batches; numba caches what it compiles):
    the CB lattice, both transducer lattices and the joint's row reductions, the CB
    distribution's count tables, its samplers and their decompositions."""
    import torch

    from cbasr._backends import use_backend
    from cbasr.distributions import (
        ConditionalBernoulli,
        bounded_bernoulli_marginals,
        bounded_bernoulli_sample,
        id_checking_log_probs,
        id_checking_sample,
    )
    from cbasr.losses import (
        cb_marginal_nll,
        hat_nll_from_logits,
        rnnt_lattice_nll,
        transducer_lattice_nll,
    )

    B, T, U, V = 2, 6, 2, 4
    frames, labels = torch.tensor([6, 4]), torch.tensor([2, 1])
    targets = torch.tensor([[1, 2], [3, 0]])
    with use_backend("numba"):
        for dtype in (torch.float32, torch.float64):
            a = torch.randn(B, T, dtype=dtype, requires_grad=True)
            lp = torch.randn(B, T, U, dtype=dtype).log_softmax(-1).requires_grad_()
            cb_marginal_nll(a, lp, frames, labels).sum().backward()
            for monotonic in (False, True):
                blank = torch.randn(B, T, U + 1, dtype=dtype, requires_grad=True)
                emit = torch.randn(B, T, U, dtype=dtype, requires_grad=True)
                transducer_lattice_nll(blank, emit, frames, labels, monotonic).sum().backward()
            joint = torch.randn(B, T, U + 1, V, dtype=dtype, requires_grad=True)
            rnnt_lattice_nll(joint, targets, frames, labels).sum().backward()
            blank = torch.randn(B, T, U + 1, dtype=dtype, requires_grad=True)
            hat_nll_from_logits(blank, joint, targets, frames, labels).sum().backward()
            x = torch.randn(B, T, dtype=dtype, requires_grad=True)
            cb = ConditionalBernoulli(x, labels, frames)
            b = cb.sample()
            cb.log_prob(b).sum().backward()
            id_checking_sample(x.detach(), labels, frames)
            bounded_bernoulli_sample(x.detach(), labels, frames)
            id_checking_log_probs(x, labels, b, frames).sum().backward()
            bounded_bernoulli_marginals(x, labels, frames).sum().backward()


if __name__ == "__main__":
    main()
