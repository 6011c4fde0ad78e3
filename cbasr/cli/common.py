"""Shared set-up for the entry points: logging, and the experiment lock of the Hydra apps."""

import functools
import logging
import os
import sys

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import OmegaConf

from cbasr.storage.lock import ExperimentLocked, lock_experiment

__all__ = ["setup_logging", "ExperimentLockCallback", "one_line_errors", "DEBUG_ENV"]

DEBUG_ENV = "CBASR_DEBUG"  # set to 1: a fatal error shows its full traceback


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


class ExperimentLockCallback(Callback):
    """Before Hydra writes anything into the experiment directory (``.hydra/``, the log): exit
    with one line naming the required options not given, then take the directory's lock, so a
    second run on a directory in use exits at once, changing nothing. Under ``torchrun`` only
    rank 0 takes the lock. Named in ``hydra.callbacks`` of the app's config.

    Hydra turns an exception raised here into a warning, so every refusal is an exit."""

    def _check_required(self, config) -> None:
        prog = os.path.basename(sys.argv[0])
        job = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
        missing = sorted(OmegaConf.missing_keys(job))
        if missing:
            print(
                f"{prog}: required options not given: {', '.join(missing)} "
                f"(add them as key=value, e.g. {missing[0]}=...)",
                file=sys.stderr,
            )
            sys.exit(2)

    def _lock(self, directory) -> None:
        if os.environ.get("RANK", "0") != "0":
            return
        prog = os.path.basename(sys.argv[0])
        try:
            lock_experiment(directory)
        except ExperimentLocked as error:
            print(f"{prog}: {error}", file=sys.stderr)
            sys.exit(1)
        except OSError as error:  # a read-only or misplaced exp_dir: before Hydra writes there
            print(f"{prog}: {type(error).__name__}: {error} (exp_dir)", file=sys.stderr)
            sys.exit(1)

    def on_run_start(self, config, **kwargs) -> None:
        self._check_required(config)
        self._lock(config.hydra.run.dir)

    def on_multirun_start(self, config, **kwargs) -> None:
        self._check_required(config)

    def on_job_start(self, config, **kwargs) -> None:
        """A sweep's job: its own directory (Hydra has written its ``.hydra/`` by now)."""
        if config.hydra.mode == RunMode.MULTIRUN:
            self._lock(config.hydra.runtime.output_dir)


def one_line_errors(prog: str):
    """Decorate an entry point so that a fatal error ends it with one line, ``<prog>: <Type>:
    <message>`` (the message names the file, option or utterance), on stderr and appended to
    the run's log files (``train.log``), and exit status 1; ``CBASR_DEBUG=1`` re-raises it with
    the full traceback instead."""

    def decorate(main):
        @functools.wraps(main)
        def run(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except Exception as error:
                line = f"{prog}: {type(error).__name__}: {error}"
                record = logging.LogRecord(prog, logging.ERROR, __file__, 0, line, None, None)
                for handler in logging.getLogger().handlers:
                    if isinstance(handler, logging.FileHandler):
                        handler.handle(record)
                        handler.flush()
                if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
                    raise
                print(line + f" (set {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
                sys.exit(1)

        return run

    return decorate
