"""What the ACP agent (api/acp_agent.py) needs of the daemon's threads, as two protocols,
and the one implementation of them over the registry.

The agent never holds a ``Conversation`` or the ``Registry``: everything it does to a
thread is a command (sessions/commands.py) run through the thread's port, the one entry
point the REST and WebSocket surfaces use too, so a prompt sent over ACP is the same
operation, with the same bounds, as one sent over REST — locally or on the replica that
runs the thread. What it reads (the transcript, the pending permission requests, the seq
it is at, the modes) goes through :class:`AcpThread` and nothing else.

**Where a new operation goes** (fork, an elicitation answer; a model switch is
:class:`~bridge.sessions.commands.SetModel`): its command in
sessions/commands.py, then an ACP method in acp_agent.py's table that builds it and calls
:meth:`AcpThread.run`; nothing here changes. A new *read* the agent needs is one method on
:class:`AcpThread` and one line in :class:`ConversationThread`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol, TypeVar

import structlog

from bridge.api.events import change_frames
from bridge.api.threads import delete_thread_of
from bridge.api.users import User
from bridge.errors import BridgeError
from bridge.protocols.codecs import may_have_modes
from bridge.protocols.envelope import Frames, Page
from bridge.sessions.commands import Command
from bridge.sessions.conversation import Conversation
from bridge.sessions.fanout import Subscriber
from bridge.sessions.modes import modes_of
from bridge.sessions.registry import Registry
from bridge.store.base import ThreadRow

log = structlog.get_logger("bridge.acp_gateway")

A = TypeVar("A")


class AcpThread(Protocol):
    """One thread, as an ACP session sees it."""

    @property
    def id(self) -> str: ...

    @property
    def owner(self) -> str | None:
        """The user it belongs to (users mode), else None."""
        ...

    @property
    def last_seq(self) -> int:
        """The newest committed seq: a session attached now is live from here."""
        ...

    def modes(self) -> dict[str, Any] | None:
        """The agent's session modes, once it has reported them (sessions/modes.py)."""
        ...

    def pending_permissions(self) -> list[dict[str, Any]]: ...

    def is_pending(self, request_id: str) -> bool:
        """Whether the permission request still waits for an answer."""
        ...

    def subscribe(self) -> Subscriber: ...

    def unsubscribe(self, sub: Subscriber) -> None: ...

    async def read_page(self, after: int, limit: int) -> Page: ...

    async def read_frames(self, after: int, limit: int, *, raw: bool) -> Frames: ...

    async def run(self, command: Command[A]) -> A:
        """A client's command (prompt, interrupt, permission answer, mode): its answer, or
        the BridgeError a client is refused with."""
        ...

    async def start_agent(self, wait_s: float) -> None:
        """Start an agent that may report session modes, and wait (at most ``wait_s``) until
        it is ready, so that the session/new answer can carry them; never raises."""
        ...

    def row(self) -> Mapping[str, Any]:
        """The thread as clients see it (§4.3): its title, model, agent_info, …"""
        ...

    def models(self) -> list[str]:
        """The models its profile offers: its ``models`` and its ``model``."""
        ...

    async def stop_agent(self) -> None:
        """Stop its agent, as ``POST /v1/threads/{id}/stop`` does; the thread stays."""
        ...


class AcpThreads(Protocol):
    """The threads an ACP connection can reach."""

    async def create(
        self, *, agent: str | None, cwd: str, owner: str | None, admin: bool, options: dict[str, Any] | None = None
    ) -> AcpThread:
        """A new thread; ``options`` as REST's (docs/api.md §1.5): the client's MCP servers."""
        ...

    async def get(self, thread_id: str) -> AcpThread:
        """Raises BridgeError (``thread_not_found``) when there is none."""
        ...

    async def delete(self, thread_id: str, user: User) -> None:
        """Delete the thread as ``DELETE /v1/threads/{id}`` does, with the same rights;
        raises BridgeError (``thread_not_found``: none, or not ``user``'s)."""
        ...

    def watch(self) -> AsyncIterator[list[tuple[str, Mapping[str, Any] | None]]]:
        """The threads that changed from now on, a page at a time: ``(id, the thread as
        clients see it)``, None for one deleted. Ends when the daemon stops."""
        ...

    async def list(self, *, limit: int, cursor: str | None, owner: str | None) -> tuple[list[ThreadRow], str | None]:
        """One page of threads, newest activity first (``owner``: that user's only)."""
        ...


