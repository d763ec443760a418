"""This replica among others (docs/DESIGN.md "Bus"): what the bus wakes, the commands it
brings for threads whose lease this replica holds, and the replica's heartbeat in the store.

* Commits here are announced (thread, last seq); a commit announced by another replica
  wakes this replica's copy of the thread, which reads the new records from the shared
  store and publishes them to its own subscribers (:meth:`Conversation.follow`). Followed
  threads are also read every second while the bus is down (here, or for a replica
  that holds leases but has no heartbeat on it), and every few seconds
  regardless (an announcement may be dropped), so nothing is lost without the bus.
* A client's command for a thread another replica runs is forwarded to that replica's
  inbox (sessions/forwarding.py, sessions/remote.py); commands arriving here are run as a
  local client's would be (:func:`~bridge.sessions.remote.serve`).
* Changes to thread rows wake the server-wide change streams of every replica.
* The replica's row in the store is kept alive (``GET /v1/cluster``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import structlog

from bridge.bus.base import Bus, Command
from bridge.errors import BridgeError
from bridge.sessions.conversation import Conversation
from bridge.sessions.forwarding import refuse_new_work
from bridge.sessions.local_port import LocalPort
from bridge.sessions.registry import Registry
from bridge.sessions.remote import LeaseHolders, refused, serve
from bridge.store.base import Store

log = structlog.get_logger("bridge.cluster")

FOLLOW_POLL_S = 1.0  # followed threads are read this often while the bus is down
FOLLOW_SWEEP_S = 5.0  # ... and this often while it is up (a dropped announcement)


class ClusterLink:
    """The bus's :class:`~bridge.bus.base.Listener` and command handler for this replica,
    and its heartbeat; :meth:`start` after the registry, :meth:`close` before the store."""

    def __init__(
        self, store: Store, bus: Bus, registry: Registry, *, heartbeat_s: float, lease_ttl_s: float, shared: bool
    ):
        self.store = store
        self.bus = bus
        self.registry = registry
        self.changes = registry.changes
        self.heartbeat_s = heartbeat_s
        self.holders = LeaseHolders(store, bus, bus.replica_id, lease_ttl_s=lease_ttl_s)
        self._tasks: list[asyncio.Task[None]] = []
        self._following: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self.followed_records = 0
        self.shared = shared  # other replicas may run this store's threads (a bus is configured)

    async def start(self) -> None:
        # A local commit changed a thread row: the registry's listener wakes the streams
        # here, this one every other replica.
        self.store.listeners.add(change=self.bus.announce_changes)
        if self.shared:
            self.registry.join_cluster(self.holders, self.bus.announce_commit)
        await self.bus.start(self, self.run)
        self._tasks = [
            asyncio.create_task(self._heartbeat(), name="replica-heartbeat"),
        ]
        if self.shared:
            self._tasks.append(asyncio.create_task(self._sweep(), name="follow-sweep"))

    async def close(self) -> None:
        for task in [*self._tasks, *self._following.values()]:
            task.cancel()
        for task in [*self._tasks, *self._following.values()]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.bus.close()

    def stats(self) -> dict[str, float]:
        """What crossed replicas here (nothing on a single daemon)."""
        if not self.shared:
            return {}
        return {"forwarded": self.holders.forwarded, "followed_events": self.followed_records}

    # Listener
    def committed(self, thread_id: str, last_seq: int) -> None:
        conv = self.registry.loaded(thread_id)
        if conv is not None and not conv.running and conv.core.last_seq < last_seq:
            self._wake(conv)

    def changed(self) -> None:
        self.changes.notify()

    def resync(self) -> None:
        self.changes.notify()  # anything announced while the bus was away: read the store
        for conv in self.registry.followed():
            self._wake(conv)

    # following threads another replica runs
    def _wake(self, conv: Conversation) -> None:
        if conv.id in self._following:
            self._again.add(conv.id)  # read again once the read under way is done
            return
        self._following[conv.id] = asyncio.create_task(self._follow(conv), name=f"follow-{conv.id}")

    async def _follow(self, conv: Conversation) -> None:
        try:
            while True:
                self._again.discard(conv.id)
                self.followed_records += await conv.follow()
                if conv.id not in self._again:
                    return
        except BridgeError as exc:  # the store is down: the next wake or sweep reads again
            log.info("cluster.follow_failed", thread_id=conv.id, error=exc.message)
        except Exception as exc:  # never an unretrieved task error; the type only
            log.warning("cluster.follow_failed", thread_id=conv.id, error=type(exc).__name__)
        finally:
            self._following.pop(conv.id, None)

    async def _sweep(self) -> None:
        last_full = 0.0
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(FOLLOW_POLL_S)
            followed = self.registry.followed()
            if not followed:
                continue
            # Every second while this replica's bus is down, or another replica that runs
            # threads is not on it (its announcements reach nobody); else every few seconds.
            if self.bus.healthy and loop.time() - last_full < FOLLOW_SWEEP_S and not await self.holders.peers_off_bus():
                continue
            last_full = loop.time()
            for conv in followed:
                self._wake(conv)

    # commands from other replicas' clients
    async def run(self, cmd: Command) -> Mapping[str, Any]:
        try:
            # Draining: no new work; the sender waits for the lease to go and routes it again.
            refuse_new_work(cmd.kind, self.registry.draining)
            if cmd.kind == "stop":
                await self.registry.delete(cmd.thread_id, forward=False)
                return {}
            conv = await self.registry.get(cmd.thread_id)
        except BridgeError as exc:
            raise refused(exc) from exc
        return await serve(LocalPort(conv), cmd.kind, cmd.body)  # never forwarded again: it runs here

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self.store.heartbeat()  # leases: sessions/ownership.py renews them
            except BridgeError as exc:  # the store is down: its own health says so
                log.warning("replica.heartbeat_failed", error=exc.message)
            except Exception as exc:  # never ends the loop; the type only (a driver's text may hold a DSN)
                log.warning("replica.heartbeat_failed", error=type(exc).__name__)
