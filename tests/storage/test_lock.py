"""The experiment lock: one run per directory, released by the OS however the holder ends."""

import os
import signal
import subprocess
import sys

import pytest

from cbasr.storage.lock import ExperimentLocked, lock_experiment
from tests import commands

HOLD = (
    "import sys, time; from cbasr.storage.lock import lock_experiment; "
    "lock_experiment(sys.argv[1]); print('held', flush=True); time.sleep(120)"
)


@pytest.fixture
def holder(tmp_path):
    """Another process holding ``tmp_path / 'exp'``'s lock."""
    exp = tmp_path / "exp"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(exp)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    yield exp, proc
    proc.kill()
    proc.wait()


def test_a_second_holder_is_refused_naming_the_directory_and_pid(holder):
    exp, proc = holder
    with pytest.raises(
        ExperimentLocked, match=rf"{exp} is in use by another run \(pid {proc.pid} on "
    ):
        lock_experiment(exp)
    os.kill(proc.pid, signal.SIGKILL)  # killed: the OS releases the lock, nothing stale is left
    proc.wait()
    lock_experiment(exp)
    lock_experiment(exp)  # again in the same process: a no-op


def test_cbasr_train_on_a_directory_in_use_exits_at_once_and_writes_nothing(holder):
    exp, proc = holder
    out = commands.run([sys.executable, "-m", "cbasr.cli.train", f"exp_dir={exp}"], timeout=120)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{exp} is in use by another run (pid {proc.pid} on " in lines[0]
    assert sorted(p.name for p in exp.iterdir()) == [".lock"]  # no .hydra/, no config.json, no log


def test_one_directory_by_a_relative_and_an_absolute_path_is_one_lock(tmp_path, monkeypatch):
    """The same process taking its own lock again through another spelling of the path: no-op,
    not a refusal (flock on a second descriptor of the same file would block)."""
    monkeypatch.chdir(tmp_path)
    lock_experiment("exp_rel")
    lock_experiment(tmp_path / "exp_rel")
    lock_experiment(os.path.join("exp_rel", os.pardir, "exp_rel"))
