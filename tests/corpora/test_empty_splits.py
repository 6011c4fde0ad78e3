"""Every ``cbasr-prepare`` corpus: a split of which no utterance is usable exits 1 with one line
naming the split, the count skipped and the most common reason with an example, and leaves no
``.done`` to be trusted by a rerun."""

import gzip
import json

import pytest

from cbasr.cli import prepare
from cbasr.corpora.prepare import EmptySplitError, empty_split_error
from tests.corpora.fake_gigaword import make_fake_gigaword
from tests.corpora.fake_librispeech import make_fake_librispeech
from tests.corpora.fake_speechocean762 import make_fake_speechocean762
from tests.corpora.fake_timit import make_fake_timit
from tests.corpora.fake_wsj import make_fake_wsj, make_fake_wsj_lm

TOO_SHORT = ["--max-duration", "0.01"]  # every fake utterance is longer


def _timit(root):
    make_fake_timit(root / "c")
    return ["timit", "--corpus-dir", str(root / "c"), "--allow-partial", *TOO_SHORT]


def _wsj(root):
    make_fake_wsj(root / "c")
    return ["wsj", "--corpus-dir", str(root / "c"), "--allow-partial", *TOO_SHORT]


def _librispeech(root):
    corpus = make_fake_librispeech(root / "c")
    return ["librispeech", "--corpus-dir", str(corpus), "--allow-partial", *TOO_SHORT]


def _speechocean762(root):
    make_fake_speechocean762(root / "c")
    corpus = ["--corpus-dir", str(root / "c"), "--allow-partial", "--dev-speakers", "1"]
    return ["speechocean762", *corpus, *TOO_SHORT]


def _gigaword(root):
    make_fake_gigaword(root / "c")
    (root / "c" / "org_data" / "dev.src.txt").write_text("\n\n")  # every article empty
    return ["gigaword", "--corpus-dir", str(root / "c"), "--allow-partial"]


def _wsj_lm(root):
    make_fake_wsj_lm(root / "c", per_year=0)  # markup lines only
    return ["wsj-lm", "--corpus-dir", str(root / "c"), "--allow-partial"]


def _lhotse(root):
    cut = {
        "id": "c1",
        "start": 0.0,
        "duration": 1.0,
        "channel": 0,
        "supervisions": [
            {"id": "u1", "recording_id": "r1", "start": 0.0, "duration": 1.0, "text": "a"}
        ],
        "recording": {
            "id": "r1",
            "sources": [{"type": "file", "channels": [0], "source": "/nowhere/gone.wav"}],
            "sampling_rate": 16000,
            "num_samples": 16000,
            "duration": 1.0,
        },
        "type": "MonoCut",
    }
    with gzip.open(root / "cuts.jsonl.gz", "wt") as f:
        f.write(json.dumps(cut) + "\n")
    return ["lhotse", "--manifests", f"train={root / 'cuts.jsonl.gz'}"]


def _kaldi(root):
    (root / "d").mkdir()
    (root / "d" / "wav.scp").write_text("u1 /nowhere/u1.wav\nu2 /nowhere/u2.wav\n")
    (root / "d" / "text").write_text("u1 a\nu2 b\nu3 c\n")
    return ["kaldi", "--data-dir", str(root / "d")]


CORPORA = {
    "timit": (_timit, "split train: no usable utterance, 8 skipped", "above --max-duration"),
    "wsj": (_wsj, "split si84: no usable utterance, 2 skipped", "above --max-duration"),
    "librispeech": (
        _librispeech,
        "split train-clean-5: no usable utterance, 12 skipped",
        "above --max-duration",
    ),
    "speechocean762": (
        _speechocean762,
        "split train: no usable utterance, 12 skipped",
        "above --max-duration",
    ),
    "gigaword": (_gigaword, "split dev: no usable utterance, 2 skipped", "empty article"),
    "wsj-lm": (_wsj_lm, "split lm_train: no usable sentence in 6 text files", "markup"),
    "lhotse": (
        _lhotse,
        "split train: no usable utterance, 1 skipped",
        "/nowhere/gone.wav: no such audio file",
    ),
    "kaldi": (
        _kaldi,
        "split d: no usable utterance, 3 skipped; the most common reason (2 of 3), e.g. u1: "
        "/nowhere/u1.wav: no such audio file",
        "",
    ),
}


@pytest.mark.parametrize("corpus", sorted(CORPORA))
def test_a_split_with_no_usable_utterance_exits_1_naming_it(corpus, tmp_path, caplog):
    make, message, reason = CORPORA[corpus]
    argv = make(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        prepare.main([*argv, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and message in errors[0] and reason in errors[0], errors
    assert not (tmp_path / "out" / ".done").exists()


def test_the_most_common_reason_is_counted_by_kind_not_by_text():
    skipped = [("dev", f"u{n}", f"/a/u{n}.wav: no such audio file") for n in range(3)]
    skipped += [("dev", "v", "empty transcript"), ("train", "w", "empty transcript")]
    error = empty_split_error("dev", skipped)
    assert isinstance(error, EmptySplitError)
    assert str(error) == (
        "split dev: no usable utterance, 4 skipped; the most common reason (3 of 4), e.g. u0: "
        "/a/u0.wav: no such audio file"
    )
    assert str(empty_split_error("test", skipped)) == "split test: no utterances found"
