"""How far apart a second-order CB model's training labels are, against its window.

The second-order (variable-window monotonic) decoder tells gaps between emissions apart up
to its window ``W`` (:func:`cbasr.losses.cb_marginal_nll_windowed`): every gap of ``W`` frames
or more reads the last ``W`` frames. An utterance with more encoder frames per label than
``W`` cannot spread its labels over its frames without such long gaps, so its labels are read
from windows that may not hold their whole words; earlier, such gaps had probability zero and
the lattice explained the utterance only by emitting labels away from their words, which
nothing reported. :func:`check_long_gaps` reports it at training start, with the worst case,
as a warning: such utterances train (the digits recipe's pinned second-order model is trained
on data where most are), so nothing is refused.
"""

import logging

from cbasr.models import CBModel
from cbasr.modules.decoders.base import LabelOrder

__all__ = ["check_long_gaps"]

log = logging.getLogger(__name__)


def check_long_gaps(model, num_frames: list[int], target_lens: list[int]):
    """Log, for a second-order CB model, how many training utterances have more encoder frames
    per label than its window (``T' > W L``) and the worst ratio (a warning if any has).

    Args:
        model: the model; nothing happens unless it is a :class:`CBModel` with a second-order
            decoder.
        num_frames: input frames per utterance (before subsampling).
        target_lens: labels per utterance.

    Returns:
        ``(count, worst frames per label)``, or None for other models.
    """
    if not isinstance(model, CBModel) or model.decoder.order is not LabelOrder.SECOND_ORDER:
        return None
    W = model.decoder.window
    ratios = [model.output_frames(n) / max(k, 1) for n, k in zip(num_frames, target_lens) if n > 0]
    long = sum(r > W for r in ratios)
    worst = max(ratios, default=0.0)
    share = long / max(len(ratios), 1)
    message = (
        f"{long} of {len(ratios)} training utterances ({100 * share:.1f}%) have more encoder "
        f"frames per label than the second-order window W = {W} (worst {worst:.1f} frames per "
        "label): their gaps of W frames or more read only the last W frames"
    )
    (log.warning if long else log.info)(message)
    return long, worst
