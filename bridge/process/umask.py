"""The daemon creates its own files private (umask 077, bridge/datadir.py); agents get the
umask the daemon was started with, because what they create belongs to the operator's
projects and should have the operator's usual modes."""

from __future__ import annotations

import os

PRIVATE_UMASK = 0o077
_operator: int | None = None


def make_private() -> int:
    """Set this process's umask to 077; returns (and remembers, once) the operator's."""
    global _operator
    old = os.umask(PRIVATE_UMASK)
    if _operator is None:
        _operator = old
    return _operator


def agent_umask() -> int:
    """The umask to spawn an agent with: the operator's, or -1 (unchanged) if the daemon
    never made itself private (e.g. the app run in-process by tests)."""
    return -1 if _operator is None else _operator
