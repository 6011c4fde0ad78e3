"""scripts/chunk_errors.py: a chunked transducer's greedy labels by their position in the chunk,
and its error rate attending to other chunks, against the model's own greedy search."""

import collections
import types

import jiwer
import pytest
import torch

from cbasr.data.features import write_feature_settings
from cbasr.data.manifest import read_manifest
from cbasr.data.source_tokens import open_store
from cbasr.data.vocab import tokens_of
from cbasr.inference.experiment import Experiment
from cbasr.models.transducer_greedy import Emissions
from cbasr.storage.checkpoint import load_checkpoint, save_checkpoint
from cbasr.training.options import fbank_options_of
from tests.cli.test_export import CHUNKED
from tests.inference.fake_experiment import make_experiment
from tests.scripts import load_script
from tests.search import tiny


def _script():
    return load_script("chunk_errors")


def _greedy(exp, manifest, features, full: bool) -> tuple[list[str], list[str], int]:
    """References, hypotheses and emitted labels of the model's greedy search, utterance by
    utterance (the full context inside ``full_context``)."""
    store, refs, hyps, emitted = open_store(features), [], [], 0
    for record in read_manifest(manifest):
        feats = exp.normalise(store[record["id"]]).unsqueeze(0)
        lens = torch.tensor([feats.shape[1]])
        with torch.no_grad():
            if full:
                with exp.model.encoder.full_context():
                    labels = exp.model.greedy_decode(feats, lens)[0]
            else:
                labels = exp.model.greedy_decode(feats, lens)[0]
        refs.append(" ".join(tokens_of(record, exp.units)))
        hyps.append(" ".join(exp.vocab.decode(labels)))
        emitted += len(labels)
    return refs, hyps, emitted


@pytest.mark.parametrize("attend", ["", "full"])
def test_the_report_counts_the_greedy_labels_and_their_error_rate(
    tone_data, tmp_path, capsys, attend
):
    exp_dir = make_experiment(tmp_path / "exp", tone_data, "hat", "hat", encoder=CHUNKED)
    write_feature_settings(exp_dir, fbank_options_of(tone_data / "fbank/train", 40), True)
    exp = Experiment(exp_dir)
    tiny.emit_about_a_third(exp.model, torch.zeros(1, 30, exp.cmvn[0].numel()), torch.tensor([30]))
    best = exp_dir / "checkpoints/best.pt"  # the model that emits, as the script loads it
    save_checkpoint(best, {**load_checkpoint(best), "model": exp.model.state_dict()})
    manifest, features = tone_data / "corpus/test.jsonl", tone_data / "fbank/test"
    args = ["--exp-dir", str(exp_dir), "--manifest", str(manifest), "--features", str(features)]
    _script().main([*args, *(["--attend", attend] if attend else [])])
    out = capsys.readouterr().out.splitlines()
    refs, hyps, emitted = _greedy(Experiment(exp_dir), manifest, features, full=attend == "full")
    wer = jiwer.process_words(refs, hyps)
    want = sum(len(r.split()) for r in refs)
    assert f"error rate: {100 * wer.wer:.2f}% of {want} tokens" in out
    rows = out[out.index("position in chunk | labels | errors (%)") + 1 :][: CHUNKED["chunk_size"]]
    assert sum(int(row.split(" | ")[1]) for row in rows) == emitted > 0
    assert ("decoded attending to the full context" in out) == (attend == "full")


def test_attend_and_the_chunk_are_checked(tone_data, tmp_path):
    exp_dir = make_experiment(tmp_path / "exp", tone_data, "hat", "hat", encoder=CHUNKED)
    write_feature_settings(exp_dir, fbank_options_of(tone_data / "fbank/train", 40), True)
    manifest, features = tone_data / "corpus/test.jsonl", tone_data / "fbank/test"
    args = ["--exp-dir", str(exp_dir), "--manifest", str(manifest), "--features", str(features)]
    for bad in ("0", "-2", "two"):
        with pytest.raises(SystemExit, match="--attend takes a number of frames"):
            _script().main([*args, "--attend", bad])
    _script().main([*args, "--attend", "1"])  # chunks of one frame: a valid choice
    offline = make_experiment(tmp_path / "offline", tone_data, "hat", "hat")  # recurrent
    write_feature_settings(offline, fbank_options_of(tone_data / "fbank/train", 40), True)
    args[1] = str(offline)
    with pytest.raises(SystemExit, match="not a chunked encoder"):
        _script().main(args)
    with pytest.raises(SystemExit, match="--attend needs a chunked Conformer"):
        _script().main([*args, "--chunk", "3", "--attend", "full"])


class _Vocab:
    def decode(self, ids):
        return ["-abcx"[i] for i in ids]


class _Model:
    def __init__(self, labels, frames):
        self.found = Emissions([labels], [frames])

    def greedy_emissions(self, feats, lens):
        return self.found


def test_tally_counts_labels_errors_and_lags_by_position_on_a_hand_built_utterance():
    """Reference a b c d (gold ends 0.5, 1.0, 1.5 s, the last none); hypothesis a x c emitted
    on encoder frames 3, 5 and 9 of 0.25 s, in chunks of 4: positions 3, 1, 1; x is wrong; a
    is emitted 1 frame after its gold end (frame 2), c 3 frames after (frame 6)."""
    tally = _script()._tally
    exp = types.SimpleNamespace(
        units="phones", normalise=lambda f: f, vocab=_Vocab(), model=_Model([1, 4, 3], [3, 5, 9])
    )
    record = {"id": "u", "phones": list("abcd"), "phone_starts": [0.0, 0.5, 1.0, 1.5]}
    counters = collections.Counter(), collections.Counter(), collections.Counter()
    refs, hyps = [], []
    tally(exp, {"u": torch.zeros(12, 2)}, record, 4, 0.25, counters, refs, hyps)
    assert counters == ({3: 1, 1: 2}, {3: 0, 1: 1}, {1: 1, 3: 1})
    assert (refs, hyps) == (["a b c d"], ["a x c"])
    untimed = {"id": "v", "phones": list("abcd")}  # no gold times: no lags
    tally(exp, {"v": torch.zeros(12, 2)}, untimed, 4, 0.25, counters, refs, hyps)
    assert counters == ({3: 2, 1: 4}, {3: 0, 1: 2}, {1: 1, 3: 1})
    tally(exp, {}, {"id": "w", "phones": ["a"]}, 4, 0.25, counters, refs, hyps)  # no features
    assert len(refs) == 2
