"""A fatal error ends a training command with one line naming its cause, also in train.log."""

import errno
import os
import subprocess
import sys

import pytest

from cbasr.storage.files import atomic_write


def _train(tmp_path, debug: bool):
    env = {**os.environ, "CBASR_DEBUG": "1" if debug else "0"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cbasr.cli.train",
            f"exp_dir={tmp_path / 'exp'}",
            f"data.vocab={tmp_path / 'missing.txt'}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_a_missing_input_is_one_line_on_stderr_and_in_train_log(tmp_path):
    out = _train(tmp_path, debug=False)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert lines == [
        f"cbasr-train: FileNotFoundError: {tmp_path / 'missing.txt'} not found (data.vocab) "
        "(set CBASR_DEBUG=1 for the traceback)"
    ]
    log = (tmp_path / "exp" / "train.log").read_text()
    assert (
        f"cbasr-train: FileNotFoundError: {tmp_path / 'missing.txt'} not found (data.vocab)" in log
    )


def test_the_debug_flag_shows_the_traceback(tmp_path):
    out = _train(tmp_path, debug=True)
    assert out.returncode == 1 and "Traceback" in out.stderr


def test_a_failed_write_names_the_file(tmp_path):
    def full_disk(f):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match=r"No space left on device: '.*score.json'"):
        atomic_write(tmp_path / "score.json", full_disk)
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind
