"""Archived threads in both stores (issue #38 item 4, docs/api.md §4.24): the flag is a
column of the thread row, written like the title, kept across a reopen, and the thread
list leaves archived threads out unless asked for them (only them, or all)."""

from __future__ import annotations

import asyncio

import pytest
from support.stores import StoreFactory, thread

pytestmark = pytest.mark.timeout(60)


async def ids(store: object, **kw: object) -> list[str]:
    rows, _ = await store.list_threads(limit=10, cursor=None, agent=None, **kw)  # type: ignore[attr-defined]
    return [r["id"] for r in rows]


async def test_archived_threads_are_listed_only_when_asked_for(opened: StoreFactory) -> None:
    async with asyncio.timeout(30):
        async with opened() as store:
            for n, tid in enumerate(("ta", "tb", "tc")):
                await store.create_thread(thread(tid, f"2026-12-01T00:00:0{n}.000Z", owner="alice"))  # type: ignore[arg-type]
            got = await store.get_thread("ta")
            assert got is not None and got["archived"] is False
            await store.update_thread("tb", {"archived": True})
            assert await ids(store) == ["tc", "ta"]
            assert await ids(store, archived=True) == ["tb"]
            assert await ids(store, archived=None) == ["tc", "tb", "ta"]
            assert await ids(store, owner="alice", archived=True) == ["tb"]
            assert await ids(store, owner="bob", archived=None) == []
        async with opened() as store:
            got = await store.get_thread("tb")
            assert got is not None and got["archived"] is True
            await store.update_thread("tb", {"archived": False})
            assert await ids(store) == ["tc", "tb", "ta"]
            changes = await store.read_changes(0, 100)
            assert [c.thread["archived"] for c in changes if c.thread_id == "tb"] == [False]  # type: ignore[index]
