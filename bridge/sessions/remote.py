"""Threads whose lease another replica holds (docs/DESIGN.md "Bus"): who the holder is, how a client's
command reaches it, and what comes back — the bus side of forwarding.

The forwarding port (sessions/forwarding.py) asks :class:`LeaseHolders` who holds a thread's
live lease; when it is another replica, the command's wire form goes to that replica's
inbox on the bus (:meth:`LeaseHolders.forward`) and the holder's answer — the same body a local
client would have been given, or the same refusal (:func:`refusal`) — comes back. The
holder runs the command exactly as it runs a local client's (:func:`serve`), so
``client_id`` idempotency holds across replicas: the holder looks the id up in the shared
store.

The answer comes back over the bus while the events the command caused come through the
store (a commit announcement, then a read), so either can arrive first. The client's own
subscription (``answer_to``) is held while the answer is awaited (sessions/fanout.py), and
its transport releases it once the answer is pushed: the answer first, as on the holder.

Everything in a command comes from another process and is checked before it is used
(:func:`~bridge.sessions.commands.from_wire`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from bridge.bus.base import Bus, BusUnavailable, CommandRefused, NoReply, NotOnBus, Reply, valid_id
from bridge.errors import BridgeError
from bridge.sessions.commands import ThreadPort, from_wire
from bridge.sessions.fanout import Subscriber
from bridge.store.base import Lease, Store

# How long a client's input may wait for the holder's answer: a first prompt there may
# spawn the agent and run its handshake.
FORWARD_TIMEOUT_S = 30.0
RETRY_AFTER_S = 2  # a bus outage: the bus reconnects by itself within seconds of Redis answering
# Two readings of a lease's expiry more than this apart (beyond what the reads' own
# durations explain) mean its holder renewed it in between.
RENEWED_BY_S = 0.05


class HolderGone(Exception):
    """The replica a command was sent to no longer holds the thread's lease (it died or
    was cut off, and its lease expired): route the input again."""


class ForwardFailed(BridgeError):
    """The holder could not be reached; the input was not acted on, or its answer was lost
    (a retry with the same ``client_id`` is safe)."""

    code = "owner_unreachable"  # the wire code keeps its historical name (docs/api.md)
    status = 503


class _LeaseWatch:
    """One holder's lease on one thread, read again and again while a forwarded command
    waits: whether it is still that holder's, and whether the holder renews it (it is alive,
    whatever the bus says). The expiry is on the database's clock: each reading gives it
    only within the time the read took, so a renewal is counted only when a reading's
    earliest possible expiry is past an earlier reading's latest."""

    def __init__(self, store: Store, thread_id: str, holder: str) -> None:
        self.store = store
        self.thread_id = thread_id
        self.holder = holder
        self.renewed = False
        self._latest: float | None = None  # the first reading's latest possible expiry (monotonic)

    async def check(self) -> Lease:
        """The lease, still the holder's and live; :class:`HolderGone` when it is not."""
        loop = asyncio.get_running_loop()
        before = loop.time()
        lease = await self.store.lease_of(self.thread_id)
        after = loop.time()
        if lease is None or not lease.live or lease.holder != self.holder:
            raise HolderGone(self.holder)
        if lease.expires_in_s is not None:
            if self._latest is None:
                self._latest = after + lease.expires_in_s
            elif before + lease.expires_in_s > self._latest + RENEWED_BY_S:
                self.renewed = True
        return lease

    async def until_renewed(self, deadline: float, check_s: float) -> bool:
        """Read the lease until the holder is seen renewing it (True) or the deadline passes
        (False); :class:`HolderGone` once it is no longer the holder's."""
        loop = asyncio.get_running_loop()
        while not self.renewed and loop.time() < deadline:
            lease = await self.check()
            if self.renewed:
                break
            left = lease.expires_in_s if lease.expires_in_s is not None else check_s
            await asyncio.sleep(max(0.05, min(check_s, left + 0.05, deadline - loop.time())))
        return self.renewed


