"""scripts/mutate.py: the mutants it writes, the tests it picks, and a run on a tiny project."""

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import mutate  # noqa: E402

SOURCE = textwrap.dedent(
    '''\
    """Module docstring: 1 < 2 is not mutated."""
    from pathlib import Path


    def pick(record, root, limit=3):
        """Docstring with "quotes" and 0."""
        if record["per"] < limit and root:
            return Path(root).resolve() / record["audio"]
        if not record.get("verified"):
            raise ValueError(f"unverified: {record['id']}")
        total = 0
        for n in range(limit):
            total += n * 2
            if total >= 10:
                break
        print("done", total)
        check(record)
        return max(total, 1) == 7  # pragma: no mutate


    def check(record):
        return record is None
    '''
)


def _mutated(mutants, operator):
    return sorted(m.diff_line(SOURCE) for m in mutants if m.operator == operator)


def test_mutants_cover_each_operator_and_leave_docstrings_alone():
    mutants = mutate.mutants_of("pkg/mod.py", SOURCE)
    assert 'if record["per"] <= limit and root:' in _mutated(mutants, "compare")
    assert "return record is not None" in _mutated(mutants, "compare")
    assert 'if record["per"] < limit or root:' in _mutated(mutants, "boolean")
    assert 'if record.get("verified"):' in _mutated(mutants, "not dropped")
    assert 'return Path(root) / record["audio"]' in _mutated(mutants, "step dropped")
    assert "pass" in _mutated(mutants, "raise dropped")
    assert _mutated(mutants, "call dropped") == ["pass"]  # check(record); print is left alone
    assert "total -= n * 2" in _mutated(mutants, "arithmetic")
    assert "total += n / 2" in _mutated(mutants, "arithmetic")
    assert "if total >= 11:" in _mutated(mutants, "off by one")
    assert "total = 1" in _mutated(mutants, "off by one")
    assert "continue" in _mutated(mutants, "break/continue")
    assert "if not (root):" not in _mutated(mutants, "negated condition")  # inside a BoolOp
    # a key read in the function becomes another key read there
    wrong = _mutated(mutants, "wrong key")
    assert 'if record["audio"] < limit and root:' in wrong
    assert 'if not record.get("per"):' in wrong
    lines = {m.line for m in mutants}
    assert 1 not in lines and 6 not in lines  # docstrings
    assert 18 not in lines  # pragma: no mutate
    assert 10 not in {m.line for m in mutants if m.operator != "raise dropped"}  # f-string
    assert all(m.line != 16 for m in mutants)  # print


def test_each_mutant_is_valid_python_differing_at_its_place_only():
    mutants = mutate.mutants_of("pkg/mod.py", SOURCE)
    assert len(mutants) > 15
    before = SOURCE.splitlines()
    for m in mutants:
        after = m.apply(SOURCE)
        ast.parse(after)
        changed = [n + 1 for n, (a, b) in enumerate(zip(before, after.splitlines())) if a != b]
        assert changed == [m.line], m
    with pytest.raises(ValueError, match="expected"):
        mutants[0].apply(SOURCE.replace("def pick(", "def pick_one("))


def test_module_level_tables_are_data_and_scalars_are_not():
    source = (
        "CHUNK = 1 << 20\n"
        "COUNTS = {'dev': Subset(31, 1089), 'test': (12, 2620)}\n"
        "NAMES = [1, 2]\n"
        "def f(x):\n"
        "    table = {'a': 3}\n"
        "    return x[table['a']] + 1\n"
    )
    lines = {m.line for m in mutate.mutants_of("m.py", source)}
    assert lines == {1, 5, 6}


def test_negated_condition_and_while():
    source = "def f(x, flag):\n    while flag:\n        x -= 1\n    if x.ok():\n        return 1\n"
    lines = _mutated_lines(source, "negated condition")
    assert lines == ["if not (x.ok()):", "while not (flag):"]


def _mutated_lines(source, operator):
    return sorted(
        m.diff_line(source) for m in mutate.mutants_of("m.py", source) if m.operator == operator
    )


