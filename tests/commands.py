"""cbasr's commands started from tests as a user starts them, without the interpreter's start-up
each time.

:func:`run` is ``subprocess.run(argv, capture_output=True, text=True, ...)`` for a cbasr console
script (``.../bin/cbasr-train ...``) or ``python -m cbasr...``: the command is a child process
with its own pid, exit status, standard streams, environment and working directory, but it is
forked from a server (:mod:`tests.command_server`, one per test process) that imported torch,
Hydra and cbasr once. Where that could change what the command does, it is a plain subprocess:
any other program, an environment that differs from the server's in a variable other than those
read while a command runs (:data:`RUNTIME_ENV`: imported libraries read the rest when they are
imported), or a server that could not start. A command behind
:func:`tests.cli.permissions.unprivileged`'s ``setpriv`` prefix is forked without the
capabilities that prefix drops.
"""

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.cli.permissions import unprivileged

BIN = Path(sys.executable).parent

# read while a command runs, not when a module is imported (cbasr's own switches, Hydra's
# traceback switch, pytest's current-test name)
RUNTIME_ENV = ("CBASR_", "HYDRA_FULL_ERROR", "PYTEST_CURRENT_TEST")


class Server:
    """The warm server of one test process; ``env``: its environment (default: this process's)."""

    def __init__(self, env: dict | None = None):
        self.env = dict(os.environ if env is None else env)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.command_server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[1],
            env=self.env,
        )
        self._pending = b""
        self.ready = (self._reply(None) or {"ready": False})["ready"]
        if not self.ready:
            self.close()

    def warm_for(self, env: dict) -> bool:
        """Whether a command with environment ``env`` starts here as it would on its own."""
        if not self.ready or self.process.poll() is not None:
            return False
        keys = set(env) | set(self.env)
        changed = {k for k in keys if env.get(k) != self.env.get(k)}
        return all(k.startswith(RUNTIME_ENV) for k in changed)

    def run(
        self, argv, env, cwd=None, input=None, timeout=None, unprivileged=False
    ) -> subprocess.CompletedProcess:
        """Fork ``argv`` (a console script or ``python -m module``) with ``env`` in ``cwd``;
        ``unprivileged``: without the capabilities that let root ignore permission bits."""
        with tempfile.TemporaryDirectory(prefix="cbasr-command-") as tmp:
            paths = {name: os.path.join(tmp, name) for name in ("stdin", "stdout", "stderr")}
            if input is not None:
                Path(paths["stdin"]).write_text(input)
            request = {
                "argv": [str(a) for a in argv],
                "env": env,
                "cwd": str(cwd or os.getcwd()),
                "stdin": paths["stdin"] if input is not None else None,
                "stdout": paths["stdout"],
                "stderr": paths["stderr"],
                "unprivileged": unprivileged,
            }
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            pid = self._reply(None)["pid"]
            ended = self._reply(timeout)
            if ended is None:
                os.kill(pid, 9)
                self._reply(None)
                raise subprocess.TimeoutExpired(argv, timeout)
            returncode = ended["returncode"]
            out, err = (Path(paths[k]).read_text(errors="replace") for k in ("stdout", "stderr"))
        return subprocess.CompletedProcess(list(argv), returncode, out, err)

    def _reply(self, timeout) -> dict | None:
        """The server's next line, or None at its end or after ``timeout`` seconds."""
        fd = self.process.stdout.fileno()
        while b"\n" not in self._pending:
            if not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


_server: Server | None = None
started = {"warm": 0, "cold": 0}  # how the commands of this process were started


def is_command(argv) -> bool:
    """A cbasr console script or ``python -m cbasr...``: what :func:`run` can fork."""
    argv = [str(a) for a in argv]
    if Path(argv[0]).parent == BIN and Path(argv[0]).name.startswith("cbasr-"):
        return True
    return argv[0] == sys.executable and argv[1:2] == ["-m"] and argv[2].startswith("cbasr.")


def run(argv, *, env=None, cwd=None, input=None, timeout=None) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, input=input,
    timeout=timeout)``, forked from the warm server where that starts the same process."""
    global _server
    env = dict(os.environ if env is None else env)
    prefix = unprivileged() if Path(str(argv[0])).name == "setpriv" else []
    dropped = bool(prefix) and [str(a) for a in argv[: len(prefix)]] == prefix
    if is_command(argv[len(prefix) :] if dropped else argv):
        if _server is None:
            _server = Server()
            atexit.register(_server.close)
        if _server.warm_for(env):
            started["warm"] += 1
            command = argv[len(prefix) :] if dropped else argv
            return _server.run(command, env, cwd, input, timeout, unprivileged=dropped)
    started["cold"] += 1
    return subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        input=input,
        timeout=timeout,
    )
