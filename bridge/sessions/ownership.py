"""Leased ownership of live threads on a shared store (issue #18; docs/DESIGN.md
"Ownership").

A replica runs a thread's agent only while it holds the thread's lease, and every append it
makes carries the lease's epoch, which the database checks (``LeaseStore``). This module
keeps the leases this replica holds:

* :meth:`Ownership.ensure` acquires (or confirms) a lease and answers its epoch, or raises
  :class:`~bridge.errors.HeldElsewhere` naming the replica that holds it live;
* :meth:`Ownership.run` renews every lease in one statement every ``ttl / 3``;
* **self-fencing**: a lease is counted lost once ``ttl - margin`` (margin ``ttl / 5``) has
  passed since the START of the last statement that extended it (its acquire or a renew),
  or once a renew no longer returns it. The database's expiry is at least ``ttl`` after
  that start, so ``on_lost`` runs (and the registry stops the agents) before another
  replica can take the thread over.

Expiry is the database's clock; ``clock`` (monotonic here) only measures this replica's own
elapsed time, so replicas' clocks never need to agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from bridge.errors import BridgeError, Draining, HeldElsewhere, NotFound
from bridge.protocols.events import Event, Record
from bridge.store.base import LeaseStore, ThreadRow

log = structlog.get_logger("bridge.ownership")

__all__ = [
    "HeldElsewhere",
    "OpenRequests",
    "Ownership",
    "needs_takeover",
    "open_requests",
    "open_turn",
    "queued_turns",
    "takeover_events",
    "turn_in_view",
]

# A thread another replica released between our refused acquire and the lease_of that
# follows it is tried again this many times before HeldElsewhere.
ACQUIRE_TRIES = 3
# How far back a takeover looks for the turn the previous holder left open.
TAIL_EVENTS = 200
RETRY_S = 0.2  # a failed renew is tried again this soon (or ttl/10, whichever is less)
LIVE_STATES = ("starting", "running", "stopping")
# How far back, at most, the requests a lost life left pending are looked for (pages of
# TAIL_EVENTS read backwards from the end, stopping at the life's start).
LOOKBACK_EVENTS = 20 * TAIL_EVENTS
# An agent process's life begins and ends with these: nothing it asked can be pending
# across them (its exit resolves what was still pending, docs/api.md §6.4).
LIFE_BOUNDARY = frozenset({"process.started", "process.exited"})
# Each kind of request an agent can leave waiting for a client, and the kind that settles
# it. A request is pending from its event until the settling one with the same request_id.
REQUEST_KINDS = {"permission.requested": "permission.resolved", "elicitation.requested": "elicitation.resolved"}
SETTLED_BY = {settled: asked for asked, settled in REQUEST_KINDS.items()}
# How each kind's settling event says "cancelled" (an elicitation's answer is an action).
CANCELLED = {"permission.requested": {"decision": "cancelled"}, "elicitation.requested": {"action": "cancel"}}


def needs_takeover(row: ThreadRow) -> bool:
    """The row says a process or a turn was live: its holder died or was cut off."""
    return row.get("state") in LIVE_STATES or bool(row.get("turn_active"))


def open_turn(tail: Sequence[Record]) -> str | None:
    """The turn the transcript's tail leaves open (started, never ended), if any."""
    ended: set[str] = set()
    for rec in reversed(tail):
        turn_id = rec.data.get("turn_id") if isinstance(rec.data, dict) else None
        if not isinstance(turn_id, str):
            continue
        if rec.kind == "turn.ended":
            ended.add(turn_id)
        elif rec.kind == "turn.started":
            return None if turn_id in ended else turn_id
    return None


def turn_in_view(records: Sequence[Record], after: int) -> bool:
    """Whether ``records`` (the transcript after seq ``after``, to its end) hold the latest
    turn's start and the prompt that started it. Then the prompts still queued are in them
    too: prompts start in the order they were accepted, so each waiting one was accepted
    after the prompt of the turn that started last."""
    for rec in reversed(records):
        if rec.kind == "turn.started":
            prompt_seq = rec.data.get("prompt_seq") if isinstance(rec.data, dict) else None
            return not isinstance(prompt_seq, int) or prompt_seq > after
    return after == 0


