"""The default embedded store: one SQLite file in the data dir, WAL mode.

Reads run on one dedicated thread with their own connection. The one write connection lives
in the writer process (``[store] writer = "process"``, the default: bridge/store/writer.py,
fed over a socket pair by writer_client.py) or on a writer thread (``"thread"``); every
write there is one of ``sqlite_sql.OPS`` or a batch of appends. WAL lets reads and writes
run side by side, and a reader sees every committed write.

Transcript appends are group-committed: every append waiting when the writer comes round
goes into one transaction (each in its own SAVEPOINT, so one bad append cannot sink the
others), and each caller is told only after the COMMIT (in the process: on its answer). A
small batch is committed by the writer task itself, on the event loop, with a third
connection that never waits for a lock and never checkpoints (``_commit_inline``);
anything else, or any failure there, goes to the writer. Callers publish an event only
after that, so whatever a client has seen is on disk (``synchronous=NORMAL`` in WAL mode
survives a process kill). An append that finds the store idle (nothing pending, nothing else
ready to run on the loop) commits right in ``append`` (``_commit_inline``), with no hand-off at
all. If the database cannot be written (locked, disk full, I/O
error) the batch is retried with backoff until it commits; callers wait — which stops the
agent's stdout being read, so the agent itself is held back — and ``healthy`` is False
meanwhile. Nothing acknowledged is ever lost. The writer process dying is one more such
failure: requests it never answered fail (``store_unavailable``), another process is
started at once, and the batch it held is sent again marked ``again``, so what the dead
one committed before it could answer is not written twice (``sqlite_sql.commit_again``).
Migrations are keyed by ``PRAGMA user_version``.

A thread's ``updated_at``, ``last_seq`` and ``turn_active`` follow its transcript: they are
not rewritten by every append (that costs one or two more pages per commit: the row and the
activity index) but kept in ``_dirty`` and written in one transaction at most
``TOUCH_FLUSH_S`` later, before any read of thread rows, and at close. They are derived
data: at open, every thread's ``last_seq`` and ``updated_at`` are brought up to its newest
stored event, and a thread that may have had a turn in flight gets ``turn_active`` from its
newest ``turn.started``/``turn.ended`` event, so a daemon that was killed before a flush
loses nothing (issue #8).

The change log (``GET /v1/events``; store/base.py ChangeStore, docs/DESIGN.md): a write of
a thread row's client-visible columns takes the next value of the one-row ``change_log``
counter (``UPDATE … RETURNING``, in the same transaction, so values follow commit order)
as the row's ``change_seq``. The lazy columns above are changes too, so a thread's
``last_seq``/``updated_at``/``turn_active`` reach the log when its row is flushed (within
``TOUCH_FLUSH_S``), one change per thread per flush, never one per event. A deleted thread
leaves a tombstone in ``thread_tombstones``; pruning old ones raises ``change_log.horizon``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import operator
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import structlog

from bridge.clock import now_iso
from bridge.errors import LeaseLost, StoreError
from bridge.protocols.envelope import CorruptEvent, Frames, checked_envelopes, checked_lines, stored_envelopes
from bridge.protocols.events import Record
from bridge.store import sqlite_leases as leases
from bridge.store import sqlite_sql as sql
from bridge.store.base import (
    CHANGE_COLUMNS,
    PAGE_BYTES,
    TOMBSTONE_KEEP,
    TOMBSTONE_MAX_AGE_S,
    Change,
    ChangesPruned,
    SecretRow,
    ThreadFields,
    ThreadRow,
    UserRow,
)
from bridge.store.event_rows import corrupt_rows
from bridge.store.sqlite_sql import (
    _JSON_COLUMNS,
    _MIGRATIONS,
    _THREAD_COLUMNS,
    SCHEMA_VERSION,
    _Append,
    _commit,
)
from bridge.store.writer_client import WriterProcess

__all__ = ["SCHEMA_VERSION", "_MIGRATIONS", "SqliteStore", "WriterMode", "check_schema", "schema_too_new"]
WriterMode = Literal["process", "thread"]

T = TypeVar("T")
log = structlog.get_logger("bridge.store")

MAX_BATCH = 512  # appends per transaction, and at most (but for one append alone)
MAX_BATCH_TEXT = 8 * 1024 * 1024  # characters of event text: a frame to the writer
# process carries at most wire.MAX_FRAME bytes (64 MiB; a character is at most 4 in UTF-8)
# Batches up to this size commit inline, on the event loop (see _commit_inline).
INLINE_MAX_ROWS = 64
INLINE_MAX_BYTES = 128 * 1024
TOUCH_FLUSH_S = 0.5  # owed updated_at/last_seq/turn_active are written within this long
CHECKPOINT_EVERY = 1024  # inline commits between WAL checkpoints (about 4000 WAL pages)
MAX_BACKOFF_S = 2.0
# The writer process takes up to WRITER_DEPTH batches at once (``_write_loop``): one in
# flight beside another only when it holds at least PIPELINED_ROWS events (a flood's).
WRITER_DEPTH = 3
PIPELINED_ROWS = 256


def schema_too_new(path: Path, version: int) -> str:
    return (
        f"database {path} has schema version {version}, newer than this agent-bridge's "
        f"({SCHEMA_VERSION}): it was written by a newer version; run that version, or use another data dir"
    )


def check_schema(path: Path) -> None:
    """Refuse (StoreError) a database a newer agent-bridge wrote, before anything opens
    it for writing; a missing file is fine (it is created at open)."""
    if not path.exists():
        return
    try:
        db = sqlite3.connect(path)  # reads only: nothing is written before the check
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read database {path}: {exc}") from exc
    if version > SCHEMA_VERSION:
        raise StoreError(schema_too_new(path, version), code="schema_too_new")


def _later(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


def _loop_idle(loop: asyncio.AbstractEventLoop) -> bool:
    """True when nothing else is ready to run in this round of the event loop, so no other
    append can join a group commit before the next round (CPython's ``_ready`` deque;
    False, i.e. always group, on a loop without one)."""
    ready = getattr(loop, "_ready", None)
    return ready is not None and not ready


class _Flight:
    """A batch handed to the writer (``_write_loop``), and the process it was sent to, once
    it was."""

    __slots__ = ("answer", "batch", "proc")

    def __init__(self, batch: list[_Append], proc: WriterProcess | None = None) -> None:
        self.batch = batch
        self.proc = proc
        self.answer: asyncio.Future[dict[int, str]] | None = None


class SqliteStore(leases.SqliteLeases):
    def __init__(
        self,
        path: Path,
        *,
        busy_timeout_ms: int = 2000,
        replica_id: str = "local",
        writer: WriterMode = "process",
    ) -> None:
        self.path = path
        self.replica_id = replica_id
        self.busy_timeout_ms = busy_timeout_ms
        self.writer_mode: WriterMode = writer
        self._proc: WriterProcess | None = None  # writer = "process"
        self._proc_lock = asyncio.Lock()
        self._restart: asyncio.Task[None] | None = None
        self._closing = False
        self._wexec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-w")
        self._rexec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-r")
        self._wdb: sqlite3.Connection | None = None
        self._rdb: sqlite3.Connection | None = None
        self._idb: sqlite3.Connection | None = None  # inline commits (see _commit_inline)
        self._inline_commits = 0
        self._checkpoint: asyncio.Task[None] | None = None
        self._pending: list[_Append] = []
        self._generation = 0  # of the batches sent to the writer process (_abandon)
        # thread → what its row owes: (updated_at, last_seq, turn_active)
        self._dirty: dict[str, tuple[str | None, int | None, int | None]] = {}
        self._touch_timer: asyncio.TimerHandle | None = None
        self._wake: asyncio.Event | None = None
        self._writer: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()  # set whenever nothing waits to be written
        self.healthy = True
        self.last_error: str | None = None
        self.on_health: Callable[[bool, str | None], None] | None = None
        self.on_change: Callable[[], None] | None = None
        self.batches = 0
        self.pipelined = 0  # batches sent to the writer process behind one in flight
        self.appended = 0
        self.checkpoint_stats = (0, 0.0, 0.0)  # checkpoints asked for here: count, total ms, max ms

    # ------------------------------------------------------------------ plumbing

    def _connect(self) -> sqlite3.Connection:
        return sql.connect(self.path, self.busy_timeout_ms)

    async def _call(self, executor: ThreadPoolExecutor, db_attr: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            db: sqlite3.Connection | None = getattr(self, db_attr)
            if db is None:
                raise StoreError("store is closed")
            try:
                return fn(db)
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.rollback()
                raise StoreError(f"store error: {exc}") from exc

        return await asyncio.get_running_loop().run_in_executor(executor, call)

    async def _run(self, op: Callable[..., Any], *args: Any) -> Any:
        """A write (or a read that must follow earlier writes): one of ``sqlite_sql.OPS``,
        on the writer thread or in the writer process."""
        if sql.OPS.get(op.__name__) is not op:
            raise TypeError(f"{op.__name__} is not one of sqlite_sql.OPS")
        if self.writer_mode == "thread":
            return await self._call(self._wexec, "_wdb", lambda db: op(db, *args))
        proc = await self._writer_proc()
        return await proc.call(op.__name__, args)

    async def _writer_proc(self) -> WriterProcess:
        """The running writer process; a new one if the last one died (StoreError if it
        cannot be started)."""
        if self._closing:
            raise StoreError("store is closed")
        proc = self._proc
        if proc is not None and proc.alive:
            return proc
        async with self._proc_lock:
            if self._proc is None or not self._proc.alive:
                new = WriterProcess(self.path, self.busy_timeout_ms, self._writer_lost)
                await new.start()
                if self._proc is not None:
                    log.info("store.writer_restarted", pid=new.pid)
                self._proc = new
            return self._proc

    def _writer_lost(self, why: str) -> None:
        """The writer process died: unhealthy until another one runs (started at once,
        then with backoff; the write loop retries whatever was not acknowledged)."""
        log.error("store.writer_lost", why=why, pending=len(self._pending))
        self._set_health(False, f"the store's writer process {why}")
        if self._closing or (self._restart is not None and not self._restart.done()):
            return
        self._restart = asyncio.get_running_loop().create_task(self._restart_writer(), name="store-writer-restart")

    async def _restart_writer(self) -> None:
        backoff = 0.05
        while not self._closing:
            try:
                await self._writer_proc()
            except StoreError as exc:
                log.error("store.writer_start_failed", error=exc.message, retry_in_s=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            if not self._pending:
                self._set_health(True, None)
            return

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._call(self._rexec, "_rdb", fn)

    async def open(self) -> None:
        def do_open() -> None:
            try:
                self._wdb = sql.open_writer(self.path, self.busy_timeout_ms)
            except sql.SchemaTooNew as exc:
                raise StoreError(schema_too_new(self.path, exc.version), code="schema_too_new") from None

        def open_reader() -> None:
            self._rdb = self._connect()
            # The inline writer (append): never waits for a lock and never checkpoints on
            # the event loop; checkpoints run on the writer thread instead.
            idb = self._connect()
            idb.execute("PRAGMA busy_timeout=0")
            idb.execute("PRAGMA wal_autocheckpoint=0")
            self._idb = idb

        loop = asyncio.get_running_loop()
        try:
            if self.writer_mode == "process":
                try:
                    await self._writer_proc()
                except StoreError as exc:
                    if exc.code == "schema_too_new":
                        raise StoreError(
                            schema_too_new(self.path, int(exc.message.split()[-1])), code=exc.code
                        ) from None
                    raise
            else:
                await loop.run_in_executor(self._wexec, do_open)
            await loop.run_in_executor(self._rexec, open_reader)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {self.path}: {exc}") from exc
        self._wake = asyncio.Event()
        self._writer = asyncio.create_task(self._write_loop(), name="store-writer")

    async def close(self, *, drain_timeout: float = 10.0) -> None:
        if self._checkpoint is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._checkpoint
        if self._touch_timer is not None:
            self._touch_timer.cancel()
            self._touch_timer = None
        if self._writer is not None:
            self._queue_touches(None)
            if self._pending:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._drained(), drain_timeout)
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            for item in self._pending:  # never acknowledged, so never shown to anyone
                if item.done is not None and not item.done.done():
                    item.done.set_exception(StoreError("store closed before this was written"))
            self._pending.clear()
        await self._close_writer_proc()

        def close_conn(attr: str) -> Callable[[], None]:
            def do() -> None:
                db = getattr(self, attr)
                if db is not None:
                    db.close()
                    setattr(self, attr, None)

            return do

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._wexec, close_conn("_wdb"))
        await loop.run_in_executor(self._rexec, close_conn("_rdb"))
        await loop.run_in_executor(self._rexec, close_conn("_idb"))
        self._wexec.shutdown(wait=True)
        self._rexec.shutdown(wait=True)

    async def _close_writer_proc(self) -> None:
        self._closing = True
        if self._restart is not None:
            self._restart.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._restart
        proc, self._proc = self._proc, None
        if self.checkpoint_stats[0]:
            n, total, top = self.checkpoint_stats
            log.info("store.checkpoint_stats", writer=self.writer_mode, checkpoints=n, total_ms=total, max_ms=top)
        if proc is None:
            return
        if proc.alive:
            with contextlib.suppress(StoreError, TimeoutError):
                stats = await asyncio.wait_for(proc.stats(), 5.0)
                log.info("store.writer_stats", pid=proc.pid, pipelined=self.pipelined, **stats)
        await proc.close()

    async def _drained(self) -> None:
        await self._idle.wait()

    async def ping(self) -> None:
        await self._read(lambda db: db.execute("SELECT 1").fetchone())
        if not self.healthy:
            raise StoreError(f"store cannot be written: {self.last_error}")

    def _set_health(self, healthy: bool, error: str | None) -> None:
        if healthy == self.healthy:
            self.last_error = error or self.last_error
            return
        self.healthy, self.last_error = healthy, error
        if self.on_health is not None:
            self.on_health(healthy, error)

    # ------------------------------------------------------------------ threads

    @staticmethod
    def _row(row: sqlite3.Row | tuple[Any, ...]) -> ThreadRow:
        out = dict(zip(_THREAD_COLUMNS, row, strict=True))
        for col in _JSON_COLUMNS:
            out[col] = json.loads(out[col]) if out[col] is not None else None
        out["turn_active"] = bool(out["turn_active"])
        return cast(ThreadRow, out)

    @staticmethod
    def _dump(fields: ThreadFields) -> dict[str, Any]:
        out = dict(fields)
        for col in _JSON_COLUMNS:
            if col in out and out[col] is not None:
                out[col] = json.dumps(out[col])
        if "turn_active" in out:
            out["turn_active"] = int(bool(out["turn_active"]))
        unknown = set(out) - set(_THREAD_COLUMNS)
        if unknown:
            raise ValueError(f"unknown thread columns {unknown}")
        return out

    async def create_thread(self, thread: ThreadRow) -> None:
        row = leases.stamp(self._dump({k: thread.get(k) for k in _THREAD_COLUMNS if k in thread}), self.replica_id)
        await self._run(sql.create_thread, row)
        self._changed()

    async def get_thread(self, thread_id: str) -> ThreadRow | None:
        await self._flush_touches()

        def do(db: sqlite3.Connection) -> ThreadRow | None:
            row = db.execute(
                f"SELECT {','.join(_THREAD_COLUMNS)} FROM threads WHERE id=?",  # noqa: S608
                (thread_id,),
            ).fetchone()
            return self._row(row) if row else None

        return await self._read(do)

    async def list_threads(
        self, *, limit: int, cursor: str | None, agent: str | None, owner: str | None = None
    ) -> tuple[list[ThreadRow], str | None]:
        where, params = [], []
        if owner is not None:
            where.append("owner = ?")
            params.append(owner)
        if cursor:
            updated_at, tid = decode_cursor(cursor)
            where.append("(updated_at < ? OR (updated_at = ? AND id < ?))")
            params += [updated_at, updated_at, tid]
        if agent:
            where.append("agent = ?")
            params.append(agent)
        sql = (
            f"SELECT {','.join(_THREAD_COLUMNS)} FROM threads "  # noqa: S608
            f"{'WHERE ' + ' AND '.join(where) if where else ''} "
            "ORDER BY updated_at DESC, id DESC LIMIT ?"
        )

        def do(db: sqlite3.Connection) -> list[ThreadRow]:
            return [self._row(r) for r in db.execute(sql, (*params, limit + 1)).fetchall()]

        await self._flush_touches()  # the order is by updated_at
        rows = await self._read(do)
        next_cursor = None
        if len(rows) > limit:
            rows = rows[:limit]
            next_cursor = encode_cursor(rows[-1]["updated_at"], rows[-1]["id"])
        return rows, next_cursor

    async def update_thread(self, thread_id: str, fields: ThreadFields) -> None:
        row = leases.stamp(self._dump(fields), self.replica_id)
        if not row:
            return
        visible = not CHANGE_COLUMNS.isdisjoint(row)
        await self._run(sql.update_thread, thread_id, row, visible)
        if visible:
            self._changed()

    async def delete_thread(self, thread_id: str) -> bool:
        self._dirty.pop(thread_id, None)
        prune_before = sql._iso_before(TOMBSTONE_MAX_AGE_S)
        found = bool(await self._run(sql.delete_thread, thread_id, now_iso(), prune_before, TOMBSTONE_KEEP))
        if found:
            self._changed()
        return found

    async def live_threads(self) -> list[ThreadRow]:
        """Threads a previous daemon left with a process or a turn in flight. All of them:
        a SQLite file is only ever one replica's (its data dir is locked), whatever
        ``replica_id`` that replica had before (the default changes with the pid)."""
        await self._flush_touches()
        return [self._row(r) for r in await self._run(sql.live_threads)]

    # ------------------------------------------------------------------ change log

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _batch_changed(self, batch: list[_Append], failed: dict[int, str]) -> None:
        """One wake-up for a committed batch that gave some row a new change_seq."""
        if any(item.changed for i, item in enumerate(batch) if i not in failed):
            self._changed()

    async def read_changes(self, after: int, limit: int) -> list[Change]:
        cols = ",".join(_THREAD_COLUMNS)

        def do(db: sqlite3.Connection) -> list[Change]:
            db.execute("BEGIN")  # one snapshot for the three reads
            try:
                (horizon,) = db.execute("SELECT horizon FROM change_log").fetchone()
                if after < horizon:
                    raise ChangesPruned(after, horizon)
                rows = db.execute(
                    f"SELECT change_seq,created_seq,{cols} FROM threads "  # noqa: S608
                    "WHERE change_seq > ? ORDER BY change_seq LIMIT ?",
                    (after, limit),
                ).fetchall()
                gone = db.execute(
                    "SELECT change_seq,thread_id,deleted_at,owner FROM thread_tombstones "
                    "WHERE change_seq > ? ORDER BY change_seq LIMIT ?",
                    (after, limit),
                ).fetchall()
            finally:
                db.execute("COMMIT")
            out = [
                Change(r[0], "thread.created" if r[1] > after else "thread.updated", r[2], self._row(r[2:]))
                for r in rows
            ]
            out += [Change(seq, "thread.deleted", tid, None, at, owner) for seq, tid, at, owner in gone]
            out.sort(key=lambda c: c.cursor)
            return out[:limit]

        return await self._read(do)

    async def latest_change(self) -> int:
        return int(await self._read(lambda db: db.execute("SELECT latest FROM change_log").fetchone()[0]))

    async def change_horizon(self) -> int:
        return int(await self._read(lambda db: db.execute("SELECT horizon FROM change_log").fetchone()[0]))

    # ------------------------------------------------------------------ transcript

    async def append(
        self,
        thread_id: str,
        records: Sequence[Record],
        client_ids: Sequence[str | None],
        thread_fields: ThreadFields,
        *,
        epoch: int | None = None,
    ) -> None:
        """Return once the records (and the thread fields) are committed. ``updated_at``,
        ``last_seq`` and ``turn_active`` are owed to the thread row and written later
        (``_dirty``); any other field is written in the same transaction. With ``epoch``
        the transaction first checks the lease in SQL (sqlite_leases.fence)."""
        # The envelopes are stored with the rows (migration 9), built where the write
        # connection is (sqlite_sql._insert_rows): in the writer process, off this loop.
        rows = sql.rows_of(records, client_ids)
        fields = leases.stamp(self._dump(thread_fields), self.replica_id)
        updated_at = fields.pop("updated_at", None)
        turn_active = fields.pop("turn_active", None)
        last_seq = records[-1].seq if records else None
        if fields and last_seq is not None:
            fields["last_seq"] = last_seq  # the row is written anyway
        if self._writer is None or self._wake is None:
            raise StoreError("store is not open")
        item = _Append(thread_id, rows, fields, None, (updated_at, last_seq, turn_active))
        item.fence = leases.fence_of(self.replica_id, epoch)
        loop = asyncio.get_running_loop()
        if not self._pending and _loop_idle(loop):  # (no inline connection: writer = "process")
            # Nothing to group with (issue #8): commit here, with no hand-off to the writer
            # task and no wake-up of this caller afterwards.
            failed = self._commit_inline([item])
            if failed is not None:
                self._settled([item], failed)
                if failed:
                    raise _refusal(failed[0])
                return
        item.done = loop.create_future()
        self._pending.append(item)
        self._idle.clear()
        self._wake.set()
        await item.done

    def _commit_inline(self, batch: list[_Append]) -> dict[int, str] | None:
        """Commit a small batch right here, on the event loop (issue #8): handing it to the
        writer thread and being woken when it is done costs more than the commit itself,
        and is most of a prompt's round trip. Everything that became pending meanwhile is
        in the batch, so group commit still holds under load. The connection never waits
        for a lock (busy_timeout=0) and never checkpoints, so the loop is held for a small
        write only. None when the batch is not small or the attempt failed (a lock held
        elsewhere, an I/O error): the writer thread then takes it, and retries and reports
        health as before. Nothing is acknowledged before COMMIT either way."""
        db = self._idb
        if (
            db is None
            or not self.healthy
            or sum(sql.row_count(item.rows) for item in batch) > INLINE_MAX_ROWS
            or sum(map(sql.text_size, batch)) > INLINE_MAX_BYTES
        ):
            return None
        try:
            failed = _commit(db, batch)
        except sqlite3.Error:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.rollback()
            return None
        self._inline_commits += 1
        if self._inline_commits % CHECKPOINT_EVERY == 0:
            self._start_checkpoint()
        return failed

    def _settled(self, batch: list[_Append], failed: dict[int, str]) -> None:
        """A committed batch: tell its callers, and note what each thread row owes."""
        self.batches += 1
        self._batch_changed(batch, failed)
        for i, item in enumerate(batch):
            if i in failed:
                if item.done is not None and not item.done.done():
                    item.done.set_exception(_refusal(failed[i]))
                continue
            if item.touch is not None and not item.flush:
                self.appended += sql.row_count(item.rows)
                old = self._dirty.get(item.thread_id)
                new = item.touch
                self._dirty[item.thread_id] = (
                    new
                    if old is None
                    else (_later(old[0], new[0]), _later(old[1], new[1]), old[2] if new[2] is None else new[2])
                )
                if self._touch_timer is None:
                    self._touch_timer = asyncio.get_running_loop().call_later(TOUCH_FLUSH_S, self._timed_touches)
            if item.done is not None and not item.done.done():
                item.done.set_result(None)

    def _timed_touches(self) -> None:
        self._touch_timer = None
        self._queue_touches(None)

    def _queue_touches(self, done: asyncio.Future[None] | None) -> bool:
        """Queue one flush item per dirty thread; ``done`` (if given) on the last one.
        Batches commit in order, so the last one done means every one is."""
        if not self._dirty or self._wake is None:
            return False
        items = [_Append(tid, (), {}, None, touch, flush=True) for tid, touch in self._dirty.items()]
        self._dirty.clear()
        items[-1].done = done
        self._pending.extend(items)
        self._idle.clear()
        self._wake.set()
        return True

    async def _flush_touches(self) -> None:
        """Write what the thread rows owe before reading them (skipped while the store
        cannot be written: a read then sees values up to TOUCH_FLUSH_S old)."""
        if not self._dirty or not self.healthy:
            return
        done = asyncio.get_running_loop().create_future()
        if self._queue_touches(done):
            await done

    def _start_checkpoint(self) -> None:
        """Move the WAL written by inline commits into the database, on the writer thread
        (PASSIVE: it never blocks a writer or a reader)."""
        if self._checkpoint is not None and not self._checkpoint.done():
            return

        async def run() -> None:
            t0 = time.perf_counter()
            with contextlib.suppress(StoreError):
                await self._run(sql.checkpoint)
            ms = (time.perf_counter() - t0) * 1000
            self.checkpoint_stats = (
                self.checkpoint_stats[0] + 1,
                self.checkpoint_stats[1] + ms,
                max(self.checkpoint_stats[2], ms),
            )

        self._checkpoint = asyncio.create_task(run(), name="store-checkpoint")

    async def _commit_batch(self, batch: list[_Append], again: bool, flight: _Flight | None = None) -> dict[int, str]:
        """One transaction: inline or on the writer thread, or in the writer process (the
        batch as plain tuples; ``again``: the writer that had it may have committed it
        before it died, so what is already there is not written twice). ``flight``: the
        write loop's record of it, told which writer process it was sent to."""
        inline = self._commit_inline(batch)
        if inline is not None:
            return inline
        if self.writer_mode == "process":
            proc = await self._writer_proc()
            sent = proc.batch(self._wire(batch), again, self._generation)
            if flight is not None:
                flight.proc = proc
            return await sent
        result: dict[int, str] = await self._call(self._wexec, "_wdb", lambda db: _commit(db, batch))
        return result

    def _wire(self, batch: list[_Append]) -> list[tuple[Any, ...]]:
        for item in batch:  # as _write_item decides it there
            item.changed = item.flush or not CHANGE_COLUMNS.isdisjoint(item.fields)
        return [sql.wire_item(item) for item in batch]

    async def _write_loop(self) -> None:
        """Commit what is pending, in order, a batch at a time; in the writer process up to
        WRITER_DEPTH batches at once (``_send_behind``), so that it starts the next one as
        soon as it has answered one, not once this loop has taken the answer. Batches are
        settled in the order they were sent. After a failure nothing sent behind it is
        written (the writer refuses the rest of that generation) and everything not settled
        is sent again, in order, marked ``again``."""
        assert self._wake is not None
        backoff = 0.05
        again = False  # the batch failed before: its writer may have committed it (process)
        flight: deque[_Flight] = deque()
        woken: asyncio.Task[Any] | None = None
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                sent = 0  # of _pending, the items in flight
                while self._pending:
                    if not flight:
                        batch = self._batch_at(0)
                        head = _Flight(batch)
                        head.answer = asyncio.ensure_future(self._commit_batch(batch, again, head))
                        flight.append(head)
                        sent = len(batch)
                    while sent < len(self._pending) and (behind := self._send_behind(flight, sent, again)):
                        flight.append(behind)
                        sent += len(behind.batch)
                    head = flight[0]
                    assert head.answer is not None
                    if not head.answer.done() and len(flight) < WRITER_DEPTH:
                        # The head's answer, or appends that may go beside it, whichever first.
                        if woken is None or woken.done():
                            self._wake.clear()
                            woken = asyncio.ensure_future(self._wake.wait())
                        await asyncio.wait((head.answer, woken), return_when=asyncio.FIRST_COMPLETED)
                        continue
                    try:
                        failed = await head.answer
                    except StoreError as exc:
                        again = True
                        await self._abandon(flight)
                        sent = 0
                        # Locked, full or broken: nothing in the batch is acknowledged; try again.
                        self._set_health(False, exc.message)
                        log.error(
                            "store.write_failed", error=exc.message, pending=len(self._pending), retry_in_s=backoff
                        )
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, MAX_BACKOFF_S)
                        continue
                    flight.popleft()
                    backoff = 0.05
                    again = again and bool(flight)
                    if not self.healthy:
                        log.info("store.recovered")
                    self._set_health(True, None)
                    del self._pending[: len(head.batch)]
                    sent -= len(head.batch)
                    self._settled(head.batch, failed)
                self._idle.set()
        finally:
            if woken is not None:
                woken.cancel()
            for f in flight:
                if f.answer is not None:
                    f.answer.cancel()

    def _batch_at(self, start: int) -> list[_Append]:
        """The pending appends from ``start`` that go in one batch: at most MAX_BATCH, and
        no more than MAX_BATCH_TEXT characters of event text unless one append alone holds
        more."""
        pending = self._pending
        end = min(len(pending), start + MAX_BATCH)
        text = 0
        for i in range(start, end):
            text += sql.text_size(pending[i])
            if text > MAX_BATCH_TEXT and i > start:
                return pending[start:i]
        return pending[start:end]

    def _send_behind(self, flight: deque[_Flight], sent: int, again: bool) -> _Flight | None:
        """The next batch, sent now to the writer process that has the last one in flight,
        or None: only once that one was sent there (and the process still runs),
        WRITER_DEPTH batches in flight at most, and only a batch of at least PIPELINED_ROWS
        events (small appends wait and commit together, one transaction for many, as
        before)."""
        proc = flight[-1].proc
        if proc is None or not proc.alive or len(flight) >= WRITER_DEPTH:
            return None
        batch = self._batch_at(sent)
        if sum(sql.row_count(item.rows) for item in batch) < PIPELINED_ROWS:
            return None
        behind = _Flight(batch, proc)
        self.pipelined += 1
        behind.answer = asyncio.ensure_future(proc.batch(self._wire(batch), again, self._generation))
        return behind

    async def _abandon(self, flight: deque[_Flight]) -> None:
        """A batch failed: what was sent behind it is refused by the writer (or died with it);
        its answers are awaited and dropped, and the next generation sends it all again."""
        self._generation += 1
        for f in flight:
            if f.answer is not None:
                with contextlib.suppress(StoreError, asyncio.CancelledError):
                    await f.answer
        flight.clear()

    # ------------------------------------------------------------------ browser sessions

    async def load_sessions(self, now: float) -> list[tuple[str, float, str | None]]:
        """Unexpired browser sessions, oldest first (expired ones are deleted)."""
        return [(str(k), float(e), u) for k, e, u in await self._run(sql.load_sessions, float(now))]

    async def save_session(
        self, key: str, expires_at: float, evicted: Sequence[str] = (), *, user: str | None = None
    ) -> None:
        await self._run(sql.save_session, key, float(expires_at), list(evicted), user)

    async def delete_session(self, key: str) -> None:
        await self._run(sql.delete_session, key)

    # ------------------------------------------------------------------ users

    async def add_user(self, name: str, token_hash: str, *, admin: bool) -> bool:
        return bool(await self._run(sql.add_user, name, token_hash, bool(admin), now_iso()))

    async def user_by_token(self, token_hash: str) -> tuple[UserRow, str] | None:
        def do(db: sqlite3.Connection) -> tuple[UserRow, str] | None:
            row = db.execute(
                "SELECT name, admin, created_at, revoked_at, token_hash FROM users "
                "WHERE token_hash = ? AND revoked_at IS NULL",
                (token_hash,),
            ).fetchone()
            return None if row is None else (_user(row), row[4])

        return await self._read(do)

    async def get_user(self, name: str) -> UserRow | None:
        def do(db: sqlite3.Connection) -> UserRow | None:
            row = db.execute("SELECT name, admin, created_at, revoked_at FROM users WHERE name = ?", (name,)).fetchone()
            return None if row is None else _user(row)

        return await self._read(do)

    async def list_users(self) -> list[UserRow]:
        def do(db: sqlite3.Connection) -> list[UserRow]:
            return [_user(r) for r in db.execute("SELECT name, admin, created_at, revoked_at FROM users ORDER BY name")]

        return await self._read(do)

    async def revoke_user(self, name: str) -> bool:
        return bool(await self._run(sql.revoke_user, name, now_iso()))

    # ------------------------------------------------------------------ per-user secrets

    async def put_secret(
        self, user: str, profile: str, key: str, nonce: bytes, ciphertext: bytes, *, max_per_user: int
    ) -> bool:
        return bool(
            await self._run(
                sql.put_secret, user, profile, key, bytes(nonce), bytes(ciphertext), now_iso(), max_per_user
            )
        )

    async def list_secrets(self, user: str, profile: str | None = None) -> list[SecretRow]:
        def do(db: sqlite3.Connection) -> list[SecretRow]:
            rows = db.execute(
                "SELECT user_name, profile, key, nonce, ciphertext, updated_at FROM user_secrets "
                "WHERE user_name = ? AND (? IS NULL OR profile = ?) ORDER BY profile, key",
                (user, profile, profile),
            )
            return [SecretRow(r[0], r[1], r[2], bytes(r[3]), bytes(r[4]), r[5]) for r in rows]

        return await self._read(do)

    async def delete_secret(self, user: str, profile: str, key: str) -> bool:
        return bool(await self._run(sql.delete_secret, user, profile, key))

    async def read_events(self, thread_id: str, after: int, limit: int, *, with_raw: bool = True) -> list[Record]:
        raw_col = sql.RAW_SQL if with_raw else "NULL"

        def do(db: sqlite3.Connection) -> list[Record]:
            cur = db.execute(
                f"SELECT seq,ts,source,kind,{sql.DATA_SQL},{raw_col},relay FROM events"  # noqa: S608
                " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?",
                (thread_id, after, limit),
            )
            # The stored text is kept as it is: a replay relays it without parsing it.
            # (Assembling the whole envelope in SQL instead was measured slower.)
            return [
                Record(seq, ts, source, kind, None, raw, relay == 1, data)
                for seq, ts, source, kind, data, raw, relay in _bounded(cur, lambda r: len(r[4]) + len(r[5] or ""))
            ]

        return await self._read(do)

    async def read_frames(self, thread_id: str, after: int, limit: int, *, raw: bool) -> Frames:
        def do(db: sqlite3.Connection) -> Frames:
            # Read as UTF-8 bytes: the frames are sent without decoding or encoding any
            # text, and without a Record per row (issue #8); in events mode each row is its
            # stored envelope, one column (issue #22).
            db.text_factory = bytes
            try:
                with corrupt_rows(thread_id):
                    return (_raw_page if raw else _envelope_page)(db, thread_id, after, limit)
            finally:
                db.text_factory = str

        return await self._read(do)

    async def find_client_event(self, thread_id: str, client_id: str) -> int | None:
        def do(db: sqlite3.Connection) -> int | None:
            row = db.execute(
                "SELECT seq FROM events WHERE thread_id=? AND client_id=?", (thread_id, client_id)
            ).fetchone()
            return int(row[0]) if row else None

        return await self._read(do)


