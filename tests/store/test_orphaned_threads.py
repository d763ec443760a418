"""``orphaned_threads`` (issue #35 item 2), both stores: the rows that say a process or a
turn is live while no replica holds their lease live — what the sweep (sessions/sweep.py)
closes. A row that is idle, or whose lease is live, is never listed; the listing is bounded."""

from __future__ import annotations

import asyncio

import pytest
from support.stores import StoreFactory, thread

pytestmark = pytest.mark.timeout(60)


async def test_lists_live_rows_nobody_holds_and_only_them(opened: StoreFactory) -> None:
    async with asyncio.timeout(30), opened(replica_id="a") as a:
        for tid in ("thr_idle", "thr_held", "thr_released", "thr_expired", "thr_turn", "thr_never"):
            await a.create_thread(thread(tid))  # type: ignore[arg-type]
        # held live: not an orphan, whatever its row says
        assert await a.acquire_lease("thr_held", "a", 30) == 1
        await a.update_thread("thr_held", {"state": "running"})
        # released while the row still says running (its exit was never recorded)
        assert await a.acquire_lease("thr_released", "a", 30) == 1
        await a.update_thread("thr_released", {"state": "running"})
        assert await a.release_lease("thr_released", "a", 1)
        # expired on the database's clock
        assert await a.acquire_lease("thr_expired", "a", 0.05) == 1
        await a.update_thread("thr_expired", {"state": "starting"})
        # a turn open with no process recorded, lease expired
        assert await a.acquire_lease("thr_turn", "a", 0.05) == 1
        await a.update_thread("thr_turn", {"turn_active": True})
        # live but never leased (a row written before leases)
        await a.update_thread("thr_never", {"state": "stopping"})
        # idle, lease released: nothing to close
        assert await a.acquire_lease("thr_idle", "a", 0.05) == 1
        await asyncio.sleep(0.2)
        found = {r["id"] for r in await a.orphaned_threads(10)}
        assert found == {"thr_released", "thr_expired", "thr_turn", "thr_never"}
        assert len(await a.orphaned_threads(2)) == 2  # bounded
        # a row is a whole row: the sweep reads its state and its last seq
        (row,) = [r for r in await a.orphaned_threads(10) if r["id"] == "thr_turn"]
        assert row["turn_active"] is True and row["last_seq"] == 0
        # taken again: no longer an orphan
        assert await a.acquire_lease("thr_expired", "b", 30) == 2
        assert "thr_expired" not in {r["id"] for r in await a.orphaned_threads(10)}
