"""Progress bars for long work: tqdm on stderr when it is a terminal, silent otherwise (logs,
pipes, CI), so redirected output stays clean."""

import sys
from collections.abc import Iterable

from tqdm import tqdm

__all__ = ["progress_bar", "byte_bar"]


def progress_bar(
    items: Iterable, desc: str, total: int | None = None, unit: str = "utt"
) -> Iterable:
    """``items`` wrapped in a tqdm bar when stderr is a terminal."""
    return tqdm(
        items, desc=desc, total=total, unit=unit, disable=not sys.stderr.isatty(), leave=False
    )


def byte_bar(desc: str, total: int | None, initial: int = 0) -> tqdm:
    """A bar counting bytes (downloads), shown when stderr is a terminal; ``update(n)`` it."""
    return tqdm(
        desc=desc,
        total=total,
        initial=initial,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not sys.stderr.isatty(),
        leave=False,
    )
