"""Progress bars for long work: tqdm on stderr when it is a terminal, silent otherwise (logs,
pipes, CI), so redirected output stays clean."""

import sys
from collections.abc import Iterable

from tqdm import tqdm

__all__ = ["progress_bar"]


def progress_bar(
    items: Iterable, desc: str, total: int | None = None, unit: str = "utt"
) -> Iterable:
    """``items`` wrapped in a tqdm bar when stderr is a terminal."""
    return tqdm(
        items, desc=desc, total=total, unit=unit, disable=not sys.stderr.isatty(), leave=False
    )
