"""The [capacity] caps on what the store holds (issue #36, docs/configuration.md): how many
threads there are, daemon-wide (``max_threads``) and per user (``max_threads_per_user``),
and how much one thread's transcript may hold (``max_transcript_mb``; the journal counts it,
sessions/journal.py ``Journal.full``, and the agent run stops a flooding agent).

Threads are counted in the store, not in memory: on PostgreSQL every replica creates
threads in the same table, and a deleted thread frees its place at once. The count and the
creation run under this daemon's lock and the store's creation lock (on PostgreSQL an
advisory lock every replica takes), so the daemons sharing a store never go past the cap
together (docs/api.md §4.5)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from bridge.config_capacity import CapacitySettings
from bridge.errors import Busy
from bridge.store.base import ThreadStore

MIB = 1024 * 1024


class Caps:
    def __init__(self, capacity: CapacitySettings, store: ThreadStore) -> None:
        self.capacity = capacity
        self.store = store
        self.refused = 0  # creations refused with thread_limit (/metrics)
        self.transcripts_full = 0  # agents stopped with transcript_full (/metrics)
        self._creating = asyncio.Lock()

    @property
    def max_transcript_bytes(self) -> int:
        return self.capacity.max_transcript_mb * MIB

    @contextlib.asynccontextmanager
    async def room_for_thread(self, owner: str | None) -> AsyncIterator[None]:
        """While the caller creates one thread for ``owner`` (None: token mode): refused
        first (429 ``thread_limit``, nothing created) when a cap is reached."""
        async with self._creating, self.store.creation_lock():
            await self._check(owner)
            yield

    async def _check(self, owner: str | None) -> None:
        cap = self.capacity.max_threads
        held = await self.store.count_threads()
        if held >= cap:
            self._refuse(
                f"this daemon holds {held} threads, its cap ([capacity] max_threads = {cap}); "
                "delete threads that are no longer needed to create new ones"
            )
        per_user = self.capacity.max_threads_per_user
        if owner is None or per_user is None:
            return
        mine = await self.store.count_threads(owner)
        if mine >= per_user:
            self._refuse(
                f"you hold {mine} threads, the cap per user ([capacity] max_threads_per_user = {per_user}); "
                "delete threads you no longer need to create new ones"
            )

    def _refuse(self, message: str) -> None:
        self.refused += 1
        raise Busy(message, code="thread_limit")

    def transcript_full(self) -> None:
        """An agent was stopped because its thread's transcript reached the cap."""
        self.transcripts_full += 1


def full_text(held: int, cap_mb: int) -> str:
    """What a client is told when a thread's transcript reaches the cap."""
    return (
        f"this thread's transcript holds {held / MIB:.1f} MiB, its cap ([capacity] max_transcript_mb = {cap_mb}): "
        "the agent was stopped; the thread stays readable (its events and history) and takes no new prompt"
    )
