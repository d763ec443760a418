"""This replica among others (docs/DESIGN.md "Bus"): what the bus wakes, and the replica's
heartbeat in the store.

Built so far: the server-wide change streams of every replica are woken when any replica
changes a thread row (the store's change log is shared; the bus only wakes, and each stream
also polls), and every replica keeps its row in the store's ``replicas`` table alive, so
``GET /v1/cluster`` lists who is there. Commands for a thread's owner are not forwarded yet
(a replica answers ``not_owner``); a thread's live events reach clients of the replica that
runs its agent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import structlog

from bridge.bus.base import Bus, Command, CommandRefused
from bridge.errors import BridgeError
from bridge.sessions.changes import ChangeNotifier
from bridge.store.base import Store

log = structlog.get_logger("bridge.cluster")


class ClusterLink:
    """The bus's :class:`~bridge.bus.base.Listener` and command handler for this replica,
    and its heartbeat; :meth:`start` after the registry, :meth:`close` before the store."""

    def __init__(self, store: Store, bus: Bus, changes: ChangeNotifier, heartbeat_s: float):
        self.store = store
        self.bus = bus
        self.changes = changes
        self.heartbeat_s = heartbeat_s
        self._beat: asyncio.Task[None] | None = None

    async def start(self) -> None:
        local = self.store.on_change

        def on_change() -> None:  # a local commit changed a thread row: here, then everywhere
            if local is not None:
                local()
            self.bus.announce_changes()

        self.store.on_change = on_change
        await self.bus.start(self, self.run)
        self._beat = asyncio.create_task(self._heartbeat(), name="replica-heartbeat")

    async def close(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
        await self.bus.close()

    # Listener
    def committed(self, thread_id: str, last_seq: int) -> None:
        return None  # live events of another replica's thread: not relayed yet (issue #18)

    def changed(self) -> None:
        self.changes.notify()

    def resync(self) -> None:
        self.changes.notify()  # anything announced while the bus was away: read the store

    async def run(self, cmd: Command) -> Mapping[str, Any]:
        raise CommandRefused({"code": "not_owner", "message": "commands are not forwarded between replicas yet"})

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self.store.heartbeat()
            except BridgeError as exc:  # the store is down: its own health says so
                log.warning("replica.heartbeat_failed", error=exc.message)
            except Exception as exc:  # never ends the loop; the type only (a driver's text may hold a DSN)
                log.warning("replica.heartbeat_failed", error=type(exc).__name__)
