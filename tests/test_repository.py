"""The repository stands alone: nothing in it points at files outside it."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELATIVE = re.compile(
    r"(?<![\w.])(?:\.\./)+[\w.-]+"
)  # ../x, ../../x: must stay inside the repository
PAPERS = re.compile(r"papers/[\w.-]+\.txt")  # the papers are cited, not shipped


BUILT = (".venv",)  # made by `make install`: absent from a clone whose tests run another venv


def points_outside(path: Path, line: str) -> bool:
    for match in RELATIVE.finditer(line):
        target = (path.parent / match.group()).resolve()
        if not target.is_relative_to(ROOT):
            return True
        if not target.exists() and target.relative_to(ROOT).parts[:1] != BUILT:
            return True
    return bool(PAPERS.search(line))


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    suffixes = {".py", ".md", ".yaml", ".sh", ".toml", ".txt", ""}
    paths = [ROOT / line for line in out.stdout.splitlines()]
    return [p for p in paths if p.suffix in suffixes and p.is_file() and p != Path(__file__)]


def test_no_file_points_outside_the_repository():
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in tracked_text_files()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if points_outside(path, line)
    ]
    assert found == []
