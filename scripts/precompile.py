"""Byte-compile the modules cbasr's commands import, by importing them: ``make install`` runs it.

    PYTHONDONTWRITEBYTECODE= .venv/bin/python scripts/precompile.py

Python writes a module's bytecode (``__pycache__/*.pyc``) when it first imports it, unless
``PYTHONDONTWRITEBYTECODE`` is set; where it is set, every process compiles every module it
imports again, about 3-9 s per command for torch alone. Compiling the whole environment at
install time (uv's ``--compile-bytecode``) costs about 25 s on 2 cores for 10,000 files, most
of which no command imports (sympy, networkx, torch's compiler stack). Importing what the
commands import compiles about 2,500 modules in about 14 s. A module left out still works: it
is compiled when imported, as before.
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


if __name__ == "__main__":
    main()
