"""The compacted history paged from its end (docs/api.md §4.16, issue #36 item 4), read from
both stores: whatever the page size, the pages walked by their cursors join to the whole
history, no item is cut in half (streamed messages, long tool calls, permissions, queued
prompts across the pages' boundaries), a page stops at its bounds, and the newest page
reads only the last turns, not the whole transcript."""

from __future__ import annotations

import random
from typing import Any

import pytest
from support.stores import StoreFactory, thread

from bridge.protocols.events import Record
from bridge.sessions import history_read
from bridge.sessions.history import Compactor, Item
from bridge.sessions.history_read import cached_page, read_page

pytestmark = pytest.mark.timeout(60)
TS = "2026-12-01T00:00:00.000Z"
Ev = tuple[str, str, dict[str, Any]]


def _turn(rng: random.Random, n: int, queued_next: bool) -> list[Ev]:
    """One turn after its prompt: a streamed thought, a tool call whose result comes many
    events later (a permission answered in between), a plan, a streamed answer; with
    ``queued_next``, the next prompt is written while this turn still runs."""
    t = f"t{n}"
    out: list[Ev] = [("bridge", "turn.started", {"turn_id": t, "prompt_seq": 0})]
    out += [("agent", "message.delta", {"text": f"h{i}", "channel": "thought"}) for i in range(rng.randint(0, 6))]
    tool = f"k{n}"
    out.append(("agent", "tool.call", {"tool_call_id": tool, "name": "Bash", "input": {"n": n}}))
    if rng.random() < 0.5:
        out.append(("agent", "permission.requested", {"request_id": f"p{n}", "tool": "Bash", "input": {}}))
        out.append(("agent", "agent.status", {"status": "waiting"}))
        out.append(("bridge", "permission.resolved", {"request_id": f"p{n}", "decision": "allow", "by": "web"}))
    out += [("agent", "tool.call", {"tool_call_id": tool, "status": "in_progress"}) for _ in range(rng.randint(0, 4))]
    out += [("agent", "agent.status", {"status": "x"}) for _ in range(rng.randint(0, 8))]
    out.append(("agent", "tool.result", {"tool_call_id": tool, "output": f"out{n}", "is_error": False}))
    if rng.random() < 0.3:
        out.append(("agent", "plan", {"entries": [{"content": "a", "status": "pending"}]}))
        out.append(("agent", "plan", {"entries": [{"content": "a", "status": "completed"}]}))
    if queued_next:
        out.append(_prompt(n + 1))
    out += [("agent", "message.delta", {"text": f"w{i} "}) for i in range(rng.randint(1, 25))]
    if rng.random() < 0.5:
        out.append(("agent", "message", {"role": "assistant", "text": f"answer {n}"}))
    out.append(("agent", "turn.ended", {"turn_id": t, "status": "success"}))
    return out


def _prompt(n: int) -> Ev:
    return ("client", "message", {"role": "user", "text": f"prompt {n}", "turn_id": f"t{n}"})


def transcript(seed: int, turns: int) -> list[Record]:
    rng = random.Random(seed)
    events: list[Ev] = [("bridge", "process.started", {"pid": 1}), ("agent", "agent.status", {"status": "ready"})]
    queued = False
    for n in range(1, turns + 1):
        if not queued:
            events.append(_prompt(n))
        queued = rng.random() < 0.2
        events += _turn(rng, n, queued)
        if n == 3:  # a late result of this turn's tool after the next turn began: its own item there
            events.append(_prompt(n + 1))
            events += _turn(rng, n + 1, False)[:1]
            events.append(("agent", "tool.result", {"tool_call_id": f"k{n}", "output": "late", "is_error": False}))
            events += _turn(rng, n + 1, False)[1:]
    return [Record(i, TS, src, kind, data, None, False) for i, (src, kind, data) in enumerate(events, 1)]


async def stored(store: Any, tid: str, recs: list[Record]) -> None:
    await store.create_thread(thread(tid))
    for i in range(0, len(recs), 200):
        await store.append(tid, recs[i : i + 200], [None] * len(recs[i : i + 200]), {})


def whole(recs: list[Record]) -> Compactor:
    comp = Compactor()
    comp.feed(recs)
    return comp


def count_reads(store: Any) -> list[int]:
    """From now on, each of the store's event reads appends how many records it gave."""
    read = store.read_events
    counted: list[int] = []

    async def counting(thread_id: str, after: int, limit: int, **kw: Any) -> Any:
        page = await read(thread_id, after, limit, **kw)
        counted.append(len(page))
        return page

    store.read_events = counting
    return counted


async def walk(store: Any, tid: str, limit: int) -> list[list[Item]]:
    pages: list[list[Item]] = []
    before: int | None = None
    while True:
        page = await read_page(store, tid, before, limit)
        assert len(page.items) <= limit
        pages.append(page.items)
        if not page.more:
            assert page.before is None
            return pages
        assert page.before is not None and (before is None or page.before < before)
        before = page.before


async def test_pages_of_any_size_join_to_the_whole_history(opened: StoreFactory) -> None:
    recs = transcript(7, 40)
    full = whole(recs).snapshot()
    assert len(recs) > 400 and len(full) > 200
    async with opened() as store:
        await stored(store, "thr_h", recs)
        assert (await read_page(store, "thr_h", None, 1000)).items == full
        assert (await read_page(store, "thr_h", None, 1000)).last_seq == len(recs)
        for limit in (1, 2, 3, 7, 50, 199):
            pages = await walk(store, "thr_h", limit)
            joined = [item for page in reversed(pages) for item in page]
            assert joined == full, limit  # nothing lost, nothing repeated, nothing cut
            assert all(len(p) == limit for p in pages[:-1])  # only the oldest page is short
            # The compaction kept at commit pages the same way.
            cached: list[list[Item]] = []
            before: int | None = None
            while True:
                page = cached_page(whole(recs), before, limit)
                cached.append(page.items)
                if not page.more:
                    break
                before = page.before
            assert cached == pages, limit


