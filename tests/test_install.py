"""A plain (non-editable) ``pip install .`` carries everything the commands need: the Hydra config
tree is package data, so ``cbasr-train --cfg job`` composes from any directory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RUN_FROM_TARGET = """
import sys
target = sys.argv[1]
sys.path.insert(0, target)
import cbasr
assert cbasr.__file__.startswith(target), cbasr.__file__  # the installed copy, not the checkout
from cbasr.cli.train import main
sys.argv = ["cbasr-train", "--cfg", "job", "exp_dir=exp/x", "loss=cb_marginal"]
main()
"""


@pytest.mark.slow
def test_a_non_editable_install_composes_a_training_config_from_anywhere(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    assert (target / "cbasr" / "conf" / "train.yaml").is_file()
    assert (target / "cbasr" / "conf" / "loss" / "cb_marginal.yaml").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", RUN_FROM_TARGET, str(target)],
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "exp_dir: exp/x" in out.stdout
    assert "name: cb_marginal" in out.stdout


@pytest.mark.slow
def test_precompile_writes_the_bytecode_of_what_the_commands_import(tmp_path):
    # `make install` runs scripts/precompile.py with bytecode writing on; here its bytecode goes
    # to a fresh prefix, where every module it imports must land, torch's and cbasr's alike.
    prefix = tmp_path / "pycache"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "precompile.py")],
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(prefix)},
        check=True,
        timeout=600,
    )
    compiled = {p.name.split(".")[0] for p in prefix.rglob("*.pyc")}
    # the commands, the losses, TensorBoard's writer, numba's compiler (mathimpl), pytest
    for module in ("train", "decode", "align", "pruned", "writer", "mathimpl", "fixtures"):
        assert module in compiled, module