def test_tests_for_mirrors_the_package(tmp_path):
    (tmp_path / "tests" / "inference").mkdir(parents=True)
    (tmp_path / "tests" / "test_checks.py").write_text("")
    assert mutate.tests_for(tmp_path, "cbasr/inference/grid.py") == ["tests/inference"]
    assert mutate.tests_for(tmp_path, "cbasr/checks.py") == ["tests/test_checks.py"]
    assert mutate.tests_for(tmp_path, "cbasr/_backends.py") == ["tests"]  # no test_backends.py
    assert mutate.tests_for(tmp_path, "cbasr/lm/arpa.py") == ["tests"]  # no tests/lm


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def _project(root: Path) -> None:
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text(
        "def clip(x, top):\n"
        "    if x > top:\n"
        "        return top\n"
        "    return x\n"
        "\n"
        "\n"
        "def shift(x):\n"
        "    return x + 1\n"
    )
    (root / "tests" / "pkg").mkdir(parents=True)
    (root / "tests" / "pkg" / "test_mod.py").write_text(
        "from pkg.mod import clip, shift\n"
        "\n"
        "\n"
        "def test_clip():\n"
        "    assert clip(5, 3) == 3 and clip(1, 3) == 1\n"
        "\n"
        "\n"
        "def test_shift():\n"
        "    assert shift(0) == 1\n"
    )
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")


@pytest.mark.parametrize("coverage", [True, False], ids=["coverage", "no-coverage"])
def test_a_run_kills_what_the_tests_catch_and_lists_the_survivors(tmp_path, capsys, coverage):
    _project(tmp_path)
    out = tmp_path / "outcomes.json"
    command = ["pkg/mod.py", "--root", str(tmp_path), "--jobs", "2", "--json", str(out)]
    assert mutate.main(command + ([] if coverage else ["--no-coverage"])) == 0
    outcomes = {
        (o["line"], o["replacement"]): (o["status"], o["by"]) for o in json.loads(out.read_text())
    }
    # with coverage a killed mutant is caught by the tests that run its line; a survivor (and
    # every mutant without coverage) runs the whole selection
    covering = "covering" if coverage else "all"
    assert outcomes == {
        (2, ">="): ("survived", "all"),  # clip(3, 3) is not tested: the boundary survives
        (8, "-"): ("killed", covering),
        (8, "0"): ("killed", covering),
    }
    report = capsys.readouterr().out
    assert "survived  pkg/mod.py:2:9 compare: if x >= top:" in report
    # the source was put back in the project and no copy changed it
    assert "if x > top:" in (tmp_path / "pkg" / "mod.py").read_text()


def test_since_keeps_the_changed_lines(tmp_path):
    _project(tmp_path)
    text = (tmp_path / "pkg" / "mod.py").read_text().replace("x + 1", "x + 2")
    (tmp_path / "pkg" / "mod.py").write_text(text)
    assert mutate.changed_lines(tmp_path, "pkg/mod.py", "HEAD") == {8}
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
    assert mutate.changed_lines(tmp_path, "pkg/mod.py", "HEAD~1") == {8}
    assert mutate.changed_lines(tmp_path, "pkg/mod.py", "HEAD") == set()


def test_a_mutants_limit_follows_its_selections_time(tmp_path):
    (tmp_path / "junit.xml").write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.cli.test_a" name="t1" time="2.5"/>'
        '<testcase classname="tests.cli.test_a.TestB" name="t2" time="1.5"/>'
        '<testcase classname="tests.losses.test_c" name="t3" time="10"/>'
        '<testcase classname="tests.test_top" name="t4" time="0.5"/>'
        "</testsuite></testsuites>"
    )
    durations = mutate.test_durations(tmp_path / "junit.xml")
    assert durations == {
        "tests/cli/test_a.py": 4.0,
        "tests/losses/test_c.py": 10.0,
        "tests/test_top.py": 0.5,
    }
    assert mutate.selection_time(durations, ["tests/cli"]) == 4.0
    assert mutate.selection_time(durations, ["tests/cli/", "tests/test_top.py"]) == 4.5
    assert mutate.selection_time(durations, ["tests"]) == 14.5
    assert mutate.selection_time(durations, ["tests/clix"]) == 0.0
