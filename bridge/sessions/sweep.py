"""Closing the books of threads nobody runs any more (issue #35 item 2; docs/DESIGN.md
"Ownership").

A replica that dies, freezes or loses the database leaves its threads' rows saying a
process or a turn is live. The next replica that needs such a thread closes its books
when it takes the lease (``ThreadLease._adopt``), but a thread nobody sends input to would
stay "running" for good. So every replica, every few seconds (:func:`sweep_interval`),
asks the store for rows that say live while no replica holds their lease
(``orphaned_threads``), and for each:

1. takes the lease with the normal acquire — one replica wins, the others are refused
   and move on;
2. claims it through the thread's conversation, which reads the row again under the new
   epoch and, if it still says live, appends the closing events in one fenced append
   (``process.exited``, the pending requests cancelled, one ``turn.ended`` per open or
   queued turn, reason ``owner_lost``);
3. gives the lease back at once, so the thread is anyone's to run next.

The sweep never touches a process: the dead owner's agent was on another host (or died
with it), and a live but cut-off owner kills its own agent before its lease can expire.
"""

from __future__ import annotations

import asyncio
import random
from typing import Protocol

import structlog

from bridge.errors import BridgeError
from bridge.sessions.ownership import Ownership
from bridge.store.base import LeaseStore

log = structlog.get_logger("bridge.sweep")

SWEEP_LIMIT = 50  # rows looked at per sweep; more wait for the next one
REASON = "owner_lost"


def sweep_interval(ttl_s: float) -> float:
    """How often a replica sweeps: half a lease, within 0.5-5 s. A left-open turn is then
    ended at most about ``ttl_s`` plus this after its owner's last renew."""
    return min(5.0, max(0.5, ttl_s / 2))


class Claimable(Protocol):
    """A thread's conversation as the sweep uses it (sessions/conversation.py)."""

    async def claim(self, *, reason: str = ...) -> int | None: ...
    async def release_if_idle(self) -> None: ...


class Threads(Protocol):
    """The registry as the sweep uses it."""

    @property
    def draining(self) -> bool: ...

    async def get(self, thread_id: str) -> Claimable: ...


class OrphanSweep:
    def __init__(
        self, store: LeaseStore, ownership: Ownership, threads: Threads, *, every_s: float, limit: int = SWEEP_LIMIT
    ) -> None:
        self.store = store
        self.ownership = ownership
        self.threads = threads
        self.every_s = every_s
        self.limit = limit
        self.closed = 0  # threads whose lease this replica took to close their books

    async def run(self) -> None:
        while True:
            # A little jitter, so that replicas started together do not sweep in step.
            await asyncio.sleep(self.every_s * random.uniform(0.8, 1.2))  # noqa: S311
            if self.threads.draining:
                continue  # a replica on its way out takes no lease
            try:
                await self.sweep_once()
            except BridgeError as exc:  # the store is down: its own health says so
                log.info("sweep.failed", error=exc.message)
            except Exception as exc:  # never ends the loop; the type only (a driver's text may hold a DSN)
                log.warning("sweep.failed", error=type(exc).__name__)

    async def sweep_once(self) -> int:
        """One look at the store; how many threads this replica took to close."""
        taken = 0
        for row in await self.store.orphaned_threads(self.limit):
            if self.threads.draining:
                break
            taken += await self._close(row["id"])
        return taken

    async def _close(self, thread_id: str) -> bool:
        if self.ownership.holds(thread_id):
            return False  # ours, running or about to: the lease's own paths deal with it
        try:
            await self.ownership.ensure(thread_id)
        except BridgeError:  # another replica holds it (it won, or runs it), or it was deleted
            return False
        try:
            conv = await self.threads.get(thread_id)
        except BridgeError:
            await self.ownership.release(thread_id)
            return False
        try:
            await conv.claim(reason=REASON)  # the books are closed here, under the new epoch
            log.warning("thread.orphan_closed", thread_id=thread_id, replica_id=self.ownership.replica_id)
            self.closed += 1
        except BridgeError as exc:
            log.info("sweep.close_failed", thread_id=thread_id, error=exc.message)
        finally:
            await conv.release_if_idle()  # unless a start here took it over meanwhile
        return True
