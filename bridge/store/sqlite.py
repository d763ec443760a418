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

The rows, their encoding, the shared reads, health and ``ping`` are the PostgreSQL store's
too (bridge/store/common.py, rows.py); the transcript pages are read in sqlite_reads.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import structlog

from bridge.clock import now_iso
from bridge.errors import StoreError
from bridge.protocols.envelope import Frames, Page
from bridge.protocols.events import Record
from bridge.store import rows, search_sqlite, search_text, usage, usage_sqlite
from bridge.store import sqlite_leases as leases
from bridge.store import sqlite_reads as reads
from bridge.store import sqlite_sql as sql
from bridge.store.base import (
    CHANGE_COLUMNS,
    EVENT_OVERHEAD,
    TOMBSTONE_KEEP,
    TOMBSTONE_MAX_AGE_S,
    StoreListeners,
    ThreadFields,
    ThreadRow,
)
from bridge.store.common import CommonStore
from bridge.store.event_rows import corrupt_rows
from bridge.store.sqlite_accounts import SqliteAccounts
from bridge.store.sqlite_sql import _MIGRATIONS, SCHEMA_VERSION, _Append, _commit, check_schema, schema_too_new
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


_later = rows.later
_refusal = rows.refusal  # (an append refused alone: LeaseLost for a fence)


def _loop_idle(loop: asyncio.AbstractEventLoop) -> bool:
    """True when nothing else is ready to run in this round of the event loop, so no other
    append can join a group commit before the next round (CPython's ``_ready`` deque;
    False, i.e. always group, on a loop without one)."""
    ready = getattr(loop, "_ready", None)
    return ready is not None and not ready


