"""The generated parts of the documentation site, and the Sphinx extension that writes them.

Every table of figures on the site is made here, at build time, from the files that hold the
figures: the decoder x loss compatibility table from the code (``cbasr-models table``), the
results tables from each recipe's ``results.csv``, the performance tables from ``benchmarks/``
(``scripts/perf_table.py``), each recipe's page from its ``README.md`` and the list of its
pinned systems from the comment that opens each ``conf/*.yaml``. The pages include what this
module writes under ``docs/_generated/`` (git-ignored), so no page holds a copy that could
drift from its source.

The functions return Markdown and import no Sphinx, so the tests call them directly
(``tests/cli/test_models.py``).
"""

import csv
import importlib.util
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
GENERATED = DOCS / "_generated"

COMPATIBILITY_START = "<!-- cbasr-models table -->"
COMPATIBILITY_END = "<!-- end of table -->"

INTEGER_COLUMNS = {
    "sub",
    "del",
    "ins",
    "ref_tokens",
    "utts",
    "parameters",
    "epochs",
    "repeat_deletions",
    "repeat_tokens",
    "other_deletions",
    "other_tokens",
}
TEXT_COLUMNS = {"system", "decode"}


def compatibility() -> str:
    """The decoder x loss table of ``cbasr-models table``, between the markers the tests read."""
    from cbasr.cli.models import compatibility_table

    return f"{COMPATIBILITY_START}\n{compatibility_table()}{COMPATIBILITY_END}\n"


def recipes(root: Path = ROOT) -> list[str]:
    """The corpus recipes: the folders of ``recipes/`` with a ``run.sh``."""
    return sorted(p.parent.name for p in (root / "recipes").glob("*/run.sh"))


def read_results(path: Path) -> list[dict]:
    """The rows of a ``cbasr-compare --csv`` file, typed as :func:`markdown_table` reads them
    (an empty cell is ``None``)."""

    def value(column: str, text: str):
        if column in TEXT_COLUMNS:
            return text
        if text == "":
            return None
        return int(text) if column in INTEGER_COLUMNS else float(text)

    with open(path, newline="") as f:
        return [{k: value(k, v) for k, v in row.items()} for row in csv.DictReader(f)]


def results_table(path: Path) -> str:
    """A results CSV as ``cbasr-compare`` prints it (with the repeat columns where every row
    has them)."""
    from cbasr.evaluation.compare import markdown_table

    rows = read_results(path)
    repeats = bool(rows) and all(r.get("repeat_tokens") is not None for r in rows)
    return markdown_table(rows, repeats=repeats)


def experiment_results(path: Path, experiment: str) -> str:
    """The rows of one experiment (``<experiment>:<decoding>``) of a results CSV."""
    from cbasr.evaluation.compare import markdown_table

    rows = [r for r in read_results(path) if r["system"].rpartition(":")[0] == experiment]
    return markdown_table(rows)


def results(root: Path = ROOT) -> str:
    """A section per recipe with a results CSV, a table per CSV."""
    parts = []
    for name in recipes(root):
        files = sorted((root / "recipes" / name).glob("results*.csv"))
        if not files:
            continue
        parts.append(f"## {name}\n")
        for path in files:
            rel = path.relative_to(root)
            parts.append(
                f"`{rel}` ({len(read_results(path))} rows; the commands that wrote it and what "
                f"the figures mean: `{rel.parent}/RESULTS.md`):\n"
            )
            parts.append(results_table(path))
    return "\n".join(parts)


def _perf_table_module():
    path = ROOT / "scripts" / "perf_table.py"
    spec = importlib.util.spec_from_file_location("perf_table", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def performance(root: Path = ROOT) -> str:
    """``scripts/perf_table.py --summary`` over every folder of ``benchmarks/``, then each
    folder's table of every measured figure."""
    perf = _perf_table_module()
    folders = sorted(p for p in (root / "benchmarks").iterdir() if p.is_dir())
    rel = [p.relative_to(root) for p in folders]
    parts = [
        "### One row per run\n",
        f"`scripts/perf_table.py --summary {' '.join(map(str, rel))}` (`-`: not measured in "
        "that run):\n",
        perf.summary(folders).rstrip("\n") + "\n",
    ]
    for folder, name in zip(folders, rel):
        parts += [f"### `{name}`\n", perf.table(folder).rstrip("\n") + "\n"]
    return "\n".join(parts)


def _leading_comment(path: Path) -> str:
    """The comment lines that open a YAML file, as one line."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines).replace("|", "\\|")


def pinned_systems(name: str, root: Path = ROOT) -> str:
    """A recipe's pinned experiment configs (``recipes/<name>/conf/*.yaml``) with the comment
    that opens each."""
    confs = sorted((root / "recipes" / name / "conf").glob("*.yaml"))
    if not confs:
        return ""
    lines = ["| config | what it is |", "|---|---|"]
    lines += [f"| `{p.stem}` | {_leading_comment(p)} |" for p in confs]
    return "\n".join(lines) + "\n"


def recipe_readme(name: str, root: Path = ROOT) -> str:
    """A recipe's ``README.md``; empty where it has none."""
    path = root / "recipes" / name / "README.md"
    return path.read_text() if path.exists() else ""


def generated_files(root: Path = ROOT) -> dict[str, str]:
    """``{path under docs/_generated: Markdown}`` for every generated part."""
    files = {
        "compatibility.md": compatibility(),
        "results.md": results(root),
        "performance.md": performance(root),
        "demo.md": experiment_results(root / "recipes/synth/results.csv", "demo_hat"),
    }
    for name in recipes(root):
        files[f"recipe-{name}-readme.md"] = recipe_readme(name, root)
        files[f"recipe-{name}-systems.md"] = pinned_systems(name, root)
    return files


def write_generated(root: Path = ROOT, out: Path = GENERATED) -> None:
    """Write :func:`generated_files` under ``out``, leaving unchanged files untouched (Sphinx
    then rereads only the pages whose included files changed)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in generated_files(root).items():
        path = out / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


# Module docstrings show commands and code as indented blocks, as a reader of the source sees
# them; reStructuredText reads such a block as a block quote (reflowed, or an error where its
# lines are indented unevenly). An indented block after a blank line that follows a paragraph
# is made a literal block, as ``::`` would make it.
_LIST_ITEM = re.compile(r"^(?:[-*+]|\d+[.)]|\(\d+\))\s")


def literal_blocks(lines: list[str]) -> list[str]:
    """``lines`` of a docstring with a ``::`` paragraph before each indented block (of 4 spaces
    or more) that follows a blank line after an unindented paragraph that is not a list item,
    a field or a directive and does not already end with ``::``."""
    out: list[str] = []
    previous = ""  # the last non-blank line
    for i, line in enumerate(lines):
        starts_block = (
            line.startswith("    ")
            and i > 0
            and lines[i - 1].strip() == ""
            and previous
            and not previous.startswith((" ", "..", ":", ">>>"))
            and not _LIST_ITEM.match(previous)
            and not previous.rstrip().endswith("::")
        )
        if starts_block:
            out += ["::", ""]
        out.append(line)
        if line.strip():
            previous = line
    return out


def _process_docstring(app, what, name, obj, options, lines):
    if what == "module":
        lines[:] = literal_blocks(lines)


def setup(app):
    app.connect("builder-inited", lambda app: write_generated())
    app.connect("autodoc-process-docstring", _process_docstring)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