def queued_turns(tail: Sequence[Record]) -> list[str]:
    """The turns the tail shows prompted but neither started nor ended (they waited behind
    the active one), in the order they were accepted."""
    prompted: list[str] = []
    done: set[str] = set()
    for rec in tail:
        turn_id = rec.data.get("turn_id") if isinstance(rec.data, dict) else None
        if not isinstance(turn_id, str):
            continue
        if rec.kind == "message" and rec.source == "client":
            prompted.append(turn_id)
        elif rec.kind in ("turn.started", "turn.ended"):
            done.add(turn_id)
    return [t for t in prompted if t not in done]


class OpenRequests:
    """The requests a lost life left pending, found by reading its transcript BACKWARDS, a
    page at a time (:meth:`feed_back`, newest page first): a request is open when no
    settling event for it was seen after it. Reading stops being useful (``done``) at the
    life's start (or the previous life's end): nothing older can still be pending."""

    def __init__(self) -> None:
        self.open: list[tuple[str, str]] = []  # (kind, request_id), oldest first
        self.done = False
        self._settled: set[tuple[str, str]] = set()

    def feed_back(self, page: Sequence[Record]) -> None:
        """One page, older than every page fed before it."""
        found: list[tuple[str, str]] = []
        for rec in reversed(page):
            if self.done:
                break
            if rec.kind in LIFE_BOUNDARY:
                self.done = True
                break
            rid = rec.data.get("request_id") if isinstance(rec.data, dict) else None
            if not isinstance(rid, str):
                continue
            if rec.kind in SETTLED_BY:
                self._settled.add((SETTLED_BY[rec.kind], rid))
            elif rec.kind in REQUEST_KINDS and (rec.kind, rid) not in self._settled:
                self._settled.add((rec.kind, rid))  # asked twice: settled once
                found.append((rec.kind, rid))
        self.open[:0] = reversed(found)


def open_requests(tail: Sequence[Record]) -> list[tuple[str, str]]:
    """The requests (kind, request_id) the tail shows asked in its last life and never settled."""
    scan = OpenRequests()
    scan.feed_back(tail)
    return scan.open


def settled_by(tail: Sequence[Record], request_id: str) -> str | None:
    """Who settled ``request_id`` in the tail (a ``permission.resolved``'s ``by``), if it did."""
    for rec in reversed(tail):
        if rec.kind in SETTLED_BY and isinstance(rec.data, dict) and rec.data.get("request_id") == request_id:
            return str(rec.data.get("by") or "unknown")
    return None


def cancelled(kind: str, request_id: str, reason: str) -> Event:
    """A request of a life that ended, settled as cancelled; ``by`` says why (docs/api.md §6.4)."""
    return Event("bridge", REQUEST_KINDS[kind], {"request_id": request_id, **CANCELLED[kind], "by": reason})


def takeover_events(
    row: ThreadRow,
    reason: str,
    turn_id: str | None,
    queued: Sequence[str] = (),
    requests: Sequence[tuple[str, str]] = (),
) -> tuple[list[Event], dict[str, Any]]:
    """What a new holder appends over a life the old one left open: the process's end,
    the requests it left pending settled as cancelled (by ``reason``), the interrupted
    turn's one terminal event, and the row made consistent. The order is the one an
    agent's own exit records (core.process_exited)."""
    last_exit = {"code": None, "signal": None, "reason": reason}
    events = []
    if row.get("state") in LIVE_STATES:
        events.append(Event("bridge", "process.exited", {"pid": row.get("pid"), **last_exit}))
    events += [cancelled(kind, rid, reason) for kind, rid in requests]
    if row.get("turn_active"):
        data: dict[str, Any] = {"status": "error", "reason": reason, "exit": last_exit}
        data["error"] = (
            "the replica running this thread's agent was lost during this turn"
            if reason == "owner_lost"
            else "the daemon stopped during this turn"
        )
        if turn_id is not None:
            data = {"turn_id": turn_id, **data}
        events.append(Event("bridge", "turn.ended", data))
        for waiting in queued:  # every accepted prompt ends exactly once (docs/api.md §6.2)
            not_started = {**data, "turn_id": waiting, "error": f"not started: {data['error']}"}
            events.append(Event("bridge", "turn.ended", not_started))
    fields = {
        "state": "exited",
        "turn_active": False,
        "last_exit": last_exit,
        "pid": None,
        "pid_start": None,
        "pending_permissions": 0,  # the life that asked is over: nothing waits any more
    }
    return events, fields


