"""Decoding a split: beam search through the engine, settings in decode.json, up-to-date checks
that notice changed settings, speakers for scoring."""

import hashlib
import json
import os

import pytest
import torch

from cbasr.inference.decode import decode_settings, decode_split, is_decoded
from cbasr.inference.experiment import Experiment
from cbasr.search import BeamSearchOptions
from tests.inference.fake_experiment import make_experiment
from tests.search import tiny


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)  # put back by tests/conftest.py


def _decode(exp, tone_data, out, **kwargs):
    return decode_split(exp, tone_data / "corpus/dev.jsonl", tone_data / "fbank/dev", out, **kwargs)


def test_beam_one_decodes_like_greedy_and_settings_are_recorded(tone_data, tmp_path):
    exp = Experiment(make_experiment(tmp_path / "cb", tone_data, "pointwise", "cb_marginal"))
    greedy = _decode(exp, tone_data, tmp_path / "greedy")
    beam = _decode(exp, tone_data, tmp_path / "beam1", options=BeamSearchOptions(beam=1))
    hyps = (tmp_path / "greedy/hyp.trn").read_text()
    assert (
        hyps == (tmp_path / "beam1/hyp.trn").read_text() and len(set(hyps.split())) > 16
    )  # non-empty hyps
    assert greedy["settings"] == {"search": "greedy"} and beam["settings"]["beam"] == 1
    info = json.loads((tmp_path / "beam1/decode.json").read_text())
    assert (
        info["settings"] == decode_settings(exp, BeamSearchOptions(beam=1))
        and info["parameters"] > 0
    )
    assert info["utts"] == 16 and info["rtf"] > 0 and info["audio_seconds"] > 1
    corpus = [json.loads(x) for x in (tone_data / "corpus/dev.jsonl").read_text().splitlines()]
    assert (tmp_path / "beam1/utt2spk").read_text() == "".join(
        f"{r['id']} {r['speaker']}\n" for r in corpus
    )
    # up to date only for the same checkpoint and the same settings
    assert is_decoded(exp, tmp_path / "greedy") and not is_decoded(exp, tmp_path / "beam1")
    assert is_decoded(exp, tmp_path / "beam1", decode_settings(exp, BeamSearchOptions(beam=1)))
    assert not is_decoded(exp, tmp_path / "beam1", decode_settings(exp, BeamSearchOptions(beam=2)))


def test_a_retrained_checkpoint_is_not_up_to_date(tone_data, tmp_path):
    """The same settings and data decoded by an older checkpoint file: decode again."""
    exp_dir = make_experiment(tmp_path / "cb", tone_data, "pointwise", "cb_marginal")
    exp = Experiment(exp_dir)
    _decode(exp, tone_data, tmp_path / "greedy")
    assert is_decoded(exp, tmp_path / "greedy")
    best = exp_dir / "checkpoints/best.pt"
    stamp = best.stat()
    os.utime(best, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000_000))  # retrained
    retrained = Experiment(exp_dir)
    assert retrained.checkpoint_stamp != exp.checkpoint_stamp
    assert not is_decoded(retrained, tmp_path / "greedy")


def test_transducer_settings_name_the_symbols_per_frame(tone_data, tmp_path):
    exp = Experiment(make_experiment(tmp_path / "hat", tone_data, "hat", "hat"))
    settings = decode_settings(exp, BeamSearchOptions(beam=4, am_weight=2.0, ilm_weight=0.5))
    assert settings["max_symbols"] == 3 and settings["ilm_weight"] == 0.5  # the model's max_symbols
    summary = _decode(
        exp, tone_data, tmp_path / "out", options=BeamSearchOptions(beam=2, ilm_weight=0.5)
    )
    assert summary["settings"]["ilm_weight"] == 0.5 and summary["utts"] == 16


def test_options_that_do_not_apply_are_refused(tone_data, tmp_path):
    exp = Experiment(make_experiment(tmp_path / "cb", tone_data, "pointwise", "cb_marginal"))
    with pytest.raises(ValueError, match="LM fusion needs a beam search"):
        decode_settings(exp, None, "lm.arpa")
    with pytest.raises(ValueError, match="ilm-weight .* needs a HAT model; this is a cb model"):
        _decode(exp, tone_data, tmp_path / "x", options=BeamSearchOptions(beam=2, ilm_weight=1.0))
    with pytest.raises(ValueError, match="--lm-weight is set but no language model"):
        _decode(exp, tone_data, tmp_path / "x", options=BeamSearchOptions(beam=2, lm_weight=1.0))


