"""recipes/shared/common.sh's decode_splits: one cbasr-decode per split, side by side."""

import os
import subprocess
from pathlib import Path

COMMON = Path(__file__).resolve().parents[2] / "recipes" / "shared" / "common.sh"

# A stand-in for cbasr-decode: records its arguments, fails for the split named "bad".
FAKE_DECODE = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
[[ " $* " != *" --splits bad "* ]] || exit 3
"""


def _decode_splits(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("cbasr-decode", FAKE_DECODE), ("cbasr-train", "#!/bin/sh\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    script = f"""set -euo pipefail
recipe_name=test; stage=0; stop_stage=0
source {COMMON}
decode_splits {" ".join(args)}
echo finished
"""
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(tmp_path / "calls"),
    }
    return subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )


def test_one_process_per_split_with_a_share_of_the_cores(tmp_path):
    done = _decode_splits(tmp_path, "dev", "test", "--", "--exp-dir", "exp/x", "--beam", "8")
    assert done.returncode == 0 and "finished" in done.stdout, done.stderr
    calls = sorted((tmp_path / "calls").read_text().splitlines())
    threads = max(1, len(os.sched_getaffinity(0)) // 2)  # as nproc counts
    assert calls == [
        f"--exp-dir exp/x --beam 8 --splits {split} --num-threads {threads}"
        for split in ("dev", "test")
    ]


def test_a_failing_split_fails_the_stage_after_the_others_finish(tmp_path):
    done = _decode_splits(tmp_path, "bad", "test", "--", "--exp-dir", "exp/x")
    assert done.returncode != 0 and "finished" not in done.stdout
    calls = (tmp_path / "calls").read_text().splitlines()
    assert sorted(call.split("--splits ")[1].split()[0] for call in calls) == ["bad", "test"]


def test_runs_started_in_the_same_second_log_to_their_own_files(tmp_path):
    """A sweep starts several run.sh at once: each keeps its own log under log/."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cbasr-train").write_text("#!/bin/sh\n")
    (bin_dir / "date").write_text("#!/bin/sh\necho 20261126-120000\n")  # one second for all
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = f"""set -euo pipefail
recipe_name=test; stage=0; stop_stage=0
source {COMMON}
echo "run $RUN"
"""
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    runs = [
        subprocess.Popen(
            ["bash", "-c", script],
            cwd=tmp_path,
            env={**env, "RUN": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(3)
    ]
    for run in runs:  # until each run's tee has closed the pipe: its log is complete
        run.communicate(timeout=60)
    assert [run.returncode for run in runs] == [0, 0, 0]
    logs = sorted((tmp_path / "log").glob("run-20261126-120000*.log"))
    assert len(logs) == 3
    assert sorted(log.read_text() for log in logs) == [f"run {i}\n" for i in range(3)]