def _raw_page(db: sqlite3.Connection, thread_id: str, after: int, limit: int) -> Frames:
    """Raw mode relays the agent's own lines, one per stdout line (``relay``)."""
    cur = db.execute(
        "SELECT seq,CASE WHEN source='agent' AND relay=1 THEN"
        " coalesce(substr(env,raw_at+1,length(env)-raw_at-1),raw) END FROM events"
        " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?",
        (thread_id, after, limit),
    )
    rows: list[tuple[int, bytes | None]] = _bounded(cur, lambda r: len(r[1] or b""))
    return Frames(checked_lines(rows), len(rows), rows[-1][0] if rows else after)


def _envelope_page(db: sqlite3.Connection, thread_id: str, after: int, limit: int) -> Frames:
    """Each row's stored envelope, one column (issue #22). A page that may hold rows from
    before migration 9 (the transcript is gapless, so its seqs are ``after+1 ..
    after+limit``; the partial index ``events_without_env`` answers) is read with their
    columns too, and theirs are built from those, as before."""
    old = db.execute(
        "SELECT 1 FROM events INDEXED BY events_without_env"
        " WHERE thread_id=? AND seq>? AND seq<=? AND env IS NULL LIMIT 1",
        (thread_id, after, after + limit),
    ).fetchone()
    rows = None
    if old is None:
        cur = db.execute(
            "SELECT seq,env FROM events WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?", (thread_id, after, limit)
        )
        rows = _envelope_rows(cur)
    if rows is None:
        rows = _with_legacy(db, thread_id, after, limit)
    return Frames(checked_envelopes(rows), len(rows), rows[-1][0] if rows else after)


