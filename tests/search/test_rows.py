"""Hypothesis rows: the per-utterance state entries that the searches do not gather are truly
per-utterance (searching with every entry gathered gives the same result), and the row helpers
gather tensors, LSTM states and lists alike."""

import pytest
import torch

from cbasr.search import BeamSearchOptions
from cbasr.search.conditional_bernoulli import cb_beam_search
from cbasr.search.rows import PER_UTTERANCE_KEYS, cat_rows, reorder_rows
from cbasr.search.transducer import transducer_beam_search
from tests.search import tiny


@pytest.mark.parametrize("name", tiny.CB + ["transducer", "hat"])
def test_per_utterance_entries_are_never_changed_by_the_search(name):
    model = tiny.build(name, seed=3, shift=1.5)
    assert type(model.decoder) in PER_UTTERANCE_KEYS
    feats, lens = tiny.batch(seed=4)
    h, h_lens = model.encoder(feats, lens)
    options = BeamSearchOptions(beam=3, nbest=3, max_symbols=3)
    search = cb_beam_search if name in tiny.CB else transducer_beam_search
    with torch.no_grad():
        fast = search(model.decoder, h, h_lens, options)
        full = search(model.decoder, h, h_lens, options, per_utterance=())
    assert [[(x.tokens, x.score) for x in n] for n in fast] == [
        [(x.tokens, x.score) for x in n] for n in full
    ]


def test_row_helpers_gather_every_kind_of_entry():
    state = {
        "x": torch.arange(6).view(3, 2),
        "lstm": (torch.arange(6).view(2, 3), torch.arange(6).view(2, 3) + 10),
        "history": [("a",), ("b",), ("c",)],
        "none": None,
    }
    index = torch.tensor([2, 2, 0])
    out = reorder_rows(state, index)
    assert out["x"].tolist() == [[4, 5], [4, 5], [0, 1]]
    assert out["lstm"][0].tolist() == [[2, 2, 0], [5, 5, 3]] and out["lstm"][1][0].tolist() == [
        12,
        12,
        10,
    ]
    assert out["history"] == [("c",), ("c",), ("a",)] and out["none"] is None
    both = cat_rows([state, out])
    assert (
        both["x"].shape == (6, 2) and both["lstm"][0].shape == (2, 6) and len(both["history"]) == 6
    )
