"""A transcript page says whether events may follow it (issue #34 item 7): a page cut by
bytes is short by count and is not the end, so every reader pages on by ``more``, never by
``len(page) < limit``. And a page's read loads no more than its bound: the rows are
measured before their content is taken. Both stores (tests/store/conftest.py)."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from support.stores import StoreFactory, thread
from support.stores import user_prompt as prompt

from bridge.protocols.events import Record
from bridge.store.base import PAGE_BYTES

pytestmark = pytest.mark.timeout(60)
MIB = 1024 * 1024


def agent_line(seq: int, size: int) -> Record:
    line = json.dumps({"type": "assistant", "text": "y" * size})
    return Record(seq, "2026-12-01T00:00:00.000Z", "agent", "agent.other", {"type": "assistant"}, line, True)


async def test_a_page_cut_by_bytes_says_more_and_the_last_page_does_not(opened: StoreFactory) -> None:
    async with opened() as store:
        await store.create_thread(thread("thr_m"))  # type: ignore[arg-type]
        # seq 1 small, 2 a prompt over the bound, 3 an agent line over it, 4 small.
        rows = [agent_line(1, 10), prompt(2, 3 * MIB), agent_line(3, 5 * MIB), agent_line(4, 10)]
        for rec in rows:
            await store.append("thr_m", [rec], [None], {})

        page = await store.read_events("thr_m", 0, 1000)
        assert [r.seq for r in page] == [1, 2] and page.more  # short by count, not the end
        page = await store.read_events("thr_m", 2, 1000)
        assert [r.seq for r in page] == [3] and page.more
        page = await store.read_events("thr_m", 3, 1000)
        assert [r.seq for r in page] == [4] and not page.more  # the end
        page = await store.read_events("thr_m", 4, 1000)
        assert list(page) == [] and not page.more
        page = await store.read_events("thr_m", 0, 1)
        assert [r.seq for r in page] == [1] and page.more  # cut by count
        bare = await store.read_events("thr_m", 0, 1000, with_raw=False)
        assert [r.seq for r in bare] == [1, 2] and bare.more

        frames = await store.read_frames("thr_m", 0, 1000, raw=False)
        assert (frames.count, frames.last, frames.more) == (2, 2, True)
        assert [json.loads(t)["seq"] for t in frames.texts] == [1, 2]
        frames = await store.read_frames("thr_m", 2, 1000, raw=False)
        assert (frames.count, frames.last, frames.more) == (1, 3, True)
        frames = await store.read_frames("thr_m", 3, 1000, raw=False)
        assert (frames.count, frames.last, frames.more) == (1, 4, False)
        frames = await store.read_frames("thr_m", 4, 1000, raw=False)
        assert (frames.count, frames.last, frames.more) == (0, 4, False)

        # Raw mode counts only the lines it relays: the prompt sends nothing, the agent line
        # over the bound ends a page.
        frames = await store.read_frames("thr_m", 0, 1000, raw=True)
        assert (frames.count, frames.last, frames.more) == (3, 3, True)
        assert [len(t) > PAGE_BYTES for t in frames.texts] == [False, True]
        frames = await store.read_frames("thr_m", 3, 1000, raw=True)
        assert (frames.count, frames.last, frames.more) == (1, 4, False)


async def test_a_page_read_loads_no_more_than_its_bound(tmp_path: object) -> None:
    """SQLite (its reads run in this process, where tracemalloc sees them): a thread of
    24 agent lines of 2 MiB, each page read loads about one page, not the rows after it
    (the read took 64 or 128 rows at a time before measuring them: 48 MiB or more for
    this page)."""
    from support.stores import opened_at

    async with opened_at(f"sqlite:///{tmp_path}/bridge.db") as store:
        await store.create_thread(thread("thr_b"))  # type: ignore[arg-type]
        for seq in range(1, 25):
            await store.append("thr_b", [agent_line(seq, 2 * MIB)], [None], {})
        for read in (
            lambda: store.read_events("thr_b", 0, 1000),
            lambda: store.read_frames("thr_b", 0, 1000, raw=False),
            lambda: store.read_frames("thr_b", 0, 1000, raw=True),
        ):
            tracemalloc.start()
            try:
                page = await read()
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert page.more
            assert peak < 2 * PAGE_BYTES + 4 * MIB, f"{peak / MIB:.0f} MiB for one page"


async def test_large_rows_of_another_wire_version_are_rebuilt_like_small_ones(
    opened: StoreFactory, store_url: str
) -> None:
    """SQLite reads a row over 64 KiB apart from its page; PostgreSQL measures the page
    first. A large row of another wire version is still never sent as stored."""
    from test_conformance import execute

    recs = [agent_line(1, 10), prompt(2, 100 * 1024), agent_line(3, 200 * 1024), agent_line(4, 10)]
    async with opened() as store:
        await store.create_thread(thread("thr_w"))  # type: ignore[arg-type]
        await store.append("thr_w", recs, [None] * 4, {})
        changed = (
            "CAST(substr(env, 1, 18) || '7' || substr(env, 20) AS BLOB)"
            if store_url.startswith("sqlite")
            else "overlay(env PLACING '7'::bytea FROM 19 FOR 1)"
        )
        want = [r.envelope().encode() for r in recs]
        frames = await store.read_frames("thr_w", 0, 1000, raw=False)
        assert frames.texts == want and not frames.more
        await execute(
            store_url,
            f"UPDATE events SET wire = wire + 1, env = {changed} WHERE thread_id = %s AND seq = 3",
            ("thr_w",),
        )
        stored = await execute(store_url, "SELECT env FROM events WHERE thread_id = %s AND seq = 3", ("thr_w",))
        assert bytes(stored[0][0]).startswith(b'{"seq":3,"ts":"2027')  # sent as stored, it would differ
        frames = await store.read_frames("thr_w", 0, 1000, raw=False)
        assert frames.texts == want and (frames.count, frames.last, frames.more) == (4, 4, False)
        lines = await store.read_frames("thr_w", 0, 1000, raw=True)
        assert lines.texts == [r.raw.encode() for r in recs if r.relay and r.raw is not None]
        page = await store.read_events("thr_w", 0, 1000)
        assert [(r.seq, r.data_json, r.raw) for r in page] == [(r.seq, r.data_json, r.raw) for r in recs]
