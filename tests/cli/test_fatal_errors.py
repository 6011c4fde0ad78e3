"""A fatal error ends a training command with one line naming its cause, also in train.log."""

import errno
import os
import sys

import pytest

from cbasr.storage.files import atomic_write
from tests import commands
from tests.cli.permissions import unprivileged
from tests.sweeps import diagonal


def _train(tmp_path, debug: bool):
    env = {**os.environ, "CBASR_DEBUG": "1" if debug else "0"}
    return commands.run(
        [
            sys.executable,
            "-m",
            "cbasr.cli.train",
            f"exp_dir={tmp_path / 'exp'}",
            f"data.vocab={tmp_path / 'missing.txt'}",
        ],
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


@pytest.mark.parametrize(
    "module,required",
    [
        ("cbasr.cli.train", "exp_dir"),
        ("cbasr.cli.train_lm", "data.train, data.valid, data.vocab, exp_dir"),
    ],
)
def test_a_bare_training_command_names_the_required_options(tmp_path, module, required):
    out = commands.run([sys.executable, "-m", module], cwd=tmp_path, timeout=120)
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f": required options not given: {required} (add them as key=value, "
            f"e.g. {required.split(',')[0]}=...)"
        )
    )
    assert "Traceback" not in out.stderr and list(tmp_path.iterdir()) == []


def test_cbasr_results_fails_on_a_directory_that_is_not_an_experiment(tmp_path, capsys):
    from cbasr.cli.results import main

    for path, why in (
        (tmp_path / "nope", "is not an experiment directory"),
        (tmp_path, "no scored decoding (decode/*/score.json) in any"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main([str(path)])
        assert exit_.value.code == 1 and why in capsys.readouterr().err


COMMANDS = [
    [
        "cbasr.cli.decode",
        "--exp-dir",
        "{missing}",
        "--manifest-dir",
        "{missing}",
        "--feature-dir",
        "{missing}",
    ],
    ["cbasr.cli.score", "--exp-dir", "{missing}"],
    [
        "cbasr.cli.align",
        "--exp-dir",
        "{missing}",
        "--manifest-dir",
        "{missing}",
        "--feature-dir",
        "{missing}",
    ],
    ["cbasr.cli.average", "--exp-dir", "{missing}", "--last", "2"],
    ["cbasr.cli.compare", "{missing}"],
    ["cbasr.cli.results", "{missing}"],
    ["cbasr.cli.features", "--manifest-dir", "{missing}", "--out", "{out}"],
    ["cbasr.cli.vocab", "--manifest", "{missing}/train.jsonl", "--out", "{out}/v.txt"],
    ["cbasr.cli.prepare", "timit", "--corpus-dir", "{missing}", "--out", "{out}"],
    ["cbasr.cli.prepare", "wsj", "--corpus-dir", "{missing}", "--out", "{out}"],
    ["cbasr.cli.prepare", "gigaword", "--corpus-dir", "{missing}", "--out", "{out}"],
    ["cbasr.cli.prepare", "kaldi", "--data-dir", "{missing}", "--out", "{out}"],
    ["cbasr.cli.prepare", "lhotse", "--manifests", "train={missing}", "--out", "{out}"],
    ["cbasr.cli.transcribe", "--exp-dir", "{missing}", "a.wav"],
    ["cbasr.cli.export", "--exp-dir", "{missing}", "--format", "onnx", "--out", "{out}/m"],
    ["cbasr.cli.transcribe", "--exp-dir", "{out}", "--list", "{missing}"],
]


def _command_id(command):
    return command[0].rsplit(".", 1)[1] + (
        "_" + command[1] if command[0].endswith("prepare") else ""
    )


# each command once in make test (the three kinds in turn), every (kind, command) in test-slow
@pytest.mark.parametrize(
    "command,kind",
    diagonal(COMMANDS, ["missing", "a regular file", "unreadable"], row_id=_command_id),
)
def test_every_command_on_a_missing_path_ends_in_one_line(tmp_path, command, kind):
    """A missing path; a regular file where a directory (or a file's parent) is expected, with
    the outputs under that regular file; or a directory that cannot be read."""
    out = tmp_path / "out"
    prefix = []
    if kind == "a regular file":
        (tmp_path / "nowhere").write_text("a file, not a directory\n")
        out = tmp_path / "nowhere" / "out"
    elif kind == "unreadable":
        (tmp_path / "nowhere").mkdir(mode=0o000)
        prefix = unprivileged()
    args = [a.format(missing=tmp_path / "nowhere", out=out) for a in command]
    out = commands.run(
        [*prefix, sys.executable, "-m", *args],
        timeout=120,
        env={**os.environ, "CBASR_DEBUG": "0"},
    )
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr[-1500:]
    # one line naming the path (after argparse's usage lines, for an argparse refusal)
    lines = [line for line in out.stderr.strip().splitlines() if "INFO" not in line]
    usage = [i for i, line in enumerate(lines) if line.startswith("usage:")]
    assert len(lines[usage[0] + 1 :] if usage else lines) <= (4 if usage else 1), out.stderr
    assert "nowhere" in lines[-1], out.stderr[-1500:]
    if kind == "unreadable":  # a directory: where a file is expected, it says so
        assert "Permission denied" in lines[-1] or "is not a file" in lines[-1], lines[-1]
