"""The shared store: PostgreSQL through psycopg 3 (async), for several replicas of the
daemon on one database (docs/DESIGN.md "The PostgreSQL store").

Connections, each used by one thing at a time (an ``asyncio.Lock`` each, so no statement
of another task ever lands inside a transaction):

* the **writer**: group-committed transcript appends and every other write;
* the **readers** (``READERS``): transcript pages and thread rows;
* the **control** connection: leases, replicas and the session-level advisory lock that
  keeps a second live process off this ``replica_id`` (released by the server when the
  process, and so the connection, dies).

Appends are group-committed as in the SQLite store: every append waiting when the writer
task comes round goes into one transaction, and each caller is told only after COMMIT. A
batch is three statements whatever its size: one ``UPDATE threads … FROM unnest(…)`` that
both brings each thread's ``last_seq``/``updated_at``/``turn_active`` forward and fences
the appends that carry an epoch (``lease_owner``, ``lease_epoch`` and an expiry still in
the future on the database's clock; the row lock it takes is held to COMMIT, so a takeover
waits for this batch or this batch sees the new epoch and is refused — never both), one
``INSERT … SELECT FROM unnest(…)`` of every event, and the thread columns an append
changes. An append that is refused (a fence, a duplicate ``client_id`` or seq) is refused
alone: the batch is then redone with one savepoint per append. Unlike SQLite the derived
thread columns are written in the same transaction, not later: other replicas read them.

A lost connection is retried with backoff until the batch commits (``healthy`` is False
meanwhile, callers wait, nothing acknowledged is lost). A COMMIT whose answer was lost may
have committed: on retry, an append whose first event is already stored exactly as sent is
taken as committed, not refused.

The change log (``GET /v1/events``; store/base.py ChangeStore, docs/DESIGN.md) is the
SQLite store's: a transaction that changes a thread row's client-visible columns takes
the next value(s) of the one-row ``change_log`` counter (``UPDATE … RETURNING``, not a
sequence) as the row's ``change_seq``, once per thread per transaction. The counter row
stays locked to COMMIT, so values follow commit order across every replica; each write
takes it as its last statement, to keep that lock short. An append batch takes one value
per thread it changes, all in one statement (``_BUMP``). A deleted thread leaves a
tombstone; pruning old ones raises ``change_log.horizon``. ``read_changes`` reads in one
REPEATABLE READ snapshot. ``on_change`` hears of this process's commits only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import psycopg
import structlog
from psycopg import AsyncConnection

from bridge.clock import now_iso
from bridge.errors import InvalidRequest, LeaseLost, StoreError
from bridge.protocols.envelope import (
    CorruptEvent,
    Frames,
    checked_envelopes,
    checked_lines,
    stored_envelopes,
)
from bridge.protocols.events import Record
from bridge.store import pg_schema
from bridge.store.base import (
    CHANGE_COLUMNS,
    PAGE_BYTES,
    TOMBSTONE_KEEP,
    TOMBSTONE_MAX_AGE_S,
    Change,
    ChangesPruned,
    Lease,
    Replica,
    SecretRow,
    ThreadFields,
    ThreadRow,
    UserRow,
)
from bridge.store.event_rows import corrupt_rows, event_rows
from bridge.store.sqlite import decode_cursor, encode_cursor
from bridge.store.sqlite_leases import LEASE_LOST, stamp
from bridge.store.sqlite_sql import _JSON_COLUMNS, _THREAD_COLUMNS, _iso_before
from bridge.store.urls import StoreUrl

T = TypeVar("T")
log = structlog.get_logger("bridge.store")

MAX_BATCH = 512  # appends per transaction
MAX_BACKOFF_S = 2.0
READERS = 2
CONNECT_TIMEOUT_S = 10
# The server ends a session left idle inside a transaction this long (ms): a replica frozen
# (SIGSTOP, a paused VM) in the middle of a batch would otherwise hold the thread rows'
# locks, and so block the takeover of its expired leases, until it ran again. A batch's
# statements follow each other at once, so only a stalled process hits it; its batch is
# then retried on a new connection, where the fence decides.
IDLE_IN_TRANSACTION_MS = 2000
_COLS = ",".join(_THREAD_COLUMNS)

# The connection is gone or the server refuses work for now: retried, never "refused".
_TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError)
# This append alone is bad: refused, the rest of its batch commits.
_REFUSED = (psycopg.IntegrityError, psycopg.DataError, UnicodeEncodeError, ValueError)

_FENCE_TOUCH = """
UPDATE threads t SET
    last_seq = greatest(t.last_seq, coalesce(v.last_seq, t.last_seq)),
    updated_at = greatest(t.updated_at, coalesce(v.updated_at, t.updated_at)),
    turn_active = coalesce(v.turn_active, t.turn_active)
FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::boolean[], %s::text[], %s::bigint[])
    AS v(id, last_seq, updated_at, turn_active, owner, epoch)
WHERE t.id = v.id AND (v.epoch IS NULL OR (t.lease_owner = v.owner AND t.lease_epoch = v.epoch
    AND t.lease_expires > clock_timestamp()))
RETURNING t.id
"""
# The next len(ids) counter values, given to the rows ``ids`` in that order (rows this
# transaction has already written, so locked: the counter row is always locked last).
_BUMP = """
WITH c AS (UPDATE change_log SET latest = latest + %(n)s RETURNING latest)
UPDATE threads t SET change_seq = c.latest - %(n)s + v.ord
FROM c, unnest(%(ids)s::text[]) WITH ORDINALITY AS v(id, ord)
WHERE t.id = v.id
"""
# A tombstone at the next counter value (a thread deleted twice keeps the newest).
_TOMBSTONE = """
WITH c AS (UPDATE change_log SET latest = latest + 1 RETURNING latest)
INSERT INTO thread_tombstones (thread_id, change_seq, deleted_at, owner) SELECT %s, c.latest, %s, %s FROM c
ON CONFLICT (thread_id) DO UPDATE SET change_seq = excluded.change_seq, deleted_at = excluded.deleted_at,
    owner = excluded.owner
