"""Permission bits that bind the commands a test runs, also when the tests run as root.

Root ignores permission bits through ``CAP_DAC_OVERRIDE`` (and ``CAP_DAC_READ_SEARCH``); as root,
:func:`unprivileged` is a ``setpriv`` prefix that drops both for the command it runs.
"""

import os
import shutil

import pytest

_DROP = "-dac_override,-dac_read_search"


def unprivileged() -> list[str]:
    """The command prefix that makes permission bits bind this test's subprocesses."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permission bits would not bind")
    return [setpriv, f"--inh-caps={_DROP}", f"--bounding-set={_DROP}"]


def read_only(path):
    """Take write permission from ``path`` and everything below it."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            os.chmod(os.path.join(root, name), 0o444)
        os.chmod(root, 0o555)


def writable(path):
    for root, _dirs, files in os.walk(path):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
