"""cbasr-train: train (or resume) an experiment; a Hydra app over the configs in ``conf/``.

    cbasr-train exp_dir=exp/blstm_ctc encoder.hidden=192 optim.lr=2e-3 trainer.max_epochs=12

Running the same command again in the same ``exp_dir`` resumes where it stopped. The same
command runs on several processes (GPUs, or CPU processes with gloo) under ``torchrun``:

    torchrun --nproc_per_node=4 $(which cbasr-train) exp_dir=exp/blstm_ctc ...
"""

import logging
import os

import hydra
from omegaconf import DictConfig

from cbasr.cli.common import one_line_errors
from cbasr.config import CONF_DIR, to_plain
from cbasr.config.schema import register_configs

register_configs()
log = logging.getLogger("cbasr-train")


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
    from cbasr.engines.trainer import train  # after Hydra has set up logging

    _quiet_other_ranks()
    container = to_plain(cfg)
    log.info("experiment %s", cfg.exp_dir)
    train(container, cfg.exp_dir)


if __name__ == "__main__":
    main()
