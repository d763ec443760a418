"""Pages of a thread's compacted history read from the store from its end (docs/api.md
§4.16, issue #36): a page of a million-event thread costs what its last turns cost, not
what the whole transcript costs.

A page holds the items that begin before a cursor seq (``before``; none: the newest
items), at most ``limit`` of them. It is built backwards a few whole turns at a time: the
newest ``turn.started`` events before the cursor (one walk back along the primary key,
bridge/store/rows.py TURN_STARTS_BEFORE) are where the compaction begins, and it ends
where the turn holding the cursor ends, at the next turn start (sessions/history.py: an
item never spans one, so whole turns compact to the items the whole transcript gives).
Older turns are added (8 turns, then twice as many each time) until the page has
``limit`` items or has read its bound of events or bytes; a turn that crosses a bound is
kept whole, so an item is never cut in half, and the newest items are kept when there are
more than ``limit``. Each store read is one bounded page of records on the store's
reader, and the compaction between two reads is bounded by it: the event loop is never
held for longer than one page's work.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.sessions.history import Compactor, Item, older_than
from bridge.store.base import Store

MAX_SEQ = 2**53
READ_PAGE = 100  # records per store read: the compaction between two reads is this much (~1 ms)
PAGE_EVENTS = 20_000  # older turns are added to a page only while it has read fewer events…
PAGE_BYTES = 8 * 1024 * 1024  # …and fewer bytes of event data than these
FIRST_TURNS, MOST_TURNS = 8, 256  # turn starts looked up at once: 8, then twice as many each time


@dataclass(slots=True)
class HistoryPage:
    items: list[Item]
    last_seq: int  # the newest event the page read
    more: bool  # older items may exist: ask again with ``before``
    before: int | None  # the cursor for the next older page (when ``more``)


@dataclass(slots=True)
class _Span:
    comp: Compactor
    events: int
    size: int


async def _compact(store: Store, thread_id: str, start: int, end: int | None, cut: int) -> _Span:
    """The records from ``start`` (a turn start; 0: the first event) up to ``end``, or with
    ``end`` None up to the first turn start at or after ``cut`` (the end of the turn that
    holds ``cut - 1``) or the transcript's end, compacted: whole turns, one compaction
    (the turns' items are the same as compacted one by one)."""
    comp = Compactor()
    after = max(start, 1) - 1
    events = size = 0
    while end is None or after < end:
        page = await store.read_events(thread_id, after, READ_PAGE if end is None else min(READ_PAGE, end - after))
        stop = len(page)
        if end is None:
            stop = next((i for i, r in enumerate(page) if r.kind == "turn.started" and r.seq >= cut), stop)
        records = page[:stop] if stop < len(page) else page
        comp.feed(records)
        events += len(records)
        size += sum(len(rec.data_json) for rec in records)
        if stop < len(page) or not page.more or not page:
            break
        after = page[-1].seq
    return _Span(comp, events, size)


def _oldest_within(starts: list[int], cut: int, budget: int) -> int:
    """Of the turn starts found (newest first), the oldest whose turns up to ``cut`` stay
    within ``budget`` events (the newest, whatever its size; 0 when none was found: the
    events before the first turn)."""
    if not starts:
        return 0
    chosen = starts[0]
    for seq in starts[1:]:
        if cut - seq > budget:
            break
        chosen = seq
    return chosen


async def read_page(store: Store, thread_id: str, before: int | None, limit: int) -> HistoryPage:
    """The newest ``limit`` items that begin before ``before`` (all: None), from the store."""
    items: list[Item] = []
    cut = MAX_SEQ if before is None else before
    end: int | None = None  # the first span read runs to the end of its last turn
    events = size = last_seq = 0
    start, want = cut, FIRST_TURNS
    while start > 1 and len(items) < limit and events < PAGE_EVENTS and size < PAGE_BYTES:
        starts = await store.turn_starts_before(thread_id, cut, want)
        start = _oldest_within(starts, cut if end is not None else (starts[0] if starts else 0), PAGE_EVENTS - events)
        span = await _compact(store, thread_id, start, end, cut)
        last_seq = max(last_seq, span.comp.last_seq)
        items[:0] = span.comp.snapshot(0, older_than(span.comp.items, cut))
        events += span.events
        size += span.size
        cut, end, want = start, start - 1, min(want * 2, MOST_TURNS)
    if len(items) > limit:
        del items[: len(items) - limit]
        return HistoryPage(items, last_seq, True, items[0]["from"])
    older = start > 1
    return HistoryPage(items, last_seq, older, start if older else None)


def cached_page(comp: Compactor, before: int | None, limit: int) -> HistoryPage:
    """The same page from a compaction kept from the thread's first event."""
    n = older_than(comp.items, before)
    lo = max(0, n - limit)
    items = comp.snapshot(lo, n)
    return HistoryPage(items, comp.last_seq, lo > 0, items[0]["from"] if lo > 0 else None)