_SECOND = operator.itemgetter(1)


def _envelope_rows(cur: sqlite3.Cursor, max_bytes: int = PAGE_BYTES) -> list[tuple[int, bytes]] | None:
    """``_bounded`` for ``(seq, env)`` rows, a chunk at a time while no row of it can
    reach the bound (the sizes summed in C). None at a row from before migration 9 (no
    envelope: the page is read again with its columns); CorruptEvent at an envelope that
    is not bytes."""
    rows: list[tuple[int, bytes]] = []
    total = 0
    while total < max_bytes and (chunk := cur.fetchmany(128)):
        try:
            size = sum(map(len, map(_SECOND, chunk)))
        except TypeError:  # not bytes
            size = max_bytes
        if total + size < max_bytes:
            rows += chunk
            total += size
            continue
        for row in chunk:
            if row[1] is None:
                return None
            if row[1].__class__ is not bytes:
                raise CorruptEvent(row[0])
            rows.append(row)
            total += len(row[1])
            if total >= max_bytes:
                break
    return rows


def _with_legacy(db: sqlite3.Connection, thread_id: str, after: int, limit: int) -> list[tuple[int, bytes]]:
    """A page that holds rows from before migration 9, read as before (``stored_envelopes``
    of their columns; the new rows' ``data`` and ``raw`` cut out of their envelopes, which
    joins them back byte for byte). A row whose data cannot be had: CorruptEvent."""
    cur = db.execute(
        f"SELECT seq,ts,source,kind,{sql.DATA_SQL},{sql.RAW_SQL} FROM events"  # noqa: S608
        " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?",
        (thread_id, after, limit),
    )
    rows = _bounded(cur, lambda r: len(r[4] or b"") + len(r[5] or b""))
    try:
        return list(zip([r[0] for r in rows], stored_envelopes(rows), strict=True))
    except TypeError:  # a NULL where data must be
        raise CorruptEvent(next(r[0] for r in rows if not isinstance(r[4], bytes))) from None


