"""decode.json read in one place: today's records, the first format's and none at all."""

import json

from cbasr.evaluation.decode_info import DecodeInfo


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