"""
# Tombstones beyond the newest %(keep)s, and those deleted before %(before)s, are dropped;
# the horizon moves up to the newest one dropped (a cursor below it could miss a deletion).
_PRUNE = """
WITH upto AS (
    SELECT max(change_seq) AS m FROM thread_tombstones WHERE deleted_at < %(before)s OR change_seq <=
        (SELECT change_seq FROM thread_tombstones ORDER BY change_seq DESC LIMIT 1 OFFSET %(keep)s)
), gone AS (
    DELETE FROM thread_tombstones WHERE change_seq <= (SELECT m FROM upto)
)
UPDATE change_log SET horizon = greatest(horizon, upto.m) FROM upto WHERE upto.m IS NOT NULL
"""
# An event's data and raw: from its stored envelope (pg_schema migration 4), or from its
# columns for a row written before.
_DATA_SQL = (
    "CASE WHEN env IS NULL THEN data ELSE convert_from(substring(env FROM data_at + 1 "
    "FOR coalesce(raw_at - 7, length(env) - 12) - data_at), 'UTF8') END"
)
_RAW_SQL = (
    "CASE WHEN env IS NULL THEN raw ELSE convert_from(substring(env FROM raw_at + 1 "
    "FOR length(env) - raw_at - 1), 'UTF8') END"
)
_READ_EVENTS = (
    f"SELECT seq, ts, source, kind, {_DATA_SQL}, {_RAW_SQL}, relay FROM events "  # noqa: S608
    "WHERE thread_id = %s AND seq > %s ORDER BY seq LIMIT %s"
)
_READ_EVENTS_NO_RAW = _READ_EVENTS.replace(_RAW_SQL, "NULL", 1)
_RENEW = """
UPDATE threads t SET lease_expires = clock_timestamp() + make_interval(secs => %s)
FROM (SELECT id FROM threads WHERE lease_owner = %s AND lease_expires > clock_timestamp()
      ORDER BY id FOR UPDATE) AS mine
WHERE t.id = mine.id
RETURNING t.id, t.lease_epoch
"""
RENEW_ATTEMPTS = 3
_INSERT = """
INSERT INTO events (thread_id, seq, ts, source, kind, env, data_at, raw_at, relay, client_id, data)
SELECT *, '' FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[], %s::bytea[],
    %s::integer[], %s::integer[], %s::boolean[], %s::text[])
