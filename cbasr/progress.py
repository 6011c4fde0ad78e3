"""Progress bars for long work: tqdm on stderr when it is a terminal, silent otherwise (logs,
pipes, CI), so redirected output stays clean."""

import sys
from collections.abc import Iterable

from tqdm import tqdm

__all__ = ["progress_bar", "counter_bar", "byte_bar"]


def progress_bar(
    items: Iterable, desc: str, total: int | None = None, unit: str = "utt"
) -> Iterable:
    """``items`` wrapped in a tqdm bar when stderr is a terminal."""
    return tqdm(
        items, desc=desc, total=total, unit=unit, disable=not sys.stderr.isatty(), leave=False
    )


def counter_bar(
    desc: str,
    total: int | None,
    initial: int = 0,
    unit: str = "it",
    enabled: bool = True,
    **options,
) -> tqdm:
    """A bar counted by hand (``update(n)``), from ``initial`` (a resumed epoch) to ``total``;
    shown when ``enabled`` and stderr is a terminal (``options``: tqdm's)."""
    return tqdm(
        desc=desc,
        total=total,
        initial=initial,
        unit=unit,
        disable=not (enabled and sys.stderr.isatty()),
        leave=False,
        **options,
    )


def byte_bar(desc: str, total: int | None, initial: int = 0) -> tqdm:
    """A bar counting bytes (downloads), shown when stderr is a terminal; ``update(n)`` it."""
    return counter_bar(desc, total, initial, unit="B", unit_scale=True, unit_divisor=1024)
