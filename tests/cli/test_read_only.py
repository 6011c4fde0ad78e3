"""Every command that writes, given a read-only output: one line naming the path, exit 1.

Permission bits bind only processes without ``CAP_DAC_OVERRIDE``: as root (CI and the
development machines run as root), the commands run under ``setpriv`` with that capability
(and ``CAP_DAC_READ_SEARCH``) dropped, so a read-only directory is read-only to them too.
"""

import os
import shutil

import pytest

from tests import commands
from tests.cli.permissions import read_only, unprivileged, writable
from tests.cli.training import BIN, decode_args


@pytest.fixture(scope="module")
def decoded(trained, tone_data, tmp_path_factory):
    """A copy of the trained experiment with its dev split decoded, once for the module."""
    exp = tmp_path_factory.mktemp("read_only") / "exp"
    # without what other tests decoded into copies of the experiment (an up-to-date decoding
    # would be skipped, writing nothing)
    shutil.copytree(trained, exp, ignore=shutil.ignore_patterns("decode", "align"))
    decode = commands.run([str(BIN / "cbasr-decode"), *decode_args(tone_data, exp)])
    assert decode.returncode == 0, decode.stderr[-2000:]
    return exp


@pytest.fixture
def scene(tmp_path, decoded):
    """A copy of the decoded experiment and a read-only directory ``ro``, both read-only once
    the test has built what it needs."""
    shutil.copytree(decoded, tmp_path / "exp")
    (tmp_path / "ro").mkdir()
    yield tmp_path
    writable(tmp_path)  # so that pytest can remove it


def _commands(tone_data, exp, ro):
    corpus, fbank = tone_data / "corpus", tone_data / "fbank"
    return {
        "train": [
            "cbasr-train",
            f"exp_dir={ro / 'exp'}",
            f"data.manifest_dir={corpus}",
            f"data.feature_dir={fbank}",
            f"data.vocab={tone_data / 'lang/phones.txt'}",
            "encoder.hidden=8",
            "encoder.num_layers=1",
            "trainer.max_epochs=1",
        ],
        "decode": ["cbasr-decode", *decode_args(tone_data, exp, "test")],
        "score": ["cbasr-score", "--exp-dir", str(exp), "--splits", "dev"],
        "align": ["cbasr-align", "--exp-dir", str(exp), "--manifest-dir", str(corpus),
                  "--feature-dir", str(fbank), "--splits", "dev"],
        "average": ["cbasr-average", "--exp-dir", str(exp), "--last", "2"],
        "compare": ["cbasr-compare", str(exp), "--csv", str(ro / "results.csv")],
        "export": ["cbasr-export", "--exp-dir", str(exp), "--format", "torchscript",
                   "--out", str(ro / "model.pt")],
        "features": ["cbasr-features", "--manifest-dir", str(corpus), "--out", str(ro / "fbank"),
                     "--workers", "0"],
        "vocab": ["cbasr-vocab", "--manifest", str(corpus / "train.jsonl"),
                  "--out", str(ro / "lang" / "phones.txt")],
        "synth": ["cbasr-synth", "--out", str(ro / "synth"), "--size", "tiny"],
    }  # fmt: skip


@pytest.mark.parametrize(
    "name",
    ["train", "decode", "score", "align", "average", "compare", "export", "features", "vocab",
     "synth"],
)  # fmt: skip
def test_a_read_only_output_ends_in_one_line_naming_it(scene, trained, tone_data, name):
    exp, ro = scene / "exp", scene / "ro"
    command = _commands(tone_data, exp, ro)[name]
    before = sorted(p.relative_to(scene) for p in scene.rglob("*"))
    read_only(scene)
    out = commands.run(
        [*unprivileged(), str(BIN / command[0]), *command[1:]],
        timeout=300,
        env={**os.environ, "CBASR_DEBUG": "0", "HYDRA_FULL_ERROR": "0"},
    )
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = [line for line in out.stderr.strip().splitlines() if "INFO" not in line]
    assert len(lines) == 1, out.stderr[-2000:]
    assert "Permission denied" in lines[0] and str(scene) in lines[0], lines[0]
    # nothing was written, and nothing that was there is gone
    assert sorted(p.relative_to(scene) for p in scene.rglob("*")) == before
