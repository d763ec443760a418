"""The SQLite writer process (``[store] writer = "process"``, bridge/store/writer.py): its
death at any moment loses nothing acknowledged and shows nothing half-written, requests it
never answered fail with ``store_unavailable``, another writer takes over, and the pipe's
decoder takes whatever a dying writer leaves in it (truncated or garbled frames)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from pathlib import Path

import pytest
from conftest import alive, processes_mentioning, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st
from support.stores import records, thread

from bridge.errors import StoreError
from bridge.protocols.events import Record
from bridge.store import sqlite_sql, wire, writer, writer_client
from bridge.store.sqlite import SqliteStore

TS = "2026-12-01T00:00:00.000Z"
PER, TOTAL = 100, 6000  # records per append, per thread


def writer_pid(store: SqliteStore) -> int:
    assert store._proc is not None and store._proc.pid is not None
    return store._proc.pid


async def test_the_writer_killed_mid_stream_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """Four threads append 100 records at a time (over INLINE_MAX_ROWS: every one goes to
    the writer process) while the writer is SIGKILLed twice: every append returns (after
    another writer took over), each thread's transcript is exactly 1..n with every append
    whole, and health went False and back to True."""
    async with asyncio.timeout(45):
        store = SqliteStore(tmp_path / "bridge.db")
        health: list[bool] = []
        store.listeners.add(health=lambda ok, _err: health.append(ok))
        await store.open()
        try:
            tids = [f"thr_{i}" for i in range(4)]
            for tid in tids:
                await store.create_thread(thread(tid, TS))  # type: ignore[arg-type]
            acked = dict.fromkeys(tids, 0)
            seen_partial: list[int] = []

            async def appender(tid: str) -> None:
                for first in range(1, TOTAL + 1, PER):
                    await store.append(tid, records(first, PER, TS), [None] * PER, {"updated_at": TS})
                    acked[tid] = first + PER - 1

            async def watcher() -> None:
                # A reader never sees part of an append: each is one transaction.
                db = sqlite3.connect(tmp_path / "bridge.db")
                try:
                    while not all(v == TOTAL for v in acked.values()):
                        for tid in tids:
                            (n,) = db.execute("SELECT count(*) FROM events WHERE thread_id=?", (tid,)).fetchone()
                            if n % PER:
                                seen_partial.append(n)
                        await asyncio.sleep(0.002)
                finally:
                    db.close()

            async def killer() -> None:
                for _ in range(2):
                    await wait_until(lambda: sum(acked.values()) > TOTAL, what="some appends")
                    pid = writer_pid(store)
                    os.kill(pid, signal.SIGKILL)
                    await wait_until(lambda p=pid: store._proc is not None and store._proc.pid != p, what="restart")

            await asyncio.gather(*(appender(t) for t in tids), watcher(), killer())
            assert not seen_partial
            assert False in health and health[-1] is True and store.healthy
            for tid in tids:
                got = await store.read_events(tid, 0, TOTAL + 1)
                assert [r.seq for r in got] == list(range(1, TOTAL + 1))
        finally:
            await store.close()


async def test_a_request_the_dead_writer_never_answered_fails_with_store_unavailable(tmp_path: Path) -> None:
    """The writer is stopped (SIGSTOP), a thread creation and an append wait for it, then
    it is SIGKILLed: the creation fails with ``store_unavailable`` (never half-done: the
    row is absent or whole), the append is committed by the next writer exactly once."""
    async with asyncio.timeout(30):
        store = SqliteStore(tmp_path / "bridge.db")
        await store.open()
        try:
            await store.create_thread(thread("thr_a", TS))  # type: ignore[arg-type]
            pid = writer_pid(store)
            os.kill(pid, signal.SIGSTOP)
            create = asyncio.ensure_future(store.create_thread(thread("thr_b", TS)))  # type: ignore[arg-type]
            # Over INLINE_MAX_ROWS: it goes to the writer process (a small one commits inline).
            append = asyncio.ensure_future(store.append("thr_a", records(1, 100, TS), [None] * 100, {}))
            await asyncio.sleep(0.1)
            assert not create.done() and not append.done()
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(StoreError) as exc:
                await create
            assert exc.value.code == "store_unavailable"
            await append
            assert writer_pid(store) != pid and not alive(pid)
            assert [r.seq for r in await store.read_events("thr_a", 0, 1000)] == list(range(1, 101))
            assert store.healthy
            await store.create_thread(thread("thr_c", TS))  # type: ignore[arg-type]
        finally:
            await store.close()
        assert not alive(pid)


def test_a_batch_sent_again_is_not_written_twice(tmp_path: Path) -> None:
    """The writer committed a batch and died before its answer: the batch sent again
    (``again``) writes only what is not there yet, and refuses what it would refuse."""
    db = sqlite_sql.open_writer(tmp_path / "bridge.db", 2000)
    try:
        for tid in ("t1", "t2"):
            sqlite_sql.create_thread(db, {**thread(tid, TS), "options": "{}"})

        def item(tid: str, first: int) -> sqlite_sql._Append:
            rows = sqlite_sql.rows_of(records(first, 2, TS), [None, None])
            return sqlite_sql._Append(tid, rows, {}, None, (TS, first + 1, None))

        assert sqlite_sql._commit(db, [item("t1", 1), item("t2", 1)]) == {}
        again = sqlite_sql.commit_again(db, [item("t1", 1), item("t2", 1), item("t1", 3)])
        assert again == {}
        seqs = db.execute("SELECT thread_id, seq FROM events ORDER BY thread_id, seq").fetchall()
        assert seqs == [("t1", 1), ("t1", 2), ("t1", 3), ("t1", 4), ("t2", 1), ("t2", 2)]
        clash = item("t2", 2)  # seq 2 is there with other data: refused, as on a first try
        clash.rows[sqlite_sql.DATA][0] = '{"other":1}'
        assert list(sqlite_sql.commit_again(db, [clash])) == [0]
    finally:
        db.close()


async def test_a_writer_that_cannot_open_the_database_is_reported(tmp_path: Path) -> None:
    (tmp_path / "bridge.db").write_bytes(b"not a database" * 100)
    store = SqliteStore(tmp_path / "bridge.db")
    async with asyncio.timeout(20):
        with pytest.raises(StoreError, match="cannot open store"):
            await store.open()
        await store.close()
    assert not processes_mentioning(f"bridge.store.writer 3 {tmp_path}")


# ---------------------------------------------------------------- the decoder of the pipe


def valid_replies() -> st.SearchStrategy[bytes]:
    scalar = st.none() | st.booleans() | st.integers() | st.text(max_size=20)
    obj = st.fixed_dictionaries(
        {"i": st.integers(0, 2**40)},
        optional={
            "r": st.recursive(scalar, lambda c: st.lists(c, max_size=4), max_leaves=10),
            "f": st.dictionaries(st.integers(0, 600).map(str), st.text(max_size=20), max_size=4),
        },
    )
    return obj.map(lambda o: json.dumps(o).encode())


@settings(max_examples=300, deadline=None)
@given(st.lists(valid_replies(), min_size=1, max_size=5), st.data())
def test_replies_split_anywhere_come_out_whole(payloads: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(wire.frame(p) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    reader = wire.FrameReader()
    got: list[bytes] = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got += reader.feed(stream[a:b])
    assert got == payloads and reader.buffered == 0
    for p in got:
        assert wire.parse_reply(p).id == json.loads(p)["i"]


@settings(max_examples=300, deadline=None)
@given(st.lists(valid_replies(), min_size=1, max_size=3), st.data())
def test_a_truncated_stream_leaves_only_whole_replies_and_a_remainder(
    payloads: list[bytes], data: st.DataObject
) -> None:
    """A writer killed mid-write: the frames before the cut, nothing of the cut one."""
    stream = b"".join(wire.frame(p) for p in payloads)
    cut = data.draw(st.integers(0, len(stream) - 1))
    reader = wire.FrameReader()
    got = reader.feed(stream[:cut])
    assert got == payloads[: len(got)] and len(got) < len(payloads)
    assert reader.buffered == cut - sum(4 + len(p) for p in got)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_is_refused_with_wire_error_only(junk: bytes) -> None:
    reader = wire.FrameReader(max_frame=1 << 16)
    try:
        for payload in reader.feed(junk):
            wire.parse_reply(payload)
    except wire.WireError:
        pass


@settings(max_examples=500, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["i", "r", "f", "e", "c", "x"]), c),
        max_leaves=12,
    )
)
def test_any_json_is_a_checked_reply_or_wire_error(value: object) -> None:
    try:
        rep = wire.parse_reply(json.dumps(value).encode())
    except wire.WireError:
        return
    assert isinstance(rep.id, int) and rep.id >= 0
    assert all(isinstance(k, int) and isinstance(v, str) for k, v in rep.refused.items())
    assert rep.error is None or isinstance(rep.error, str)


_ROW_VALUES = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=40) | st.binary(max_size=8)
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(max_size=12),
            st.lists(st.tuples(*[_ROW_VALUES] * 9), max_size=4),
            st.dictionaries(st.text(max_size=8), _ROW_VALUES, max_size=3),
            st.tuples(_ROW_VALUES, _ROW_VALUES, _ROW_VALUES),
            st.booleans(),
            st.none() | st.tuples(st.text(max_size=8), st.integers(0, 2**40)),
        ),
        max_size=3,
    ),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_a_batch_request_comes_out_as_it_went_in(items: list[tuple[object, ...]], again: bool, gen: int) -> None:
    """Daemon → writer: a batch goes as marshal (``M``), and comes out equal, types kept
    (bool stays bool, bytes stay bytes)."""
    msg = ("b", 7, again, items, gen)
    (payload,) = wire.FrameReader().feed(b"".join(wire.request_parts(msg)))
    assert payload[:1] == b"M"
    out = wire.parse_request(payload)
    assert out == msg and [type(x) for x in out] == [type(x) for x in msg]


class Name(str):
    """A str subclass: marshal refuses it."""


def test_what_marshal_cannot_write_goes_as_a_pickle() -> None:
    msg = ("c", 3, "create_thread", ({"id": Name("thr_a")},))
    (payload,) = wire.FrameReader().feed(b"".join(wire.request_parts(msg)))
    assert payload[:1] == b"\x80"
    out = wire.parse_request(payload)
    assert out == msg and type(out[3][0]["id"]) is Name


def test_an_oversized_frame_is_refused_before_it_is_buffered() -> None:
    reader = wire.FrameReader(max_frame=1024)
    with pytest.raises(wire.WireError):
        reader.feed((5000).to_bytes(4, "big") + b"x" * 10)


async def every_write(store: SqliteStore) -> list[object]:
    """One call of every write the store makes (each an op of sqlite_sql.OPS), and what came back."""
    out: list[object] = []
    await store.create_thread(thread("thr_a", TS, state="running"))  # type: ignore[arg-type]
    await store.create_thread(thread("thr_b", TS))  # type: ignore[arg-type]
    await store.update_thread("thr_b", {"title": "b", "options": {"x": [1, 2]}})
    await store.append("thr_a", records(1, 70, TS), [None] * 69 + ["cid-1"], {"turn_active": True})
    out.append(await store.find_client_event("thr_a", "cid-1"))
    out.append(await store.delete_thread("thr_b"))
    out.append(await store.delete_thread("thr_b"))
    out.append([(r["id"], r["last_seq"], r["turn_active"], r["state"]) for r in await store.live_threads()])
    await store.save_session("k1", 1e12, [], user="ann")
    await store.save_session("k2", 1.0, ["k0"])
    out.append(await store.load_sessions(10.0))
    await store.delete_session("k1")
    out.append(await store.add_user("ann", "h1", admin=True))
    out.append(await store.add_user("ann", "h2", admin=False))
    out.append(await store.revoke_user("ann"))
    epoch = await store.acquire_lease("thr_a", "r1", 30.0)
    out.append(epoch)
    out.append(await store.acquire_lease("thr_a", "r2", 30.0))
    out.append(await store.renew_leases("r1", 30.0))
    lease = await store.lease_of("thr_a")
    out.append(lease is not None and (lease.holder, lease.epoch, lease.live))
    out.append(await store.release_lease("thr_a", "r1", epoch or 0))
    await store.register_replica("inst", "http://x")
    await store.heartbeat()
    out.append([(r.replica_id, r.instance, r.url, r.threads) for r in await store.list_replicas()])
    row = await store.get_thread("thr_a")
    out.append(row is not None and (row["last_seq"], row["turn_active"]))
    return out


async def test_both_writers_answer_every_write_alike(tmp_path: Path) -> None:
    async with asyncio.timeout(30):
        answers = []
        for mode in ("thread", "process"):
            store = SqliteStore(tmp_path / f"{mode}.db", writer=mode)  # type: ignore[arg-type]
            await store.open()
            try:
                answers.append(await every_write(store))
            finally:
                await store.close()
        assert answers[0] == answers[1]
        assert answers[1][:3] == [70, True, False] and answers[1][4] == [("k1", 1e12, "ann")]


async def test_requests_the_pipe_cannot_take_at_once_arrive_whole_and_in_order(tmp_path: Path) -> None:
    """The writer stopped (SIGSTOP) while batches of about 2 MB each pile up, far more than
    the socket pair's buffers hold: the first is sent in part, the rest wait behind it;
    once the writer runs again every batch commits, whole and in order."""
    proc = writer_client.WriterProcess(tmp_path / "bridge.db", 2000, lambda why: None)
    async with asyncio.timeout(60):
        await proc.start()
        pid = proc.pid
        assert pid is not None
        try:
            await proc.call("create_thread", ({**thread("thr_a", TS), "options": "{}"},))
            os.kill(pid, signal.SIGSTOP)
            try:
                sent = []
                for b in range(12):
                    recs = [
                        Record(s, TS, "agent", "message.delta", {"text": f"{s} " + "x" * 20_000}, None, False)
                        for s in range(100 * b + 1, 100 * b + 101)
                    ]
                    item = sqlite_sql._Append("thr_a", sqlite_sql.rows_of(recs, [None] * 100), {}, None)
                    item.touch = (TS, 100 * b + 100, None)
                    sent.append(asyncio.ensure_future(proc.batch([sqlite_sql.wire_item(item)], False)))
                await asyncio.sleep(0)
                assert proc._out  # (the pipe is full: the rest waits in the daemon)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert await asyncio.gather(*sent) == [{}] * 12
        finally:
            await proc.close()
    db = sqlite3.connect(tmp_path / "bridge.db")
    try:
        got = db.execute(f"SELECT seq, {sqlite_sql.DATA_SQL} FROM events ORDER BY seq").fetchall()
    finally:
        db.close()
    assert [s for s, _ in got] == list(range(1, 1201))
    assert all(json.loads(data)["text"] == f"{s} " + "x" * 20_000 for s, data in got)


async def test_a_checkpoint_is_asked_for_by_the_bytes_that_came_in(tmp_path: Path) -> None:
    """Twelve batches, far fewer than ``CHECKPOINT_EVERY`` commits: carrying more than
    ``CHECKPOINT_BYTES`` of event text in all (each row's its own, though the frame holds
    the string once), they make the writer process checkpoint; carrying little, they do
    not. Half of them come with their size counted by the store, half without."""

    async def checkpoints(db: str, row_bytes: int) -> int:
        proc = writer_client.WriterProcess(tmp_path / db, 2000, lambda why: None)
        await proc.start()
        try:
            await proc.call("create_thread", ({**thread("thr_a", TS), "options": "{}"},))
            for b in range(12):
                text = json.dumps("x" * row_bytes)
                rows = (list(range(10 * b + 1, 10 * b + 11)), [TS] * 10, ["agent"] * 10, ["message"] * 10)
                rows += ([text] * 10, [None] * 10, [0] * 10, [None] * 10)
                item = sqlite_sql._Append("thr_a", rows, {}, None, (TS, 10 * b + 10, None))
                if b % 2:
                    sqlite_sql.text_size(item)  # counted by the store (its batch cap) or not
                assert await proc.batch([sqlite_sql.wire_item(item)], False) == {}
            done = int((await proc.stats())["checkpoints"])
            while row_bytes * 120 > writer.CHECKPOINT_BYTES and not done:  # (on its own thread)
                await asyncio.sleep(0.01)
                done = int((await proc.stats())["checkpoints"])
            return done
        finally:
            await proc.close()

    assert 12 < writer.CHECKPOINT_EVERY
    async with asyncio.timeout(30):
        assert await checkpoints("small.db", 100) == 0
        assert await checkpoints("big.db", writer.CHECKPOINT_BYTES // 80) >= 1


# A stand-in writer (the real one's first word, then one scripted answer to the first
# request): what a broken or dying writer can leave on the pipe.
FAKE_WRITER = """
import os, socket, struct, sys, time
sock = socket.socket(fileno=3)
def frame(b): return struct.pack(">I", len(b)) + b
sock.sendall(frame(b'{"i":0,"r":"ready"}'))
sock.recv(1 << 20)
answer = bytes.fromhex(sys.argv[1])
sock.sendall(answer)
if sys.argv[2] == "exit":
    os._exit(0)
