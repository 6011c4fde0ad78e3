"""cbasr-decode keys a decoding by the data it read: an edited transcript or features
extracted again decode again (and the score follows), the same data are skipped, and a missing
manifest directory is an error naming it."""

import json
import logging
import shutil

import pytest

from cbasr.cli import decode, features, score
from tests.inference.fake_experiment import make_experiment


@pytest.fixture
def setup(tone_data, tmp_path):
    """A fake CTC experiment and a private copy of the tone corpus and its dev features."""
    manifests, fbank = tmp_path / "corpus", tmp_path / "fbank"
    shutil.copytree(tone_data / "corpus", manifests)  # audio paths are relative to the manifest
    shutil.copytree(tone_data / "fbank" / "dev", fbank / "dev")
    exp = make_experiment(tmp_path / "exp", tone_data, "pointwise", "ctc")
    return exp, manifests, fbank


@pytest.fixture(autouse=True)
def info_logs(caplog):
    """The decoder logs "skipping" at INFO when a decoding is up to date."""
    caplog.set_level(logging.INFO)


def _decode(exp, manifests, fbank, *extra):
    decode.main(
        [
            "--exp-dir",
            str(exp),
            "--manifest-dir",
            str(manifests),
            "--feature-dir",
            str(fbank),
            "--splits",
            "dev",
            "--num-threads",
            "1",
            *extra,
        ]
    )
    return json.loads((exp / "decode" / "dev" / "decode.json").read_text())


def test_the_same_data_are_skipped_and_an_edited_transcript_decodes_and_scores_again(setup, caplog):
    exp, manifests, fbank = setup
    first = _decode(exp, manifests, fbank)
    assert first["data"]["manifest"] == str((manifests / "dev.jsonl").resolve())
    score.main(["--exp-dir", str(exp), "--splits", "dev"])
    before = json.loads((exp / "decode" / "dev" / "score.json").read_text())

    caplog.clear()
    assert _decode(exp, manifests, fbank)["data"] == first["data"]
    assert "skipping" in caplog.text

    # one utterance's transcript (the model's units: phones) gains a token
    lines = (manifests / "dev.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["phones"] = record["phones"] + record["phones"][:1]
    lines[0] = json.dumps(record)
    (manifests / "dev.jsonl").write_text("\n".join(lines) + "\n")
    caplog.clear()
    second = _decode(exp, manifests, fbank)
    assert "skipping" not in caplog.text
    assert second["data"]["manifest_sha256"] != first["data"]["manifest_sha256"]
    ref = (exp / "decode" / "dev" / "ref.trn").read_text().splitlines()[0]
    assert ref.split("(")[0].split() == record["phones"]
    score.main(["--exp-dir", str(exp), "--splits", "dev"])
    after = json.loads((exp / "decode" / "dev" / "score.json").read_text())
    assert after["ref_tokens"] == before["ref_tokens"] + 1


def test_features_extracted_again_decode_again(setup, caplog):
    exp, manifests, fbank = setup
    first = _decode(exp, manifests, fbank)
    (fbank / "dev" / ".done").unlink()  # the way to make cbasr-features extract a split again
    features.main(
        ["--manifest-dir", str(manifests), "--out", str(fbank), "--splits", "dev"]
        + ["--num-mel-bins", "40", "--workers", "0"]
    )
    caplog.clear()
    second = _decode(exp, manifests, fbank)
    assert "skipping" not in caplog.text
    assert second["data"]["features_done"] != first["data"]["features_done"]


def test_another_manifest_directory_decodes_again(setup, tmp_path, caplog):
    exp, manifests, fbank = setup
    _decode(exp, manifests, fbank)
    other = tmp_path / "other"
    shutil.copytree(manifests, other)
    caplog.clear()
    assert _decode(exp, other, fbank)["data"]["manifest"] == str((other / "dev.jsonl").resolve())
    assert "skipping" not in caplog.text


@pytest.mark.parametrize("decoded_before", [False, True])
def test_a_missing_manifest_directory_is_an_error_naming_it(setup, tmp_path, decoded_before):
    exp, manifests, fbank = setup
    if decoded_before:
        _decode(exp, manifests, fbank)
    missing = tmp_path / "no-such-dir"
    with pytest.raises(SystemExit) as error:
        _decode(exp, missing, fbank)
    assert str(missing) in str(error.value) and "no such directory" in str(error.value)


def test_a_missing_manifest_is_an_error_naming_it(setup):
    exp, manifests, fbank = setup
    (manifests / "dev.jsonl").unlink()
    (manifests / "test.jsonl").write_text("")
    with pytest.raises(SystemExit) as error:
        _decode(exp, manifests, fbank)
    assert str(manifests / "dev.jsonl") in str(error.value)
