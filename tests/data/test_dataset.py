import json
import logging

import pytest
import torch

from cbasr.data.augment import Augmentation
from cbasr.data.dataset import AsrDataset, collate
from cbasr.data.features import FbankOptions, extract_split
from cbasr.data.vocab import Vocabulary
from cbasr.evaluation.delay import gold_ends
from tests.fakes import make_tone_corpus


def _prepare(tmp_path):
    corpus = make_tone_corpus(tmp_path / "corpus", {"train": 8})
    records = [json.loads(line) for line in (corpus / "train.jsonl").read_text().splitlines()]
    records[1]["phones"] = []  # empty transcript
    records[2]["phones"] = ["a", "zz"]  # token outside the vocabulary
    records[3]["audio"] = "wav/train/missing.wav"  # unreadable audio
    (corpus / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    extract_split(corpus / "train.jsonl", tmp_path / "f", FbankOptions(num_mel_bins=20), workers=0)
    return corpus, records


def test_unusable_utterances_are_skipped_with_reasons(tmp_path, caplog):
    corpus, records = _prepare(tmp_path)
    too_short = records[4]["id"]

    def check(num_frames, targets):
        return (
            "too short"
            if records[4]["id"] == too_short
            and len(targets) == len(records[4]["phones"])
            and num_frames < 10_000
            and targets == vocab.encode(records[4]["phones"])
            else None
        )

    vocab = Vocabulary(["a", "b", "c", "d", "e"])
    with caplog.at_level(logging.WARNING):
        ds = AsrDataset(corpus / "train.jsonl", tmp_path / "f", vocab, "phones", check=check)
    reasons = dict(ds.skipped)
    assert reasons[records[1]["id"]] == "empty transcript"
    assert "['zz']" in reasons[records[2]["id"]]
    assert "no features" in reasons[records[3]["id"]]
    assert reasons[too_short] == "too short"
    assert len(ds) == 4 and "skipped 4 of 8" in caplog.text
    utt_id, feats, targets = ds[0]
    assert utt_id == records[0]["id"] and feats.shape[1] == 20
    assert targets.tolist() == vocab.encode(records[0]["phones"])


def test_cmvn_and_collate_padding(tmp_path):
    corpus, _ = _prepare(tmp_path)
    vocab = Vocabulary(["a", "b", "c", "d", "e"])
    raw = AsrDataset(corpus / "train.jsonl", tmp_path / "f", vocab, "phones")
    mean, std = torch.full((20,), 2.0), torch.full((20,), 4.0)
    normed = AsrDataset(corpus / "train.jsonl", tmp_path / "f", vocab, "phones", cmvn=(mean, std))
    torch.testing.assert_close(normed[0][1], (raw[0][1] - 2.0) / 4.0)
    batch = collate([raw[0], raw[1]])
    lens = [raw[0][1].shape[0], raw[1][1].shape[0]]
    assert batch.feat_lens.tolist() == lens and batch.feats.shape == (2, max(lens), 20)
    short = lens.index(min(lens))
    assert batch.feats[short, min(lens) :].abs().sum() == 0
    assert batch.target_lens.tolist() == [raw[0][2].numel(), raw[1][2].numel()]
    assert batch.targets[0, : raw[0][2].numel()].tolist() == raw[0][2].tolist()


def test_utterance_mean_norm_subtracts_each_utterances_own_mean_after_the_cmvn(tmp_path):
    corpus, _ = _prepare(tmp_path)
    vocab = Vocabulary(["a", "b", "c", "d", "e"])
    raw = AsrDataset(corpus / "train.jsonl", tmp_path / "f", vocab, "phones")
    mean, std = torch.linspace(1.0, 3.0, 20), torch.full((20,), 4.0)
    args = (corpus / "train.jsonl", tmp_path / "f", vocab, "phones")
    utt = AsrDataset(*args, cmvn=(mean, std), utterance_mean=True)
    for i in range(2):
        scaled = (raw[i][1] - mean) / std
        torch.testing.assert_close(utt[i][1], scaled - scaled.mean(dim=0))
        assert utt[i][1].mean(dim=0).abs().max() < 1e-5 < scaled.mean(dim=0).abs().max()
    with pytest.raises(ValueError, match="mean_norm=utterance normalises filterbank"):
        AsrDataset(*args, utterance_mean=True)


def test_augmented_items_depend_on_seed_epoch_and_index_only(tmp_path):
    corpus, _ = _prepare(tmp_path)
    vocab = Vocabulary(["a", "b", "c", "d", "e"])
    aug = Augmentation(speed_factors=(0.9, 1.1), freq_masks=2, freq_mask_width=5)
    plain = AsrDataset(corpus / "train.jsonl", tmp_path / "f", vocab, "phones")
    augmented = AsrDataset(
        corpus / "train.jsonl", tmp_path / "f", vocab, "phones", augmentation=aug, seed=3
    )
    first = [augmented[i][1] for i in range(len(augmented))]
    backwards = [augmented[i][1] for i in reversed(range(len(augmented)))][
        ::-1
    ]  # another access order
    assert all(torch.equal(a, b) for a, b in zip(first, backwards))
    lengths = [f.shape[0] for f in first]
    assert all(n in (round(m / 0.9), round(m / 1.1)) for n, m in zip(lengths, plain.num_frames))
    assert any((f == 0).all(0).any() for f in first)  # masked bins
    augmented.set_epoch(1)
    assert not all(torch.equal(a, augmented[i][1]) for i, a in enumerate(first))
    assert all(
        torch.equal(plain[i][1], plain.store[plain.records[i]["id"]]) for i in range(len(plain))
    )


def test_speed_up_is_skipped_where_the_utterance_would_become_too_short(tmp_path):
    corpus, _ = _prepare(tmp_path)
    vocab = Vocabulary(["a", "b", "c", "d", "e"])
    plain = AsrDataset(corpus / "train.jsonl", tmp_path / "f", vocab, "phones")
    limit = min(plain.num_frames)  # the shortest is usable at its length, not shorter

    def check(num_frames, targets):
        return "too short" if num_frames < limit else None

    fast = AsrDataset(
        corpus / "train.jsonl",
        tmp_path / "f",
        vocab,
        "phones",
        check=check,
        augmentation=Augmentation(speed_factors=(1.5,)),
    )
    shortest = fast.num_frames.index(limit)
    assert fast[shortest][1].shape[0] == limit  # kept at speed 1
    longer = [i for i, n in enumerate(fast.num_frames) if n >= 1.5 * limit + 1]
    assert longer and fast[longer[0]][1].shape[0] == round(fast.num_frames[longer[0]] / 1.5)


def test_on_the_fly_features_equal_the_cached_ones(tmp_path):
    corpus, records = _prepare(tmp_path)
    vocab = Vocabulary(["a", "b", "c", "d", "e"])
    cached = AsrDataset(corpus / "train.jsonl", tmp_path / "f", vocab, "phones")
    live = AsrDataset(
        corpus / "train.jsonl", None, vocab, "phones", fbank=FbankOptions(num_mel_bins=20)
    )
    assert "audio not found" in dict(live.skipped)[records[3]["id"]]
    assert [r["id"] for r in live.records] == [r["id"] for r in cached.records]
    assert live.num_frames == cached.num_frames  # from the manifest's durations
    for i in range(len(live)):
        torch.testing.assert_close(
            live[i][1], cached[i][1], rtol=2e-3, atol=2e-2
        )  # cached: float16
    (tmp_path / "corpus" / records[0]["audio"]).write_bytes(b"not audio")
    assert live[0] is None  # an unreadable file is left out of its batch, by id in the log
    batch = collate([live[0], live[1]])
    assert batch.ids == [live.records[1]["id"]]


@pytest.mark.parametrize("frame", ["first", "second", "last"])
def test_non_finite_stored_features_are_a_counted_skip_naming_the_utterance(
    tmp_path, caplog, monkeypatch, frame
):
    """NaN or Inf in the feature file (a damaged or foreign store) never reaches a batch,
    wherever it sits in the utterance, and the utterances beside it stay."""
    import numpy as np

    from cbasr.data import features
    from cbasr.data.features import FeatureStore

    monkeypatch.setattr(features, "_SCAN_ROWS", 7)  # the file is scanned in several blocks

    corpus, records = _prepare(tmp_path)
    store = FeatureStore(tmp_path / "f")
    data = np.memmap(
        tmp_path / "f" / "feats.bin",
        dtype=np.float16,
        mode="r+",
        shape=(sum(store.num_frames(u) for u in store.index), store.dim),
    )
    for utt, value in ((records[0]["id"], np.nan), (records[5]["id"], np.inf)):
        offset, frames = store.index[utt]
        data[offset + {"first": 0, "second": 1, "last": frames - 1}[frame], 3] = value
    data.flush()
    vocab = Vocabulary(["a", "b", "c", "d", "e"])
    with caplog.at_level(logging.WARNING):
        ds = AsrDataset(corpus / "train.jsonl", tmp_path / "f", vocab, "phones")
    reasons = dict(ds.skipped)
    for utt in (records[0]["id"], records[5]["id"]):
        assert reasons[utt] == "non-finite stored features (NaN or Inf)"
        assert f"skipping {utt}: non-finite stored features" in caplog.text
    assert "skipped 5 of 8" in caplog.text
    assert all(torch.isfinite(ds[i][1]).all() for i in range(len(ds)))


def _phone_ends(record, tokens):
    return gold_ends(record, "phones", tokens)


def test_label_times_are_each_labels_gold_end_scaled_by_the_speed(tmp_path, caplog):
    corpus, records = _prepare(tmp_path)
    vocab = Vocabulary(["a", "b", "c", "d", "e"])
    del records[5]["phone_starts"]  # an utterance without times: counted, logged, not bounded
    (corpus / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with caplog.at_level(logging.WARNING):
        timed = AsrDataset(
            corpus / "train.jsonl", tmp_path / "f", vocab, "phones", label_times=_phone_ends
        )
    assert "1 of 5 utterances have no gold phones times" in caplog.text
    assert records[5]["id"] in caplog.text
    by_id = {r["id"]: r for r in records}
    for i in range(len(timed)):
        utt_id, _, targets, ends = timed[i]
        starts = by_id[utt_id].get("phone_starts")
        if starts is None:
            assert ends.isnan().all() and ends.numel() == targets.numel()
        else:  # a phone ends where the next starts; the last phone's end is unknown
            torch.testing.assert_close(ends[:-1], torch.tensor(starts[1:]))
            assert ends[-1].isnan()
    assert len(AsrDataset(corpus / "train.jsonl", tmp_path / "f", vocab, "phones")[0]) == 3
    fast = AsrDataset(
        corpus / "train.jsonl",
        tmp_path / "f",
        vocab,
        "phones",
        augmentation=Augmentation(speed_factors=(1.25,)),
        label_times=_phone_ends,
    )
    torch.testing.assert_close(fast[0][3], timed[0][3] / 1.25, equal_nan=True)
    for record in records:
        record.pop("phone_starts", None)
    (corpus / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ValueError, match="train.jsonl: no utterance has gold phones times"):
        AsrDataset(corpus / "train.jsonl", tmp_path / "f", vocab, "phones", label_times=_phone_ends)


def test_collate_pads_label_times_with_nan_and_gives_their_frames():
    feats = torch.zeros(5, 2), torch.zeros(3, 2)
    items = [
        ("a", feats[0], torch.tensor([1, 2, 3]), torch.tensor([0.05, 0.06, float("nan")])),
        ("b", feats[1], torch.tensor([4]), torch.tensor([0.0901])),
    ]
    batch = collate(items)
    assert batch.label_ends.shape == (2, 3)
    assert batch.label_ends[1, 1:].isnan().all()
    # 30 ms frames: an end at 50 ms is in frame 1, at exactly 60 ms the end of frame 1
    assert batch.label_end_frames(0.03).tolist() == [[1, 1, -1], [3, -1, -1]]
    assert batch.to(torch.device("cpu")).label_ends is not None
    plain = collate([item[:3] for item in items])
    assert plain.label_ends is None and plain.to(torch.device("cpu")).label_ends is None
    with pytest.raises(ValueError, match="no label times"):
        plain.label_end_frames(0.03)
