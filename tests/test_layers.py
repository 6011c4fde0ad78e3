"""The package's layering, held by its imports: every edge points down the docs' layer table.

The table between ``<!-- layers -->`` markers in docs/architecture.md is the one place the layer
map is written; this test reads it and parses every ``import`` in ``cbasr/`` with ``ast`` (those
inside functions too), so the documentation and the code cannot drift apart.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cbasr"


def layer_table(readme: str) -> dict[str, int]:
    """``{package: row}`` from the layer table of docs/architecture.md."""
    match = re.search(r"<!-- layers -->\n(.*?)<!-- end of layers -->", readme, re.S)
    assert match, "docs/architecture.md has no <!-- layers --> table"
    rows = {}
    for line in match.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue
        for name in re.findall(r"`([a-z_]+)`", cells[1]):
            assert name not in rows, f"{name} is on two rows of the layer table"
            rows[name] = int(cells[0])
    return rows


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every ``cbasr`` module or name ``path`` imports."""
    module = module_name(path, root)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            found += [(node.lineno, f"{source}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name == "cbasr" or name.startswith("cbasr.")]


def violations(rows: dict[str, int], files: list[Path], root: Path = ROOT) -> list[str]:
    """Upward or sideways imports, cross-package private imports, and command-to-command imports."""
    found = []
    for path in files:
        module = module_name(path, root)
        parts = module.split(".")
        if len(parts) == 1:  # cbasr/__init__.py: the public face, above every layer
            continue
        src = parts[1]
        where = f"{path.relative_to(root)}"
        for line, name in imported_modules(path, root):
            target = name.split(".")
            if len(target) < 2:
                found.append(f"{where}:{line} imports the top-level cbasr package")
                continue
            dst = target[1]
            if dst == src:
                if src == "cli" and len(parts) > 2 and target[2] not in ("common", parts[2]):
                    found.append(f"{where}:{line}: the command imports another command ({name})")
                continue
            if any(p.startswith("_") and not p.startswith("__") for p in target[2:]):
                found.append(f"{where}:{line}: private {name} imported from outside {dst}")
            if rows[dst] >= rows[src]:
                kind = "sideways" if rows[dst] == rows[src] else "upward"
                found.append(
                    f"{where}:{line}: {kind} import of {name} (row {rows[src]} -> {rows[dst]})"
                )
    return found


@pytest.fixture(scope="module")
def rows() -> dict[str, int]:
    return layer_table((ROOT / "docs" / "architecture.md").read_text())


def test_every_package_and_top_level_module_is_on_a_row(rows):
    names = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    names |= {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    assert names - set(rows) == set(), "add these to the layer table of docs/architecture.md"
    assert set(rows) - names == set(), "the docs' layer table names what the package lacks"


def test_every_import_points_down_the_layer_table(rows):
    assert violations(rows, sorted(PACKAGE.rglob("*.py"))) == []


def test_the_check_finds_each_kind_of_violation(rows, tmp_path):
    """The checker itself, on a fake package: one of each violation, and one legal edge."""
    fake = tmp_path / "cbasr"
    for sub in ("losses", "training", "cli"):
        (fake / sub).mkdir(parents=True)
        (fake / sub / "__init__.py").write_text("")
    (fake / "losses" / "up.py").write_text(
        "import torch\n"
        "from cbasr.distributions import PoissonBinomial\n"  # down: fine
        "def f():\n    from cbasr.training.trainer import train\n"  # up, inside a function
    )
    (fake / "training" / "private.py").write_text("from cbasr.losses._helpers import x\n")
    (fake / "cli" / "decode.py").write_text(
        "from cbasr.cli.score import main\nfrom cbasr.cli.common import y\n"
    )
    (fake / "cli" / "rel.py").write_text("from ..search import beam\n")  # relative, down: fine
    found = violations(rows, sorted(fake.rglob("*.py")), tmp_path)
    assert len(found) == 3, found
    assert "another command (cbasr.cli.score.main)" in found[0]
    assert "cbasr/losses/up.py:4: upward import of cbasr.training.trainer.train" in found[1]
    assert "private cbasr.losses._helpers.x" in found[2]


def test_evaluation_imports_no_torch():
    """Scoring and comparison run where torch is not installed (a results server, CI of
    tables): importing every evaluation module loads no torch, directly or through the
    cbasr modules they import."""
    modules = sorted(p.stem for p in (PACKAGE / "evaluation").glob("*.py") if p.stem != "__init__")
    assert {"scoring", "compare", "rouge"} <= set(modules)
    code = (
        "import sys\n"
        + "".join(f"import cbasr.evaluation.{m}\n" for m in modules)
        + "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


def test_training_and_inference_never_import_each_other(rows):
    assert rows["training"] == rows["inference"]  # a sideways import is a violation


KERNEL = re.compile(r"^_(kernels|\w+_kernel|\w+_triton)$")  # compiled and Triton kernel modules


def import_cycles_through_kernels(files: list[Path], root: Path = ROOT) -> list[str]:
    """Import cycles (through imports anywhere in a file) that pass a kernel module."""
    modules = {module_name(path, root): path for path in files}
    graph = {}
    for module, path in modules.items():
        targets = set()
        for _, name in imported_modules(path, root):
            while name and name not in modules:  # `from a.b import c`: c may be a name in a.b
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    found = []
    for start in sorted(m for m in graph if KERNEL.match(m.rpartition(".")[2])):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    found.append(" -> ".join(path + [start]))
                elif nxt not in seen and nxt != "cbasr":
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return found


def test_kernel_modules_import_their_references_one_way():
    """A kernel module imports its PyTorch reference; the reference never imports a kernel
    back (the dispatch lives in a third module), so no import cycle passes a kernel."""
    files = sorted(PACKAGE.rglob("*.py"))
    kernels = [p for p in files if KERNEL.match(p.stem)]
    assert len(kernels) >= 5
    assert import_cycles_through_kernels(files) == []


def test_the_cycle_check_finds_a_cycle(tmp_path):
    pkg = tmp_path / "cbasr" / "dist"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_tables.py").write_text("from cbasr.dist import _kernels\n")
    (pkg / "_kernels.py").write_text("def f():\n    from cbasr.dist._tables import g\n")
    found = import_cycles_through_kernels(sorted(tmp_path.rglob("*.py")), tmp_path)
    assert found == ["cbasr.dist._kernels -> cbasr.dist._tables -> cbasr.dist._kernels"]
