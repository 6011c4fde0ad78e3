"""decode.json read in one place: today's records, the first format's and none at all."""

import json

from cbasr.evaluation.decode_info import DecodeInfo
from cbasr.evaluation.scoring import score_decode_dir, write_trn


def test_a_record_reads_its_fields_and_keeps_the_rest(tmp_path):
    record = {
        "checkpoint": "averaged",
        "epoch": 12,
        "checkpoint_stamp": "1:2",
        "search": "beam",
        "settings": {"search": "beam", "beam": 8},
        "units": "sp:data/lang/sp500.model",
        "failed": 2,
        "skipped": 0,
        "empty_refs": 1,
        "oov_ref_utts": 3,
        "parameters": 18569557,
        "rtf": 0.02,
        "data": {"manifest": "m", "manifest_sha256": "x"},
        "device": "cpu",
    }
    (tmp_path / "decode.json").write_text(json.dumps(record))
    info = DecodeInfo.read(tmp_path)
    assert (info.checkpoint, info.epoch, info.settings["beam"], info.failed) == (
        "averaged",
        12,
        8,
        2,
    )
    assert (info.parameters, info.rtf, info.data["manifest"]) == (18569557, 0.02, "m")
    assert info.raw["device"] == "cpu"


def test_the_first_format_and_a_missing_record(tmp_path):
    (tmp_path / "decode.json").write_text(
        json.dumps({"checkpoint": "best", "epoch": 3, "search": "greedy", "skipped": 1})
    )
    info = DecodeInfo.read(tmp_path)
    assert info.settings == {"search": "greedy"} and info.skipped == 1
    assert (info.parameters, info.checkpoint_stamp, info.data, info.failed) == (None, None, None, 0)
    assert DecodeInfo.read(tmp_path / "nowhere") is None


def test_every_field_is_read_from_its_own_key(tmp_path):
    """Each field of the record comes from its key (every value distinct: a field read from
    another key shows)."""
    record = {
        "checkpoint": "epoch-7",
        "epoch": 7,
        "checkpoint_stamp": "1700000000:4096",
        "search": "beam",
        "settings": {"search": "beam", "beam": 4, "lm_weight": 0.3},
        "units": "chars",
        "skipped": 5,
        "failed": 2,
        "empty_refs": 1,
        "oov_ref_utts": 3,
        "parameters": 1234,
        "rtf": 0.25,
        "data": {"manifest": "/m/dev.jsonl", "features_done": "ab@12"},
        "utts": 16,
        "decode_seconds": 9.5,
    }
    (tmp_path / "decode.json").write_text(json.dumps(record))
    assert DecodeInfo.read(tmp_path) == DecodeInfo(
        checkpoint="epoch-7",
        epoch=7,
        settings={"search": "beam", "beam": 4, "lm_weight": 0.3},
        units="chars",
        skipped=5,
        failed=2,
        empty_refs=1,
        oov_ref_utts=3,
        parameters=1234,
        rtf=0.25,
        checkpoint_stamp="1700000000:4096",
        data={"manifest": "/m/dev.jsonl", "features_done": "ab@12"},
    )


def test_the_first_format_keeps_its_beam_search(tmp_path):
    """A record of the first format (``search``, no ``settings``) reads its own search."""
    (tmp_path / "decode.json").write_text(json.dumps({"search": "beam", "epoch": 3}))
    assert DecodeInfo.read(tmp_path).settings == {"search": "beam"}
    (tmp_path / "decode.json").write_text(json.dumps({"epoch": 3}))
    assert DecodeInfo.read(tmp_path).settings == {"search": "greedy"}


def test_a_score_copies_each_field_of_the_decode_record(tmp_path):
    """score.json takes the decoding's counts and checkpoint from decode.json, each its own."""
    refs = [("u1", ["a", "b"]), ("u2", ["c"]), ("u3", [])]
    write_trn(tmp_path / "ref.trn", refs)
    write_trn(tmp_path / "hyp.trn", [("u1", ["a", "b"]), ("u2", []), ("u3", [])])
    (tmp_path / "decode.json").write_text(
        json.dumps(
            {
                "checkpoint": "averaged",
                "epoch": 9,
                "settings": {"search": "beam", "beam": 2},
                "units": "phones",
                "skipped": 4,
                "failed": 1,
                "empty_refs": 2,
                "oov_ref_utts": 3,
            }
        )
    )
    score = score_decode_dir(tmp_path, bootstrap_samples=20)
    copied = ("skipped", "failed", "empty_refs", "oov_ref_utts", "checkpoint", "epoch")
    assert {k: score[k] for k in copied} == {
        "skipped": 4,
        "failed": 1,
        "empty_refs": 2,
        "oov_ref_utts": 3,
        "checkpoint": "averaged",
        "epoch": 9,
    }
    assert score["settings"] == {"search": "beam", "beam": 2} and score["error_rate"] == 100 / 3


def test_a_record_without_the_counts_reads_them_as_zero():
    """decode.json of older decodings lacks the problem counts: none of each, as a fresh
    record has."""
    info = DecodeInfo.from_json({"checkpoint": "best", "settings": {"search": "greedy"}})
    assert (info.skipped, info.failed, info.empty_refs, info.oov_ref_utts) == (0, 0, 0, 0)
    assert info == DecodeInfo()
