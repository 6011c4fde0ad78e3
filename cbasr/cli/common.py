"""Shared set-up for the entry points: logging, and the experiment lock of the Hydra apps."""

import logging
import os
import sys

from hydra.experimental.callback import Callback

from cbasr.storage.lock import ExperimentLocked, lock_experiment

__all__ = ["setup_logging", "ExperimentLockCallback"]


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


class ExperimentLockCallback(Callback):
    """Take the experiment directory's lock before Hydra writes anything into it (``.hydra/``,
    the log): a second run on a directory in use exits at once with one line, changing nothing.
    Under ``torchrun`` only rank 0 takes it. Named in ``hydra.callbacks`` of the app's config."""

    def on_run_start(self, config, **kwargs) -> None:
        if os.environ.get("RANK", "0") != "0":
            return
        try:
            lock_experiment(config.hydra.run.dir)
        except ExperimentLocked as error:
            print(f"{os.path.basename(sys.argv[0])}: {error}", file=sys.stderr)
            sys.exit(1)
