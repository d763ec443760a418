"""Transcript pages are bounded by bytes as well as by count (Hardening II #4): a replay of
a thread full of huge events holds one page in memory, not the whole transcript. Both
stores (tests/store/conftest.py)."""

from __future__ import annotations

import pytest
from support.stores import StoreFactory, thread
from support.stores import user_prompt as big

from bridge.store.base import PAGE_BYTES

pytestmark = pytest.mark.timeout(60)
MIB = 1024 * 1024


async def test_pages_stop_at_the_byte_bound_and_still_cover_every_event_in_order(opened: StoreFactory) -> None:
    async with opened() as store:
        row = {
            "id": "thr_1",
            "agent": "a",
            "protocol": "stream-json",
            "cwd": "/tmp",
            "title": "",
            "state": "idle",
            "turn_active": False,
            "last_seq": 0,
            "created_at": "t",
            "updated_at": "t",
            "options": {},
        }
        await store.create_thread(row)  # type: ignore[arg-type]
        for seq in range(1, 25):  # 24 events of ~2 MiB each (text and raw line)
            await store.append("thr_1", [big(seq, MIB)], [None], {})
        seen: list[int] = []
        after = 0
        while page := await store.read_events("thr_1", after, 1000):
            size = sum(len(r.data_json) + len(r.raw or "") for r in page)
            assert size < PAGE_BYTES + 3 * MIB and len(page) <= PAGE_BYTES // (2 * MIB) + 1
            seen += [r.seq for r in page]
            after = page[-1].seq
        assert seen == list(range(1, 25))
        frames = await store.read_frames("thr_1", 0, 1000, raw=False)
        assert 1 <= frames.count <= PAGE_BYTES // (2 * MIB) + 1 and frames.last == frames.count
        assert sum(len(t) for t in frames.texts) < PAGE_BYTES + 3 * MIB
        # Raw mode relays agent lines only: these client events are rows with nothing to send.
        frames = await store.read_frames("thr_1", 0, 1000, raw=True)
        assert frames.texts == [] and frames.count == 24
        small = await store.read_events("thr_1", 0, 2)
        assert [r.seq for r in small] == [1, 2]  # the count bound still holds


async def test_a_page_without_raw_has_the_same_events_and_no_raw(opened: StoreFactory) -> None:
    """``with_raw=False`` (the compacted history's read): the same records, data and all,
    with ``raw`` left unread."""
    async with opened() as store:
        await store.create_thread(thread("thr_2"))  # type: ignore[arg-type]
        await store.append("thr_2", [big(1, 100), big(2, 200)], [None, None], {})
        full = await store.read_events("thr_2", 0, 10)
        bare = await store.read_events("thr_2", 0, 10, with_raw=False)
        assert [(r.seq, r.kind, r.source, r.data, r.relay) for r in bare] == [
            (r.seq, r.kind, r.source, r.data, r.relay) for r in full
        ]
        assert all(r.raw is not None for r in full) and all(r.raw is None for r in bare)