class LeaseHolders:
    """This replica's view of who holds which thread's lease, and its way to their inboxes."""

    def __init__(
        self, store: Store, bus: Bus, replica_id: str, *, lease_ttl_s: float, timeout_s: float = FORWARD_TIMEOUT_S
    ) -> None:
        self.store = store
        self.bus = bus
        self.replica_id = replica_id
        self.timeout_s = timeout_s
        # While waiting for an answer, the holder's lease is looked at this often: a holder
        # that died is given up on once its lease has expired, not after the whole timeout.
        self.check_s = max(0.1, min(2.0, lease_ttl_s / 4))
        self.forwarded = 0

    async def elsewhere(self, thread_id: str) -> str | None:
        """The replica that holds the thread's live lease, when it is not this one."""
        lease = await self.store.lease_of(thread_id)
        if lease is None or not lease.live or lease.holder is None or lease.holder == self.replica_id:
            return None
        return lease.holder

    async def peers_off_bus(self) -> bool:
        """Whether another replica holds live leases but has no heartbeat on the bus: its
        commits are announced to nobody, so the threads followed here are read from the
        store every second, as when this replica's own bus is down. False while the store
        cannot say (reading it more often would not help)."""
        try:
            on_bus = await self.bus.live_replicas()
        except BusUnavailable:
            return True
        try:
            replicas = await self.store.list_replicas()
        except BridgeError:
            return False
        return any(r.threads > 0 and r.replica_id != self.replica_id and r.replica_id not in on_bus for r in replicas)

    async def forward(
        self,
        holder: str,
        kind: str,
        thread_id: str,
        body: Mapping[str, Any],
        *,
        answer_to: Subscriber | None = None,
    ) -> Mapping[str, Any]:
        """Run a client's input on ``holder``; its answer body, or its refusal re-raised.
        Raises :class:`HolderGone` when the holder's lease ends before it answers.
        ``answer_to``: the sending client's subscription, held from before the command is
        sent (the holder may commit at once) for at most the timeout; whoever pushes the
        answer to it releases it, whatever the outcome."""
        if answer_to is not None:
            answer_to.hold(self.timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        watch = _LeaseWatch(self.store, thread_id, holder)
        request = asyncio.ensure_future(self.bus.request(holder, kind, thread_id, body, self.timeout_s))
        try:
            while not request.done():
                await asyncio.wait({request}, timeout=self.check_s)
                if not request.done():
                    await watch.check()  # it lost the thread while we waited (its answer, if any, is moot)
            reply = await self._reply(request, watch, deadline)
        finally:
            if not request.done():
                request.cancel()
        self.forwarded += 1
        if not reply.ok:
            raise refusal(reply.body)
        return reply.body

    async def _reply(self, request: asyncio.Future[Reply], watch: _LeaseWatch, deadline: float) -> Reply:
        holder = watch.holder
        try:
            return request.result()
        except BusUnavailable as exc:
            raise ForwardFailed(
                f"replica {holder} runs this thread and the bus to it is down; retry later "
                "(with the same client_id if the input may already have reached it)",
                code="bus_unavailable",
                retry_after_s=RETRY_AFTER_S,
            ) from exc
        except NotOnBus as exc:
            # Not reading the bus: dead (its lease runs out, then the input runs here), or
            # alive and cut off from Redis (it renews its lease: tell the client now rather
            # than after the whole timeout).
            if await watch.until_renewed(deadline, self.check_s):
                raise ForwardFailed(
                    f"replica {holder} runs this thread but is not on the bus ({exc}); retry later",
                    code="bus_unavailable",
                    retry_after_s=RETRY_AFTER_S,
                ) from exc
            raise ForwardFailed(f"no answer from replica {holder}, which runs this thread: {exc}") from exc
        except NoReply as exc:
            await self._until_gone(holder, watch.thread_id, deadline)
            raise ForwardFailed(f"no answer from replica {holder}, which runs this thread: {exc}") from exc

    async def _until_gone(self, holder: str, thread_id: str, deadline: float) -> None:
        """The holder did not answer in time: wait, until the deadline, for its lease to
        end — then :class:`HolderGone` — or return (it is alive but silent)."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline:
            lease = await self.store.lease_of(thread_id)
            if lease is None or not lease.live or lease.holder != holder:
                raise HolderGone(holder)
            left = lease.expires_in_s if lease.expires_in_s is not None else self.check_s
            await asyncio.sleep(max(0.05, min(self.check_s, left + 0.05, deadline - loop.time())))


def refusal(body: Mapping[str, Any]) -> BridgeError:
    """The holder's refusal, as the error a local client would have been given."""
    code, message, status = body.get("code"), body.get("message"), body.get("status")
    err = BridgeError(
        message if isinstance(message, str) else "refused by the replica holding the thread",
        code=code if valid_id(code) else "refused",
    )
    if isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 599:
        err.status = status
    retry = body.get("retry_after_s")  # a 503 memory_budget's Retry-After, across replicas
    if isinstance(retry, int) and not isinstance(retry, bool) and 1 <= retry <= 3600:
        err.retry_after_s = retry
    return err


def refused(exc: BridgeError) -> CommandRefused:
    body: dict[str, Any] = {"code": exc.code, "message": exc.message, "status": exc.status}
    if exc.retry_after_s is not None:
        body["retry_after_s"] = exc.retry_after_s
    return CommandRefused(body)


async def serve(port: ThreadPort, kind: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
    """A command from another replica's client, run here (the lease holder) as a local client's
    is run — on ``port``, this replica's local port, so never forwarded again (a
    thread whose lease moved on meanwhile is refused ``not_owner``, and the sender may
    retry). The command is read strictly first (:func:`~bridge.sessions.commands.from_wire`):
    a malformed one is refused ``invalid_request`` and nothing is done."""
    try:
        command = from_wire(kind, body)
        return command.answer_to_wire(await port.run(command))
    except BridgeError as exc:
        raise refused(exc) from exc
