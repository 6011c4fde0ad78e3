#!/usr/bin/env python
"""Mutation testing in our own habits: one-line bugs of the kinds we make, run against the tests.

    make mutate PATHS=cbasr/inference/grid.py
    python scripts/mutate.py cbasr/inference/grid.py cbasr/corpora/librispeech.py \\
        --since af4440f --sample 16 --seed 1 --json mutants.json

For each named file the script writes one mutant per place where a plausible one-line bug fits
(the operators below), applies each in its own copy of the repository, runs the tests of the
matching folder (``cbasr/<area>/...`` -> ``tests/<area>/``, ``cbasr/<module>.py`` ->
``tests/test_<module>.py``; ``--tests`` names others) with ``make test``'s selection
(``-m "not slow and not gpu"``), and lists the mutants that no test fails: the survivors. A
survivor is a missing test, or an equivalent mutant (one that changes no behaviour: name it as
such in the issue's note).

The operators, each a bug seen in this code base's history:

- a comparison flipped at its boundary or negated (``<`` / ``<=``, ``==`` / ``!=``, ``is`` /
  ``is not``, ``in`` / ``not in``);
- arithmetic swapped (``+`` / ``-``, ``*`` / ``/``, ``//`` -> ``*``; also in ``+=``);
- ``and`` / ``or``; a ``not`` dropped; an ``if`` / ``while`` condition negated;
- an integer off by one (``0`` -> ``1``, ``1`` -> ``0``, ``n`` -> ``n + 1``), a float doubled,
  ``True`` / ``False``;
- a dictionary key read from another key of the same function (``rec["per"]`` ->
  ``rec["wer"]``);
- a call made for its effect, or a ``raise``, dropped (``pass``): the check never run;
- a path or string step dropped (``.resolve()``, ``.absolute()``, ``.expanduser()``,
  ``.strip()``, ``.lower()``...): the relative path kept;
- ``min`` / ``max``, ``any`` / ``all``, ``break`` / ``continue``.

Docstrings, annotations, log calls, tables of data assigned at module level (published counts
and sums, presets: a test could only restate them) and lines marked ``# pragma: no mutate``
are left alone.
With ``--since REV`` only the lines changed since ``REV`` are mutated.

How a mutant is judged: the folder's tests run first under coverage, which records the tests
that execute each line (in this process; a test that runs a command in a subprocess is not
seen). A mutant runs the tests that cover its line first (``-x``: the first failure kills
it); a mutant they do not kill, or whose line no test covers in process, then runs the whole
selection (``--no-coverage``: every mutant runs the whole selection). A run past
``--timeout`` x its selection's time in the unmutated run (plus a start-up allowance) counts as
killed (an infinite loop is a caught bug). The copies (``--jobs`` of them, one per core by
default) share the project's ``.venv``; ``PYTHONPATH`` points each run at its copy.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKERS = "not slow and not gpu"

COMPARE_SWAP = {
    ast.Lt: "<=",
    ast.LtE: "<",
    ast.Gt: ">=",
    ast.GtE: ">",
    ast.Eq: "!=",
    ast.NotEq: "==",
    ast.Is: "is not",
    ast.IsNot: "is",
    ast.In: "not in",
    ast.NotIn: "in",
}
COMPARE_TEXT = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}
BINOP_SWAP = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "/"),
    ast.Div: ("/", "*"),
    ast.FloorDiv: ("//", "*"),
}
NAME_SWAP = {"min": "max", "max": "min", "any": "all", "all": "any"}
DROPPED_STEPS = {
    "resolve",
    "absolute",
    "expanduser",
    "strip",
    "rstrip",
    "lstrip",
    "lower",
    "upper",
    "casefold",
}
QUIET_CALLS = re.compile(r"^(print|log|logger|logging|_log|LOG|warnings|tqdm|bar|progress)\b")


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One text edit of one file: ``original`` at ``(line, col)`` (1-based line, 0-based column,
    both of the edit's first character) becomes ``replacement``."""

    path: str
    line: int
    col: int
    original: str
    replacement: str
    operator: str

    @property
    def name(self) -> str:
        return f"{self.path}:{self.line}:{self.col} {self.operator}"

    def apply(self, source: str) -> str:
        """The mutated source; the text at the mutant's place must be its ``original``."""
        start = _offset(source, self.line, self.col)
        found = source[start : start + len(self.original)]
        if found != self.original:
            raise ValueError(f"{self.name}: expected {self.original!r}, found {found!r}")
        return source[:start] + self.replacement + source[start + len(self.original) :]

    def diff_line(self, source: str) -> str:
        """The mutated line, as one line (a multi-line edit shows its first line)."""
        mutated = self.apply(source).splitlines()
        return mutated[self.line - 1].strip() if self.line <= len(mutated) else ""


