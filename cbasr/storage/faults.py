"""Fault injection for the tests that kill real training processes; inert unless asked for.

``CBASR_FAULT_INJECTION`` holds comma-separated points ``<event>:<n>[@<rank>]``:

- ``kill-in-checkpoint:N``: SIGKILL this process halfway through writing the N-th checkpoint
  file it writes (counted from 1 in this process);
- ``kill-in-step:N``: SIGKILL it during optimizer step N of the run (counted from 1 over the
  whole run), after the backward pass and before the update.

``@R`` restricts a point to the process of rank R. Nothing else reads the variable.
"""

import logging
import os
import signal
from collections import Counter

__all__ = ["ENV", "armed", "kill_if_armed", "next_count"]

ENV = "CBASR_FAULT_INJECTION"
log = logging.getLogger(__name__)
_counts: Counter = Counter()


def armed(event: str, n: int, rank: int = 0) -> bool:
    """Whether ``CBASR_FAULT_INJECTION`` asks for ``event`` at its ``n``-th occurrence on ``rank``."""
    spec = os.environ.get(ENV, "")
    if not spec:
        return False
    for point in spec.split(","):
        where, _, on_rank = point.strip().partition("@")
        if where == f"{event}:{n}" and (not on_rank or int(on_rank) == rank):
            return True
    return False


def next_count(event: str) -> int:
    """Count one more ``event`` in this process; its number, from 1."""
    _counts[event] += 1
    return _counts[event]


def kill_if_armed(event: str, n: int, rank: int = 0) -> None:
    """SIGKILL this process (no clean-up, no flushing of files) when ``event:n`` is armed."""
    if armed(event, n, rank):
        log.warning("fault injection: SIGKILL at %s:%d", event, n)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
