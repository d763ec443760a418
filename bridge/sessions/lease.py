"""One thread's lease, as its conversation holds it (docs/DESIGN.md "Ownership").

:class:`~bridge.sessions.ownership.Ownership` keeps every lease this replica holds
(acquire, renew, self-fence, release); a :class:`ThreadLease` is one thread's view of it,
with the four things a conversation does with its lease:

* :meth:`ThreadLease.hold` — the epoch for the next append, acquired if needed. A new
  epoch is *adopted* first: the row is read again and a life the previous holder left open
  is closed (:meth:`_adopt`), before anything of this replica's is appended;
* :meth:`ThreadLease.lose` — the store refused an append for its epoch, or the lease could
  not be renewed in time: the object is finished, every later hold refused;
* :meth:`ThreadLease.release` — the agent exited: any replica may run the thread next.

With no :class:`Ownership` (SQLite: one daemon, nothing to contend for) every hold is None
and appends carry no epoch, exactly as before leases existed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from bridge.errors import HeldElsewhere, LeaseLost, NotFound
from bridge.protocols.events import Event, Record
from bridge.sessions.journal import Journal
from bridge.sessions.ownership import (
    LOOKBACK_EVENTS,
    TAIL_EVENTS,
    OpenRequests,
    Ownership,
    needs_takeover,
    open_turn,
    queued_turns,
    settled_by,
    takeover_events,
    turn_in_view,
)
from bridge.store.base import Store, ThreadRow, TranscriptStore

log = structlog.get_logger("bridge.lease")

# The row read again under a new epoch: the holder refreshes what it keeps from it.
Refresh = Callable[[ThreadRow], None]


def _nothing() -> None:
    return None


async def _records(store: TranscriptStore, thread_id: str, after: int, upto: int) -> list[Record]:
    """The records after ``after`` up to ``upto``, whatever the store's page byte bound."""
    out: list[Record] = []
    while after < upto:
        page = await store.read_events(thread_id, after, upto - after, with_raw=False)
        out += page
        if not page or not page.more:
            break
        after = page[-1].seq
    return out


async def settled_in_transcript(store: Store, thread_id: str, request_id: str) -> str | None:
    """Who settled ``request_id``, when the transcript's last TAIL_EVENTS say so: a
    request whose answer this replica's memory never saw (another replica closed a lost
    owner's books, or ran the agent that asked)."""
    row = await store.get_thread(thread_id)
    if row is None:
        return None
    last = row.get("last_seq", 0)
    return settled_by(await _records(store, thread_id, max(0, last - TAIL_EVENTS), last), request_id)


async def closing_events(store: TranscriptStore, row: ThreadRow, reason: str) -> tuple[list[Event], dict[str, Any]]:
    """What closes the books of a life its holder left open (``row`` says a process or a
    turn was live). Read from the transcript's last TAIL_EVENTS, and further back, a page
    at a time (at most LOOKBACK_EVENTS), while something the books need is older than
    what was read: a permission request (the row counts more pending than were found, and
    the life's start is not yet in view), or the open turn's start and the prompt that
    started it (a long turn streams far more than TAIL_EVENTS): so the turn ends with its
    ``turn_id``, and every prompt queued behind it ends too."""
    records, requests = await _life_tail(store, row, turn=bool(row.get("turn_active")))
    return takeover_events(row, reason, open_turn(records), queued_turns(records), requests.open)


async def _life_tail(store: TranscriptStore, row: ThreadRow, *, turn: bool) -> tuple[list[Record], OpenRequests]:
    """The transcript's last TAIL_EVENTS records, and older pages (at most LOOKBACK_EVENTS
    in all) while the row counts more pending permission requests than were found and the
    life's start is not yet in view, or (``turn``) while the open turn's start is not; with
    the requests those records leave open."""
    tid, last = row["id"], row.get("last_seq", 0)
    start = max(0, last - TAIL_EVENTS)
    records = await _records(store, tid, start, last)
    requests = OpenRequests()
    requests.feed_back(records)
    want = row.get("pending_permissions") or 0
    while 0 < start and last - start < LOOKBACK_EVENTS:
        requests_older = not requests.done and len(requests.open) < want
        turn_older = turn and not turn_in_view(records, start)
        if not (requests_older or turn_older):
            break
        older = max(0, start - TAIL_EVENTS)
        page = await _records(store, tid, older, start)
        requests.feed_back(page)
        records = page + records
        start = older
    return records, requests


