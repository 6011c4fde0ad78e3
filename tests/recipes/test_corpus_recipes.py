"""Each licensed-corpus recipe end to end on its fake tree: a few utterances, a tiny model, one or two
epochs. Checks the plumbing of every stage, not accuracy.

Whole recipes against fake archives: ``make test-slow`` (and CI) run them; ``make test`` keeps
one layout per corpus (tests/corpora) and the synthetic recipe end to end."""

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpora.fake_gigaword import make_fake_gigaword
from tests.corpora.fake_librispeech import WORDS, fake_archive
from tests.corpora.fake_speechocean762 import make_fake_speechocean762
from tests.corpora.fake_timit import make_fake_timit
from tests.corpora.fake_wsj import arpa_of, make_fake_wsj, make_fake_wsj_lm
from tests.corpora.http_mirror import Mirror

pytestmark = pytest.mark.slow

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
TINY = [
    "encoder.hidden=16",
    "encoder.num_layers=1",
    "trainer.max_epochs=2",
    "trainer.num_threads=1",
    "data.spec_augment.freq_masks=0",
    "data.spec_augment.time_masks=0",
]


def _copy_recipe(name: str, tmp_path: Path) -> Path:
    recipe = tmp_path / name
    recipe.mkdir()
    shutil.copy(RECIPES / name / "run.sh", recipe)
    shutil.copytree(RECIPES / name / "conf", recipe / "conf")
    shutil.copytree(RECIPES / "shared", tmp_path / "shared")
    return recipe


