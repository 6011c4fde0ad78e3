import json
import logging

import pytest
import soundfile
import torch

from cbasr.data.features import (
    FbankOptions,
    FeaturePool,
    FeatureStore,
    compute_fbank,
    extract_split,
    extraction_options,
    frames_of,
    load_cmvn,
    write_cmvn,
)
from tests.fakes import make_tone_corpus

OPTS = FbankOptions(num_mel_bins=23)


def test_fbank_frames_and_resampling():
    wave = torch.randn(16000) * 0.1
    feats = compute_fbank(wave, 16000, OPTS)
    assert feats.shape == (98, 23) == (frames_of(1.0, OPTS), 23)  # 1 + (16000 - 400) // 160
    wave8k = torch.sin(torch.arange(8000) * 0.3) * 0.1
    assert compute_fbank(wave8k, 8000, OPTS).shape[0] == 98  # resampled to 16 kHz first
    assert compute_fbank(torch.zeros(100), 16000, OPTS).shape == (0, 23)


@pytest.fixture
def corpus(tmp_path):
    return make_tone_corpus(tmp_path / "corpus", {"train": 12})


def test_store_returns_what_compute_fbank_gives(corpus, tmp_path):
    summary = extract_split(
        corpus / "train.jsonl", tmp_path / "f", OPTS, workers=0, accumulate_stats=True
    )
    store = FeatureStore(tmp_path / "f")
    records = [json.loads(line) for line in (corpus / "train.jsonl").read_text().splitlines()]
    assert len(store) == summary["kept"] == 12
    all_frames = []
    for r in records:
        wave, sr = soundfile.read(corpus / r["audio"], dtype="float32")
        expected = compute_fbank(torch.from_numpy(wave), sr, OPTS)
        got = store[r["id"]]
        assert got.dtype == torch.float32 and got.shape == expected.shape
        torch.testing.assert_close(got, expected, atol=0.02, rtol=2e-3)  # stored as float16
        all_frames.append(got.double())
    write_cmvn(summary, tmp_path / "cmvn.json")
    mean, std = load_cmvn(tmp_path / "cmvn.json")
    stacked = torch.cat(all_frames)
    torch.testing.assert_close(mean.double(), stacked.mean(0), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(std.double(), stacked.std(0, unbiased=False), atol=1e-4, rtol=1e-4)


def test_parallel_workers_give_the_same_features(corpus, tmp_path):
    extract_split(corpus / "train.jsonl", tmp_path / "a", OPTS, workers=0)
    extract_split(corpus / "train.jsonl", tmp_path / "b", OPTS, workers=2)
    assert (tmp_path / "a/feats.bin").read_bytes() == (tmp_path / "b/feats.bin").read_bytes()
    assert (tmp_path / "a/index.tsv").read_text() == (tmp_path / "b/index.tsv").read_text()


def test_a_shared_pool_serves_several_splits_and_starts_only_when_needed(corpus, tmp_path):
    extract_split(corpus / "train.jsonl", tmp_path / "a", OPTS, workers=0)
    with FeaturePool(2) as pool:
        extract_split(corpus / "train.jsonl", tmp_path / "b", OPTS, pool=pool)
        workers = pool._pool
        assert workers is not None
        extract_split(corpus / "train.jsonl", tmp_path / "c", OPTS, pool=pool)
        assert pool._pool is workers  # the same processes for the second split
    assert pool._pool is None
    for name in "bc":
        assert (tmp_path / name / "feats.bin").read_bytes() == (
            tmp_path / "a/feats.bin"
        ).read_bytes()
    with FeaturePool(2) as idle:  # every split complete: no process started
        extract_split(corpus / "train.jsonl", tmp_path / "c", OPTS, pool=idle)
        assert idle._pool is None


def test_missing_and_corrupt_audio_are_skipped_by_id(corpus, tmp_path, caplog):
    (corpus / "wav/train/train-0003.wav").unlink()
    (corpus / "wav/train/train-0005.wav").write_bytes(b"RIFF garbage")
    with caplog.at_level(logging.WARNING):
        summary = extract_split(corpus / "train.jsonl", tmp_path / "f", OPTS, workers=0)
    assert (summary["kept"], summary["skipped"]) == (10, 2)
    skipped = (tmp_path / "f/skipped.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in skipped] == ["train-0003", "train-0005"]
    assert "skipping utterance train-0003" in caplog.text and "skipped 2 of 12" in caplog.text
    assert "train-0003" not in FeatureStore(tmp_path / "f")


def test_complete_extraction_is_skipped_and_incomplete_redone(corpus, tmp_path, caplog):
    extract_split(corpus / "train.jsonl", tmp_path / "f", OPTS, workers=0)
    stamp = (tmp_path / "f/feats.bin").stat().st_mtime_ns
    with caplog.at_level(logging.INFO):
        extract_split(corpus / "train.jsonl", tmp_path / "f", OPTS, workers=0)
    assert "skipping" in caplog.text and (tmp_path / "f/feats.bin").stat().st_mtime_ns == stamp
    extract_split(corpus / "train.jsonl", tmp_path / "f", FbankOptions(num_mel_bins=40), workers=0)
    assert FeatureStore(tmp_path / "f").dim == 40  # other options: redone
    (tmp_path / "f/.done").unlink()  # as if killed before finishing
    with pytest.raises(FileNotFoundError, match="features incomplete"):
        FeatureStore(tmp_path / "f")
    extract_split(corpus / "train.jsonl", tmp_path / "f", OPTS, workers=0)
    assert FeatureStore(tmp_path / "f").dim == 23


def test_cmvn_needs_frames(tmp_path):
    with pytest.raises(ValueError, match="no frames"):
        write_cmvn({"frames": 0, "sum": [], "sum_sq": []}, tmp_path / "cmvn.json")


def test_deltas_are_appended_and_match_torchaudio():
    import torchaudio

    from cbasr.data.features import FbankOptions, compute_fbank

    wave = torch.sin(torch.arange(8000) * 0.07) * torch.linspace(0.1, 0.9, 8000)
    static = compute_fbank(wave, 16000, FbankOptions(num_mel_bins=23))
    both = compute_fbank(wave, 16000, FbankOptions(num_mel_bins=23, deltas=2))
    assert both.shape == (static.shape[0], 69)
    torch.testing.assert_close(both[:, :23], static)
    delta = torchaudio.functional.compute_deltas(static.t(), win_length=5).t()
    torch.testing.assert_close(both[:, 23:46], delta)
    torch.testing.assert_close(
        both[:, 46:], torchaudio.functional.compute_deltas(delta.t(), win_length=5).t()
    )
    # a hand-worked delta: (2 (x[t+2] - x[t-2]) + (x[t+1] - x[t-1])) / 10 away from the edges
    t = 10
    hand = (2 * (static[t + 2] - static[t - 2]) + (static[t + 1] - static[t - 1])) / 10
    torch.testing.assert_close(both[t, 23:46], hand)


def test_extraction_options_of_a_foreign_feature_directory_name_the_file(tmp_path):
    """A ``.done`` not written by cbasr-features (no recorded options) is refused by name, not
    with a KeyError."""
    (tmp_path / ".done").write_text(json.dumps({"dim": 80, "frames": 10, "kept": 1}))
    with pytest.raises(ValueError, match=r"\.done records no extraction options"):
        extraction_options(tmp_path)
    (tmp_path / ".done").write_text(json.dumps({"params": {"num_mel_bins": 40, "deltas": 1}}))
    assert extraction_options(tmp_path) == FbankOptions(num_mel_bins=40, deltas=1)


def test_normalise_is_the_cmvn_and_with_utterance_mean_each_utterances_own_mean_too():
    from cbasr.data.features import normalise

    g = torch.Generator().manual_seed(0)
    feats = torch.randn(7, 5, generator=g) * 3 + 2
    mean, std = torch.linspace(-1.0, 1.0, 5), torch.full((5,), 2.0)
    torch.testing.assert_close(normalise(feats, mean, std), (feats - mean) / std)
    scaled = (feats - mean) / std
    torch.testing.assert_close(normalise(feats, mean, std, True), scaled - scaled.mean(dim=0))
    assert normalise(feats[:1], mean, std, True).abs().max() == 0  # one frame: its own mean
    assert normalise(feats[:0], mean, std, True).shape == (0, 5)


def test_an_experiment_s_config_says_whether_each_utterance_s_mean_is_subtracted():
    from cbasr.data.features import FbankOptions, FeatureSettings, utterance_mean_of

    assert utterance_mean_of({"data": {"mean_norm": "utterance"}}) is True
    for config in (
        None,
        {},
        {"data": {}},
        {"data": {"mean_norm": "train"}},
        {"mean_norm": "utterance"},
    ):
        assert utterance_mean_of(config) is False
    plain = FeatureSettings(FbankOptions(num_mel_bins=5), torch.zeros(5), torch.ones(5), False)
    assert plain.utterance_mean is False  # experiments trained before data.mean_norm