"""


@dataclass(slots=True)
class _Append:
    thread_id: str
    rows: list[tuple[Any, ...]]
    fields: dict[str, Any]  # thread columns written in the same transaction
    touch: tuple[str | None, int | None, bool | None]  # updated_at, last_seq, turn_active
    fence: tuple[str, int] | None  # (replica_id, epoch)
    done: asyncio.Future[None]


@dataclass(slots=True)
class _Conn:
    """One connection and the lock that gives it to one task at a time."""

    conn: AsyncConnection[Any] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class PostgresStore:
    def __init__(self, url: StoreUrl, *, replica_id: str = "local") -> None:
        self.url = url
        self.replica_id = replica_id
        self._writer_conn = _Conn()
        self._readers = [_Conn() for _ in range(READERS)]
        self._next_reader = 0
        self._control = _Conn()
        # Renewing leases has a connection of its own: a renew that waits behind other
        # lease traffic (acquires, releases) could miss its deadline and fence the replica.
        self._renewer = _Conn()
        self._replica_locked = False
        self._instance: str | None = None
        self._replica_url: str | None = None
        self._pending: list[_Append] = []
        self._wake: asyncio.Event | None = None
        self._writer: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self.healthy = True
        self.last_error: str | None = None
        self.on_health: Callable[[bool, str | None], None] | None = None
        self.on_change: Callable[[], None] | None = None
        self.batches = 0
        self.appended = 0

    # ------------------------------------------------------------------ plumbing

    def _error(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(f"{what}: {self.url.scrub(str(exc)).strip()}", code="store_unavailable")

    async def _connect(self) -> AsyncConnection[Any]:
        try:
            conn = await AsyncConnection.connect(self.url.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise self._error(f"cannot connect to {self.url.shown}", exc) from exc
        try:
            await conn.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}")
        except BaseException as exc:
            await conn.close()
            if not isinstance(exc, psycopg.Error):
                raise
            raise self._error(f"cannot set up a session on {self.url.shown}", exc) from exc
        return conn

    @contextlib.asynccontextmanager
    async def _use(self, slot: _Conn) -> AsyncIterator[AsyncConnection[Any]]:
        """The slot's connection (made again if it was lost), for this task alone; a lost
        connection, or one a cancelled task left mid-statement, is dropped so the next use
        reconnects."""
        async with slot.lock:
            if slot.conn is None or slot.conn.closed:
                slot.conn = await self._connect()
            try:
                yield slot.conn
            except (*_TRANSIENT, asyncio.CancelledError):
                # Gone, or left mid-statement by a cancelled caller: never reused.
                await _discard(slot)
                raise

    async def _do(self, slot: _Conn, fn: Callable[[AsyncConnection[Any]], Any]) -> Any:
        try:
            async with self._use(slot) as conn:
                return await fn(conn)
        except _TRANSIENT as exc:
            raise self._error("store unavailable", exc) from exc
        except psycopg.Error as exc:
            raise StoreError(f"store error: {self.url.scrub(str(exc))}") from exc

    async def _write(self, fn: Callable[[AsyncConnection[Any]], Any]) -> Any:
        return await self._do(self._writer_conn, fn)

    async def _read(self, fn: Callable[[AsyncConnection[Any]], Any]) -> Any:
        slot = self._readers[self._next_reader % READERS]
        self._next_reader += 1
        return await self._do(slot, fn)

    async def open(self) -> None:
        conn = await self._connect()
        try:
            applied = await pg_schema.migrate(conn)  # under the migration lock
            if applied:
                log.info("store.migrated", url=self.url.shown, versions=applied)
        except _TRANSIENT as exc:
            await conn.close()
            raise self._error(f"cannot open store {self.url.shown}", exc) from exc
        except BaseException:
            await conn.close()
            raise
        self._writer_conn.conn = conn
        self._wake = asyncio.Event()
        self._writer = asyncio.create_task(self._write_loop(), name="store-writer")

    async def close(self, *, drain_timeout: float = 10.0) -> None:
        self._closing = True
        if self._writer is not None:
            if self._pending:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), drain_timeout)
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        for item in self._pending:  # never acknowledged, so never shown to anyone
            if not item.done.done():
                item.done.set_exception(StoreError("store closed before this was written"))
        self._pending.clear()
        for slot in (self._writer_conn, *self._readers, self._control, self._renewer):
            await _discard(slot)
        self._replica_locked = False

    async def ping(self) -> None:
        await self._read(lambda c: c.execute("SELECT 1"))
        if not self.healthy:
            raise StoreError(f"store cannot be written: {self.last_error}", code="store_unavailable")

    def _set_health(self, healthy: bool, error: str | None) -> None:
        if healthy == self.healthy:
            self.last_error = error or self.last_error
            return
        self.healthy, self.last_error = healthy, error
        if self.on_health is not None:
            self.on_health(healthy, error)

    # ------------------------------------------------------------------ threads

    @staticmethod
    def _row(row: Sequence[Any]) -> ThreadRow:
        out = dict(zip(_THREAD_COLUMNS, row, strict=True))
        for col in _JSON_COLUMNS:
            out[col] = json.loads(out[col]) if out[col] is not None else None
        out["turn_active"] = bool(out["turn_active"])
        return cast(ThreadRow, out)

    def _dump(self, fields: ThreadFields) -> dict[str, Any]:
        out = dict(fields)
        for col in _JSON_COLUMNS:
            if col in out and out[col] is not None:
                out[col] = json.dumps(out[col])
        if "turn_active" in out:
            out["turn_active"] = bool(out["turn_active"])
        unknown = set(out) - set(_THREAD_COLUMNS)
        if unknown:
            raise ValueError(f"unknown thread columns {unknown}")
        nul = [k for k, v in out.items() if isinstance(v, str) and "\x00" in v]
        if nul:  # PostgreSQL text cannot hold one (JSON columns are escaped, so never there)
            raise InvalidRequest(f"{', '.join(nul)} cannot contain a NUL character", code="invalid_request")
        return stamp(out, self.replica_id)

    async def create_thread(self, thread: ThreadRow) -> None:
        row = self._dump({k: thread.get(k) for k in _THREAD_COLUMNS if k in thread})
        # One statement (its own transaction): the counter is taken as it commits.
        sql = (
            "WITH c AS (UPDATE change_log SET latest = latest + 1 RETURNING latest) "  # noqa: S608
            f"INSERT INTO threads ({','.join(row)}, change_seq, created_seq) "
            f"VALUES ({','.join('%s' for _ in row)}, (SELECT latest FROM c), (SELECT latest FROM c))"
        )
        await self._write(lambda c: c.execute(sql, tuple(row.values())))
        self._changed()

    async def get_thread(self, thread_id: str) -> ThreadRow | None:
        async def do(c: AsyncConnection[Any]) -> ThreadRow | None:
            cur = await c.execute(f"SELECT {_COLS} FROM threads WHERE id = %s", (thread_id,))  # noqa: S608
            row = await cur.fetchone()
            return self._row(row) if row else None

        return cast(ThreadRow | None, await self._read(do))

    async def list_threads(
        self, *, limit: int, cursor: str | None, agent: str | None, owner: str | None = None
    ) -> tuple[list[ThreadRow], str | None]:
        where: list[str] = []
        params: list[Any] = []
        if owner is not None:
            where.append("owner = %s")
            params.append(owner)
        if cursor:
            updated_at, tid = decode_cursor(cursor)
            where.append("(updated_at < %s OR (updated_at = %s AND id < %s))")
            params += [updated_at, updated_at, tid]
        if agent:
            where.append("agent = %s")
            params.append(agent)
        sql = (
            f"SELECT {_COLS} FROM threads {'WHERE ' + ' AND '.join(where) if where else ''} "  # noqa: S608
            "ORDER BY updated_at DESC, id DESC LIMIT %s"
        )

        async def do(c: AsyncConnection[Any]) -> list[ThreadRow]:
            cur = await c.execute(sql, (*params, limit + 1))
            return [self._row(r) for r in await cur.fetchall()]

        rows = cast(list[ThreadRow], await self._read(do))
        next_cursor = None
        if len(rows) > limit:
            rows = rows[:limit]
            next_cursor = encode_cursor(rows[-1]["updated_at"], rows[-1]["id"])
        return rows, next_cursor

    async def update_thread(self, thread_id: str, fields: ThreadFields) -> None:
        row = self._dump(fields)
        if not row:
            return
        sql = f"UPDATE threads SET {','.join(f'{k} = %s' for k in row)} WHERE id = %s"  # noqa: S608
        visible = not CHANGE_COLUMNS.isdisjoint(row)

        async def do(c: AsyncConnection[Any]) -> bool:
            if not visible:
                await c.execute(sql, (*row.values(), thread_id))
                return False
            async with c.transaction():
                cur = await c.execute(sql, (*row.values(), thread_id))
                if cur.rowcount == 0:
                    return False  # no such thread: no change
                await c.execute(_BUMP, {"n": 1, "ids": [thread_id]})
                return True

        if await self._write(do):
            self._changed()

    async def delete_thread(self, thread_id: str) -> bool:
        deleted_at = now_iso()

        async def do(c: AsyncConnection[Any]) -> bool:
            async with c.transaction():
                await c.execute("DELETE FROM events WHERE thread_id = %s", (thread_id,))
                cur = await c.execute("DELETE FROM threads WHERE id = %s RETURNING owner", (thread_id,))
                gone = await cur.fetchone()
                if gone is None:
                    return False
                await c.execute(_TOMBSTONE, (thread_id, deleted_at, gone[0]))
                await c.execute(_PRUNE, {"before": _iso_before(TOMBSTONE_MAX_AGE_S), "keep": TOMBSTONE_KEEP})
                return True

        found = bool(await self._write(do))
        if found:
            self._changed()
        return found

    async def live_threads(self) -> list[ThreadRow]:
        """Rows with a process or a turn in flight that THIS replica recorded (the start-up
        reaper must never touch another replica's processes)."""

        async def do(c: AsyncConnection[Any]) -> list[ThreadRow]:
            cur = await c.execute(
                f"SELECT {_COLS} FROM threads WHERE replica_id = %s "  # noqa: S608
                "AND (state IN ('starting', 'running', 'stopping') OR turn_active)",
                (self.replica_id,),
            )
            return [self._row(r) for r in await cur.fetchall()]

        return cast(list[ThreadRow], await self._write(do))

    # ------------------------------------------------------------------ change log

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    async def read_changes(self, after: int, limit: int) -> list[Change]:
        async def do(c: AsyncConnection[Any]) -> list[Change]:
            await c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")  # one snapshot
            try:
                cur = await c.execute("SELECT horizon FROM change_log")
                row = await cur.fetchone()
                horizon = int(row[0]) if row else 0
                if after < horizon:
                    raise ChangesPruned(after, horizon)
                cur = await c.execute(
                    f"SELECT change_seq, created_seq, {_COLS} FROM threads "  # noqa: S608
                    "WHERE change_seq > %s ORDER BY change_seq LIMIT %s",
                    (after, limit),
                )
                rows = await cur.fetchall()
                cur = await c.execute(
                    "SELECT change_seq, thread_id, deleted_at, owner FROM thread_tombstones "
                    "WHERE change_seq > %s ORDER BY change_seq LIMIT %s",
                    (after, limit),
                )
                gone = await cur.fetchall()
            finally:
                await c.execute("COMMIT")  # (a ROLLBACK if a statement failed)
            out = [
                Change(int(r[0]), "thread.created" if r[1] > after else "thread.updated", r[2], self._row(r[2:]))
                for r in rows
            ]
            out += [Change(int(seq), "thread.deleted", tid, None, at, owner) for seq, tid, at, owner in gone]
            out.sort(key=lambda ch: ch.cursor)
            return out[:limit]

        return cast(list[Change], await self._read(do))

    async def _counter(self, column: str) -> int:
        async def do(c: AsyncConnection[Any]) -> int:
            cur = await c.execute(f"SELECT {column} FROM change_log")  # noqa: S608
            row = await cur.fetchone()
            return int(row[0]) if row else 0

        return cast(int, await self._read(do))

    async def latest_change(self) -> int:
        return await self._counter("latest")

    async def change_horizon(self) -> int:
        return await self._counter("horizon")

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
        rows = event_rows(thread_id, records, client_ids)
        fields = self._dump(thread_fields)
        updated_at = fields.pop("updated_at", None)
        turn_active = fields.pop("turn_active", None)
        last_seq = records[-1].seq if records else None
        if self._writer is None or self._wake is None or self._closing:
            raise StoreError("store is not open")
        item = _Append(
            thread_id,
            rows,
            fields,
            (updated_at, last_seq, turn_active),
            None if epoch is None else (self.replica_id, epoch),
            asyncio.get_running_loop().create_future(),
        )
        self._pending.append(item)
        self._idle.clear()
        self._wake.set()
        await item.done

    async def _write_loop(self) -> None:
        assert self._wake is not None
        backoff = 0.05
        retried = False
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = self._pending[:MAX_BATCH]
                try:
                    async with self._use(self._writer_conn) as conn:
                        failed, changed = await _commit(conn, batch, retried=retried)
                except (*_TRANSIENT, StoreError) as exc:
                    # Gone or refusing: nothing in the batch is acknowledged; try again.
                    message = exc.message if isinstance(exc, StoreError) else self.url.scrub(str(exc)).strip()
                    self._set_health(False, message)
                    log.error("store.write_failed", error=message, pending=len(self._pending), retry_in_s=backoff)
                    retried = True
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
                backoff, retried = 0.05, False
                if not self.healthy:
                    log.info("store.recovered")
                self._set_health(True, None)
                del self._pending[: len(batch)]
                self._settled(batch, failed)
                if changed:
                    self._changed()
            self._idle.set()

    def _settled(self, batch: list[_Append], failed: dict[int, str]) -> None:
        self.batches += 1
        for i, item in enumerate(batch):
            if item.done.done():
                continue
            if i in failed:
                reason = failed[i]
                item.done.set_exception(
                    LeaseLost(reason) if reason.startswith(LEASE_LOST) else StoreError(f"append refused: {reason}")
                )
                continue
            self.appended += len(item.rows)
            item.done.set_result(None)

    async def read_events(self, thread_id: str, after: int, limit: int, *, with_raw: bool = True) -> list[Record]:
        sql = _READ_EVENTS if with_raw else _READ_EVENTS_NO_RAW

        async def do(c: AsyncConnection[Any]) -> list[Record]:
            async with c.cursor() as cur:
                await cur.execute(sql, (thread_id, after, limit))
                rows = await _bounded(cur, lambda r: len(r[4]) + len(r[5] or ""))
            return [
                Record(seq, ts, source, kind, None, raw, relay, data)
                for seq, ts, source, kind, data, raw, relay in rows
            ]

        return cast(list[Record], await self._read(do))

    async def read_frames(self, thread_id: str, after: int, limit: int, *, raw: bool) -> Frames:
        async def do(c: AsyncConnection[Any]) -> Frames:
            async with c.cursor() as cur:
                with corrupt_rows(thread_id):
                    return await (_raw_page if raw else _envelope_page)(cur, thread_id, after, limit)

        return cast(Frames, await self._read(do))

    async def find_client_event(self, thread_id: str, client_id: str) -> int | None:
        async def do(c: AsyncConnection[Any]) -> int | None:
            cur = await c.execute(
                "SELECT seq FROM events WHERE thread_id = %s AND client_id = %s", (thread_id, client_id)
            )
            row = await cur.fetchone()
            return int(row[0]) if row else None

        return cast(int | None, await self._read(do))

    # ------------------------------------------------------------------ browser sessions

    async def load_sessions(self, now: float) -> list[tuple[str, float, str | None]]:
        async def do(c: AsyncConnection[Any]) -> list[tuple[str, float, str | None]]:
            await c.execute("DELETE FROM browser_sessions WHERE expires_at <= %s", (now,))
            cur = await c.execute("SELECT key, expires_at, user_name FROM browser_sessions ORDER BY expires_at")
            return [(k, float(e), u) for k, e, u in await cur.fetchall()]

        return cast(list[tuple[str, float, str | None]], await self._write(do))

    async def save_session(
        self, key: str, expires_at: float, evicted: Sequence[str] = (), *, user: str | None = None
    ) -> None:
        async def do(c: AsyncConnection[Any]) -> None:
            async with c.transaction():
                if evicted:
                    await c.execute("DELETE FROM browser_sessions WHERE key = ANY(%s)", (list(evicted),))
                await c.execute(
                    "INSERT INTO browser_sessions (key, expires_at, user_name) VALUES (%s, %s, %s) "
                    "ON CONFLICT (key) DO UPDATE SET expires_at = excluded.expires_at, user_name = excluded.user_name",
                    (key, expires_at, user),
                )

        await self._write(do)

    async def delete_session(self, key: str) -> None:
        await self._write(lambda c: c.execute("DELETE FROM browser_sessions WHERE key = %s", (key,)))

    # ------------------------------------------------------------------ users

    async def add_user(self, name: str, token_hash: str, *, admin: bool) -> bool:
        async def do(c: AsyncConnection[Any]) -> bool:
            cur = await c.execute(
                "INSERT INTO users (name, token_hash, admin, created_at) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (name) DO UPDATE SET token_hash = excluded.token_hash, admin = excluded.admin, "
                "revoked_at = NULL WHERE users.revoked_at IS NOT NULL",
                (name, token_hash, admin, now_iso()),
            )
            return cur.rowcount > 0

        return bool(await self._write(do))

    async def user_by_token(self, token_hash: str) -> tuple[UserRow, str] | None:
        async def do(c: AsyncConnection[Any]) -> tuple[UserRow, str] | None:
            cur = await c.execute(
                f"SELECT {_USER_COLS}, token_hash FROM users WHERE token_hash = %s AND revoked_at IS NULL",  # noqa: S608
                (token_hash,),
            )
            row = await cur.fetchone()
            return None if row is None else (_user(row), row[4])

        return cast(tuple[UserRow, str] | None, await self._read(do))

    async def get_user(self, name: str) -> UserRow | None:
        async def do(c: AsyncConnection[Any]) -> UserRow | None:
            cur = await c.execute(f"SELECT {_USER_COLS} FROM users WHERE name = %s", (name,))  # noqa: S608
            row = await cur.fetchone()
            return None if row is None else _user(row)

        return cast(UserRow | None, await self._read(do))

    async def list_users(self) -> list[UserRow]:
        async def do(c: AsyncConnection[Any]) -> list[UserRow]:
            cur = await c.execute(f"SELECT {_USER_COLS} FROM users ORDER BY name")  # noqa: S608
            return [_user(r) for r in await cur.fetchall()]

        return cast(list[UserRow], await self._read(do))

    async def revoke_user(self, name: str) -> bool:
        async def do(c: AsyncConnection[Any]) -> bool:
            async with c.transaction():
                cur = await c.execute(
                    "UPDATE users SET token_hash = NULL, revoked_at = %s WHERE name = %s AND revoked_at IS NULL",
                    (now_iso(), name),
                )
                await c.execute("DELETE FROM browser_sessions WHERE user_name = %s", (name,))
                if cur.rowcount > 0:
                    await c.execute("DELETE FROM user_secrets WHERE user_name = %s", (name,))
                return cur.rowcount > 0

        return bool(await self._write(do))

    # ------------------------------------------------------------------ per-user secrets

    async def put_secret(
        self, user: str, profile: str, key: str, nonce: bytes, ciphertext: bytes, *, max_per_user: int
    ) -> bool:
        async def do(c: AsyncConnection[Any]) -> bool:
            async with c.transaction():
                # One user's puts in turn (the count below is then exact); other users' do not wait.
                await c.execute(
                    "SELECT pg_advisory_xact_lock(%s::int, hashtext(%s))", (pg_schema.SECRETS_LOCK_CLASS, user)
                )
                cur = await c.execute(
                    "SELECT count(*), count(*) FILTER (WHERE profile = %s AND key = %s) "
                    "FROM user_secrets WHERE user_name = %s",
                    (profile, key, user),
                )
                row = await cur.fetchone()
                held, there = (int(row[0]), int(row[1])) if row else (0, 0)
                if not there and held >= max_per_user:
                    return False
                await c.execute(
                    "INSERT INTO user_secrets (user_name, profile, key, nonce, ciphertext, updated_at) "
                    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (user_name, profile, key) DO UPDATE SET "
                    "nonce = excluded.nonce, ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
                    (user, profile, key, bytes(nonce), bytes(ciphertext), now_iso()),
                )
                return True

        return bool(await self._write(do))

    async def list_secrets(self, user: str, profile: str | None = None) -> list[SecretRow]:
        async def do(c: AsyncConnection[Any]) -> list[SecretRow]:
            cur = await c.execute(
                "SELECT user_name, profile, key, nonce, ciphertext, updated_at FROM user_secrets "
                "WHERE user_name = %s AND (%s::text IS NULL OR profile = %s) ORDER BY profile, key",
                (user, profile, profile),
            )
            return [SecretRow(r[0], r[1], r[2], bytes(r[3]), bytes(r[4]), r[5]) for r in await cur.fetchall()]

        return cast(list[SecretRow], await self._read(do))

    async def delete_secret(self, user: str, profile: str, key: str) -> bool:
        async def do(c: AsyncConnection[Any]) -> bool:
            cur = await c.execute(
                "DELETE FROM user_secrets WHERE user_name = %s AND profile = %s AND key = %s", (user, profile, key)
            )
            return cur.rowcount > 0

        return bool(await self._write(do))

    # ------------------------------------------------------------------ leases

    async def acquire_lease(self, thread_id: str, replica_id: str, ttl_s: float) -> int | None:
        async def do(c: AsyncConnection[Any]) -> int | None:
            cur = await c.execute(
                "UPDATE threads SET lease_epoch = CASE WHEN lease_owner = %(r)s "
                "AND lease_expires > clock_timestamp() THEN lease_epoch ELSE lease_epoch + 1 END, "
                "lease_owner = %(r)s, lease_expires = clock_timestamp() + make_interval(secs => %(ttl)s) "
                "WHERE id = %(t)s AND (lease_owner IS NULL OR lease_owner = %(r)s "
                "OR lease_expires <= clock_timestamp()) RETURNING lease_epoch",
                {"r": replica_id, "ttl": float(ttl_s), "t": thread_id},
            )
            row = await cur.fetchone()
            return None if row is None else int(row[0])

        return cast(int | None, await self._do(self._control, do))

    async def renew_leases(self, replica_id: str, ttl_s: float) -> dict[str, int]:
        async def do(c: AsyncConnection[Any]) -> dict[str, int]:
            # The rows are locked in id order, and a deadlock with a group commit (which
            # touches the same rows) is retried at once: a renew must not miss its turn.
            for attempt in range(RENEW_ATTEMPTS):
                try:
                    async with c.transaction():
                        cur = await c.execute(_RENEW, (float(ttl_s), replica_id))
                        return {str(tid): int(epoch) for tid, epoch in await cur.fetchall()}
                except psycopg.errors.DeadlockDetected:
                    if attempt == RENEW_ATTEMPTS - 1:
                        raise
            raise AssertionError("unreachable")

        return cast(dict[str, int], await self._do(self._renewer, do))

    async def release_lease(self, thread_id: str, replica_id: str, epoch: int) -> bool:
        async def do(c: AsyncConnection[Any]) -> bool:
            cur = await c.execute(
                "UPDATE threads SET lease_owner = NULL, lease_expires = NULL "
                "WHERE id = %s AND lease_owner = %s AND lease_epoch = %s",
                (thread_id, replica_id, epoch),
            )
            return cur.rowcount > 0

        return bool(await self._do(self._control, do))

    async def lease_of(self, thread_id: str) -> Lease | None:
        async def do(c: AsyncConnection[Any]) -> Lease | None:
            cur = await c.execute(
                "SELECT lease_owner, lease_epoch, extract(epoch FROM lease_expires - clock_timestamp()) "
                "FROM threads WHERE id = %s",
                (thread_id,),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            owner, epoch, left = row
            live = owner is not None and left is not None and left > 0
            return Lease(owner, int(epoch), None if owner is None else float(left), live)

        return cast(Lease | None, await self._read(do))  # a read: any reader connection

    # ------------------------------------------------------------------ replicas

    async def register_replica(self, instance: str, url: str | None) -> None:
        """Take the replica's advisory lock on the control connection (held while this
        process lives) or refuse, then record the replica."""

        async def do(c: AsyncConnection[Any]) -> None:
            if not self._replica_locked:
                if not await pg_schema.try_replica_lock(c, self.replica_id):
                    raise pg_schema.replica_in_use(self.replica_id)
                self._replica_locked = True
            await c.execute(
                "INSERT INTO replicas (replica_id, instance, url, started_at, heartbeat_at) "
                "VALUES (%s, %s, %s, to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), "
                "clock_timestamp()) ON CONFLICT (replica_id) DO UPDATE SET instance = excluded.instance, "
                "url = excluded.url, started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at",
                (self.replica_id, instance, url),
            )

        self._instance, self._replica_url = instance, url
        await self._do(self._control, do)

    async def heartbeat(self) -> None:
        """Beat; if the control connection was lost (and its lock with it), take the lock
        again first, or refuse (``replica_id_in_use``: another process took this id)."""
        if self._control.conn is None or self._control.conn.closed:
            self._replica_locked = False
            if self._instance is not None:
                await self.register_replica(self._instance, self._replica_url)
                return
        await self._do(
            self._control,
            lambda c: c.execute(
                "UPDATE replicas SET heartbeat_at = clock_timestamp() WHERE replica_id = %s", (self.replica_id,)
            ),
        )

    async def list_replicas(self) -> list[Replica]:
        async def do(c: AsyncConnection[Any]) -> list[Replica]:
            cur = await c.execute(
                "SELECT r.replica_id, r.instance, r.url, r.started_at, "
                "extract(epoch FROM clock_timestamp() - r.heartbeat_at), "
                "(SELECT count(*) FROM threads t WHERE t.lease_owner = r.replica_id "
                "AND t.lease_expires > clock_timestamp()) FROM replicas r ORDER BY r.replica_id"
            )
            return [Replica(r[0], r[1], r[2], r[3], float(r[4]), int(r[5])) for r in await cur.fetchall()]

        return cast(list[Replica], await self._read(do))


_USER_COLS = "name, admin, created_at, revoked_at"


def _user(row: Sequence[Any]) -> UserRow:
    return UserRow(str(row[0]), bool(row[1]), str(row[2]), row[3])


async def _discard(slot: _Conn) -> None:
    conn, slot.conn = slot.conn, None
    if conn is not None:
        with contextlib.suppress(Exception):
            await conn.close()


async def _raw_page(cur: Any, thread_id: str, after: int, limit: int) -> Frames:
    """Raw mode relays the agent's own lines, one per stdout line (``relay``)."""
    await cur.execute(
        "SELECT seq, CASE WHEN source = 'agent' AND relay THEN coalesce(substring(env FROM raw_at + 1 "
        "FOR length(env) - raw_at - 1), convert_to(raw, 'UTF8')) END "
        "FROM events WHERE thread_id = %s AND seq > %s ORDER BY seq LIMIT %s",
        (thread_id, after, limit),
    )
    rows: list[tuple[int, bytes | None]] = await _bounded(cur, lambda r: len(r[1] or b""))
    return Frames(checked_lines(rows), len(rows), rows[-1][0] if rows else after)


async def _envelope_page(cur: Any, thread_id: str, after: int, limit: int) -> Frames:
    """Each row's stored envelope, one column (issue #22); rows from before it (env NULL)
    are built from their columns, as before."""
    await cur.execute(
        "SELECT seq, env, CASE WHEN env IS NULL THEN length(data) + coalesce(length(raw), 0) ELSE 0 END "
        "FROM events WHERE thread_id = %s AND seq > %s ORDER BY seq LIMIT %s",
        (thread_id, after, limit),
    )
    rows: list[tuple[int, bytes | None, int]] = await _bounded(cur, lambda r: r[2] + len(r[1] or b""))
    if any(r[1] is None for r in rows):
        envs = await _with_legacy(cur, thread_id, rows)
    else:
        envs = [(seq, env) for seq, env, _ in rows if env is not None]
    return Frames(checked_envelopes(envs), len(envs), envs[-1][0] if envs else after)


async def _with_legacy(cur: Any, thread_id: str, rows: list[tuple[int, bytes | None, int]]) -> list[tuple[int, bytes]]:
    """A page holding rows from before migration 4: theirs built from their columns. A row
    gone meanwhile (its thread was deleted between the reads) fails as corrupt."""
    seqs = [seq for seq, env, _ in rows if env is None]
    await cur.execute(
        "SELECT seq, convert_to(ts, 'UTF8'), convert_to(source, 'UTF8'), convert_to(kind, 'UTF8'), "
        "convert_to(data, 'UTF8'), convert_to(raw, 'UTF8') FROM events "
        "WHERE thread_id = %s AND seq >= %s AND seq <= %s AND env IS NULL ORDER BY seq",
        (thread_id, seqs[0], seqs[-1]),
    )
    old = await cur.fetchall()
    built = dict(zip((r[0] for r in old), stored_envelopes(old), strict=True))
    out: list[tuple[int, bytes]] = []
    for seq, env, _ in rows:
        text = env if env is not None else built.get(seq)
        if text is None:  # deleted meanwhile
            raise CorruptEvent(seq)
        out.append((seq, text))
    return out


async def _bounded(cur: Any, size: Callable[[Any], int], max_bytes: int = PAGE_BYTES) -> list[Any]:
    """The cursor's rows, stopping after the row that brings the page to ``max_bytes``."""
    rows: list[Any] = []
    total = 0
    while total < max_bytes and (chunk := await cur.fetchmany(64)):
        for row in chunk:
            rows.append(row)
            total += size(row)
            if total >= max_bytes:
                break
    return rows


async def _commit(conn: AsyncConnection[Any], batch: list[_Append], *, retried: bool) -> tuple[dict[int, str], bool]:
    """One transaction for the batch; refused appends are refused alone (see the module
    docstring). ``retried``: the last attempt's COMMIT may have landed. The appends
    refused, and whether some row got a new change_seq (or may have, in a COMMIT that
    landed)."""
    done = await _already_committed(conn, batch) if retried else set()
    todo = [(i, item) for i, item in enumerate(batch) if i not in done]
    if _fences_agree(item for _, item in todo):
        try:
            async with conn.transaction():
                failed, changed = await _write(conn, todo)
                await _bump(conn, changed)
                return failed, bool(changed or done)
        except _REFUSED:
            pass  # someone in the batch is bad: find out who, one savepoint each
    failed, any_changed = await _commit_each(conn, todo)
    return failed, any_changed or bool(done)


async def _commit_each(conn: AsyncConnection[Any], todo: list[tuple[int, _Append]]) -> tuple[dict[int, str], bool]:
    """The batch again, one savepoint per append; the counter once, for them all."""
    failed: dict[int, str] = {}
    changed_ids: dict[str, None] = {}  # in order, once each
    async with conn.transaction():
        for i, item in todo:
            try:
                async with conn.transaction():  # a savepoint
                    one_failed, one_changed = await _write(conn, [(i, item)])
            except _REFUSED as exc:
                failed[i] = str(exc).strip().splitlines()[0]
                continue
            failed.update(one_failed)
            changed_ids.update(dict.fromkeys(one_changed))
        await _bump(conn, list(changed_ids))
    return failed, bool(changed_ids)


async def _bump(conn: AsyncConnection[Any], ids: list[str]) -> None:
    """The batch's last statement: the next counter values, one per changed thread."""
    if ids:
        await conn.execute(_BUMP, {"n": len(ids), "ids": ids})


def _fences_agree(items: Any) -> bool:
    """Every append of one thread in the batch under the same fence (so one row of the
    fence-and-touch statement stands for all of them)."""
    seen: dict[str, tuple[str, int] | None] = {}
    for item in items:
        if seen.setdefault(item.thread_id, item.fence) != item.fence:
            return False
    return True


def _touches(todo: list[tuple[int, _Append]]) -> dict[str, list[Any]]:
    """One row of the fence-and-touch statement per thread: [last_seq, updated_at,
    turn_active, owner, epoch] (the newest of each; the last turn_active; the fence)."""
    touches: dict[str, list[Any]] = {}
    for _, item in todo:
        updated_at, last_seq, turn_active = item.touch
        t = touches.setdefault(item.thread_id, [None, None, None, None, None])
        t[0] = _later(t[0], last_seq)
        t[1] = _later(t[1], updated_at)
        if turn_active is not None:
            t[2] = turn_active
        if item.fence is not None:
            t[3], t[4] = item.fence
    return touches


def _later(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


def _lease_lost(item: _Append) -> str:
    owner, epoch = item.fence or ("", 0)
    return f"{LEASE_LOST}thread {item.thread_id} is no longer leased to {owner} with epoch {epoch}"


async def _write(conn: AsyncConnection[Any], todo: list[tuple[int, _Append]]) -> tuple[dict[int, str], list[str]]:
    """The statements of one batch (in a transaction) but the counter's: the appends
    refused by their fence, and the threads whose visible columns it changed, in order."""
    failed, passed = await _fence_and_touch(conn, todo)
    live = [item for i, item in todo if i not in failed]
    changed = _changed(live, passed)
    rows = [r for item in live for r in item.rows]
    if rows:
        await conn.execute(_INSERT, [list(col) for col in zip(*rows, strict=True)])
    for item in live:
        if item.fields:
            sets = ",".join(f"{k} = %s" for k in item.fields)
            await conn.execute(f"UPDATE threads SET {sets} WHERE id = %s", (*item.fields.values(), item.thread_id))  # noqa: S608
    return failed, list(changed)


def _changed(live: list[_Append], passed: set[str]) -> dict[str, None]:
    """The threads (in order, once each) the appends change as clients see them: the
    transcript columns of the fence-and-touch statement, or a visible field."""
    return {
        item.thread_id: None
        for item in live
        if item.thread_id in passed
        and (any(v is not None for v in item.touch) or not CHANGE_COLUMNS.isdisjoint(item.fields))
    }


async def _fence_and_touch(
    conn: AsyncConnection[Any], todo: list[tuple[int, _Append]]
) -> tuple[dict[int, str], set[str]]:
    """The first statement: the thread rows brought forward and locked, the fences applied;
    the appends whose fence failed, and the threads whose row it wrote."""
    # In id order, as a renew locks them (store/postgres.py _RENEW): fewer deadlocks.
    touches = dict(sorted(_touches(todo).items()))
    columns = [[t[k] for t in touches.values()] for k in range(5)]
    cur = await conn.execute(_FENCE_TOUCH, [list(touches), *columns])
    passed = {r[0] for r in await cur.fetchall()}
    failed = {i: _lease_lost(item) for i, item in todo if item.fence is not None and item.thread_id not in passed}
    return failed, passed


async def _already_committed(conn: AsyncConnection[Any], batch: list[_Append]) -> set[int]:
    """Appends of ``batch`` whose first event is stored exactly as sent (an earlier COMMIT
    landed though its answer was lost)."""
    firsts = [(i, item.rows[0]) for i, item in enumerate(batch) if item.rows]
    if not firsts:
        return set()
    tids, seqs, tss, envs = zip(*((r[0], r[1], r[2], r[5]) for _, r in firsts), strict=True)
    cur = await conn.execute(
        "SELECT e.thread_id, e.seq FROM events e JOIN unnest(%s::text[], %s::bigint[], %s::text[], %s::bytea[]) "
        "AS v(thread_id, seq, ts, env) ON e.thread_id = v.thread_id AND e.seq = v.seq "
        "AND e.ts = v.ts AND e.env = v.env",
        [list(tids), list(seqs), list(tss), list(envs)],
    )
    stored = {(t, s) for t, s in await cur.fetchall()}
    return {i for i, r in firsts if (r[0], r[1]) in stored}
