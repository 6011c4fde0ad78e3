"""cbasr-train-lm: train (or resume) an LSTM token language model; a Hydra app over
``conf/train_lm.yaml`` and ``conf/lm/``.

    cbasr-train-lm exp_dir=exp/lm data.train=data/synth/train.jsonl data.valid=data/synth/dev.jsonl \\
        data.vocab=data/lang/phones.txt lm.hidden=128 trainer.max_epochs=8

Running the same command again in the same ``exp_dir`` resumes after the last finished epoch.
Use the result with ``cbasr-decode --beam N --lm exp/lm --lm-weight W``.
"""

import logging

import hydra
from omegaconf import DictConfig

from cbasr.cli.common import one_line_errors
from cbasr.config import CONF_DIR, to_typed
from cbasr.config.lm_schema import register_lm_configs

register_lm_configs()
log = logging.getLogger("cbasr-train-lm")


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train_lm")
@one_line_errors("cbasr-train-lm")
def main(cfg: DictConfig) -> None:
    from cbasr.training.lm_task import train_lm  # after Hydra has set up logging

    log.info("language model %s", cfg.exp_dir)
    history = train_lm(to_typed(cfg))
    if history:
        log.info(
            "done: validation perplexity %.3f after epoch %d",
            history[-1]["valid_ppl"],
            history[-1]["epoch"],
        )


if __name__ == "__main__":
    main()