def _offset(source: str, line: int, col: int) -> int:
    lines = source.splitlines(keepends=True)
    # ast's columns count UTF-8 bytes
    prefix = lines[line - 1].encode()[:col].decode()
    return sum(len(text) for text in lines[: line - 1]) + len(prefix)


class _Collector(ast.NodeVisitor):
    """Walks one module and lists its mutants."""

    def __init__(self, path: str, source: str):
        self.path = path
        self.source = source
        self.lines = source.splitlines()
        self.mutants: list[Mutant] = []
        self.skip: set[int] = {
            n for n, text in enumerate(self.lines, 1) if "pragma: no mutate" in text
        }
        self.function_keys: list[list[tuple[int, int, str]]] = []

    # ---- text helpers --------------------------------------------------------------------

    def _segment(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.source, node) or ""

    def _add(self, line: int, col: int, original: str, replacement: str, operator: str):
        if line in self.skip or original == replacement:
            return
        self.mutants.append(Mutant(self.path, line, col, original, replacement, operator))

    def _between(self, left: ast.AST, right: ast.AST, token: str, replacement: str, op: str):
        """Replace ``token`` in the text between the end of ``left`` and the start of
        ``right`` (an operator, which the tree does not place)."""
        line, col = left.end_lineno, left.end_col_offset
        start = _offset(self.source, line, col)
        stop = _offset(self.source, right.lineno, right.col_offset)
        gap = self.source[start:stop]
        pattern = r"(?<![\w<>=!*/+-])" + re.escape(token) + r"(?![\w<>=!*/+-])"
        if token[0].isalpha():
            pattern = r"\b" + re.escape(token).replace(r"\ ", r"\s+") + r"\b"
        match = re.search(pattern, _blank_comments(gap))
        if match is None:
            return
        at = start + match.start()
        before = self.source[:at]
        at_line = before.count("\n") + 1
        at_col = len(before.rsplit("\n", 1)[-1].encode())
        self._add(at_line, at_col, gap[match.start() : match.end()], replacement, op)

    # ---- what is not mutated -------------------------------------------------------------

    def visit_FunctionDef(self, node):
        self._skip_docstring(node)
        for decorator in node.decorator_list:
            self.visit(decorator)
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d]:
            self.visit(default)
        self.function_keys.append([])
        for statement in node.body:
            self.visit(statement)
        self._swap_keys(self.function_keys.pop())

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self._skip_docstring(node)
        for statement in node.body:
            self.visit(statement)

    def visit_Module(self, node):
        self._skip_docstring(node)
        self.function_keys.append([])
        for statement in node.body:
            value = getattr(statement, "value", None)
            if isinstance(statement, ast.Assign | ast.AnnAssign) and isinstance(
                value, ast.Dict | ast.List | ast.Tuple | ast.Set
            ):
                continue  # a table of data (published counts, sums, presets): facts, not logic
            self.visit(statement)
        self._swap_keys(self.function_keys.pop())

    def _skip_docstring(self, node):
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            if isinstance(body[0].value.value, str):
                body.pop(0)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)

    def visit_JoinedStr(self, node):
        return  # messages

    def visit_If(self, node):
        if _is_type_checking(node.test) or _is_main_guard(node.test):
            return
        self._negate(node.test, "negated condition")
        self.generic_visit(node)

    def visit_While(self, node):
        self._negate(node.test, "negated condition")
        self.generic_visit(node)

    # ---- the operators -------------------------------------------------------------------

    def _negate(self, test: ast.AST, operator: str):
        if isinstance(test, ast.Compare | ast.BoolOp) or (
            isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
        ):
            return  # the comparison, boolean and not operators cover these
        if test.lineno != test.end_lineno:
            return
        text = self._segment(test)
        self._add(test.lineno, test.col_offset, text, f"not ({text})", operator)

    def visit_Compare(self, node):
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            self._between(left, right, COMPARE_TEXT[type(op)], COMPARE_SWAP[type(op)], "compare")
            left = right
        self.generic_visit(node)

    def visit_BinOp(self, node):
        swap = BINOP_SWAP.get(type(node.op))
        path_join = isinstance(node.op, ast.Div) and isinstance(
            node.right, ast.Constant | ast.JoinedStr
        )
        formatting = any(_is_text(side) for side in (node.left, node.right))
        if swap and not path_join and not formatting:
            self._between(node.left, node.right, swap[0], swap[1], "arithmetic")
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        swap = BINOP_SWAP.get(type(node.op))
        if swap:
            self._between(node.target, node.value, swap[0] + "=", swap[1] + "=", "arithmetic")
        self.generic_visit(node)

    def visit_BoolOp(self, node):
        token, replacement = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        for left, right in zip(node.values, node.values[1:]):
            self._between(left, right, token, replacement, "boolean")
        self.generic_visit(node)

    def visit_UnaryOp(self, node):
        if isinstance(node.op, ast.Not):
            text = self._segment(node)
            operand = self._segment(node.operand)
            if text.startswith("not") and text.endswith(operand) and node.lineno == node.end_lineno:
                self._add(node.lineno, node.col_offset, text, operand, "not dropped")
        self.generic_visit(node)

    def visit_Constant(self, node):
        value = node.value
        if isinstance(value, bool):
            self._add(node.lineno, node.col_offset, repr(value), repr(not value), "boolean")
        elif isinstance(value, int):
            text = self._segment(node)
            if text.isdigit():
                mutated = {0: 1, 1: 0}.get(value, value + 1)
                self._add(node.lineno, node.col_offset, text, str(mutated), "off by one")
        elif isinstance(value, float):
            text = self._segment(node)
            mutated = 1.0 if value == 0 else 2 * value
            self._add(node.lineno, node.col_offset, text, repr(mutated), "constant")

    def visit_Subscript(self, node):
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and self.function_keys:
            self.function_keys[-1].append((key.lineno, key.col_offset, self._segment(key)))
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Name) and func.id in NAME_SWAP:
            self._add(func.lineno, func.col_offset, func.id, NAME_SWAP[func.id], "name swap")
        if (
            isinstance(func, ast.Attribute)
            and func.attr in DROPPED_STEPS
            and not node.args
            and not node.keywords
            and node.lineno == node.end_lineno
        ):
            text = self._segment(node)
            self._add(node.lineno, node.col_offset, text, self._segment(func.value), "step dropped")
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and self.function_keys
        ):
            arg = node.args[0]
            self.function_keys[-1].append((arg.lineno, arg.col_offset, self._segment(arg)))
        self.generic_visit(node)

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Call):
            text = self._segment(node)
            if not QUIET_CALLS.match(text):
                self._add(node.lineno, node.col_offset, text, "pass", "call dropped")
        self.generic_visit(node)

    def visit_Raise(self, node):
        self._add(node.lineno, node.col_offset, self._segment(node), "pass", "raise dropped")
        # a raise's message is not mutated

    def visit_Break(self, node):
        self._add(node.lineno, node.col_offset, "break", "continue", "break/continue")

    def visit_Continue(self, node):
        self._add(node.lineno, node.col_offset, "continue", "break", "break/continue")

    def _swap_keys(self, keys: list[tuple[int, int, str]]):
        """Each string key read in a function becomes the next other key read there."""
        distinct = list(dict.fromkeys(text for _, _, text in keys))
        if len(distinct) < 2:
            return
        for line, col, text in keys:
            other = distinct[(distinct.index(text) + 1) % len(distinct)]
            self._add(line, col, text, other, "wrong key")


