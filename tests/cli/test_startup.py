"""Commands that run on text alone start without importing torch (about 4 s of a 2-core
machine's time per command; a recipe runs several)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["cbasr.cli.score", "cbasr.cli.results", "cbasr.cli.vocab"])
def test_text_commands_do_not_import_torch(module):
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'numba') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"{module} imports {out.stdout.strip()}"