def test_empty_and_out_of_vocabulary_references_are_counted_not_dropped(tone_data, tmp_path):
    from cbasr.evaluation.scoring import score_decode_dir

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    records = [json.loads(x) for x in (tone_data / "corpus/dev.jsonl").read_text().splitlines()]
    records[0]["phones"] = []
    records[1]["phones"] = ["a", "zz", "zz"]
    for r in records:  # the audio stays where it was
        r["audio"] = str((tone_data / "corpus" / r["audio"]).resolve())
    (corpus / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    exp = Experiment(make_experiment(tmp_path / "cb", tone_data, "pointwise", "cb_marginal"))
    info = decode_split(exp, corpus / "dev.jsonl", tone_data / "fbank/dev", tmp_path / "out")
    assert info["utts"] == 16 and info["empty_refs"] == 1
    assert info["oov_ref_utts"] == 1 and info["oov_ref_tokens"] == ["zz"]
    score = score_decode_dir(tmp_path / "out", 50)
    assert score["utts"] == 16 and score["empty_refs"] == 1 and score["oov_ref_utts"] == 1


def test_decode_records_count_each_kind_of_problem_under_its_own_key(tone_data, tmp_path):
    """decode.json (and the score read from it) keeps failed, empty and out-of-vocabulary
    references apart: 3, 1 and 2 here, each under its own key."""
    from cbasr.evaluation.scoring import score_decode_dir

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    records = [json.loads(x) for x in (tone_data / "corpus/dev.jsonl").read_text().splitlines()]
    for r in records:  # the audio stays where it was
        r["audio"] = str((tone_data / "corpus" / r["audio"]).resolve())
    records[0]["phones"] = []
    records[1]["phones"] = ["a", "zz"]
    records[2]["phones"] = ["yy"]
    records += [{**records[3], "id": f"no-features-{i}"} for i in range(3)]
    (corpus / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    exp = Experiment(
        make_experiment(tmp_path / "cb", tone_data, "pointwise", "cb_marginal", epoch=7)
    )
    options = BeamSearchOptions(beam=2)
    decode_split(
        exp, corpus / "dev.jsonl", tone_data / "fbank/dev", tmp_path / "out", options=options
    )
    info = json.loads((tmp_path / "out/decode.json").read_text())
    counts = ("utts", "failed", "skipped", "empty_refs", "oov_ref_utts")
    assert [info[k] for k in counts] == [19, 3, 0, 1, 2] and info["oov_ref_tokens"] == ["yy", "zz"]
    assert (info["search"], info["settings"]["beam"], info["epoch"]) == ("beam", 2, 7)
    score = score_decode_dir(tmp_path / "out", 20)
    assert [score[k] for k in counts] == [19, 3, 0, 1, 2] and score["epoch"] == 7


class _Stamped:
    """What is_decoded reads of an experiment: its checkpoint's stamp."""

    checkpoint_stamp = "1700000000000:4096"


def _record(out_dir, **fields):
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"checkpoint": "best", "settings": {"search": "greedy"}, **fields}
    (out_dir / "decode.json").write_text(json.dumps(record))


def test_a_record_from_before_the_stamps_is_out_of_date_for_stamped_data(tmp_path):
    """A decoding recorded before data (or checkpoints) were stamped is never taken as up to date
    for stamped data; one with the same stamps is."""
    stamp = {"manifest": "/c/dev.jsonl", "manifest_sha256": "aa", "features": "/f/dev"}
    data = {**stamp, "features_done": "bb@1"}
    exp, out = _Stamped(), tmp_path / "dev"
    _record(out, checkpoint_stamp=exp.checkpoint_stamp)  # no "data": written before the stamps
    assert is_decoded(exp, out)  # data None: the caller decoded them itself
    assert not is_decoded(exp, out, None, data)
    _record(out, checkpoint_stamp=exp.checkpoint_stamp, data=data)
    assert is_decoded(exp, out, None, data)
    _record(out, checkpoint_stamp=exp.checkpoint_stamp, data={**stamp, "features_done": None})
    assert not is_decoded(exp, out, None, data)  # features without .done, now stamped
    _record(out, data=data)  # no checkpoint stamp
    assert not is_decoded(exp, out, None, data) and not is_decoded(exp, out)


def test_the_data_stamp_resolves_paths_and_follows_the_features_record(tmp_path, monkeypatch):
    """data_stamp: absolute paths whatever the cwd; the features' .done by content and
    modification time, None until there is one."""
    from cbasr.inference.decode import data_stamp

    (tmp_path / "corpus").mkdir()
    (tmp_path / "fbank/dev").mkdir(parents=True)
    (tmp_path / "corpus/dev.jsonl").write_text('{"id": "u1"}\n')
    monkeypatch.chdir(tmp_path)
    relative = data_stamp("corpus/dev.jsonl", "fbank/dev")
    absolute = data_stamp(tmp_path / "corpus/dev.jsonl", tmp_path / "fbank/dev")
    assert relative == absolute and relative["features_done"] is None
    assert relative["manifest"] == str((tmp_path / "corpus/dev.jsonl").resolve())
    assert relative["features"] == str((tmp_path / "fbank/dev").resolve())
    done = tmp_path / "fbank/dev/.done"
    done.write_text('{"params": {}}\n')
    first = data_stamp("corpus/dev.jsonl", "fbank/dev")["features_done"]
    assert first.startswith(hashlib.sha256(done.read_bytes()).hexdigest())
    status = done.stat()
    done.write_text('{"params": {}}\n')  # extracted again: the same record, a later time
    os.utime(done, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000_000))
    assert data_stamp("corpus/dev.jsonl", "fbank/dev")["features_done"] != first


