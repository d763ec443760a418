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
more than ``limit``. A turn longer than ``history.TURN_WINDOW`` events is cut at the
window edges the compaction puts in it (sessions/history.py): they stand for turn starts
here, so a page of a flooded turn reads a window or two of it, not the whole turn. Each
store read is one bounded page of records on the store's
reader, and the compaction between two reads is bounded by it: the event loop is never
held for longer than one page's work.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.sessions import history
from bridge.sessions.history import Compactor, Item, edge_after, older_than
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


Bound = tuple[int, int]  # (a turn start or window edge, the seq of the turn start it is in)


def _bounds(starts: list[int], top: int) -> list[Bound]:
    """The turn starts found before ``top`` (newest first), each preceded by its turn's
    window edges that lie before the next newer one (or ``top``), newest first; with no
    turn start found, the edges from the first event (turn start 0)."""
    out: list[Bound] = []
    newer = top
    for turn in starts or [0]:
        edge = edge_after(turn, newer - 1) - history.TURN_WINDOW  # the last edge before ``newer``
        while edge > turn:
            out.append((edge, turn))
            edge -= history.TURN_WINDOW
        out.append((turn, turn))
        newer = turn
    return out


async def _compact(store: Store, thread_id: str, start: Bound, end: int | None, cut: int, stop_at: int) -> _Span:
    """The records from ``start`` (a turn start or window edge; 0: the first event) up to
    ``end``, or with ``end`` None up to the first turn start at or after ``cut`` or
    ``stop_at`` (the end of the turn, or window, that holds ``cut - 1``) or the
    transcript's end, compacted: whole turns, one compaction (the turns' items are the
    same as compacted one by one)."""
    comp = Compactor(start[1])
    after = max(start[0], 1) - 1
    events = size = 0
    while end is None or after < end:
        page = await store.read_events(thread_id, after, READ_PAGE if end is None else min(READ_PAGE, end - after))
        stop = len(page)
        if end is None:
            stop = next(
                (i for i, r in enumerate(page) if r.seq >= stop_at or (r.kind == "turn.started" and r.seq >= cut)), stop
            )
        records = page[:stop] if stop < len(page) else page
        comp.feed(records)
        events += len(records)
        size += sum(len(rec.data_json) for rec in records)
        if stop < len(page) or not page.more or not page:
            break
        after = page[-1].seq
    return _Span(comp, events, size)


def _oldest_within(bounds: list[Bound], cut: int, budget: int) -> Bound:
    """Of the bounds found (newest first), the oldest whose span up to ``cut`` stays within
    ``budget`` events (the newest, whatever its size; (0, 0) when none was found: the
    events before the first turn)."""
    if not bounds:
        return (0, 0)
    chosen = bounds[0]
    for bound in bounds[1:]:
        if cut - bound[0] > budget:
            break
        chosen = bound
    return chosen


async def _top(store: Store, thread_id: str) -> int:
    """Just past the thread's last event: the newest turn's window edges lie below it."""
    row = await store.get_thread(thread_id)
    return (row.get("last_seq") or 0) + 1 if row is not None else 1


async def read_page(store: Store, thread_id: str, before: int | None, limit: int) -> HistoryPage:
    """The newest ``limit`` items that begin before ``before`` (all: None), from the store."""
    items: list[Item] = []
    cut = MAX_SEQ if before is None else before
    top = cut if before is not None else await _top(store, thread_id)
    end: int | None = None  # the first span read runs to the end of its last turn (or window)
    events = size = last_seq = 0
    start, want = cut, FIRST_TURNS
    while start > 1 and len(items) < limit and events < PAGE_EVENTS and size < PAGE_BYTES:
        starts = await store.turn_starts_before(thread_id, cut, want)
        bounds = _bounds(starts, min(cut, top))
        ref = cut if end is not None else bounds[0][0]  # never empty: (0, 0) at least
        chosen = _oldest_within(bounds, ref, PAGE_EVENTS - events)
        stop_at = edge_after(bounds[0][1], cut - 1) if end is None and cut < MAX_SEQ else MAX_SEQ
        span = await _compact(store, thread_id, chosen, end, cut, stop_at)
        start = chosen[0]
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