class ConversationThread:
    """:class:`AcpThread` over a conversation (its public methods) and the port the
    registry gives out for it."""

    def __init__(self, conv: Conversation, registry: Registry) -> None:
        self._conv = conv
        self._registry = registry

    @property
    def id(self) -> str:
        return self._conv.id

    @property
    def owner(self) -> str | None:
        owner = self._conv.thread.get("owner")
        return owner if isinstance(owner, str) else None

    @property
    def last_seq(self) -> int:
        return int(self._conv.thread["last_seq"])

    def modes(self) -> dict[str, Any] | None:
        return modes_of(self._conv.thread)

    def pending_permissions(self) -> list[dict[str, Any]]:
        return self._conv.pending_permissions()

    def is_pending(self, request_id: str) -> bool:
        return any(view.get("request_id") == request_id for view in self._conv.pending_permissions())

    def pending_elicitations(self) -> list[dict[str, Any]]:
        """The thread's pending elicitations (api/acp_elicit.py asks them of its clients)."""
        return self._conv.core.elicitations.views()

    def subscribe(self) -> Subscriber:
        return self._conv.subscribe()

    def unsubscribe(self, sub: Subscriber) -> None:
        self._conv.unsubscribe(sub)

    async def read_page(self, after: int, limit: int) -> Page:
        return await self._conv.journal.read_page(after, limit)

    async def read_frames(self, after: int, limit: int, *, raw: bool) -> Frames:
        return await self._conv.journal.read_frames(after, limit, raw=raw)

    async def run(self, command: Command[A]) -> A:
        # Asked of the registry at each command: the thread may have moved to another replica.
        return await self._registry.port(self._conv).run(command)

    def row(self) -> Mapping[str, Any]:
        return self._conv.thread

    def models(self) -> list[str]:
        profile = self._conv.profile
        if profile is None:
            return []
        return [*(profile.models or ()), *([profile.model] if profile.model else [])]

    async def stop_agent(self) -> None:
        await self._conv.stop("stopped")

    async def start_agent(self, wait_s: float) -> None:
        """An ACP profile's agent is started at session/new, so that the answer carries the
        modes it reports; one that cannot start (or is slow) is left to the first prompt,
        which reports why, as for any thread."""
        conv = self._conv
        if conv.profile is None or not may_have_modes(conv.profile.protocol):
            return
        try:
            async with asyncio.timeout(wait_s):
                await conv.ensure_started()
                await conv.until_ready()
        except (BridgeError, TimeoutError) as exc:
            log.info("acp.agent_not_started", thread_id=conv.id, error=getattr(exc, "code", type(exc).__name__))


class RegistryThreads:
    """:class:`AcpThreads` over the registry."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    async def create(
        self, *, agent: str | None, cwd: str, owner: str | None, admin: bool, options: dict[str, Any] | None = None
    ) -> AcpThread:
        conv = await self._registry.create(
            agent=agent, cwd=cwd, model=None, title=None, options=options, owner=owner, admin=admin
        )
        return ConversationThread(conv, self._registry)

    async def get(self, thread_id: str) -> AcpThread:
        return ConversationThread(await self._registry.get(thread_id), self._registry)

    async def delete(self, thread_id: str, user: User) -> None:
        await delete_thread_of(self._registry, user, thread_id)

    async def watch(self) -> AsyncIterator[list[tuple[str, Mapping[str, Any] | None]]]:
        reg = self._registry
        async for frames in change_frames(reg.store, reg.changes, None):
            yield [
                (f["thread"]["id"], None if f["kind"] == "thread.deleted" else f["thread"])
                for f in frames
                if "thread" in f
            ]

    async def list(self, *, limit: int, cursor: str | None, owner: str | None) -> tuple[list[ThreadRow], str | None]:
        return await self._registry.list_threads(limit=limit, cursor=cursor, agent=None, owner=owner)
