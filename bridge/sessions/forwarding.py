"""The thread port of a replica among others (docs/api.md §1.2 "any replica serves any
thread"): a client's command runs where the thread's agent runs.

:class:`Forwarding` wraps this replica's local port. While the agent runs here, the
command runs here. Otherwise the store says who holds the thread's live lease: another
replica gets the command in its inbox (sessions/remote.py) and its answer — or its refusal,
as the error a local client would have been given — comes back typed; nobody, and it runs
here (which may start the agent, and take the lease). The registry hands this port out
when a bus joins the replicas (``Registry.port``); a single daemon's port is the local
one (sessions/local_port.py).

Races are settled by the lease, not here: a holder that dies before answering
(:class:`~bridge.sessions.remote.HolderGone`) is routed around, at most
:data:`ROUTE_ATTEMPTS` times; a replica that took the lease between the look-up and the
local start (:class:`~bridge.errors.HeldElsewhere`, raised before anything was done here) gets
the command forwarded instead. A prompt's ``client_id`` keeps a retry from running twice:
the holder looks it up in the shared store.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import structlog

from bridge.errors import HeldElsewhere
from bridge.sessions.commands import Command, MalformedAnswer, ThreadPort
from bridge.sessions.fanout import Subscriber
from bridge.sessions.remote import ForwardFailed, HolderGone, LeaseHolders

log = structlog.get_logger("bridge.forwarding")

A = TypeVar("A")

ROUTE_ATTEMPTS = 3  # holders tried for one command when each dies before answering


class LocalThread(ThreadPort, Protocol):
    """What forwarding needs of this replica's own port (sessions/local_port.py)."""

    id: str

    @property
    def running(self) -> bool: ...

    def touch(self) -> None: ...


class Forwarding:
    """:class:`~bridge.sessions.commands.ThreadPort` for a thread any replica may run."""

    def __init__(self, local: LocalThread, holders: LeaseHolders) -> None:
        self.local = local
        self.holders = holders

    async def run(self, command: Command[A], *, answer_to: Subscriber | None = None) -> A:
        if self.local.running:
            return await self.local.run(command, answer_to=answer_to)
        if (forwarded := await self._elsewhere(command, answer_to)) is not None:
            return forwarded[0]
        try:
            return await self.local.run(command, answer_to=answer_to)
        except HeldElsewhere:  # another replica took the lease first: it runs the command
            if (forwarded := await self._elsewhere(command, answer_to)) is None:
                raise
            return forwarded[0]

    async def _elsewhere(self, command: Command[A], answer_to: Subscriber | None) -> tuple[A] | None:
        """The holder's answer, when another replica runs the thread; None when nobody does
        (the command is this replica's to run)."""
        thread_id = self.local.id
        kind, body = command.to_wire()
        for _ in range(ROUTE_ATTEMPTS):
            holder = await self.holders.elsewhere(thread_id)
            if holder is None:
                return None
            self.local.touch()
            log.info("thread.forwarded", thread_id=thread_id, holder=holder, kind=kind)
            try:
                reply = await self.holders.forward(
                    holder, kind, thread_id, body, answer_to=answer_to if command.answered else None
                )
            except HolderGone:  # it died or was cut off before answering: route again
                log.warning("thread.holder_gone", thread_id=thread_id, holder=holder, kind=kind)
                continue
            try:
                return (command.answer_from_wire(reply),)
            except MalformedAnswer as exc:
                raise ForwardFailed("the holder's answer is not well-formed") from exc
        raise ForwardFailed("the replica running this thread keeps changing; retry")
