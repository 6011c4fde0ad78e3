"""Beam search for any cbasr model: encoder once, then the search of its decoder family."""

import dataclasses

import torch

from cbasr.models import CBModel, CTCModel, TransducerModel
from cbasr.modules.decoders import LabelOrder
from cbasr.search.conditional_bernoulli import cb_beam_search
from cbasr.search.ctc import ctc_prefix_beam_search
from cbasr.search.fusion import LabelScorer
from cbasr.search.hypotheses import BeamSearchOptions, Hypothesis
from cbasr.search.label_synchronous import cb_label_beam_search
from cbasr.search.tdt import tdt_beam_search
from cbasr.search.transducer import transducer_beam_search

__all__ = ["beam_search", "check_options", "search_family", "cb_search_kind"]


def search_family(model) -> str:
    """``"ctc"``, ``"cb"`` or ``"transducer"``: which search decodes ``model``."""
    if isinstance(model, CTCModel):
        return "ctc"
    if isinstance(model, CBModel):
        return "cb"
    if isinstance(model, TransducerModel):
        return "transducer"
    raise TypeError(f"no beam search for {type(model).__name__}")


def cb_search_kind(model, options: BeamSearchOptions) -> str:
    """``"frame"`` or ``"label"``: which search decodes a CB ``model`` with ``options``
    (``cb_search="auto"``: the frame-synchronous prefix search for every decoder, as accurate as
    the label-synchronous search on the synth recipe's autoregressive model, and faster:
    recipes/synth/RESULTS.md, "Every decoder x loss pair on the same encoder and budget")."""
    return "frame" if options.cb_search == "auto" else options.cb_search


def check_options(model, options: BeamSearchOptions, lm: LabelScorer | None) -> None:
    """Refuse option combinations that do not apply to ``model``, naming the option."""
    family = search_family(model)
    if options.cb_search != "auto" and family != "cb":
        raise ValueError(f"--cb-search applies to CB models only; this is a {family} model")
    if (
        family == "cb"
        and cb_search_kind(model, options) == "label"
        and model.decoder.order is not LabelOrder.HISTORY
    ):
        raise ValueError(
            "--cb-search label needs an autoregressive decoder; the frame-synchronous search is "
            f"exact for this one ({type(model.decoder).__name__}, order {model.decoder.order.value})"
        )
    if options.ilm_weight != 0 and not (family == "transducer" and model.criterion == "hat"):
        raise ValueError(
            f"--ilm-weight (HAT eq. 9's lambda_2) needs a HAT model; this is a {family} model"
            + (f" ({model.criterion})" if family == "transducer" else "")
        )
    if options.merge != "host" and (family != "transducer" or model.criterion == "tdt"):
        kind = f"{family} model" + (" (tdt)" if family == "transducer" else "")
        raise ValueError(f"--merge applies to the RNN-T and HAT beam search; this is a {kind}")
    if options.lm_weight != 0 and lm is None:
        raise ValueError("--lm-weight is set but no language model is given (--lm)")
    if family == "transducer" and model.criterion == "tdt" and lm is not None:
        raise ValueError("--lm: the TDT beam search has no language-model fusion")


@torch.no_grad()
def beam_search(
    model,
    feats: torch.Tensor,
    feat_lens: torch.Tensor,
    options: BeamSearchOptions,
    lm: LabelScorer | None = None,
) -> list[list[Hypothesis]]:
    """N-best hypotheses of each utterance.

    Args:
        model: a :class:`~cbasr.models.CTCModel`, :class:`~cbasr.models.CBModel` or
            :class:`~cbasr.models.TransducerModel` (in eval mode).
        feats: ``(B, T, F)`` features; feat_lens: ``(B,)``.
        options: see :class:`BeamSearchOptions`; transducers use the model's ``max_symbols``
            unless the options set one.
        lm: external language model for shallow fusion.

    Returns:
        Per utterance, hypotheses best first.
    """
    check_options(model, options, lm)
    family = search_family(model)
    if family == "ctc":
        log_probs, lens = model.log_probs(feats, feat_lens)
        return ctc_prefix_beam_search(log_probs, lens, options, lm)
    h, lens = model.encoder(feats, feat_lens)
    if family == "cb":
        if cb_search_kind(model, options) == "label":
            return cb_label_beam_search(model.decoder, h, lens, options, lm)
        return cb_beam_search(model.decoder, h, lens, options, lm)
    if options.max_symbols is None:
        options = dataclasses.replace(options, max_symbols=model.max_symbols)
    if model.criterion == "tdt":
        return tdt_beam_search(model.decoder, h, lens, options, options.max_symbols)
    return transducer_beam_search(model.decoder, h, lens, options, lm, monotonic=model.monotonic)