async def waiting_in_transcript(store: TranscriptStore, row: ThreadRow) -> list[dict[str, Any]]:
    """The permission requests the transcript shows waiting, as ``GET …/permissions`` lists
    them: for a replica that does not run the thread's agent (another replica does, and
    only it holds them in memory)."""
    if not row.get("pending_permissions"):
        return []
    records, requests = await _life_tail(store, row, turn=False)
    waiting = {rid for kind, rid in requests.open if kind == "permission.requested"}
    return [
        {
            "request_id": rec.data["request_id"],
            "tool": rec.data.get("tool"),
            "input": rec.data.get("input") or {},
            "options": list(rec.data.get("options") or []),
            "seq": rec.seq,
            "created_at": rec.ts,
        }
        for rec in records
        if rec.kind == "permission.requested" and isinstance(rec.data, dict) and rec.data.get("request_id") in waiting
    ]


class ThreadLease:
    def __init__(
        self,
        journal: Journal,
        ownership: Ownership | None,
        *,
        refresh: Refresh | None = None,
        on_lost: Callable[[], None] = _nothing,
    ) -> None:
        """``refresh``: called with the row read again when a new epoch is adopted.
        ``on_lost``: the holder's reaction when this lease turns out lost while held."""
        self.id = journal.id
        self.journal = journal
        self.store = journal.store
        self.ownership = ownership
        self._refresh = refresh
        self._on_lost = on_lost
        self.epoch: int | None = None
        self.lost = False  # the lease was lost: the holder is finished (the registry drops it)

    @property
    def held(self) -> bool:
        """An append needs no statement to hold the lease first (no leases, or one held)."""
        return self.ownership is None or self.epoch is not None

    async def hold(self, reason: str = "owner_lost") -> int | None:
        """This thread's epoch (acquired if needed), None with no leases. A new epoch over
        a row that says a process or a turn was live closes that life's books first
        (``reason``). Raises HeldElsewhere while another replica holds it, LeaseLost once lost.
        The caller holds the journal's lock."""
        if self.ownership is None:
            return None
        if self.lost:
            raise LeaseLost(f"thread {self.id}: this replica lost its lease")
        try:
            epoch = await self.ownership.ensure(self.id)
        except HeldElsewhere:
            if self.epoch is not None:  # it was ours: taken over while this replica could not renew
                self._on_lost()
            raise
        if self.epoch is not None and epoch != self.epoch:
            # Our lease lapsed and was granted again: whatever ran meanwhile is not ours to trust.
            self._on_lost()
            raise LeaseLost(f"thread {self.id}: this replica's lease lapsed")
        if epoch != self.epoch:
            await self._adopt(epoch, reason)
            self.epoch = epoch
        return epoch

    async def _adopt(self, epoch: int, reason: str) -> None:
        """A new epoch: the row is read again (another replica may have written since this
        object last looked), and a life the previous holder left open is closed."""
        fresh = await self.store.get_thread(self.id)
        if fresh is None:
            raise NotFound(f"no thread {self.id}", code="thread_not_found")
        if self._refresh is not None:
            self._refresh(fresh)
        if not needs_takeover(fresh):
            return
        events, fields = await closing_events(self.store, fresh, reason)
        await self.journal.commit(events, fields, None, epoch)
        ended = [e.data.get("turn_id") for e in events if e.kind == "turn.ended"]
        cancelled = sum(1 for e in events if e.data.get("decision") == "cancelled")
        log.warning("thread.taken_over", thread_id=self.id, epoch=epoch, reason=reason, turns=ended, requests=cancelled)

    def lose(self) -> bool:
        """Mark the lease lost (the store refused an append for its epoch, or it could not
        be renewed in time). True the first time: the caller then stops what runs."""
        if self.lost:
            return False
        self.lost = True
        if self.ownership is not None:
            self.ownership.forget(self.id)
        return True

    async def release(self) -> None:
        """Give the lease back (the agent exited), so any replica may run the thread next."""
        if self.ownership is None or self.lost:
            return
        self.epoch = None
        await self.ownership.release(self.id)