def test_a_word_lm_is_recorded_in_the_settings_only_when_used(tone_data, tmp_path):
    exp = Experiment(make_experiment(tmp_path / "exp", tone_data, "pointwise", "ctc"))
    beam = BeamSearchOptions(beam=2)
    assert decode_settings(exp, beam, "lm.arpa", lm_words=True)["lm_words"] is True
    assert "lm_words" not in decode_settings(exp, beam, "lm.arpa")


def test_the_data_stamp_of_a_missing_manifest_names_it(tmp_path):
    from cbasr.inference.decode import data_stamp

    with pytest.raises(FileNotFoundError, match=r"dev\.jsonl: no such manifest"):
        data_stamp(tmp_path / "dev.jsonl", tmp_path / "fbank")


def test_an_experiment_without_its_directory_or_checkpoint_is_named(tone_data, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope: no such experiment directory"):
        Experiment(tmp_path / "nope")
    exp_dir = make_experiment(tmp_path / "exp", tone_data, "pointwise", "ctc")
    with pytest.raises(FileNotFoundError, match=r"checkpoints/last\.pt not found: has .* been"):
        Experiment(exp_dir, "last")
    with pytest.raises(FileNotFoundError, match=r"other\.pt not found"):
        Experiment(exp_dir, str(tmp_path / "other.pt"))


def test_timing_a_streaming_greedy_search_by_its_blocks_and_the_rest_at_the_end(
    tone_data, tmp_path
):
    """A unidirectional transducer's greedy decoding emits each token when its encoder frame
    (stacks of 2 feature frames, 10 ms apart, 25 ms windows) is complete; its beam search and a
    bidirectional one at the utterance's end; the gold ends are the next phones' starts."""
    from cbasr.evaluation.delay import read_timing
    from cbasr.evaluation.scoring import read_trn

    corpus = {
        r["id"]: r
        for r in map(json.loads, (tone_data / "corpus/dev.jsonl").read_text().splitlines())
    }
    streaming = Experiment(
        make_experiment(tmp_path / "s", tone_data, "hat", "hat", encoder={"bidirectional": False})
    )
    offline = Experiment(make_experiment(tmp_path / "o", tone_data, "hat", "hat"))
    feats = {u: streaming.normalise(f) for u, f in _features(tone_data)}
    padded = torch.nn.utils.rnn.pad_sequence(list(feats.values()), batch_first=True)
    lens = torch.tensor([len(f) for f in feats.values()])
    tiny.emit_about_a_third(streaming.model, padded, lens)
    info = _decode(streaming, tone_data, tmp_path / "greedy")
    assert info["emission"] == "streaming"
    hyps, timing = (
        read_trn(tmp_path / "greedy/hyp.trn"),
        read_timing(tmp_path / "greedy/timing.tsv"),
    )
    assert sum(map(len, hyps.values())) > 0
    for u, (ends, emitted) in timing.items():
        record = corpus[u]
        assert ends == [*record["phone_starts"][1:], None]
        found = streaming.model.greedy_emissions(feats[u][None], torch.tensor([len(feats[u])]))
        assert streaming.vocab.decode(found.labels[0]) == hyps[u]
        want = [min(record["duration"], (2 * t + 1) * 0.01 + 0.025) for t in found.frames[0]]
        assert emitted == pytest.approx(want, abs=1e-4)
    beam = _decode(streaming, tone_data, tmp_path / "beam", options=BeamSearchOptions(beam=2))
    assert beam["emission"] == "utterance end"
    assert _decode(offline, tone_data, tmp_path / "offline")["emission"] == "utterance end"
    for name in ("beam", "offline"):
        hyps = read_trn(tmp_path / name / "hyp.trn")
        for u, (_, emitted) in read_timing(tmp_path / name / "timing.tsv").items():
            assert emitted == pytest.approx([corpus[u]["duration"]] * len(hyps[u]), abs=1e-4)


def _features(tone_data):
    from cbasr.data.source_tokens import open_store

    store = open_store(tone_data / "fbank/dev")
    corpus = (tone_data / "corpus/dev.jsonl").read_text().splitlines()
    return [(u, store[u]) for u in (json.loads(line)["id"] for line in corpus)]


def test_an_offline_token_is_emitted_at_the_utterance_s_end_even_without_a_recorded_duration():
    """The manifest's duration, else the last feature frame's window end; an utterance
    without features ends at 0."""
    from cbasr.inference.decode import _emitted

    frames = {"u": 10, "v": 0, "w": 1}
    assert _emitted(None, {"id": "u", "duration": 0.2}, ["a"], {}, frames, 0.01, 0.025) == [0.2]
    got = _emitted(None, {"id": "u"}, ["a", "b"], {}, frames, 0.01, 0.025)
    assert got == pytest.approx([0.115, 0.115])
    assert _emitted(None, {"id": "v"}, ["a"], {}, frames, 0.01, 0.025) == [0.0]
    assert _emitted(None, {"id": "w"}, ["a"], {}, frames, 0.01, 0.025) == [0.025]  # one window
