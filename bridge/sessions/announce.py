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

from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from bridge.protocols.events import Record
from bridge.store.base import ThreadRow

log = structlog.get_logger("bridge.announce")

# Something else told of a thread's commits (the thread's row as it now is, the records).
Listener = Callable[[ThreadRow, Sequence[Record]], None]


class Announcer(Protocol):
    def committed(self, records: Sequence[Record]) -> None:
        """``records`` (in seq order) are durable: tell whoever listens."""
        ...


class Also:
    """An announcer that, after ``first``, tells ``listener`` too (Web Push, bridge/push):
    a listener's failure is logged, never the commit's."""

    def __init__(self, first: Announcer, thread: ThreadRow, listener: Listener) -> None:
        self.first = first
        self.thread = thread
        self.listener = listener

    def committed(self, records: Sequence[Record]) -> None:
        self.first.committed(records)
        try:
            self.listener(self.thread, records)
        except Exception:
            log.exception("announce.listener_failed", thread_id=self.thread.get("id"))
