"""The default embedded store: one SQLite file in the data dir, WAL mode.

All SQL runs on one dedicated thread (sqlite3 connections are not shared across threads),
so calls are serialized in the order they were awaited. A transcript append and the
thread's ``last_seq`` update commit in one transaction: what a client has been shown is
on disk (``synchronous=NORMAL`` in WAL mode survives a process kill). Schema migrations
are keyed by ``PRAGMA user_version``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from bridge.errors import StoreError
from bridge.protocols.events import Record, dumps
from bridge.store.base import ThreadRow

T = TypeVar("T")

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
]

_THREAD_COLUMNS = ("id", "agent", "protocol", "model", "cwd", "title", "native_session_id",
                   "state", "turn_active", "last_seq", "created_at", "updated_at", "last_exit",
                   "options", "pid")
_JSON_COLUMNS = ("last_exit", "options")


class SqliteStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._db: sqlite3.Connection | None = None

    # ------------------------------------------------------------------ plumbing

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            if self._db is None:
                raise StoreError("store is closed")
            try:
                return fn(self._db)
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.rollback()
                raise StoreError(f"store error: {exc}") from exc

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def open(self) -> None:
        def do_open() -> None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=5000")
            db.execute("PRAGMA foreign_keys=ON")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            for i, ddl in enumerate(_MIGRATIONS[version:], start=version + 1):
                db.execute("BEGIN")
                for stmt in filter(str.strip, ddl.split(";")):
                    db.execute(stmt)
                db.execute(f"PRAGMA user_version={i}")
                db.execute("COMMIT")
            self._db = db

        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, do_open)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {self.path}: {exc}") from exc

    async def close(self) -> None:
        def do_close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await asyncio.get_running_loop().run_in_executor(self._executor, do_close)
        self._executor.shutdown(wait=True)

    async def ping(self) -> None:
        await self._run(lambda db: db.execute("SELECT 1").fetchone())

    # ------------------------------------------------------------------ threads

    @staticmethod
    def _row(row: sqlite3.Row | tuple[Any, ...]) -> ThreadRow:
        out = dict(zip(_THREAD_COLUMNS, row, strict=True))
        for col in _JSON_COLUMNS:
            out[col] = json.loads(out[col]) if out[col] is not None else None
        out["turn_active"] = bool(out["turn_active"])
        return out

    @staticmethod
    def _dump(fields: dict[str, Any]) -> dict[str, Any]:
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
        row = self._dump({k: thread.get(k) for k in _THREAD_COLUMNS if k in thread})
        cols = ",".join(row)
        marks = ",".join("?" for _ in row)

        def do(db: sqlite3.Connection) -> None:
            db.execute(f"INSERT INTO threads ({cols}) VALUES ({marks})", tuple(row.values()))  # noqa: S608

        await self._run(do)

    async def get_thread(self, thread_id: str) -> ThreadRow | None:
        def do(db: sqlite3.Connection) -> ThreadRow | None:
            row = db.execute(f"SELECT {','.join(_THREAD_COLUMNS)} FROM threads WHERE id=?",  # noqa: S608
                             (thread_id,)).fetchone()
            return self._row(row) if row else None

        return await self._run(do)

    async def list_threads(self, *, limit: int, cursor: str | None,
                           agent: str | None) -> tuple[list[ThreadRow], str | None]:
        where, params = [], []
        if cursor:
            updated_at, tid = decode_cursor(cursor)
            where.append("(updated_at < ? OR (updated_at = ? AND id < ?))")
            params += [updated_at, updated_at, tid]
        if agent:
            where.append("agent = ?")
            params.append(agent)
        sql = (f"SELECT {','.join(_THREAD_COLUMNS)} FROM threads "  # noqa: S608
               f"{'WHERE ' + ' AND '.join(where) if where else ''} "
               "ORDER BY updated_at DESC, id DESC LIMIT ?")

        def do(db: sqlite3.Connection) -> list[ThreadRow]:
            return [self._row(r) for r in db.execute(sql, (*params, limit + 1)).fetchall()]

        rows = await self._run(do)
        next_cursor = None
        if len(rows) > limit:
            rows = rows[:limit]
            next_cursor = encode_cursor(rows[-1]["updated_at"], rows[-1]["id"])
        return rows, next_cursor

    async def update_thread(self, thread_id: str, fields: dict[str, Any]) -> None:
        row = self._dump(fields)
        if not row:
            return
        sets = ",".join(f"{k}=?" for k in row)

        def do(db: sqlite3.Connection) -> None:
            db.execute(f"UPDATE threads SET {sets} WHERE id=?", (*row.values(), thread_id))  # noqa: S608

        await self._run(do)

    async def delete_thread(self, thread_id: str) -> bool:
        def do(db: sqlite3.Connection) -> bool:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM events WHERE thread_id=?", (thread_id,))
            cur = db.execute("DELETE FROM threads WHERE id=?", (thread_id,))
            db.execute("COMMIT")
            return cur.rowcount > 0

        return await self._run(do)

    async def live_threads(self) -> list[ThreadRow]:
        """Threads a previous daemon left with a process or a turn in flight."""
        def do(db: sqlite3.Connection) -> list[ThreadRow]:
            rows = db.execute(
                f"SELECT {','.join(_THREAD_COLUMNS)} FROM threads "  # noqa: S608
                "WHERE state IN ('starting','running','stopping') OR turn_active=1").fetchall()
            return [self._row(r) for r in rows]

        return await self._run(do)

    # ------------------------------------------------------------------ transcript

    async def append(self, thread_id: str, records: Sequence[Record],
                     client_ids: Sequence[str | None], thread_fields: dict[str, Any]) -> None:
        rows = [(thread_id, r.seq, r.ts, r.source, r.kind, dumps(r.data), r.raw,
                 int(r.relay), cid) for r, cid in zip(records, client_ids, strict=True)]
        fields = self._dump({**thread_fields, "last_seq": records[-1].seq} if records
                            else thread_fields)
        sets = ",".join(f"{k}=?" for k in fields)

        def do(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT INTO events (thread_id,seq,ts,source,kind,data,raw,relay,client_id)"
                           " VALUES (?,?,?,?,?,?,?,?,?)", rows)
            if fields:
                db.execute(f"UPDATE threads SET {sets} WHERE id=?", (*fields.values(), thread_id))  # noqa: S608
            db.execute("COMMIT")

        await self._run(do)

    async def read_events(self, thread_id: str, after: int, limit: int) -> list[Record]:
        def do(db: sqlite3.Connection) -> list[Record]:
            rows = db.execute(
                "SELECT seq,ts,source,kind,data,raw,relay FROM events WHERE thread_id=? AND seq>?"
                " ORDER BY seq LIMIT ?", (thread_id, after, limit)).fetchall()
            return [Record(seq, ts, source, kind, json.loads(data), raw, bool(relay))
                    for seq, ts, source, kind, data, raw, relay in rows]

        return await self._run(do)

    async def find_client_event(self, thread_id: str, client_id: str) -> int | None:
        def do(db: sqlite3.Connection) -> int | None:
            row = db.execute("SELECT seq FROM events WHERE thread_id=? AND client_id=?",
                             (thread_id, client_id)).fetchone()
            return int(row[0]) if row else None

        return await self._run(do)


def encode_cursor(updated_at: str, thread_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([updated_at, thread_id]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, str]:
    from bridge.errors import InvalidRequest

    try:
        pad = "=" * (-len(cursor) % 4)
        value = json.loads(base64.urlsafe_b64decode(cursor + pad))
        if (isinstance(value, list) and len(value) == 2
                and all(isinstance(v, str) for v in value)):
            return value[0], value[1]
    except (ValueError, UnicodeDecodeError):
        pass
    raise InvalidRequest("cursor is not valid", code="invalid_cursor")
