"""scripts/chunk_errors.py: a chunked transducer's greedy labels by their position in the chunk,
and its error rate attending to other chunks, against the model's own greedy search."""

import jiwer
import pytest
import torch

from cbasr.data.features import write_feature_settings
from cbasr.data.manifest import read_manifest
from cbasr.data.source_tokens import open_store
from cbasr.data.vocab import tokens_of
from cbasr.inference.experiment import Experiment
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


def test_attend_is_checked(tone_data, tmp_path):
    exp_dir = make_experiment(tmp_path / "exp", tone_data, "hat", "hat", encoder=CHUNKED)
    write_feature_settings(exp_dir, fbank_options_of(tone_data / "fbank/train", 40), True)
    args = [
        "--exp-dir",
        str(exp_dir),
        "--manifest",
        "m",
        "--features",
        str(tone_data / "fbank/test"),
    ]
    with pytest.raises(SystemExit, match="--attend takes a number of frames"):
        _script().main([*args, "--attend", "0"])