class Ownership:
    def __init__(
        self,
        store: LeaseStore,
        replica_id: str,
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_lost: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.store = store
        self.replica_id = replica_id
        self.ttl_s = ttl_s
        self.margin_s = ttl_s / 5
        self.clock = clock
        self.on_lost = on_lost
        # Told which leases a statement just extended (their deadline() moved): the fence
        # watchdog's kill times follow (bridge/process/fence.py).
        self.on_extended: Callable[[list[str]], None] | None = None
        self._held: dict[str, int] = {}  # thread -> epoch
        self._since: dict[str, float] = {}  # thread -> start of the last statement that extended it
        self._pending: dict[str, int] = {}  # threads being acquired now (count of callers)
        self.renewals = 0
        self.renew_failures = 0
        self.lost_total = 0
        self.draining = False  # SIGTERM: no lease is acquired any more (drain)

    def drain(self) -> None:
        """From now on :meth:`ensure` only confirms leases already held: it raises
        :class:`~bridge.errors.Draining` for any other."""
        self.draining = True

    # ------------------------------------------------------------------ queries

    def epoch(self, thread_id: str) -> int | None:
        return self._held.get(thread_id)

    def holds(self, thread_id: str) -> bool:
        return thread_id in self._held

    def count(self) -> int:
        return len(self._held)

    def _fresh(self, thread_id: str) -> bool:
        since = self._since.get(thread_id)
        return since is not None and self.clock() - since < self.ttl_s - self.margin_s

    # ------------------------------------------------------------------ acquire / release

    async def ensure(self, thread_id: str) -> int:
        """The epoch this replica holds on ``thread_id``: the one held while it is fresh,
        else acquired (a new epoch when the thread had no live holder). Raises HeldElsewhere
        while another replica holds it live, NotFound when there is no such thread."""
        held = self._held.get(thread_id)
        if held is not None and self._fresh(thread_id):
            return held
        if self.draining and held is None:
            # SIGTERM: a lease this replica still holds may be confirmed (its agent's exit is
            # recorded under it), but none is taken: the thread is the next replica's.
            raise Draining(f"this replica is shutting down and takes no thread's lease (thread {thread_id})")
        self._pending[thread_id] = self._pending.get(thread_id, 0) + 1
        try:
            return await self._acquire(thread_id)
        finally:
            left = self._pending.pop(thread_id) - 1
            if left:
                self._pending[thread_id] = left

    async def _acquire(self, thread_id: str) -> int:
        for _ in range(ACQUIRE_TRIES):
            started = self.clock()
            epoch = await self.store.acquire_lease(thread_id, self.replica_id, self.ttl_s)
            if epoch is not None:
                self._held[thread_id] = epoch
                self._since[thread_id] = max(started, self._since.get(thread_id, started))
                self._extended([thread_id])
                return epoch
            self._forget(thread_id)
            lease = await self.store.lease_of(thread_id)
            if lease is None:
                raise NotFound(f"no thread {thread_id}", code="thread_not_found")
            if lease.live and lease.holder is not None and lease.holder != self.replica_id:
                raise HeldElsewhere(lease.holder, thread_id)
        raise HeldElsewhere("unknown", thread_id)

    def forget(self, thread_id: str) -> None:
        """This replica gave the thread up without the store (a refused append)."""
        self._forget(thread_id)

    def _forget(self, thread_id: str) -> int | None:
        self._since.pop(thread_id, None)
        return self._held.pop(thread_id, None)

    async def release(self, thread_id: str) -> None:
        """Give the lease up at once (the agent stopped, the thread closed or deleted). A
        failure is logged: the lease then expires by itself, or the next renew finds it
        unknown and releases it."""
        epoch = self._forget(thread_id)
        if epoch is not None:
            await self._release(thread_id, epoch)

    async def _release(self, thread_id: str, epoch: int) -> None:
        try:
            await self.store.release_lease(thread_id, self.replica_id, epoch)
        except BridgeError as exc:
            log.warning("lease.release_failed", thread_id=thread_id, error=exc.message)

    async def release_all(self) -> None:
        held = dict(self._held)
        self._held.clear()
        self._since.clear()
        await asyncio.gather(*(self._release(t, e) for t, e in held.items()))

    # ------------------------------------------------------------------ renew and fence

    async def renew_once(self) -> bool:
        """One renew statement for every lease; True when it succeeded. Leases it did not
        return are lost (``on_lost``); leases it returned that this replica no longer
        keeps (a release that failed) are released."""
        before = {t: e for t, e in self._held.items() if t not in self._pending}
        started = self.clock()
        try:  # no timeout of its own: the watchdog fences on time while this waits
            renewed = await self.store.renew_leases(self.replica_id, self.ttl_s)
        except Exception as exc:  # the type only for a driver's error (its text may hold a DSN)
            self.renew_failures += 1
            error = exc.message if isinstance(exc, BridgeError) else type(exc).__name__
            log.warning("lease.renew_failed", error=error, held=len(before))
            return False
        self.renewals += 1
        await self._renewed(before, started, renewed)
        return True

    async def _renewed(self, before: dict[str, int], started: float, renewed: dict[str, int]) -> None:
        lost, extended = [], []
        for tid, epoch in before.items():
            if self._held.get(tid) != epoch or tid in self._pending:
                continue  # released, lost or re-acquired meanwhile: not this renew's business
            if renewed.get(tid) == epoch:
                self._since[tid] = max(started, self._since.get(tid, started))
                extended.append(tid)
            else:
                lost.append(tid)
        self._extended(extended)
        strays = [(t, e) for t, e in renewed.items() if t not in self._held and t not in self._pending]
        for tid, epoch in strays:
            await self._release(tid, epoch)
        self._lose(lost, "not_renewed")

    def check(self) -> list[str]:
        """Self-fence: every lease not extended for ``ttl - margin`` is lost now."""
        now = self.clock()
        limit = self.ttl_s - self.margin_s
        lost = [t for t, since in self._since.items() if now - since >= limit and t not in self._pending]
        self._lose(lost, "renew_overdue")
        return lost

    def _lose(self, lost: list[str], why: str) -> None:
        if not lost:
            return
        for tid in lost:
            self._forget(tid)
        self.lost_total += len(lost)
        log.warning("lease.lost", threads=lost, why=why, replica_id=self.replica_id)
        if self.on_lost is not None:
            self.on_lost(lost)

    def deadline(self, thread_id: str) -> float | None:
        """When this lease is given up unless extended (on ``clock``): ``ttl - margin``
        after the start of the last statement that extended it. None when not held."""
        since = self._since.get(thread_id)
        return None if since is None else since + self.ttl_s - self.margin_s

    def _extended(self, thread_ids: list[str]) -> None:
        if thread_ids and self.on_extended is not None:
            self.on_extended(thread_ids)

    def next_deadline(self) -> float | None:
        """When the oldest lease must be given up (on ``clock``), None when none is held."""
        if not self._since:
            return None
        return min(self._since.values()) + self.ttl_s - self.margin_s

    async def run(self) -> None:
        """Renew every ``ttl / 3`` and fence on time, even while a renew hangs."""
        watchdog = asyncio.create_task(self._watchdog(), name="lease-watchdog")
        try:
            while True:
                started = self.clock()
                ok = await self.renew_once()
                self.check()
                # A failed renew (a store blip, a deadlock victim) is retried soon, not a
                # third of the ttl later: two misses in a row would fence everything.
                every = self.ttl_s / 3 if ok else min(self.ttl_s / 10, RETRY_S)
                await asyncio.sleep(max(0.0, every - (self.clock() - started)))
        finally:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog

    async def _watchdog(self) -> None:
        while True:
            self.check()
            deadline = self.next_deadline()
            wait = self.ttl_s / 3 if deadline is None else deadline - self.clock()
            await asyncio.sleep(min(self.ttl_s / 3, max(0.005, wait)))
