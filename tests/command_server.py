"""The warm interpreter behind :func:`tests.commands.run`: imports what cbasr's commands import,
then forks one child per request, which runs the command as a fresh interpreter would.

Protocol (JSON lines): a request on stdin, ``{"argv", "env", "cwd", "stdin", "stdout",
"stderr", "unprivileged"}`` (file paths for the streams; ``unprivileged``: as
:func:`tests.cli.permissions.unprivileged`'s prefix would start it); the replies on stdout, ``{"pid"}`` when the child
has started and ``{"returncode"}`` (negative: the signal) when it has ended. The first line the
server writes is ``{"ready": true}``, or ``{"ready": false, "why"}`` where it cannot fork safely
(more than one thread after the imports).

The child takes the request's working directory, environment, standard streams and
``sys.argv``, then runs the console script's function (``sys.exit(main())``) or, for ``python
-m module``, the module as ``__main__``, and leaves as the interpreter does: an uncaught
exception printed by ``sys.excepthook`` (status 1), ``SystemExit``'s status, non-daemon threads
joined, ``atexit`` handlers run, streams flushed. It does not tear down the modules it did not
import itself: ``os._exit`` after that.
"""

import atexit
import copy
import importlib
import importlib.metadata
import json
import os
import runpy
import signal
import sys
import threading


def _entry_points() -> dict:
    return {
        ep.name: ep
        for ep in importlib.metadata.entry_points(group="console_scripts")
        if ep.value.startswith("cbasr.")
    }


def _warm(entry_points: dict) -> None:
    """Import what the commands import, but not the commands: their modules register Hydra
    configs, OmegaConf resolvers and loggers when imported, which the child of one command must
    not find registered by another. Each child imports its own command module afresh."""
    import logging

    from hydra.core.config_store import ConfigStore
    from omegaconf.basecontainer import BaseContainer

    store = copy.deepcopy(ConfigStore.instance().repo)
    resolvers = dict(BaseContainer._resolvers)
    loggers = set(logging.Logger.manager.loggerDict)
    for ep in entry_points.values():
        importlib.import_module(ep.module)
    for ep in entry_points.values():
        sys.modules.pop(ep.module, None)
    ConfigStore.instance().repo = store
    BaseContainer._resolvers = resolvers
    for name in set(logging.Logger.manager.loggerDict) - loggers:
        del logging.Logger.manager.loggerDict[name]


def _drop_dac_capabilities() -> None:
    """What ``setpriv --inh-caps=-dac_override,-dac_read_search --bounding-set=-...`` gives the
    command it starts as root: neither capability in the bounding, effective, permitted or
    inheritable set, so permission bits bind."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    dac_override, dac_read_search, pr_capbset_drop = 1, 2, 24
    for cap in (dac_override, dac_read_search):
        if libc.prctl(pr_capbset_drop, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]

    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    keep = ~((1 << dac_override) | (1 << dac_read_search)) & 0xFFFFFFFF
    for field in ("effective", "permitted", "inheritable"):
        setattr(data[0], field, getattr(data[0], field) & keep)
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _child(request: dict, entry_points: dict):
    """Become the command: returns the function to run at the top level."""
    if request.get("unprivileged"):
        _drop_dac_capabilities()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in (
        (0, request["stdin"] or os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    argv = request["argv"]
    if os.path.basename(argv[0]) not in entry_points:  # python -m module ...
        module = argv[2]
        sys.modules.pop(module, None)  # run afresh as __main__, as `python -m` does
        sys.argv = [module, *argv[3:]]
        sys.path[0] = os.getcwd()  # as `python -m` puts it
        return lambda: runpy.run_module(module, run_name="__main__", alter_sys=True)
    function = entry_points[os.path.basename(argv[0])].load()
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(argv[0])  # a script's own directory, as Python puts it
    return lambda: sys.exit(function())


def serve() -> object:
    """The request loop; in a child, returns the command to run."""
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # nothing but the replies reaches the client's pipe
    os.close(null)
    entry_points = _entry_points()
    _warm(entry_points)
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads > 1 or threading.active_count() > 1:
        replies.write(json.dumps({"ready": False, "why": f"{threads} threads"}) + "\n")
        replies.flush()
        return None
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            return _child(request, entry_points)
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()
    return None


def _status(code) -> int:
    """The exit status of ``SystemExit(code)``, printing a message as the interpreter does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def exit_as_python(command) -> None:
    try:
        command()
        code = 0
    except SystemExit as stop:
        code = _status(stop.code)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    command = serve()
    if command is not None:
        exit_as_python(command)
