"""tests.commands: a command forked from the warm server is the process ``subprocess.run``
starts, with the environment, working directory and input it was given."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests import commands
from tests.cli.permissions import unprivileged

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # the server refuses to fork with threads


@pytest.fixture(scope="module")
def server():
    warm = commands.Server(ENV)
    assert warm.ready
    yield warm
    warm.close()


def _plain(argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, **kwargs)


@pytest.mark.parametrize(
    "argv",
    [
        [sys.executable, "-m", "cbasr.cli.train"],  # Hydra's refusal of missing options
        [str(commands.BIN / "cbasr-score"), "--ref", "nowhere.trn", "--hyp", "nowhere.trn"],
        [str(commands.BIN / "cbasr-models"), "--help"],
        # Hydra's help lists the config groups each command registers when imported
        [str(commands.BIN / "cbasr-train"), "-m", "--help"],  # a script's own -m: Hydra's sweep
        [str(commands.BIN / "cbasr-train-lm"), "--help"],
    ],
    ids=["module", "script-error", "script-help", "script-m", "script-lm"],
)
def test_a_forked_command_ends_as_the_subprocess_does(server, argv, tmp_path):
    forked = server.run(argv, ENV, cwd=tmp_path, timeout=120)
    plain = _plain(argv, cwd=tmp_path, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )
    assert plain.returncode != 0 or plain.stdout


def test_the_child_has_the_request_s_directory_environment_input_and_its_own_pid(server, tmp_path):
    (tmp_path / "probe.py").write_text(
        textwrap.dedent(
            """
            import os, sys
            print(os.getcwd(), os.environ.get("CBASR_PROBE"), sys.stdin.read().strip(), os.getpid())
            print(sys.argv[1:], file=sys.stderr)
            sys.exit(3)
            """
        )
    )
    env = {**ENV, "CBASR_PROBE": "on"}
    out = server.run([sys.executable, "-m", "probe", "a", "b"], env, cwd=tmp_path, input="in\n")
    where, probe, given, pid = out.stdout.split()
    assert (out.returncode, where, probe, given) == (3, str(tmp_path), "on", "in")
    assert int(pid) not in (os.getpid(), server.process.pid)
    assert out.stderr == "['a', 'b']\n"
    again = server.run([sys.executable, "-m", "probe"], ENV, cwd=tmp_path)
    assert again.stdout.split()[1] == "None"  # nothing of one request reaches the next


def test_an_uncaught_exception_prints_its_traceback_and_exits_1(server, tmp_path):
    (tmp_path / "boom.py").write_text("raise ValueError('boom')\n")
    out = server.run([sys.executable, "-m", "boom"], ENV, cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.startswith("Traceback") and out.stderr.endswith("ValueError: boom\n")


def test_a_command_past_its_timeout_is_killed(server, tmp_path):
    (tmp_path / "wait.py").write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        server.run([sys.executable, "-m", "wait"], ENV, cwd=tmp_path, timeout=0.5)
    assert server.run([sys.executable, "-m", "cbasr.cli.train"], ENV, timeout=120).returncode


def test_only_run_time_variables_may_differ_from_the_server_s_environment(server):
    assert server.warm_for({**ENV, "CBASR_DEBUG": "1", "HYDRA_FULL_ERROR": "1"})
    assert not server.warm_for({**ENV, "OMP_NUM_THREADS": "2"})
    assert not server.warm_for({k: v for k, v in ENV.items() if k != "PATH"})


def test_other_programs_are_plain_subprocesses():
    assert commands.is_command([commands.BIN / "cbasr-train", "exp_dir=x"])
    assert commands.is_command([sys.executable, "-m", "cbasr.cli.decode"])
    assert not commands.is_command([sys.executable, "-c", "import cbasr"])
    assert not commands.is_command(["setpriv", "--", commands.BIN / "cbasr-train"])
    before = dict(commands.started)
    assert commands.run([sys.executable, "-c", "print(7)"]).stdout == "7\n"
    assert commands.started["cold"] == before["cold"] + 1


@pytest.mark.skipif(os.geteuid() != 0, reason="permission bits bind without root anyway")
def test_an_unprivileged_command_meets_the_permission_bits_as_under_setpriv(server, tmp_path):
    (tmp_path / "closed").mkdir(mode=0o000)
    argv = [str(commands.BIN / "cbasr-vocab"), "--manifest", str(tmp_path / "closed/x.jsonl")]
    argv += ["--out", str(tmp_path / "phones.txt")]
    forked = server.run(argv, ENV, unprivileged=True, timeout=120)
    plain = _plain([*unprivileged(), *argv], timeout=120)
    assert (forked.returncode, forked.stderr) == (plain.returncode, plain.stderr)
    assert "Permission denied" in plain.stderr
    root = server.run(argv, ENV, timeout=120)
    assert "Permission denied" not in root.stderr  # root's capabilities ignore the bits
