"""Appends issued the way the conversation pipelines them (sessions/journal.py: each one
before the previous one is acknowledged) to the SQLite store and its writer process: batches
commit in the order the appends were issued, a failure lets nothing sent behind it commit
(the writer refuses the rest of that generation), and everything not acknowledged is sent
again, in order, until it commits. (The store itself has one batch at a time in flight:
the one commit pipeline is the journal's, issue #33.)"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from conftest import wait_until
from support.stores import records, thread

from bridge.errors import StoreError
from bridge.protocols.events import Record
from bridge.store import sqlite_sql, wire
from bridge.store.sqlite import SqliteStore
from bridge.store.writer_client import WriterProcess

TS = "2026-12-05T00:00:00.000Z"
PER = 300  # records per append: a flood's burst


def wire_rows(tid: str, first: int, n: int) -> sqlite_sql.Rows:
    return sqlite_sql.rows_of(records(first, n, TS), [None] * n)


def wire_item(tid: str, rows: sqlite_sql.Rows, fields: dict[str, object]) -> tuple[object, ...]:
    return (tid, rows, fields, (TS, rows[sqlite_sql.SEQ][-1] if rows else None, None), False, None, -1)


async def gaps_while(path: Path, tids: list[str], work: Awaitable[Any]) -> list[tuple[str, list[int]]]:
    """While ``work`` runs: read each thread's seqs every 2 ms on a connection of its own;
    every read that is not 1..n (a batch committed ahead of one before it)."""
    task = asyncio.ensure_future(work)
    gaps: list[tuple[str, list[int]]] = []
    db = sqlite3.connect(path)
    try:
        while not task.done():
            for tid in tids:
                got = [s for (s,) in db.execute("SELECT seq FROM events WHERE thread_id=?", (tid,))]
                if got != list(range(1, len(got) + 1)):
                    gaps.append((tid, got))
            await asyncio.wait({task}, timeout=0.002)
    finally:
        db.close()
    await task
    return gaps


def seqs(path: Path, tid: str) -> list[int]:
    db = sqlite3.connect(path)
    try:
        return [s for (s,) in db.execute("SELECT seq FROM events WHERE thread_id=? ORDER BY seq", (tid,))]
    finally:
        db.close()


async def test_a_batch_sent_behind_a_failed_one_is_refused_until_the_next_generation(tmp_path: Path) -> None:
    """Three batches sent back to back to the real writer process, the first failing as a
    whole (a column that does not exist: not one of the refusals that sink one append
    only): the two behind it are refused unwritten; sent again under the next generation
    they commit, and the first, mended, after them would not be in order, so the test
    sends everything again in order, as the store does."""
    async with asyncio.timeout(30):
        path = tmp_path / "bridge.db"
        store = SqliteStore(path)
        await store.open()  # creates the schema (and its own writer, which stays idle)
        await store.create_thread(thread("thr_a", TS))  # type: ignore[arg-type]
        lost: list[str] = []
        proc = WriterProcess(path, 2000, lost.append)
        await proc.start()
        try:
            bad = wire_item("thr_a", wire_rows("thr_a", 1, 10), {"no_such_column": 1})
            good2 = wire_item("thr_a", wire_rows("thr_a", 11, 10), {})
            good3 = wire_item("thr_a", wire_rows("thr_a", 21, 10), {})
            answers = [proc.batch([bad], False, 0), proc.batch([good2], False, 0), proc.batch([good3], False, 0)]
            outcomes = await asyncio.gather(*answers, return_exceptions=True)
            assert all(isinstance(o, StoreError) for o in outcomes), outcomes
            assert "no_such_column" in str(outcomes[0])
            assert "a batch sent before this one failed" in str(outcomes[1])
            assert "a batch sent before this one failed" in str(outcomes[2])
            assert seqs(path, "thr_a") == []  # nothing out of order, nothing half-written
            # The next generation: the mended first batch and the rest, in order.
            fixed = wire_item("thr_a", wire_rows("thr_a", 1, 10), {})
            again = [proc.batch([fixed], True, 1), proc.batch([good2], True, 1), proc.batch([good3], True, 1)]
            assert await asyncio.gather(*again) == [{}, {}, {}]
            assert seqs(path, "thr_a") == list(range(1, 31))
            assert lost == []
        finally:
            await proc.close()
            await store.close()


async def test_pipelined_appends_commit_in_order_and_survive_a_locked_database(tmp_path: Path) -> None:
    """Two appenders per thread in the way the conversation pipelines (each append issued
    before the previous one is acknowledged), appends of 300 events, while another
    connection holds the write lock for a while: every append returns once committed, a
    reader polling all along never sees a gap (a batch committed ahead of one that failed
    would show one), each transcript ends exactly 1..n, and health went False and back."""
    async with asyncio.timeout(60):
        path = tmp_path / "bridge.db"
        health: list[bool] = []
        store = SqliteStore(path, busy_timeout_ms=50)
        store.listeners.add(health=lambda ok, _err: health.append(ok))
        await store.open()
        tids = ["thr_a", "thr_b"]
        rounds = 12
        try:
            for tid in tids:
                await store.create_thread(thread(tid, TS))  # type: ignore[arg-type]

            async def appender(tid: str) -> None:
                inflight: list[asyncio.Future[None]] = []
                for r in range(rounds):
                    first = r * PER + 1
                    inflight.append(asyncio.ensure_future(store.append(tid, records(first, PER, TS), [None] * PER, {})))
                    if len(inflight) > 2:
                        await inflight.pop(0)
                    await asyncio.sleep(0)
                for f in inflight:
                    await f

            # The write lock is held elsewhere from the start until batches have failed, been
            # refused behind the failure and sent again (with backoff) a few times.
            lock = sqlite3.connect(path, isolation_level=None)
            lock.execute("BEGIN IMMEDIATE")

            async def unlock() -> None:
                # Three failures, each abandoning what was behind it.
                await wait_until(lambda: store._generation >= 3, 20, "three failed batches")
                lock.execute("ROLLBACK")
                lock.close()

            assert await gaps_while(path, tids, asyncio.gather(*(appender(t) for t in tids), unlock())) == []
            for tid in tids:
                assert seqs(path, tid) == list(range(1, rounds * PER + 1))
            assert False in health and health[-1] is True
        finally:
            await store.close()


async def test_the_order_of_acknowledgements_is_the_order_of_appends(tmp_path: Path) -> None:
    """Each append is acknowledged only after every append issued before it (its batch
    was sent after theirs and is answered after theirs)."""
    async with asyncio.timeout(30):
        store = SqliteStore(tmp_path / "bridge.db")
        await store.open()
        try:
            await store.create_thread(thread("thr_a", TS))  # type: ignore[arg-type]
            acked: list[int] = []

            async def one(first: int) -> None:
                await store.append("thr_a", records(first, PER, TS), [None] * PER, {})
                acked.append(first)

            issued = []
            for i in range(8):
                issued.append(asyncio.ensure_future(one(i * PER + 1)))
                for _ in range(5):  # the write loop sends it before the next is issued
                    await asyncio.sleep(0)
            await asyncio.gather(*issued)
            assert acked == [i * PER + 1 for i in range(8)]
        finally:
            await store.close()


async def test_the_writer_killed_with_appends_in_flight_loses_and_reorders_nothing(tmp_path: Path) -> None:
    """Pipelined appends of 300 events from two threads while the writer process is
    SIGKILLed three times, each time once more batches committed: every append returns, a
    reader never sees a gap, and each transcript ends exactly 1..n (what the dead writer
    committed before answering is not written twice)."""
    async with asyncio.timeout(60):
        path = tmp_path / "bridge.db"
        store = SqliteStore(path)
        await store.open()
        tids = ["thr_a", "thr_b"]
        try:
            for tid in tids:
                await store.create_thread(thread(tid, TS))  # type: ignore[arg-type]

            kills = asyncio.Event()
            appended = dict.fromkeys(tids, 0)

            async def appender(tid: str) -> None:
                # Until the killer is done, and at least 30 appends.
                inflight: list[asyncio.Future[None]] = []
                r = 0
                while r < 30 or not kills.is_set():
                    inflight.append(
                        asyncio.ensure_future(store.append(tid, records(r * PER + 1, PER, TS), [None] * PER, {}))
                    )
                    r += 1
                    if len(inflight) > 2:
                        await inflight.pop(0)
                    await asyncio.sleep(0)
                for f in inflight:
                    await f
                appended[tid] = r * PER

            def replaced(old: WriterProcess) -> bool:
                new = store._proc
                return new is not None and new is not old and new.alive

            async def killer() -> None:
                for n in range(3):
                    seen = store.batches
                    await wait_until(lambda s=seen: store.batches > s + 1, 20, "batches committed")
                    proc = store._proc
                    assert proc is not None
                    proc.kill()
                    await wait_until(lambda p=proc: replaced(p), 20, f"writer {n + 2}")
                kills.set()

            assert await gaps_while(path, tids, asyncio.gather(*(appender(t) for t in tids), killer())) == []
            for tid in tids:
                assert seqs(path, tid) == list(range(1, appended[tid] + 1))
            assert store.healthy
        finally:
            await store.close()


async def test_appends_waiting_together_beyond_one_frame_go_in_several_batches(tmp_path: Path) -> None:
    """Many big appends pending at once (a hundred threads flooding) hold more text than
    one frame to the writer process may carry (wire.MAX_FRAME): they are committed in
    several batches, never refused as one oversized frame (which stalled the write loop)."""
    async with asyncio.timeout(60):
        store = SqliteStore(tmp_path / "bridge.db")
        await store.open()
        try:
            tids = [f"thr_{i}" for i in range(40)]
            for tid in tids:
                await store.create_thread(thread(tid, TS))  # type: ignore[arg-type]
            big = "x" * 7000
            batches = store.batches

            def payload(first: int) -> list[Record]:
                return [
                    Record(s, TS, "agent", "message.delta", {"text": big}, None, False)
                    for s in range(first, first + 300)
                ]

            # 40 appends of 300 events of 7 KB each, about 84 MB in all, issued together.
            await asyncio.gather(*(store.append(tid, payload(1), [None] * 300, {}) for tid in tids))
            for tid in tids:
                assert seqs(tmp_path / "bridge.db", tid) == list(range(1, 301))
            assert store.batches - batches >= 84 * 1024 * 1024 // wire.MAX_FRAME + 1  # more than one frame's worth
        finally:
            await store.close()
