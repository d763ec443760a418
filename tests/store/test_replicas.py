"""Replicas on one store (issue #18), both stores: registration, heartbeats, the listing;
on PostgreSQL a second live process with the same replica_id is refused (a session-level
advisory lock the server drops when the holder dies; SQLite's data-dir lock does that job
for it). Thread rows record the replica that recorded their process, and live_threads (the
start-up reaper's list) is only this replica's."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from support.stores import StoreFactory, opened_at, thread

from bridge.errors import StoreError

pytestmark = pytest.mark.timeout(60)


async def test_register_heartbeat_and_list(opened: StoreFactory) -> None:
    async with asyncio.timeout(30), opened(replica_id="a") as a:
        await a.register_replica("nonce-1", "http://10.0.0.1:8765")
        await a.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        await a.create_thread(thread("thr_2"))  # type: ignore[arg-type]
        assert await a.acquire_lease("thr_1", "a", 30) == 1
        assert await a.acquire_lease("thr_2", "a", 30) == 1
        await asyncio.sleep(0.05)  # the registration's beat is at least this old now
        start = time.monotonic()
        await a.heartbeat()
        (after,) = await a.list_replicas()
        window = time.monotonic() - start
        assert (after.replica_id, after.instance, after.url, after.threads) == (
            "a",
            "nonce-1",
            "http://10.0.0.1:8765",
            2,
        )
        # The beat happened inside the window (without it the age would be at least 0.05 s
        # more than the window), whatever the machine's load.
        assert 0 <= after.heartbeat_age_s <= window + 0.005
        assert after.started_at.endswith("Z")
        await a.release_lease("thr_2", "a", 1)
        assert [r.threads for r in await a.list_replicas()] == [1]


async def test_live_threads_are_only_this_replicas(opened: StoreFactory, store_kind: str) -> None:
    async with asyncio.timeout(30), opened(replica_id="a") as a, opened(replica_id="b") as b:
        await a.create_thread(thread("thr_a"))  # type: ignore[arg-type]
        await b.create_thread(thread("thr_b"))  # type: ignore[arg-type]
        await a.update_thread("thr_a", {"state": "running", "pid": 1234, "pid_start": 99})
        await b.append("thr_b", [], [], {"state": "running", "pid": 5678, "pid_start": 98})
        mine = {r["id"] for r in await a.live_threads()}
        theirs = {r["id"] for r in await b.live_threads()}
        if store_kind == "postgresql":
            assert (mine, theirs) == ({"thr_a"}, {"thr_b"})
        else:
            # One SQLite file is only ever one replica's (the data-dir lock), whatever id
            # it had before: all its live rows are its own.
            assert mine == theirs == {"thr_a", "thr_b"}


async def test_the_same_replica_id_twice_is_refused_on_postgres(pg_url: str) -> None:
    async with asyncio.timeout(30), opened_at(pg_url, "a") as first:
        await first.register_replica("one", None)
        await first.register_replica("one", None)  # the same process again: fine
        async with opened_at(pg_url, "a") as second:
            with pytest.raises(StoreError) as exc:
                await second.register_replica("two", None)
            assert exc.value.code == "replica_id_in_use" and "'a'" in exc.value.message
        async with opened_at(pg_url, "b") as other:
            await other.register_replica("three", None)  # another id: fine
    async with opened_at(pg_url, "a") as later:
        await later.register_replica("four", None)  # the first closed: its lock is gone
        assert {r.replica_id: r.instance for r in await later.list_replicas()} == {"a": "four", "b": "three"}


HOLDER = """
import asyncio, sys
from bridge.store.factory import open_store
async def main():
    store = await open_store(sys.argv[1], replica_id="a")
    await store.register_replica("holder", None)
    print("registered", flush=True)
    await asyncio.sleep(120)
asyncio.run(main())
"""


async def test_a_killed_holders_replica_id_is_free_again(pg_url: str, tmp_path: Path) -> None:
    """SIGKILL leaves no chance to unlock: the server drops the lock with the connection."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        pg_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(20):  # structlog's default output comes first
            while (line := await proc.stdout.readline()) and line.strip() != b"registered":
                pass
        assert line.strip() == b"registered"
        async with opened_at(pg_url, "a") as second:
            with pytest.raises(StoreError, match="in use"):
                await second.register_replica("second", None)
            proc.send_signal(signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 10)
            async with asyncio.timeout(15):
                while True:  # the server notices the dead connection at once, but asynchronously
                    try:
                        await second.register_replica("second", None)
                        break
                    except StoreError:
                        await asyncio.sleep(0.05)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