time.sleep(60)
"""


@pytest.mark.parametrize(
    ("answer", "after", "why"),
    [
        (wire.frame(b'{"i":1,"r":'), "stay", "sent a garbled answer"),  # not JSON
        (wire.frame(b'{"i":1,"f":{"x":1}}'), "stay", "sent a garbled answer"),  # not a refusal map
        ((1 << 30).to_bytes(4, "big"), "stay", "sent a garbled answer"),  # over MAX_FRAME
        (wire.frame(b'{"i":1,"f":{}}')[:9], "exit", "exited in the middle of an answer"),  # truncated
    ],
)
async def test_a_broken_writer_is_given_up_and_its_requests_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: bytes, after: str, why: str
) -> None:
    script = tmp_path / "fake_writer.py"
    script.write_text(FAKE_WRITER)

    def spawn(child: object, path: Path, busy_timeout_ms: int) -> int:
        fd = child.fileno()  # type: ignore[attr-defined]
        argv = [sys.executable, str(script), answer.hex(), after]
        return os.posix_spawn(sys.executable, argv, {}, file_actions=[(os.POSIX_SPAWN_DUP2, fd, 3)])

    monkeypatch.setattr(writer_client, "_spawn", spawn)
    lost: list[str] = []
    proc = writer_client.WriterProcess(tmp_path / "bridge.db", 2000, lost.append)
    async with asyncio.timeout(20):
        await proc.start()
        pid = proc.pid
        assert pid is not None
        with pytest.raises(StoreError) as exc:
            await proc.batch([], False)
        assert exc.value.code == "store_unavailable" and why in exc.value.message
        assert lost == [why] and not proc.alive
        await wait_until(lambda: not alive(pid), what="the broken writer to be killed and reaped")
        with pytest.raises(StoreError):
            await proc.call("checkpoint", ())
        await proc.close()