async def test_a_late_result_after_the_next_turn_began_is_an_item_of_that_turn(opened: StoreFactory) -> None:
    recs = transcript(3, 6)
    full = whole(recs).snapshot()
    late = [i for i in full if i["type"] == "tool" and i.get("output") == "late"]
    assert len(late) == 1 and "name" not in late[0]  # not joined back into turn 3's tool
    async with opened() as store:
        await stored(store, "thr_l", recs)
        joined = [i for page in reversed(await walk(store, "thr_l", 2)) for i in page]
        assert joined == full


async def test_a_page_stops_at_its_event_bound_with_whole_turns(
    opened: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    recs = transcript(11, 30)
    full = whole(recs).snapshot()
    monkeypatch.setattr(history_read, "PAGE_EVENTS", 40)
    async with opened() as store:
        await stored(store, "thr_b", recs)
        first = await read_page(store, "thr_b", None, 1000)
        assert first.more and 0 < len(first.items) < len(full)
        # The page begins at a turn start: its oldest item is the first of a turn's items.
        assert first.before is not None and first.items[0]["from"] >= first.before
        pages = await walk(store, "thr_b", 1000)
        assert len(pages) > 2 and [i for p in reversed(pages) for i in p] == full


async def test_the_newest_page_reads_the_last_turns_only(opened: StoreFactory) -> None:
    recs = transcript(5, 200)
    async with opened() as store:
        await stored(store, "thr_n", recs)
        counted = count_reads(store)
        page = await read_page(store, "thr_n", None, 5)
        assert page.items == whole(recs).snapshot()[-5:] and page.more
        assert 0 < sum(counted) < len(recs) // 20  # a few turns of 200
        counted.clear()
        older = await read_page(store, "thr_n", page.before, 5)
        assert older.items == whole(recs).snapshot()[-10:-5]
        assert sum(counted) < len(recs) // 20


async def test_turn_starts_are_found_backwards_and_an_empty_thread_has_no_page(opened: StoreFactory) -> None:
    recs = transcript(1, 3)
    starts = [r.seq for r in recs if r.kind == "turn.started"]
    async with opened() as store:
        await stored(store, "thr_s", recs)
        assert await store.turn_starts_before("thr_s", 10**9, 1) == starts[-1:]
        assert await store.turn_starts_before("thr_s", 10**9, 100) == starts[::-1]
        assert await store.turn_starts_before("thr_s", starts[1], 5) == starts[:1]
        assert await store.turn_starts_before("thr_s", starts[0], 5) == []
        await store.create_thread(thread("thr_e"))
        empty = await read_page(store, "thr_e", None, 10)
        assert (empty.items, empty.more, empty.before, empty.last_seq) == ([], False, None, 0)
        assert (await read_page(store, "thr_s", 1, 10)).items == []


def long_turn(tools: int) -> list[Record]:
    """One turn of many events: tool calls whose results come ~30 events later, streamed
    thoughts and answer text all along (a stream that crosses window edges)."""
    events: list[Ev] = [("bridge", "process.started", {"pid": 1}), _prompt(1)]
    events.append(("bridge", "turn.started", {"turn_id": "t1", "prompt_seq": 2}))
    for n in range(tools):
        events.append(("agent", "tool.call", {"tool_call_id": f"k{n}", "name": "Bash", "input": {"n": n}}))
        events += [("agent", "message.delta", {"text": f"{n}.{i} "}) for i in range(7)]
        if n >= 4:
            events.append(
                ("agent", "tool.result", {"tool_call_id": f"k{n - 4}", "output": f"o{n - 4}", "is_error": False})
            )
    events.append(("agent", "turn.ended", {"turn_id": "t1", "status": "success"}))
    events.append(_prompt(2))
    events += _turn(random.Random(2), 2, False)
    return [Record(i, TS, src, kind, data, None, False) for i, (src, kind, data) in enumerate(events, 1)]


async def test_a_turn_longer_than_a_window_is_paged_at_its_edges_without_reading_all_of_it(
    opened: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bridge.sessions import history

    monkeypatch.setattr(history, "TURN_WINDOW", 60)
    monkeypatch.setattr(history_read, "PAGE_EVENTS", 60)  # as at the defaults: a window's worth
    recs = long_turn(300)  # one turn of ~2700 events: 45 windows
    full = whole(recs).snapshot()
    # An edge cuts what crosses it: the answer's text is in several parts, some results
    # are items of their own (no name), and nothing is lost.
    texts = [i["text"] for i in full if i["type"] == "message" and i["role"] == "assistant"]
    assert len(texts) > 40 and "".join(texts).startswith("0.0 0.1 ")
    assert sum(1 for i in full if i["type"] == "tool" and "name" not in i) > 0
    async with opened() as store:
        await stored(store, "thr_w", recs)
        assert (await store.get_thread("thr_w"))["last_seq"] == len(recs)
        counted = count_reads(store)
        for limit in (3, 40):
            pages: list[list[Item]] = []
            before: int | None = None
            while True:
                counted.clear()
                page = await read_page(store, "thr_w", before, limit)
                # A page reads its windows (and at most a read page more), not the ~2700.
                assert sum(counted) <= 3 * 60 + 2 * history_read.READ_PAGE, (limit, before, sum(counted))
                pages.append(page.items)
                if not page.more:
                    break
                before = page.before
            assert [i for p in reversed(pages) for i in p] == full, limit
