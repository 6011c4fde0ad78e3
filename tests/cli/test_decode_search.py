"""cbasr-decode's search options: output directories named by the settings, refusals that name
the option, HAT eq. (9) weights reaching decode.json, and the beam search's merges alike."""

import json
import re

import pytest

from cbasr.cli import decode
from tests.cli.training import decode_args
from tests.inference.fake_experiment import make_experiment


def _args(exp, tone_data, *extra):
    return [
        *decode_args(tone_data, exp, "dev"),
        "--num-threads",
        "1",
        *extra,
    ]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--lm", "x.arpa"], "--lm need a beam search: add --beam N"),
        (
            ["--ilm-weight", "0.5", "--length-norm"],
            "--ilm-weight, --length-norm need a beam search",
        ),
        (["--beam", "-1"], "--beam must be 0 \\(greedy\\) or a beam width >= 1"),
        (["--beam", "2", "--lm-weight", "0.3"], "--lm-weight needs --lm"),
        (
            ["--beam", "2", "--ilm-weight", "0.3"],
            "--ilm-weight .* needs a HAT model; this is a cb model",
        ),
        (["--beam", "2", "--am-weight", "0"], "am_weight \\(lambda_1\\) must be positive"),
        (["--cb-search", "frame"], "--cb-search need a beam search"),
        (
            ["--beam", "2", "--cb-search", "label"],
            "--cb-search label needs an autoregressive decoder",
        ),
        (["--merge", "device"], "--merge need a beam search"),
        (
            ["--beam", "2", "--merge", "device"],
            "--merge applies to the RNN-T and HAT beam search; this is a cb model",
        ),
    ],
)
def test_options_that_do_not_apply_are_named(tone_data, tmp_path, capsys, extra, message):
    exp = make_experiment(tmp_path / "exp", tone_data, "pointwise", "cb_marginal")
    with pytest.raises(SystemExit) as error:
        decode.main(_args(exp, tone_data, *extra))
    assert re.search(message, str(error.value)), str(error.value)


def test_hat_weights_reach_decode_json_and_name_the_directory(tone_data, tmp_path):
    exp = make_experiment(tmp_path / "exp", tone_data, "hat", "hat")
    decode.main(
        _args(
            exp,
            tone_data,
            "--beam",
            "3",
            "--am-weight",
            "2.5",
            "--ilm-weight",
            "0.9",
            "--max-symbols",
            "2",
        )
    )
    info = json.loads((exp / "decode/dev_beam3_am2.5_ilm0.9/decode.json").read_text())
    assert info["settings"] == {
        "search": "beam",
        "beam": 3,
        "nbest": 1,
        "am_weight": 2.5,
        "lm_weight": 0.0,
        "ilm_weight": 0.9,
        "label_bonus": 0.0,
        "length_norm": False,
        "max_symbols": 2,
        "cb_search": "auto",
        "merge": "host",
        "lm": None,
    }
    decode.main(_args(exp, tone_data, "--beam", "3", "--tag", "mine"))
    assert (
        json.loads((exp / "decode/dev_mine/decode.json").read_text())["settings"]["max_symbols"]
        == 3
    )
    # the prefixes merged on the device: the same hypotheses, the setting in decode.json
    decode.main(_args(exp, tone_data, "--beam", "3", "--merge", "device", "--tag", "device"))
    info = json.loads((exp / "decode/dev_device/decode.json").read_text())
    assert info["settings"]["merge"] == "device"
    hyps = (exp / "decode/dev_device/hyp.trn").read_text()
    assert hyps == (exp / "decode/dev_mine/hyp.trn").read_text() and hyps.strip()


def test_the_greedy_rule_names_the_directory_and_reaches_decode_json(tone_data, tmp_path):
    """--greedy-rule emission decodes into dev_greedy-emission with the rule in decode.json
    (TransducerModel's
    greedy="emission"); the default rule records nothing;
    it is refused with a beam and for a model that is not a transducer."""
    exp = make_experiment(tmp_path / "exp", tone_data, "hat", "hat")
    decode.main(_args(exp, tone_data, "--greedy-rule", "emission"))
    decode.main(_args(exp, tone_data))
    info = json.loads((exp / "decode/dev_greedy-emission/decode.json").read_text())
    assert info["settings"] == {"search": "greedy", "greedy": "emission"}
    assert json.loads((exp / "decode/dev/decode.json").read_text())["settings"] == {
        "search": "greedy"
    }
    # this random HAT model's label mass is spread: the rules differ (tests/search has the rule)
    hyps = (exp / "decode/dev_greedy-emission/hyp.trn").read_text()
    assert hyps != (exp / "decode/dev/hyp.trn").read_text()
    with pytest.raises(SystemExit, match="--greedy-rule is for the greedy search"):
        decode.main(_args(exp, tone_data, "--beam", "2", "--greedy-rule", "label"))
    cb = make_experiment(tmp_path / "cb", tone_data, "pointwise", "cb_marginal")
    with pytest.raises(SystemExit, match="--greedy-rule is for transducers"):
        decode.main(_args(cb, tone_data, "--greedy-rule", "label"))
