"""Every agent a replica spawns on a shared store, registered with the fence watchdog
(bridge/process/fence.py) until it exits, with its lease's kill time kept current.

The kill time is the lease's self-fence deadline (``Ownership.deadline``: ``ttl - margin``
after the start of the statement that last extended it) plus half the margin. A daemon
whose event loop runs has stopped the agent itself at the deadline (and recorded why), so
the watchdog acts only when the daemon could not; and it acts ``margin / 2`` before the
lease can expire in the store, the earliest another replica can take the thread and start
its own agent on the same native session.
"""

from __future__ import annotations

import asyncio

import structlog

from bridge.process.agent_io import AgentIO, Spawn
from bridge.process.fence import Fence
from bridge.process.launch import LaunchSpec
from bridge.process.subreaper import Tracked
from bridge.sessions.ownership import Ownership

log = structlog.get_logger("bridge.fence")


class FencedSpawn:
    def __init__(self, fence: Fence, ownership: Ownership, spawn: Spawn) -> None:
        self.fence = fence
        self.ownership = ownership
        self._spawn = spawn
        self._exits: set[asyncio.Task[None]] = set()
        ownership.on_extended = self._extended

    def for_thread(self, thread_id: str) -> Spawn:
        """The spawn a conversation of ``thread_id`` uses: the agent is registered as soon
        as it exists, and forgotten when it exits."""

        async def spawn(spec: LaunchSpec) -> AgentIO:
            proc = await self._spawn(spec)
            self._arm(thread_id, proc)
            return proc

        return spawn

    def kill_at(self, thread_id: str) -> float | None:
        deadline = self.ownership.deadline(thread_id)
        return None if deadline is None else deadline + self.ownership.margin_s / 2

    def _arm(self, thread_id: str, proc: AgentIO) -> None:
        if not isinstance(getattr(proc, "pgid", None), int):
            return  # not an OS process of its own group (an in-memory agent in tests)
        kill_at = self.kill_at(thread_id)
        if kill_at is None:  # the lease went while the agent was being spawned: the lease's
            log.warning("fence.not_armed", thread_id=thread_id, pid=proc.pid)  # loss stops it
            return
        tracked: Tracked = proc  # type: ignore[assignment]
        self.fence.arm(thread_id, tracked, kill_at)
        task = asyncio.create_task(self._forget_at_exit(thread_id, proc), name=f"fence-{thread_id}")
        self._exits.add(task)
        task.add_done_callback(self._exits.discard)

    async def _forget_at_exit(self, thread_id: str, proc: AgentIO) -> None:
        try:
            await proc.wait()
        finally:
            self.fence.forget(thread_id, proc)

    def _extended(self, thread_ids: list[str]) -> None:
        for tid in thread_ids:
            kill_at = self.kill_at(tid)
            if kill_at is not None:
                self.fence.extend(tid, kill_at)
