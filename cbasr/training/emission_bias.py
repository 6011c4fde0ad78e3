"""A CB model's initial emission bias at the training data's label rate (``trainer.emit_bias_init``).

A CB model emits at frame ``t`` with probability ``p_t = P(B_t = 1) = sigmoid(a_t)``, and the
number of labels ``K = sum_t B_t`` is Poisson-Binomial with mean ``sum_t p_t`` (CB paper eqs.
5-6). The decoders start with a bias near 0, so ``p_t`` near 1/2, while word units emit about
one label per 20 encoder frames (connected digits at 30 ms per frame: ``r`` = 0.05); the first
updates of the exact marginal (eq. 38) then go to bringing ``sum_t p_t`` down to ``L``, and the
greedy search can emit nothing for the first epochs. From a bias at the label rate a run leaves
that all-blank start sooner but ends no better after a recipe's 8 epochs, so the default keeps
the decoder's own initialisation (recipes/digits/RESULTS.md, "Transducers, second-order CB and
exact CB at their potential"; synth phones, ``r`` = 0.35: recipes/synth/RESULTS.md,
"Measurements behind defaults"). CB paper section 1 (Figure 1) relates a sampler's bias to the
distance between ``p_t`` and ``L / T``; here that distance starts at zero on average: the bias
is set to ``logit(r)``, ``r`` the training data's labels per encoder frame, ``sum L / sum T'``
over the training utterances, with ``T'`` each utterance's encoder frames after subsampling
(from the frame counts the dataset has already read, without speed perturbation). With the rest
of the logit near zero-mean at initialisation, ``sum_t p_t`` is about ``r T'`` from the first
step.

The option is ``decoder`` (the decoder's own initialisation, as before the option existed),
``label_rate``, or a number: the bias itself. It applies to a new run of a CB model only: a
resumed run keeps its trained bias, and a run from another model's weights
(``trainer.init_from``) that model's.

Reference: Sean Robertson (2020), "The Conditional Bernoulli and its Application to Speech
Recognition" (the CB paper).
"""

import logging
import math

import torch

from cbasr.models import CBModel

__all__ = ["EMIT_BIAS_CHOICES", "emit_bias_option", "label_rate", "init_emission_bias"]

log = logging.getLogger(__name__)

EMIT_BIAS_CHOICES = ("decoder", "label_rate")  # or a number
# A label rate of 0 or 1 has no finite logit; the bias stays within logit(1e-4) = -9.2.
_RATE_FLOOR = 1e-4


def emit_bias_option(value: str) -> str | float:
    """``trainer.emit_bias_init`` parsed: ``"decoder"``, ``"label_rate"`` or the bias (float).

    Raises:
        ValueError: for anything else, naming the option.
    """
    if value in EMIT_BIAS_CHOICES:
        return value
    try:
        bias = float(value)
    except ValueError:
        bias = math.nan
    if not math.isfinite(bias):
        raise ValueError(
            f"trainer.emit_bias_init must be one of {list(EMIT_BIAS_CHOICES)} or a finite "
            f"number (the bias), got {value!r}"
        )
    return bias


def label_rate(encoder, num_frames: list[int], target_lens: list[int]) -> tuple[float, int, int]:
    """``(r, labels, encoder frames)``: the labels per encoder frame over a set of utterances.

    Args:
        encoder: has ``output_lengths(lens (N,)) -> (N,)``, its frames after subsampling.
        num_frames: each utterance's input frames, ``(N,)``.
        target_lens: each utterance's label count, ``(N,)``.
    """
    frames = int(encoder.output_lengths(torch.tensor(num_frames, dtype=torch.long)).sum())
    labels = int(sum(target_lens))
    if frames <= 0:
        raise ValueError("no encoder frames in the training data: no label rate")
    return labels / frames, labels, frames


def init_emission_bias(
    model: torch.nn.Module, option: str, num_frames: list[int], target_lens: list[int]
) -> float | None:
    """Set a CB model's emission bias as ``option`` says (see the module docstring).

    Args:
        model: a :class:`CBModel` (any model when ``option`` is ``"decoder"``, which changes
            nothing).
        option: ``trainer.emit_bias_init``.
        num_frames, target_lens: the training utterances' input frames and label counts.

    Returns:
        The bias set, or None when the decoder's own initialisation stays.

    Raises:
        ValueError: a bias asked of a model without emission logits (CTC, transducers).
    """
    choice = emit_bias_option(option)
    if choice == "decoder":
        return None
    if not isinstance(model, CBModel):
        raise ValueError(
            f"trainer.emit_bias_init={option} sets the emission bias of a CB model; "
            f"{type(model).__name__} has no emission logits (use trainer.emit_bias_init=decoder)"
        )
    if choice == "label_rate":
        rate, labels, frames = label_rate(model.encoder, num_frames, target_lens)
        clamped = min(max(rate, _RATE_FLOOR), 1.0 - _RATE_FLOOR)
        bias = math.log(clamped / (1.0 - clamped))
        log.info(
            "emission bias at the training data's label rate: %d labels / %d encoder frames = "
            "%.4f per frame, bias logit(%.4f) = %.4f",
            labels,
            frames,
            rate,
            clamped,
            bias,
        )
    else:
        bias = choice
        log.info("emission bias %.4f (P(B_t = 1) = %.4f)", bias, 1.0 / (1.0 + math.exp(-bias)))
    with torch.no_grad():
        model.decoder.emission_bias().fill_(bias)
    return bias
