"""The default embedded store: one SQLite file in the data dir, WAL mode.

Writes run on one dedicated thread with its own connection; reads on a second thread with
another (WAL lets them run side by side, and a reader sees every committed write).

Transcript appends are group-committed: every append waiting when the writer comes round
goes into one transaction (each in its own SAVEPOINT, so one bad append cannot sink the
others), and each caller is told only after the COMMIT. A small batch is committed by the
writer task itself, on the event loop, with a third connection that never waits for a
lock and never checkpoints (``_commit_inline``); anything else, or any failure there,
goes to the writer thread. Callers publish an event only
after that, so whatever a client has seen is on disk (``synchronous=NORMAL`` in WAL mode
survives a process kill). An append that finds the store idle (nothing pending, nothing else
ready to run on the loop) commits right in ``append`` (``_commit_inline``), with no hand-off at
all. If the database cannot be written (locked, disk full, I/O
error) the batch is retried with backoff until it commits; callers wait — which stops the
agent's stdout being read, so the agent itself is held back — and ``healthy`` is False
meanwhile. Nothing acknowledged is ever lost. Migrations are keyed by ``PRAGMA user_version``.

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
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import structlog

from bridge.clock import now_iso
from bridge.errors import LeaseLost, StoreError
from bridge.protocols.envelope import Frames, stored_envelopes
from bridge.protocols.events import Record
from bridge.store import sqlite_leases as leases
from bridge.store.base import (
    CHANGE_COLUMNS,
    PAGE_BYTES,
    TOMBSTONE_KEEP,
    TOMBSTONE_MAX_AGE_S,
    Change,
    ChangesPruned,
    ThreadFields,
    ThreadRow,
    UserRow,
)

T = TypeVar("T")
log = structlog.get_logger("bridge.store")

MAX_BATCH = 512  # appends per transaction
# Batches up to this size commit inline, on the event loop (see _commit_inline).
INLINE_MAX_ROWS = 64
INLINE_MAX_BYTES = 128 * 1024
TOUCH_FLUSH_S = 0.5  # owed updated_at/last_seq/turn_active are written within this long
CHECKPOINT_EVERY = 256  # inline commits between WAL checkpoints (about 1000 WAL pages)
MAX_BACKOFF_S = 2.0

_MIGRATIONS: list[str] = [
    # 1: threads and their transcripts
    """
    CREATE TABLE threads (
        id TEXT PRIMARY KEY,
        agent TEXT NOT NULL,
        protocol TEXT NOT NULL,
        model TEXT,
        cwd TEXT NOT NULL,
        title TEXT NOT NULL DEFAULT '',
        native_session_id TEXT,
        state TEXT NOT NULL,
        turn_active INTEGER NOT NULL DEFAULT 0,
        last_seq INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        last_exit TEXT,
        options TEXT NOT NULL DEFAULT '{}',
        pid INTEGER
    );
    CREATE INDEX threads_by_activity ON threads(updated_at DESC, id DESC);
    CREATE TABLE events (
        thread_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        ts TEXT NOT NULL,
        source TEXT NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        raw TEXT,
        relay INTEGER NOT NULL DEFAULT 0,
        client_id TEXT,
        PRIMARY KEY (thread_id, seq)
    ) WITHOUT ROWID;
    CREATE INDEX events_by_client_id ON events(thread_id, client_id) WHERE client_id IS NOT NULL;
    """,
    # 2: the agent's start time, so a later daemon can tell its process group from a
    # recycled pid (process/reaper.py)
    """
    ALTER TABLE threads ADD COLUMN pid_start INTEGER;
    """,
    # 3: what an ACP agent said about itself in initialize (capabilities, info, version)
    """
    ALTER TABLE threads ADD COLUMN agent_info TEXT;
    """,
    # 4: the sub-agent / workflow task table (sessions/tasks.py, its own JSON)
    """
    ALTER TABLE threads ADD COLUMN tasks TEXT;
    """,
    # 5: browser sessions, so a daemon restart does not sign every page out. Only a keyed
    # hash of each session id is kept (api/auth.py Sessions), never the id itself.
    """
    CREATE TABLE browser_sessions (
        key TEXT PRIMARY KEY,
        expires_at REAL NOT NULL
    ) WITHOUT ROWID;
    """,
    # 6: the change log (GET /v1/events) and the pending permission count. Existing threads
    # get change_seqs 1..n in order of activity, each as its own creation.
    """
    ALTER TABLE threads ADD COLUMN pending_permissions INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE threads ADD COLUMN change_seq INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE threads ADD COLUMN created_seq INTEGER NOT NULL DEFAULT 0;
    UPDATE threads SET change_seq = (SELECT n FROM (SELECT id AS rid, row_number() OVER
        (ORDER BY updated_at, id) AS n FROM threads) WHERE rid = threads.id);
    UPDATE threads SET created_seq = change_seq;
    CREATE UNIQUE INDEX threads_by_change ON threads(change_seq);
    CREATE TABLE thread_tombstones (
        thread_id TEXT PRIMARY KEY,
        change_seq INTEGER NOT NULL,
        deleted_at TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX tombstones_by_change ON thread_tombstones(change_seq);
    CREATE TABLE change_log (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        latest INTEGER NOT NULL,
        horizon INTEGER NOT NULL
    );
    INSERT INTO change_log (id, latest, horizon) SELECT 1, coalesce(max(change_seq), 0), 0 FROM threads;
    """,
]
# 7: leases, replicas and the replica that recorded a thread's process (issue #18); the
# same schema as PostgreSQL's (bridge/store/pg_schema.py), so both stores share one
# protocol. A client_id is unique per thread in the database itself.
_MIGRATIONS.append(
    """
    ALTER TABLE threads ADD COLUMN lease_owner TEXT;
    ALTER TABLE threads ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE threads ADD COLUMN lease_expires REAL;
    ALTER TABLE threads ADD COLUMN replica_id TEXT;
    CREATE INDEX threads_by_lease_owner ON threads(lease_owner) WHERE lease_owner IS NOT NULL;
    DROP INDEX events_by_client_id;
    CREATE UNIQUE INDEX events_by_client_id ON events(thread_id, client_id) WHERE client_id IS NOT NULL;
    CREATE TABLE replicas (
        replica_id TEXT PRIMARY KEY,
        instance TEXT NOT NULL,
        url TEXT,
        started_at TEXT NOT NULL,
        heartbeat_at REAL NOT NULL
    ) WITHOUT ROWID;
    """
)

# 8: users (issue #20): who created each thread (and each deleted one), whose each browser
# session is, and the users with the hashes of their tokens (never a token). The same as
# PostgreSQL's migration 3.
_MIGRATIONS.append(
    """
    ALTER TABLE threads ADD COLUMN owner TEXT;
    CREATE INDEX threads_by_owner ON threads(owner, updated_at DESC, id DESC) WHERE owner IS NOT NULL;
    ALTER TABLE thread_tombstones ADD COLUMN owner TEXT;
    ALTER TABLE browser_sessions ADD COLUMN user_name TEXT;
    CREATE TABLE users (
        name TEXT PRIMARY KEY,
        token_hash TEXT UNIQUE,
        admin INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        revoked_at TEXT
    ) WITHOUT ROWID;
    """
)

SCHEMA_VERSION = len(_MIGRATIONS)


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


_THREAD_COLUMNS = (
    "id",
    "agent",
    "protocol",
    "model",
    "cwd",
    "title",
    "native_session_id",
    "state",
    "turn_active",
    "last_seq",
    "created_at",
    "updated_at",
    "last_exit",
    "options",
    "pid",
    "pid_start",
    "agent_info",
    "tasks",
    "pending_permissions",
    "owner",
)
_JSON_COLUMNS = ("last_exit", "options", "agent_info")


@dataclass(slots=True)
class _Append:
    thread_id: str
    rows: list[tuple[Any, ...]]
    fields: dict[str, Any]  # thread columns written in the same transaction
    done: asyncio.Future[None] | None  # None: nobody waits (a timed flush)
    # (updated_at, last_seq, turn_active): for an append, what the thread row owes once it
    # commits; for a flush item (no rows), written with max() for the first two so an older
    # value never wins (turn_active is only ever written by flush items, in order).
    touch: tuple[str | None, int | None, int | None] | None = None
    flush: bool = False
    changed: bool = False  # its commit gave the thread row a new change_seq
    fence: tuple[str, int] | None = None  # (replica_id, epoch): the lease this append needs


# At open: every thread's derived columns brought up to its newest stored event (a daemon
# killed before its last flush of _dirty). Index seeks on the events primary key only.
# Each returns the ids it changed: those rows get a new change_seq.
_REPAIR = (
    "UPDATE threads SET last_seq = (SELECT max(seq) FROM events WHERE thread_id = threads.id) "
    "WHERE last_seq < (SELECT max(seq) FROM events WHERE thread_id = threads.id) RETURNING id",
    "UPDATE threads SET updated_at = (SELECT ts FROM events WHERE thread_id = threads.id "
    "ORDER BY seq DESC LIMIT 1) WHERE updated_at < (SELECT ts FROM events "
    "WHERE thread_id = threads.id ORDER BY seq DESC LIMIT 1) RETURNING id",
    # A turn is in flight iff the thread's newest turn.started / turn.ended is a turn.started
    # (every accepted turn ends exactly once: conversation.py, registry.py recovery).
    "UPDATE threads SET turn_active = coalesce((SELECT kind = 'turn.started' FROM events "
    "WHERE thread_id = threads.id AND kind IN ('turn.started', 'turn.ended') ORDER BY seq DESC LIMIT 1), 0) "
    "WHERE state IN ('starting', 'running', 'stopping') OR turn_active = 1 RETURNING id",
)


def _iso_before(seconds: float) -> str:
    """The wall-clock time ``seconds`` ago, in the transcript's format (so it compares as text)."""
    return datetime.fromtimestamp(time.time() - seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _prune_tombstones(db: sqlite3.Connection, older_than: str) -> None:
    """Drop the tombstones beyond the newest TOMBSTONE_KEEP, and those deleted before
    ``older_than``; the horizon moves up to the newest one dropped (a cursor below it could
    miss a deletion)."""
    (upto,) = db.execute(
        "SELECT max(change_seq) FROM thread_tombstones WHERE deleted_at < ? OR change_seq <= "
        "(SELECT change_seq FROM thread_tombstones ORDER BY change_seq DESC LIMIT 1 OFFSET ?)",
        (older_than, TOMBSTONE_KEEP),
    ).fetchone()
    if upto is None:
        return
    db.execute("DELETE FROM thread_tombstones WHERE change_seq <= ?", (upto,))
    db.execute("UPDATE change_log SET horizon = max(horizon, ?)", (upto,))


def _next_change(db: sqlite3.Connection) -> int:
    """The next cursor, taken inside the caller's transaction (so cursors follow commit
    order; a rolled-back transaction or savepoint gives its value back)."""
    return int(db.execute("UPDATE change_log SET latest = latest + 1 RETURNING latest").fetchall()[0][0])


def _repair(db: sqlite3.Connection) -> None:
    changed: dict[str, None] = {}
    for stmt in _REPAIR:
        changed.update(dict.fromkeys(r[0] for r in db.execute(stmt).fetchall()))
    for tid in changed:
        db.execute("UPDATE threads SET change_seq=? WHERE id=?", (_next_change(db), tid))


def _later(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


def _loop_idle(loop: asyncio.AbstractEventLoop) -> bool:
    """True when nothing else is ready to run in this round of the event loop, so no other
    append can join a group commit before the next round (CPython's ``_ready`` deque;
    False, i.e. always group, on a loop without one)."""
    ready = getattr(loop, "_ready", None)
    return ready is not None and not ready


class SqliteStore(leases.SqliteLeases):
    def __init__(self, path: Path, *, busy_timeout_ms: int = 2000, replica_id: str = "local") -> None:
        self.path = path
        self.replica_id = replica_id
        self.busy_timeout_ms = busy_timeout_ms
        self._wexec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-w")
        self._rexec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-r")
        self._wdb: sqlite3.Connection | None = None
        self._rdb: sqlite3.Connection | None = None
        self._idb: sqlite3.Connection | None = None  # inline commits (see _commit_inline)
        self._inline_commits = 0
        self._checkpoint: asyncio.Task[None] | None = None
        self._pending: list[_Append] = []
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
        self.appended = 0

    # ------------------------------------------------------------------ plumbing

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
        db.execute("PRAGMA synchronous=NORMAL")
        return db

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

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A write (or a read that must follow earlier writes) on the writer thread."""
        return await self._call(self._wexec, "_wdb", fn)

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._call(self._rexec, "_rdb", fn)

    async def open(self) -> None:
        def do_open() -> None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = self._connect()
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                db.close()
                raise StoreError(schema_too_new(self.path, version), code="schema_too_new")
            db.execute("PRAGMA journal_mode=WAL")
            for i, ddl in enumerate(_MIGRATIONS[version:], start=version + 1):
                db.execute("BEGIN IMMEDIATE")
                for stmt in filter(str.strip, ddl.split(";")):
                    db.execute(stmt)
                db.execute(f"PRAGMA user_version={i}")
                db.execute("COMMIT")
            db.execute("BEGIN IMMEDIATE")
            _repair(db)
            db.execute("COMMIT")
            self._wdb = db

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
        cols = ",".join(row)
        marks = ",".join("?" for _ in row)

        def do(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            seq = _next_change(db)
            db.execute(
                f"INSERT INTO threads ({cols},change_seq,created_seq) VALUES ({marks},?,?)",  # noqa: S608
                (*row.values(), seq, seq),
            )
            db.execute("COMMIT")

        await self._run(do)
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
        sets = ",".join(f"{k}=?" for k in row)
        visible = not CHANGE_COLUMNS.isdisjoint(row)

        def do(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            bump = [_next_change(db)] if visible else []
            db.execute(
                f"UPDATE threads SET {sets}{',change_seq=?' if visible else ''} WHERE id=?",  # noqa: S608
                (*row.values(), *bump, thread_id),
            )
            db.execute("COMMIT")

        await self._run(do)
        if visible:
            self._changed()

    async def delete_thread(self, thread_id: str) -> bool:
        self._dirty.pop(thread_id, None)

        deleted_at = now_iso()

        def do(db: sqlite3.Connection) -> bool:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM events WHERE thread_id=?", (thread_id,))
            gone = db.execute("DELETE FROM threads WHERE id=? RETURNING owner", (thread_id,)).fetchall()
            found = bool(gone)
            if found:
                db.execute(
                    "INSERT OR REPLACE INTO thread_tombstones (thread_id, change_seq, deleted_at, owner) "
                    "VALUES (?,?,?,?)",
                    (thread_id, _next_change(db), deleted_at, gone[0][0]),
                )
                _prune_tombstones(db, _iso_before(TOMBSTONE_MAX_AGE_S))
            db.execute("COMMIT")
            return found

        found = await self._run(do)
        if found:
            self._changed()
        return found

    async def live_threads(self) -> list[ThreadRow]:
        """Threads a previous daemon left with a process or a turn in flight. All of them:
        a SQLite file is only ever one replica's (its data dir is locked), whatever
        ``replica_id`` that replica had before (the default changes with the pid)."""
        await self._flush_touches()

        def do(db: sqlite3.Connection) -> list[ThreadRow]:
            rows = db.execute(
                f"SELECT {','.join(_THREAD_COLUMNS)} FROM threads "  # noqa: S608
                "WHERE state IN ('starting','running','stopping') OR turn_active=1"
            ).fetchall()
            return [self._row(r) for r in rows]

        return await self._run(do)

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
        rows = [
            (thread_id, r.seq, r.ts, r.source, r.kind, r.data_json, r.raw, int(r.relay), cid)
            for r, cid in zip(records, client_ids, strict=True)
        ]
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
        if not self._pending and _loop_idle(loop):
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
            or sum(len(item.rows) for item in batch) > INLINE_MAX_ROWS
            or sum(len(r[5]) + len(r[6] or "") for item in batch for r in item.rows) > INLINE_MAX_BYTES
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
                self.appended += len(item.rows)
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
        items = [_Append(tid, [], {}, None, touch, flush=True) for tid, touch in self._dirty.items()]
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
            with contextlib.suppress(StoreError):
                await self._run(lambda db: db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall())

        self._checkpoint = asyncio.create_task(run(), name="store-checkpoint")

    async def _write_loop(self) -> None:
        assert self._wake is not None
        backoff = 0.05
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = self._pending[:MAX_BATCH]
                try:
                    inline = self._commit_inline(batch)
                    failed = inline if inline is not None else await self._run(lambda db, b=batch: _commit(db, b))  # type: ignore[misc]
                except StoreError as exc:
                    # Locked, full or broken: nothing in the batch is acknowledged; try again.
                    self._set_health(False, exc.message)
                    log.error("store.write_failed", error=exc.message, pending=len(self._pending), retry_in_s=backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
                backoff = 0.05
                if not self.healthy:
                    log.info("store.recovered")
                self._set_health(True, None)
                del self._pending[: len(batch)]
                self._settled(batch, failed)
            self._idle.set()

    # ------------------------------------------------------------------ browser sessions

    async def load_sessions(self, now: float) -> list[tuple[str, float, str | None]]:
        """Unexpired browser sessions, oldest first (expired ones are deleted)."""

        def do(db: sqlite3.Connection) -> list[tuple[str, float, str | None]]:
            db.execute("DELETE FROM browser_sessions WHERE expires_at <= ?", (now,))
            rows = db.execute("SELECT key, expires_at, user_name FROM browser_sessions ORDER BY expires_at")
            return [(k, float(e), u) for k, e, u in rows]

        return await self._run(do)

    async def save_session(
        self, key: str, expires_at: float, evicted: Sequence[str] = (), *, user: str | None = None
    ) -> None:
        def do(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            db.executemany("DELETE FROM browser_sessions WHERE key = ?", [(k,) for k in evicted])
            db.execute(
                "INSERT OR REPLACE INTO browser_sessions (key, expires_at, user_name) VALUES (?, ?, ?)",
                (key, expires_at, user),
            )
            db.execute("COMMIT")

        await self._run(do)

    async def delete_session(self, key: str) -> None:
        def do(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM browser_sessions WHERE key = ?", (key,))

        await self._run(do)

    # ------------------------------------------------------------------ users

    async def add_user(self, name: str, token_hash: str, *, admin: bool) -> bool:
        def do(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                "INSERT INTO users (name, token_hash, admin, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET token_hash = excluded.token_hash, admin = excluded.admin, "
                "revoked_at = NULL WHERE users.revoked_at IS NOT NULL",
                (name, token_hash, int(admin), now_iso()),
            )
            return cur.rowcount > 0

        return await self._run(do)

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
        def do(db: sqlite3.Connection) -> bool:
            db.execute("BEGIN IMMEDIATE")
            cur = db.execute(
                "UPDATE users SET token_hash = NULL, revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
                (now_iso(), name),
            )
            db.execute("DELETE FROM browser_sessions WHERE user_name = ?", (name,))
            db.execute("COMMIT")
            return cur.rowcount > 0

        return await self._run(do)

    async def read_events(self, thread_id: str, after: int, limit: int, *, with_raw: bool = True) -> list[Record]:
        raw_col = "raw" if with_raw else "NULL"

        def do(db: sqlite3.Connection) -> list[Record]:
            cur = db.execute(
                f"SELECT seq,ts,source,kind,data,{raw_col},relay FROM events"  # noqa: S608
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
            # Read as UTF-8 bytes: the frames are joined and sent without decoding or
            # encoding any text, and without a Record per row (issue #8).
            db.text_factory = bytes
            try:
                if raw:
                    # Raw mode relays the agent's own lines, one per stdout line (``relay``).
                    cur = db.execute(
                        "SELECT seq,CASE WHEN source='agent' AND relay=1 THEN raw END FROM events"
                        " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?",
                        (thread_id, after, limit),
                    )
                    rrows: list[tuple[int, bytes | None]] = _bounded(cur, lambda r: len(r[1] or b""))
                    return Frames(
                        [text for _, text in rrows if text is not None], len(rrows), rrows[-1][0] if rrows else after
                    )
                cur = db.execute(
                    "SELECT seq,ts,source,kind,data,raw FROM events WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?",
                    (thread_id, after, limit),
                )
                rows = _bounded(cur, lambda r: len(r[4]) + len(r[5] or b""))
                return Frames(stored_envelopes(rows), len(rows), rows[-1][0] if rows else after)
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


def _write_item(db: sqlite3.Connection, item: _Append) -> None:
    # A flush writes client-visible columns; an append's own fields may. Either is one
    # change of the row: one counter step per item (i.e. per thread per commit) at most.
    item.changed = item.flush or not CHANGE_COLUMNS.isdisjoint(item.fields)
    if item.flush:
        assert item.touch is not None
        db.execute(
            "UPDATE threads SET updated_at=max(updated_at, coalesce(?, updated_at)), "
            "last_seq=max(last_seq, coalesce(?, last_seq)), turn_active=coalesce(?, turn_active), "
            "change_seq=? WHERE id=?",
            (*item.touch, _next_change(db), item.thread_id),
        )
        return
    if item.fence is not None:
        leases.fence(db, item.thread_id, *item.fence)
    if item.rows:
        db.executemany(
            "INSERT INTO events (thread_id,seq,ts,source,kind,data,raw,relay,client_id) VALUES (?,?,?,?,?,?,?,?,?)",
            item.rows,
        )
    if item.fields:
        sets = ",".join(f"{k}=?" for k in item.fields)
        bump = [_next_change(db)] if item.changed else []
        db.execute(
            f"UPDATE threads SET {sets}{',change_seq=?' if item.changed else ''} WHERE id=?",  # noqa: S608
            (*item.fields.values(), *bump, item.thread_id),
        )


# This append alone is bad (a constraint, or text SQLite cannot encode): it is refused, the
# rest of the batch commits, and the writer never stalls on it.
_REFUSED = (sqlite3.IntegrityError, UnicodeEncodeError, ValueError, OverflowError, leases.Fenced)


def _refusal(reason: str) -> StoreError:
    if reason.startswith(leases.LEASE_LOST):
        return LeaseLost(reason)
    return StoreError(f"append refused: {reason}")


def _commit(db: sqlite3.Connection, batch: list[_Append]) -> dict[int, str]:
    """One transaction for the whole batch; an append that violates a constraint is rolled
    back alone (its savepoint; a batch of one needs none) and reported, the rest commit."""
    failed: dict[int, str] = {}
    db.execute("BEGIN IMMEDIATE")
    if len(batch) == 1:
        try:
            _write_item(db, batch[0])
        except _REFUSED as exc:
            db.execute("ROLLBACK")
            return {0: str(exc)}
        db.execute("COMMIT")
        return failed
    for i, item in enumerate(batch):
        db.execute("SAVEPOINT a")
        try:
            _write_item(db, item)
        except _REFUSED as exc:
            db.execute("ROLLBACK TO a")
            failed[i] = str(exc)
        db.execute("RELEASE a")
    db.execute("COMMIT")
    return failed


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