def _is_text(node: ast.AST) -> bool:
    """A string literal, an f-string, or a sum with one: ``+`` there joins text (a crash when
    swapped, which no test needs to be written for)."""
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, ast.BinOp) and (_is_text(node.left) or _is_text(node.right))


def _blank_comments(text: str) -> str:
    return re.sub(r"#[^\n]*", lambda m: " " * len(m.group()), text)


def _is_type_checking(test: ast.AST) -> bool:
    return isinstance(test, ast.Name | ast.Attribute) and "TYPE_CHECKING" in ast.unparse(test)


def _is_main_guard(test: ast.AST) -> bool:
    return "__name__" in ast.unparse(test)


def mutants_of(path: str, source: str) -> list[Mutant]:
    """Every mutant of one module's source, in the order of the file."""
    collector = _Collector(path, source)
    collector.visit(ast.parse(source))
    unique = {(m.line, m.col, m.original, m.replacement): m for m in collector.mutants}
    return sorted(unique.values(), key=lambda m: (m.line, m.col, m.replacement))


def changed_lines(root: Path, path: str, since: str) -> set[int]:
    """The lines of ``path`` that differ from revision ``since`` (all lines of a new file)."""
    diff = subprocess.run(
        ["git", "diff", "-U0", since, "--", path],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines: set[int] = set()
    for match in re.finditer(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", diff, re.M):
        start, count = int(match.group(1)), int(match.group(2) or 1)
        lines.update(range(start, start + count))
    return lines


def tests_for(root: Path, path: str) -> list[str]:
    """The tests of a module's folder: ``cbasr/<area>/...`` -> ``tests/<area>``,
    ``cbasr/<module>.py`` -> ``tests/test_<module>.py``, ``scripts/<x>.py`` ->
    ``tests/scripts``; the whole ``tests`` folder where none matches."""
    parts = Path(path).parts
    candidates = []
    if parts[0] == "cbasr" and len(parts) > 2:
        candidates.append(Path("tests", parts[1]))
    elif parts[0] == "cbasr":
        candidates.append(Path("tests", "test_" + Path(parts[1]).stem.lstrip("_") + ".py"))
    elif parts[0] == "scripts":
        candidates.append(Path("tests", "scripts"))
    found = [str(c) for c in candidates if (root / c).exists()]
    return found or ["tests"]


# ---- running -------------------------------------------------------------------------------


def _copy_tree(root: Path, target: Path) -> None:
    """The tracked files, with mtimes kept and ``cbasr``'s ``__pycache__`` (numba's on-disk
    kernel cache checks the source's mtime; a copy that kept none would compile them again)."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = root / name.decode()
        if source.is_file():
            (target / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name.decode())
    for cache in (root / "cbasr").rglob("__pycache__"):
        shutil.copytree(cache, target / cache.relative_to(root), dirs_exist_ok=True)
    # a repository of its own, as the checkout is one (tests read `git ls-files`)
    git = ["git", "-c", "user.name=mutate", "-c", "user.email=mutate@localhost"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "unmutated"]):
        subprocess.run(git + command, cwd=target, check=True, capture_output=True)


def _environment(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    env["PYTEST_ADDOPTS"] = ""
    return env


def _pytest(tree: Path, args: list[str], timeout: float | None) -> tuple[str, float, str]:
    """Run pytest in ``tree``: ``("passed" | "failed" | "timeout", seconds, output's end)``."""
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    start = time.monotonic()
    try:
        run = subprocess.run(
            command + args,
            cwd=tree,
            env=_environment(tree),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - start, ""
    seconds = time.monotonic() - start
    # 5: no test selected; any other failure, a collection error included, is a caught bug
    status = "passed" if run.returncode in (0, 5) else "failed"
    return status, seconds, (run.stdout + run.stderr)[-3000:]


def _clear_bytecode(tree: Path, path: str) -> None:
    """Python's and numba's caches of one module: a mutant of the same size written in the
    same second as the last would otherwise be served the last one's bytecode."""
    source = tree / path
    cache = source.parent / "__pycache__"
    if cache.is_dir():
        for entry in cache.iterdir():
            if entry.name.startswith(source.stem + "."):
                entry.unlink()


COVERAGE_PLUGIN = """
import coverage
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)
    yield
"""


def covering_tests(tree: Path, paths: list[str], tests: list[str], markers: str) -> dict:
    """``{path: {line: [test ids]}}`` from one run of ``tests`` under coverage."""
    (tree / "_mutate_contexts.py").write_text(COVERAGE_PLUGIN)
    data_file = tree / ".mutate.coverage"
    command = [
        sys.executable,
        "-m",
        "coverage",
        "run",
        f"--data-file={data_file}",
        "--include=" + ",".join(str(tree / p) for p in paths),
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "_mutate_contexts",
        f"--junitxml={tree / JUNIT}",
        "-m",
        markers,
        *tests,
    ]
    run = subprocess.run(command, cwd=tree, env=_environment(tree), capture_output=True, text=True)
    if run.returncode not in (0, 5):
        sys.exit(f"the unmutated tests fail:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    import coverage

    data = coverage.CoverageData(str(data_file))
    data.read()
    result: dict[str, dict[int, list[str]]] = {}
    for path in paths:
        by_line = data.contexts_by_lineno(str(tree / path))
        result[path] = {
            line: sorted(c for c in contexts if c) for line, contexts in by_line.items()
        }
    return result


JUNIT = ".mutate.junit.xml"
STARTUP = 15.0  # seconds: a pytest run's start (torch's import) and collection


def test_durations(junit: Path) -> dict[str, float]:
    """Seconds per test file (``tests/.../test_x.py``) from the unmutated run's JUnit report."""
    import xml.etree.ElementTree as ElementTree

    seconds: dict[str, float] = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        parts = case.get("classname", "").split(".")
        while parts and parts[-1][:1].isupper():  # a class's tests: its module
            parts.pop()
        name = "/".join(parts) + ".py"
        seconds[name] = seconds.get(name, 0.0) + float(case.get("time") or 0.0)
    return seconds


def selection_time(durations: dict[str, float], tests: list[str]) -> float:
    """The serial time of a selection (folders or files) by the unmutated run's durations."""
    roots = [t.rstrip("/") for t in tests]
    return sum(
        seconds
        for name, seconds in durations.items()
        if any(name == r or name.startswith(r + "/") for r in roots)
    )


@dataclasses.dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed | survived | timeout
    seconds: float
    line: str
    by: str  # "covering" | "all"


def run_mutant(
    tree: Path,
    mutant: Mutant,
    tests: list[str],
    covering: list[str],
    markers: str,
    timeout: float,
) -> Outcome:
    source_file = tree / mutant.path
    original = source_file.read_text()
    mutated = mutant.apply(original)
    source_file.write_text(mutated)
    _clear_bytecode(tree, mutant.path)
    seconds = 0.0
    try:
        if covering:
            status, took, _ = _pytest(tree, ["-m", markers, *covering], timeout)
            seconds += took
            if status != "passed":
                return Outcome(
                    mutant, _killed(status), seconds, mutant.diff_line(original), "covering"
                )
        status, took, _ = _pytest(tree, ["-m", markers, *tests], timeout)
        seconds += took
        return Outcome(mutant, _killed(status), seconds, mutant.diff_line(original), "all")
    finally:
        source_file.write_text(original)
        _clear_bytecode(tree, mutant.path)


def _killed(status: str) -> str:
    return {"passed": "survived", "failed": "killed", "timeout": "timeout"}[status]


def _at(mutant: Mutant, place: str) -> bool:
    """Whether ``mutant`` is at ``place``: ``path:line`` or ``path:line:col``."""
    where = f"{mutant.path}:{mutant.line}:{mutant.col}"
    return where == place or where.startswith(place + ":")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+", help="the modules to mutate (relative to --root)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this)")
    parser.add_argument("--tests", nargs="*", help="the tests to run (default: the folders')")
    parser.add_argument("--markers", default=MARKERS, help=f"pytest -m (default: {MARKERS!r})")
    parser.add_argument("--since", help="mutate only the lines changed since this revision")
    parser.add_argument("--sample", type=int, help="run a random sample of this many mutants")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="copies in parallel")
    parser.add_argument(
        "--timeout",
        type=float,
        default=4.0,
        help="a mutant's limit: this x its selection's time in the unmutated run",
    )
    parser.add_argument(
        "--no-coverage",
        dest="coverage",
        action="store_false",
        help="skip the run under coverage: each mutant runs the whole selection (-x); cheaper "
        "for a few mutants over large folders",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="PATH:LINE[:COL]",
        help="run only the mutants at these places (as the report names them)",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--json", type=Path, help="write every outcome to this JSON file")
    args = parser.parse_args(argv)
    root = args.root.resolve()

    mutants: list[Mutant] = []
    for path in args.paths:
        relative = str((root / path).resolve().relative_to(root))
        source = (root / relative).read_text()
        found = mutants_of(relative, source)
        if args.since:
            lines = changed_lines(root, relative, args.since)
            found = [m for m in found if m.line in lines]
        mutants += found
    if args.only:
        mutants = [m for m in mutants if any(_at(m, place) for place in args.only)]
    if args.sample is not None and args.sample < len(mutants):
        mutants = sorted(
            random.Random(args.seed).sample(mutants, args.sample),
            key=lambda m: (m.path, m.line, m.col),
        )
    sources = {p: (root / p).read_text() for p in {m.path for m in mutants}}
    if args.list or not mutants:
        for m in mutants:
            print(f"{m.name}: {m.diff_line(sources[m.path])}")
        print(f"{len(mutants)} mutants", file=sys.stderr)
        return 0

    paths = sorted(sources)
    selection = {p: args.tests or tests_for(root, p) for p in paths}
    tests = sorted({t for p in paths for t in selection[p]})  # all that any mutant runs
    jobs = max(1, min(args.jobs, len(mutants)))
    print(f"{len(mutants)} mutants of {len(paths)} files; tests: {' '.join(tests)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="cbasr-mutate-") as scratch:
        trees = [Path(scratch, f"tree{n}") for n in range(jobs)]
        for tree in trees:
            _copy_tree(root, tree)
        start = time.monotonic()
        if args.coverage:
            covering = covering_tests(trees[0], paths, tests, args.markers)
        else:
            command = ["-n", "auto", f"--junitxml={trees[0] / JUNIT}", "-m", args.markers]
            status, _, output = _pytest(trees[0], command + tests, None)
            if status != "passed":
                sys.exit(f"the unmutated tests fail: {' '.join(tests)}\n{output}")
            covering = {path: {} for path in paths}
        baseline = time.monotonic() - start
        durations = test_durations(trees[0] / JUNIT)
        limits = {
            p: max(60.0, args.timeout * (STARTUP + selection_time(durations, selection[p])))
            for p in paths
        }
        how = "under coverage" if args.coverage else "without coverage"
        print(
            f"unmutated run {how}: {baseline:.0f} s; a mutant's limit: "
            f"{min(limits.values()):.0f}-{max(limits.values()):.0f} s",
            flush=True,
        )

        free = list(trees)
        outcomes: list[Outcome] = []
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            pending = {}
            queue = list(mutants)
            while queue or pending:
                while queue and free:
                    m = queue.pop(0)
                    tree = free.pop()
                    ids = covering[m.path].get(m.line, [])
                    future = pool.submit(
                        run_mutant, tree, m, selection[m.path], ids, args.markers, limits[m.path]
                    )
                    pending[future] = tree
                done, _ = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for future in done:
                    free.append(pending.pop(future))
                    outcome = future.result()
                    outcomes.append(outcome)
                    print(
                        f"{outcome.status:8} {outcome.seconds:6.1f} s  {outcome.mutant.name}: "
                        f"{outcome.line}",
                        flush=True,
                    )

    outcomes.sort(key=lambda o: (o.mutant.path, o.mutant.line, o.mutant.col))
    survivors = [o for o in outcomes if o.status == "survived"]
    killed = len(outcomes) - len(survivors)
    print(f"\n{killed} of {len(outcomes)} killed; {len(survivors)} survived")
    for o in survivors:
        print(f"  survived  {o.mutant.name}: {o.line}")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {**dataclasses.asdict(o.mutant), "status": o.status, "seconds": o.seconds}
                    | {"mutated_line": o.line, "by": o.by}
                    for o in outcomes
                ],
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
