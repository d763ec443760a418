"""The point where committed events are announced: the seam a cross-replica bus plugs in.

A thread's :class:`~bridge.sessions.journal.Journal` calls :meth:`Announcer.committed`
once the store has committed the records (one append, or the bursts of its pipeline that
committed together), in seq order, and before anything else happens on the loop. The
embedded default is the thread's own :class:`~bridge.sessions.fanout.Fanout` (in-process
subscribers).
A bus implementation announces the thread id and last seq to other replicas, which read
the records from the store themselves: an announcement only wakes, the store is the truth,
so an announcer must never block and may drop (a reader that missed one catches up from
the store).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bridge.protocols.events import Record


class Announcer(Protocol):
    def committed(self, records: Sequence[Record]) -> None:
        """``records`` (in seq order) are durable: tell whoever listens."""
        ...