def _run(recipe: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run(
        [str(recipe / "run.sh"), *args], capture_output=True, text=True, env=env, timeout=900
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return run


def test_timit_recipe_end_to_end(tmp_path):
    corpus = make_fake_timit(tmp_path / "corpus")
    recipe = _copy_recipe("timit", tmp_path)
    run = _run(
        recipe,
        "--corpus-dir",
        str(corpus),
        "--allow-partial",
        "--num-mel-bins",
        "40",
        "--deltas",
        "1",
        "--workers",
        "0",
        "--beam",
        "2",
        *TINY,
    )
    for stage in range(7):
        assert f"stage {stage}:" in run.stdout
    exp = recipe / "exp" / "blstm_ctc"
    for name in ("test", "test_beam2"):
        score = json.loads((exp / "decode" / name / "score.json").read_text())
        assert score["utts"] == 6 and score["token_map"].endswith("map_39.txt")
    manifest = [
        json.loads(line) for line in (recipe / "data/timit/test.jsonl").read_text().splitlines()
    ]
    assert score["ref_tokens"] == sum(len(r["phones_39"]) for r in manifest)  # scored on 39 phones
    assert " vcl " not in (exp / "decode" / "test" / "errors.pra").read_text()
    assert json.loads((exp / "config.json").read_text())["encoder"]["hidden"] == 16
    assert (
        len(json.loads((recipe / "data/fbank/cmvn.json").read_text())["mean"]) == 80
    )  # 40 bins + deltas
    assert "onset" in (exp / "align" / "dev" / "alignment.json").read_text()


def test_wsj_recipe_end_to_end(tmp_path):
    """Through the LM stages too: the LM disc's text, a unit LSTM LM trained on it, and beam
    decodings fused with it and with the word trigram (scored at word ends)."""
    corpus = make_fake_wsj(tmp_path / "corpus")
    make_fake_wsj_lm(corpus)
    recipe = _copy_recipe("wsj", tmp_path)
    run = _run(
        recipe,
        "--corpus-dir",
        str(corpus),
        "--allow-partial",
        "--workers",
        "0",
        "--beam",
        "2",
        "--stop-stage",
        "8",
        "--lm-hidden",
        "8",
        "--lm-layers",
        "1",
        "--lm-epochs",
        "1",
        "--lm-valid",  # the fake dev93 spells words with letters si284 lacks
        "data/wsj_lm/lm_train.txt",
        "--lm-weight",  # written 0.5 in the decode directory's name
        "0.50",
        "--word-lm",  # written in lower case by stage 6
        "TCB20ONP",
        "encoder.subsampling=none",
        "data.max_frames=4000",
        *TINY,
    )
    for stage in range(9):
        assert f"stage {stage}:" in run.stdout
    exp = recipe / "exp" / "blstm_ctc_chars"
    score = json.loads((exp / "decode" / "eval92" / "score.json").read_text())
    assert score["utts"] == 2 and "words" in score  # character error rate plus the WER
    dev = json.loads((exp / "decode" / "dev93" / "decode.json").read_text())
    assert dev["utts"] == 2 and dev["failed"] == 1  # the truncated .wv1: an empty hypothesis
    assert len((recipe / "data" / "wsj_lm" / "lm_train.txt").read_text().splitlines()) == 300
    assert (recipe / "exp" / "lm_chars" / "checkpoints" / "best.pt").is_file()
    for tag, words in (("beam2_lm0.5-lm_chars", False), ("beam2_lm0.5-tcb20onp-words", True)):
        decoded = json.loads((exp / "decode" / f"eval92_{tag}" / "decode.json").read_text())
        assert decoded["settings"]["lm"].endswith("lm_chars" if not words else "tcb20onp.arpa.gz")
        assert decoded["settings"].get("lm_words", False) == words
        assert (
            json.loads((exp / "decode" / f"eval92_{tag}" / "score.json").read_text())["utts"] == 2
        )


def test_gigaword_recipe_end_to_end(tmp_path):
    make_fake_gigaword(tmp_path / "giga", "sumdata")
    recipe = _copy_recipe("gigaword", tmp_path)
    run = _run(
        recipe,
        "--corpus-dir",
        str(tmp_path / "giga"),
        "--allow-partial",
        "--sp-size",
        "60",
        "--beam",
        "2",
        "encoder.embedding_dim=8",
        *TINY[:4],
    )
    for stage in range(6):
        assert f"stage {stage}:" in run.stdout
    exp = recipe / "exp" / "cb_pointwise"
    for name in ("test", "test_beam2"):
        score = json.loads((exp / "decode" / name / "score.json").read_text())
        assert (
            set(score["rouge"]) == {"rouge1", "rouge2", "rougeL", "pairs"}
            and score["rouge"]["pairs"] == 2
        )
    assert (exp / "source_vocab.txt").is_file() and "ROUGE-1" in run.stdout


def test_librispeech_recipe_end_to_end(tmp_path):
    """From the download (a local mirror serving fake Mini LibriSpeech archives and a word
    trigram, with the mirror's own sums) to WER with and without the word LM; a second run
    downloads and recomputes nothing."""
    mirror = Mirror()
    try:
        sums = []
        for subset in ("train-clean-5", "dev-clean-2"):
            data = fake_archive(tmp_path, subset)
            mirror.files[f"/31/{subset}.tar.gz"] = data
            sums.append(f"{hashlib.sha256(data).hexdigest()}  {subset}.tar.gz\n")
        (tmp_path / "sums.txt").write_text("".join(sums))
        sentences = [" ".join(WORDS[i : i + 6]) for i in range(0, len(WORDS), 3)]
        mirror.files["/11/3-gram.pruned.1e-7.arpa.gz"] = gzip.compress(
            arpa_of(sentences, 3).encode()
        )
        recipe = _copy_recipe("librispeech", tmp_path)
        args = [
            "--mirror",
            mirror.url,
            "--sums",
            str(tmp_path / "sums.txt"),
            "--allow-partial",
            "--workers",
            "0",
            "--sp-size",
            "30",
            "--beam",
            "2",
            "--stop-stage",
            "7",
            "encoder.d_model=16",
            "encoder.num_heads=2",
            "encoder.ffn_dim=16",
            "encoder.num_layers=1",
            "encoder.kernel_size=3",
            "data.num_workers=0",
            *TINY[2:],
        ]
        run = _run(recipe, *args)
        for stage in range(8):
            assert f"stage {stage}:" in run.stdout
        assert (recipe / "downloads" / "LibriSpeech" / "train-clean-5" / "19" / "121").is_dir()
        manifest = (recipe / "data" / "librispeech" / "train-clean-5.jsonl").read_text()
        assert len(manifest.splitlines()) == 12 and '"gender": "f"' in manifest
        assert (recipe / "data" / "lang" / "sp30.model").is_file()
        exp = recipe / "exp" / "conformer_ctc_mini_sp30"
        assert json.loads((exp / "config.json").read_text())["data"]["valid_split"] == "dev-clean-2"
        for name in (
            "dev-clean-2",
            "dev-clean-2_beam2",
            "dev-clean-2_beam2_lm0.5-3-gram.pruned.1e-7-words",
        ):
            score = json.loads((exp / "decode" / name / "score.json").read_text())
            assert score["utts"] == 6 and score["ref_tokens"] > 0
        decoded = json.loads(
            (
                exp / "decode" / "dev-clean-2_beam2_lm0.5-3-gram.pruned.1e-7-words" / "decode.json"
            ).read_text()
        )
        assert decoded["settings"]["lm"].endswith("downloads/lm/3-gram.pruned.1e-7.arpa.gz")
        requests = len(mirror.requests)
        again = _run(recipe, *args)
        assert len(mirror.requests) == requests  # archives extracted and the LM checked: no request
        assert "already extracted" in again.stdout and "complete, nothing to do" in again.stdout
    finally:
        mirror.close()


def _speechocean762_archive(tmp_path: Path) -> bytes:
    """``speechocean762.tar.gz`` as OpenSLR serves it: ``speechocean762/`` in the published
    layout (tab-separated Kaldi tables, paths relative to the corpus root)."""
    import io
    import tarfile

    root = tmp_path / "archive" / "speechocean762"
    make_fake_speechocean762(root)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(root, arcname="speechocean762")
    return buffer.getvalue()


def test_speechocean762_recipe_end_to_end(tmp_path):
    """From the download (a local mirror serving a fake archive) to PER per age group, phones
    and then sentencepiece words; a second run downloads and recomputes nothing; the phone LM
    (stage 7) and the beam search with it (stage 8)."""
    mirror = Mirror()
    try:
        mirror.files["/101/speechocean762.tar.gz"] = _speechocean762_archive(tmp_path)
        recipe = _copy_recipe("speechocean762", tmp_path)
        args = ["--mirror", mirror.url, "--allow-partial", "--dev-speakers", "1", "--workers",
                "0", "--beam", "2", *TINY]  # fmt: skip
        run = _run(recipe, *args)
        for stage in range(7):
            assert f"stage {stage}:" in run.stdout
        assert (recipe / "downloads" / "speechocean762" / "WAVE" / "SPEAKER0001").is_dir()
        manifest = (recipe / "data" / "so762" / "test.jsonl").read_text().splitlines()
        assert len(manifest) == 6 and '"age_group": "6-12"' in manifest[0]
        exp = recipe / "exp" / "blstm_ctc"
        for name in ("dev", "test", "test_beam2"):
            score = json.loads((exp / "decode" / name / "score.json").read_text())
            assert score["ref_tokens"] > 0 and set(score["by_speaker"])
        score = json.loads((exp / "decode" / "test" / "score.json").read_text())
        assert set(score["by_age_group"]) == {"6-12", "19+"}
        assert sum(g["utts"] for g in score["by_age_group"].values()) == 6
        assert "age_group 6-12:" in run.stdout
        requests = len(mirror.requests)
        again = _run(recipe, *args)
        assert len(mirror.requests) == requests and "already extracted" in again.stdout
        lm = _run(recipe, *args, "--stage", "7", "--stop-stage", "8", "--lm-epochs", "1")
        assert "stage 7:" in lm.stdout and "stage 8:" in lm.stdout
        assert (recipe / "exp" / "lm_phones" / "checkpoints" / "best.pt").is_file()
        fused = exp / "decode" / "test_beam2_lm0.3-lm_phones_bonus1"
        settings = json.loads((fused / "decode.json").read_text())["settings"]
        assert (settings["lm"], settings["lm_weight"], settings["label_bonus"]) == (
            "exp/lm_phones",
            0.3,
            1.0,
        )
        assert json.loads((fused / "score.json").read_text())["ref_tokens"] > 0
        words = _run(recipe, *args, "--stage", "3", "--units", "sp", "--sp-size", "20")
        score = json.loads(
            (recipe / "exp" / "blstm_ctc_sp20" / "decode" / "test" / "score.json").read_text()
        )
        assert score["words"]["ref_tokens"] == sum(
            len(json.loads(r)["words"].split()) for r in manifest
        )
        assert "stage 6:" in words.stdout
    finally:
        mirror.close()
