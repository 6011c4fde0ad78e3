import json

import pytest

from cbasr.data.manifest import ManifestError, audio_path, read_manifest

GOOD = {"id": "u1", "audio": "wav/u1.wav", "duration": 1.0, "speaker": "s1", "words": "a b"}


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_reads_records_and_resolves_relative_audio(tmp_path):
    path = _write(
        tmp_path / "train.jsonl", [json.dumps(GOOD), "", json.dumps({**GOOD, "id": "u2"})]
    )
    records = read_manifest(path)
    assert [r["id"] for r in records] == ["u1", "u2"]
    assert audio_path(records[0], path) == tmp_path / "wav" / "u1.wav"
    assert audio_path({**GOOD, "audio": "/abs/x.wav"}, path).as_posix() == "/abs/x.wav"


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"train.jsonl:2: not valid JSON"),
        (
            json.dumps({k: v for k, v in GOOD.items() if k != "words"} | {"id": "u9"}),
            r"train.jsonl:2: utterance 'u9' lacks keys \['words'\]",
        ),
        (json.dumps(GOOD), r"train.jsonl:2: duplicate utterance id 'u1'"),
    ],
)
def test_bad_lines_name_file_line_and_utterance(tmp_path, line, message):
    path = _write(tmp_path / "train.jsonl", [json.dumps(GOOD), line])
    with pytest.raises(ManifestError, match=message):
        read_manifest(path)


def test_missing_manifest(tmp_path):
    with pytest.raises(ManifestError, match="nope.jsonl: manifest not found"):
        read_manifest(tmp_path / "nope.jsonl")


def test_text_input_records_need_a_source_instead_of_audio(tmp_path):
    text = {"id": "t1", "source": "australia 's deficit shrunk", "words": "deficit narrows"}
    path = _write(tmp_path / "test.jsonl", [json.dumps(text)])
    assert read_manifest(path)[0]["source"] == text["source"]
    path = _write(tmp_path / "bad.jsonl", [json.dumps({"id": "t2", "source": "a b"})])
    with pytest.raises(ManifestError, match=r"bad.jsonl:1: utterance 't2' lacks keys \['words'\]"):
        read_manifest(path)
