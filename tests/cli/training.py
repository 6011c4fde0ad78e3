"""cbasr-train as a user runs it (a subprocess) on the tone corpus of ``tone_data``."""

import os
import subprocess
import sys
from pathlib import Path

from tests import commands

BIN = Path(sys.executable).parent


def train_cli(tone_data, exp, *overrides) -> subprocess.CompletedProcess:
    """A small BLSTM (one layer of 24) trained on ``tone_data``; ``overrides`` are Hydra's
    (``-m`` among them makes it a sweep)."""
    return commands.run(
        train_command(tone_data, exp, *overrides), env={**os.environ, "HYDRA_FULL_ERROR": "0"}
    )


def train_command(tone_data, exp, *overrides) -> list[str]:
    """The command line of :func:`train_cli`, for a test that starts it itself (Popen)."""
    flags = [o for o in overrides if o.startswith("-")]
    overrides = [o for o in overrides if not o.startswith("-")]
    return [
        str(BIN / "cbasr-train"),
        *flags,
        f"exp_dir={exp}",
        f"data.manifest_dir={tone_data / 'corpus'}",
        f"data.feature_dir={tone_data / 'fbank'}",
        f"data.vocab={tone_data / 'lang/phones.txt'}",
        "encoder.hidden=24",
        "encoder.num_layers=1",
        "data.max_frames=1200",
        "optim.lr=5e-3",
        *overrides,
    ]


def decode_args(tone_data, exp, *splits: str) -> list[str]:
    """cbasr-decode's arguments for experiment ``exp`` on ``splits`` of the tone corpus."""
    return [
        "--exp-dir",
        str(exp),
        "--manifest-dir",
        str(tone_data / "corpus"),
        "--feature-dir",
        str(tone_data / "fbank"),
        "--splits",
        *(splits or ("dev",)),
    ]
