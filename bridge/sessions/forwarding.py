"""The thread port of a replica among others (docs/api.md §1.2 "any replica serves any
thread"): a client's command runs where the thread's agent runs.

:class:`Forwarding` wraps this replica's local port. While the agent runs here, the
command runs here. Otherwise the store says who holds the thread's live lease: another
replica gets the command in its inbox (sessions/remote.py) and its answer — or its refusal,
as the error a local client would have been given — comes back typed; nobody, and it runs
here (which may start the agent, and take the lease). The registry hands this port out
when a bus joins the replicas (``Registry.port``); a single daemon's port is the local
one (sessions/local_port.py) behind a :class:`DrainGate`.

Races are settled by the lease, not here: a holder that dies before answering
(:class:`~bridge.sessions.remote.HolderGone`) is routed around, at most
:data:`ROUTE_ATTEMPTS` times; a replica that took the lease between the look-up and the
local start (:class:`~bridge.errors.HeldElsewhere`, raised before anything was done here) gets
the command forwarded instead. A prompt's ``client_id`` keeps a retry from running twice:
the holder looks it up in the shared store.

**Draining** (SIGTERM; docs/api.md §1.2 "Leases"): a replica shutting down takes no new work.
A command that would make its agent do something new (:data:`NEW_WORK`: a prompt, a mode
or config switch, a raw write) is refused ``draining`` (503, ``Retry-After``) when it would run
there — from its own clients (:func:`refuse_new_work`) and from other replicas' (the
holder's side, sessions/cluster.py). A sender refused so by a draining holder waits, at
most :func:`handover_wait_s`, for that holder to stop its agent and let the lease go,
then routes the command again: it runs here (the agent resumed) or on whoever took the
thread meanwhile. Nothing was recorded by the refusal, so nothing runs twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

import structlog

from bridge.errors import BridgeError, Draining, HeldElsewhere
from bridge.sessions.commands import (
    Command,
    MalformedAnswer,
    Prompt,
    Raw,
    SetConfigOption,
    SetMode,
    SetModel,
    ThreadPort,
)
from bridge.sessions.fanout import Subscriber
from bridge.sessions.remote import ForwardFailed, HolderGone, LeaseHolders

log = structlog.get_logger("bridge.forwarding")

A = TypeVar("A")

ROUTE_ATTEMPTS = 3  # holders tried for one command when each dies before answering

# What a draining replica no longer runs: commands that give its agent new work, or start
# one (a model switch restarts it). Interrupts, permission answers and stops still act on
# what it runs until it exits.
NEW_WORK = frozenset({Prompt.KIND, SetMode.KIND, SetConfigOption.KIND, SetModel.KIND, Raw.KIND})
# Retry-After for a sender whose draining holder did not let go in time (a draining
# replica's own refusals say 1 s: another replica serves them at once).
HANDOVER_RETRY_S = 2
HANDOVER_POLL_S = 0.1  # how often a sender looks whether the draining holder let go
# Beyond stop_grace_s, what a draining holder may take to let a thread go: the SIGKILL that
# follows the grace (3 s later), recording the exit, releasing the lease.
HANDOVER_SLACK_S = 5.0


def handover_wait_s(stop_grace_s: float) -> float:
    """How long a sender waits for a draining holder to hand a thread over."""
    return stop_grace_s + HANDOVER_SLACK_S


def refuse_new_work(kind: str, draining: bool) -> None:
    """Raise ``draining`` for a command of ``kind`` that would run on a draining replica."""
    if draining and kind in NEW_WORK:
        raise Draining("this replica is shutting down and takes no new input; send it to another replica")


class LocalThread(ThreadPort, Protocol):
    """What forwarding needs of this replica's own port (sessions/local_port.py)."""

    id: str

    @property
    def running(self) -> bool: ...

    def touch(self) -> None: ...


def _never() -> bool:
    return False


class DrainGate:
    """A single daemon's port (no other replica to forward to): its local port, with new
    work refused once the daemon drains — a prompt accepted now would only end "not
    started" when the agent is stopped a moment later."""

    def __init__(self, local: ThreadPort, draining: Callable[[], bool]) -> None:
        self.local = local
        self.draining = draining

    async def run(self, command: Command[A], *, answer_to: Subscriber | None = None) -> A:
        refuse_new_work(command.KIND, self.draining())
        return await self.local.run(command, answer_to=answer_to)


class Forwarding:
    """:class:`~bridge.sessions.commands.ThreadPort` for a thread any replica may run.
    ``draining``: whether this replica is shutting down; ``handover_s``: how long a command
    waits for a draining holder to let the thread go."""

    def __init__(
        self,
        local: LocalThread,
        holders: LeaseHolders,
        *,
        draining: Callable[[], bool] = _never,
        handover_s: float = handover_wait_s(0.0),
    ) -> None:
        self.local = local
        self.holders = holders
        self.draining = draining
        self.handover_s = handover_s

    async def run(self, command: Command[A], *, answer_to: Subscriber | None = None) -> A:
        if not self.local.running and (forwarded := await self._elsewhere(command, answer_to)) is not None:
            return forwarded[0]
        refuse_new_work(command.KIND, self.draining())  # it would run here
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
            except BridgeError as exc:
                if exc.code != Draining.code:
                    raise  # the holder's own refusal, as a local client would have had it
                # It is shutting down and refused without acting: once it has let go, route again.
                log.info("thread.holder_draining", thread_id=thread_id, holder=holder, kind=kind)
                await self._handed_over(holder)
                continue
            try:
                return (command.answer_from_wire(reply),)
            except MalformedAnswer as exc:
                raise ForwardFailed("the holder's answer is not well-formed") from exc
        raise ForwardFailed("the replica running this thread keeps changing; retry")

    async def _handed_over(self, holder: str) -> None:
        """Until ``holder`` (draining) no longer holds the thread's live lease: its agent
        stopped and the lease was let go, or it expired. A 503 ``draining`` after
        ``handover_s``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.handover_s
        while await self.holders.elsewhere(self.local.id) == holder:
            if loop.time() >= end:
                raise Draining(
                    f"replica {holder}, which runs this thread, is shutting down and has not handed it over "
                    f"within {self.handover_s:g} s; retry",
                    retry_after_s=HANDOVER_RETRY_S,
                )
            await asyncio.sleep(HANDOVER_POLL_S)
