"""cbasr-train: train (or resume) an experiment; a Hydra app over the configs in ``conf/``.

    cbasr-train exp_dir=exp/blstm_ctc encoder.hidden=192 optim.lr=2e-3 trainer.max_epochs=12

Running the same command again in the same ``exp_dir`` resumes where it stopped. The same
command runs on several processes (GPUs, or CPU processes with gloo) under ``torchrun``:

    torchrun --nproc_per_node=4 $(which cbasr-train) exp_dir=exp/blstm_ctc ...

A sweep (Hydra's multirun) trains one experiment per combination, each in its own directory
below ``exp_dir`` named by its overrides:

    cbasr-train -m exp_dir=exp/sweep encoder.hidden=128,256 optim.lr=1e-3,2e-3
    # -> exp/sweep/encoder.hidden=128,optim.lr=1e-3, ... (rerunning resumes each)
"""

import logging
import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from cbasr.cli.common import one_line_errors
from cbasr.config import CONF_DIR, to_typed
from cbasr.config.schema import register_configs

register_configs()
log = logging.getLogger("cbasr-train")


def swept_keys(argv: list[str]) -> list[str]:
    """The options a command line sweeps (``key=a,b``, ``key=range(...)``, ...)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    candidates = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(candidates)
    except Exception:  # Hydra reports a malformed override itself
        return []
    return [o.key_or_group for o in parsed if o.is_sweep_override()]


def sweep_name(task: list[str], job_num: int) -> str:
    """A sweep job's directory name: its values of the swept options (``encoder.hidden=128,
    optim.lr=1e-3``), or its number when nothing is swept."""
    keys = swept_keys(sys.argv[1:])
    chosen = [o for o in task if o.split("=", 1)[0].lstrip("+~") in keys]
    return ",".join(chosen) or str(job_num)


OmegaConf.register_new_resolver("cbasr_sweep_name", sweep_name, replace=True)


def _quiet_other_ranks() -> None:
    """Under torchrun, only process 0 writes ``train.log`` and logs below warnings."""
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        return
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
            handler.close()
    root.setLevel(logging.WARNING)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
@one_line_errors("cbasr-train")
def main(cfg: DictConfig) -> None:
    from cbasr.training.asr_task import train  # after Hydra has set up logging

    _quiet_other_ranks()
    config = to_typed(cfg)  # typed from here into the loop
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:  # this job's own directory below the sweep's exp_dir
        config.exp_dir = hydra_cfg.runtime.output_dir
    log.info("experiment %s", config.exp_dir)
    train(config)


if __name__ == "__main__":
    main()