def _user(row: Sequence[Any]) -> UserRow:
    return UserRow(str(row[0]), bool(row[1]), str(row[2]), row[3])


def _bounded(cur: sqlite3.Cursor, size: Callable[[Any], int], max_bytes: int = PAGE_BYTES) -> list[Any]:
    """The cursor's rows, stopping after the row that brings the page to ``max_bytes``
    (so a page holds at least one row, and at most max_bytes plus one row's worth)."""
    rows: list[Any] = []
    total = 0
    while total < max_bytes and (chunk := cur.fetchmany(64)):
        for row in chunk:
            rows.append(row)
            total += size(row)
            if total >= max_bytes:
                break
    return rows


def _refusal(reason: str) -> StoreError:
    if reason.startswith(leases.LEASE_LOST):
        return LeaseLost(reason)
    return StoreError(f"append refused: {reason}")


def encode_cursor(updated_at: str, thread_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([updated_at, thread_id]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, str]:
    from bridge.errors import InvalidRequest

    try:
        pad = "=" * (-len(cursor) % 4)
        value = json.loads(base64.urlsafe_b64decode(cursor + pad))
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            return value[0], value[1]
    except (ValueError, UnicodeDecodeError):
        pass
    raise InvalidRequest("cursor is not valid", code="invalid_cursor")
