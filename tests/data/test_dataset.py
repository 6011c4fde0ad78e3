import json
import logging

import torch

from cbasr.data.dataset import AsrDataset, collate
from cbasr.data.features import FbankOptions, extract_split
from cbasr.data.vocab import Vocabulary
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
        return "too short" if records[4]["id"] == too_short and len(targets) == len(records[4]["phones"]) \
            and num_frames < 10_000 and targets == vocab.encode(records[4]["phones"]) else None

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
    assert batch.feats[short, min(lens):].abs().sum() == 0
    assert batch.target_lens.tolist() == [raw[0][2].numel(), raw[1][2].numel()]
    assert batch.targets[0, : raw[0][2].numel()].tolist() == raw[0][2].tolist()