class SqliteStore(leases.SqliteLeases, SqliteAccounts, CommonStore):
    shared: ClassVar[bool] = False  # the file is one daemon's (its data dir is locked)
    _BOOL_AS_INT: ClassVar[bool] = True

    def __init__(
        self,
        path: Path,
        *,
        busy_timeout_ms: int = 2000,
        replica_id: str = "local",
        writer: WriterMode = "process",
        listeners: StoreListeners | None = None,
    ) -> None:
        super().__init__(replica_id, listeners)
        self.path = path
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
        self._generation = 0  # of the batches sent to the writer process (a failed one's retry: the next)
        # thread → what its row owes: (updated_at, last_seq, turn_active, transcript size)
        self._dirty: dict[str, tuple[str | None, int | None, int | None, int]] = {}
        self._touch_timer: asyncio.TimerHandle | None = None
        self._wake: asyncio.Event | None = None
        self._writer: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()  # set whenever nothing waits to be written
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

    async def _fetch(self, statement: str, params: Sequence[Any]) -> list[Any]:
        return await self._read(lambda db: db.execute(statement, params).fetchall())

    async def _snapshot(self, queries: list[tuple[str, tuple[Any, ...]]]) -> list[list[Any]]:
        def do(db: sqlite3.Connection) -> list[list[Any]]:
            db.execute("BEGIN")  # one snapshot for all of them
            try:
                return [db.execute(statement, params).fetchall() for statement, params in queries]
            finally:
                db.execute("COMMIT")

        return await self._read(do)

    async def _rows_settled(self) -> None:
        await self._flush_touches()

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
                log.info("store.writer_stats", pid=proc.pid, **stats)
        await proc.close()

    async def _drained(self) -> None:
        await self._idle.wait()

    # ------------------------------------------------------------------ threads

    async def create_thread(self, thread: ThreadRow) -> None:
        await self._run(sql.create_thread, self._new_row(thread))
        self._changed()

    async def update_thread(self, thread_id: str, fields: ThreadFields) -> None:
        row = self._dump(fields)
        if not row:
            return
        visible = not CHANGE_COLUMNS.isdisjoint(row)
        await self._run(sql.update_thread, thread_id, row, visible)
        if visible:
            self._changed()

    async def delete_thread(self, thread_id: str) -> bool:
        self._dirty.pop(thread_id, None)
        prune_before = rows.iso_before(TOMBSTONE_MAX_AGE_S)
        found = bool(await self._run(sql.delete_thread, thread_id, now_iso(), prune_before, TOMBSTONE_KEEP))
        if found:
            self._changed()
        return found

    async def live_threads(self) -> list[ThreadRow]:
        """Threads a previous daemon left with a process or a turn in flight. All of them:
        a SQLite file is only ever one replica's (its data dir is locked), whatever
        ``replica_id`` that replica had before (the default changes with the pid)."""
        await self._flush_touches()
        return [rows.thread_row(r) for r in await self._run(sql.live_threads)]

    # ------------------------------------------------------------------ change log

    def _batch_changed(self, batch: list[_Append], failed: dict[int, str]) -> None:
        """One wake-up for a committed batch that gave some row a new change_seq."""
        if any(item.changed for i, item in enumerate(batch) if i not in failed):
            self._changed()

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
        item = _Append(thread_id, rows, fields, None, (updated_at, last_seq, turn_active, 0))
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
                count = sql.row_count(item.rows)
                self.appended += count
                old = self._dirty.get(item.thread_id)
                # Its size (base.transcript_size: the text was counted for the batch's cap)
                # is owed to transcript_bytes like its seq to last_seq.
                size = sql.text_size(item) + EVENT_OVERHEAD * count
                new = (*item.touch[:3], size)
                self._dirty[item.thread_id] = (
                    new
                    if old is None
                    else (
                        _later(old[0], new[0]),
                        _later(old[1], new[1]),
                        old[2] if new[2] is None else new[2],
                        old[3] + size,
                    )
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

    async def _commit_batch(self, batch: list[_Append], again: bool) -> dict[int, str]:
        """One transaction: inline or on the writer thread, or in the writer process (the
        batch as plain tuples; ``again``: the writer that had it may have committed it
        before it died, so what is already there is not written twice)."""
        inline = self._commit_inline(batch)
        if inline is not None:
            return inline
        if self.writer_mode == "process":
            proc = await self._writer_proc()
            return await proc.batch(self._wire(batch), again, self._generation)
        result: dict[int, str] = await self._call(self._wexec, "_wdb", lambda db: _commit(db, batch))
        return result

    def _wire(self, batch: list[_Append]) -> list[tuple[Any, ...]]:
        for item in batch:  # as _write_item decides it there
            item.changed = item.flush or not CHANGE_COLUMNS.isdisjoint(item.fields)
        return [sql.wire_item(item) for item in batch]

    async def _write_loop(self) -> None:
        """Commit what is pending, in order, one batch at a time. There is one commit
        pipeline in the daemon, the conversation's (sessions/journal.py): it keeps several
        appends of a busy thread pending here, so the next batch is ready when the writer
        answers one (docs/DESIGN.md "Journal" has the measurements behind the choice)."""
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = self._next_batch()
                failed = await self._commit_until_done(batch)
                del self._pending[: len(batch)]
                self._settled(batch, failed)
            self._idle.set()

    async def _commit_until_done(self, batch: list[_Append]) -> dict[int, str]:
        """Commit ``batch``, retrying with backoff (``healthy`` False meanwhile) until it
        commits: locked, full or broken, nothing in it is acknowledged before. A retry is
        marked ``again`` (the writer process that had it may have committed it before it
        died) and goes under a new generation (the writer refuses the rest of a failed one)."""
        backoff = 0.05
        again = False
        while True:
            try:
                failed = await self._commit_batch(batch, again)
            except StoreError as exc:
                again = True
                self._generation += 1
                self._set_health(False, exc.message)
                log.error("store.write_failed", error=exc.message, pending=len(self._pending), retry_in_s=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            if not self.healthy:
                log.info("store.recovered")
            self._set_health(True, None)
            return failed

    def _next_batch(self) -> list[_Append]:
        """The oldest pending appends that go in one batch: at most MAX_BATCH, and no more
        than MAX_BATCH_TEXT characters of event text unless one append alone holds more."""
        pending = self._pending
        text = 0
        for i in range(min(len(pending), MAX_BATCH)):
            text += sql.text_size(pending[i])
            if text > MAX_BATCH_TEXT and i > 0:
                return pending[:i]
        return pending[:MAX_BATCH]

    # ------------------------------------------------------------------ transcript reads

    async def read_events(self, thread_id: str, after: int, limit: int, *, with_raw: bool = True) -> Page:
        return await self._read(lambda db: reads.events_page(db, thread_id, after, limit, with_raw))

    async def read_frames(self, thread_id: str, after: int, limit: int, *, raw: bool) -> Frames:
        def do(db: sqlite3.Connection) -> Frames:
            with corrupt_rows(thread_id):
                return reads.frames_page(db, thread_id, after, limit, raw)

        return await self._read(do)

    async def search(
        self, q: str, *, owner: str | None, limit: int, cursor: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        query, below = search_text.fts5_query(search_text.parse_query(q)), search_text.decode_cursor(cursor)
        return await self._read(lambda db: search_sqlite.search(db, query, owner, limit, below))

    async def usage_report(
        self, *, group_by: str, owner: str | None, since: str | None, until: str | None, limit: int
    ) -> dict[str, Any]:
        found = await self._read(lambda db: usage_sqlite.report(db, group_by, owner, since, until))
        return usage.report(found, group_by, limit)
