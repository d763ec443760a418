"""The PostgreSQL server stops under the store and comes back (issue #18): appends wait
(retried with backoff, ``healthy`` False, its health listeners told, nothing acknowledged before
COMMIT), reads and ping fail with ``store_unavailable``; when it is back everything waiting
commits once, in order, and the store is healthy again. Its own server: it is stopped."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support import postgres
from support.stores import opened_at, records, thread

from bridge.errors import StoreError

pytestmark = pytest.mark.timeout(90)


async def test_appends_wait_out_an_outage_and_lose_nothing(own_postgres: Any) -> None:
    url = own_postgres.create_database("outage")
    health: list[tuple[bool, str | None]] = []
    async with asyncio.timeout(75), opened_at(url, "a") as store:
        unhealthy = asyncio.Event()

        def told(ok: bool, err: str | None) -> None:
            health.append((ok, err))
            if not ok:
                unhealthy.set()

        store.listeners.add(health=told)
        await store.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        await store.append("thr_1", records(1, 1), [None], {})
        await asyncio.to_thread(own_postgres.stop)

        waiting = [asyncio.create_task(store.append("thr_1", records(seq, 1), [None], {})) for seq in (2, 3)]
        await unhealthy.wait()
        assert not any(t.done() for t in waiting)  # nothing acknowledged while it is down
        assert health and health[0][0] is False
        with pytest.raises(StoreError) as down:
            await store.ping()
        assert down.value.code == "store_unavailable"
        with pytest.raises(StoreError) as read:
            await store.read_events("thr_1", 0, 10)
        assert read.value.code == "store_unavailable"

        await asyncio.to_thread(own_postgres.start_server)
        await asyncio.gather(*waiting)
        assert store.healthy and health[-1] == (True, None)
        assert [r.seq for r in await store.read_events("thr_1", 0, 10)] == [1, 2, 3]
        await store.ping()
        row = await store.get_thread("thr_1")
        assert row is not None and row["last_seq"] == 3
    assert all(postgres.PASSWORD not in (err or "") for _, err in health)


async def test_a_read_cancelled_mid_query_leaves_the_store_usable(pg_url: str) -> None:
    async with asyncio.timeout(30), opened_at(pg_url, "a") as store:
        await store.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        await store.append("thr_1", records(1, 3), [None] * 3, {})
        for _ in range(4):  # every reader connection at least once
            slow = asyncio.create_task(store._read(lambda c: c.execute("SELECT pg_sleep(5)")))  # type: ignore[attr-defined]
            await asyncio.sleep(0.2)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            assert [r.seq for r in await store.read_events("thr_1", 0, 10)] == [1, 2, 3]
