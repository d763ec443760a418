"""The shared store: PostgreSQL through psycopg 3 (async), for several replicas of the
daemon on one database (docs/DESIGN.md "The PostgreSQL store").

Connections, each used by one thing at a time (an ``asyncio.Lock`` each, so no statement
of another task ever lands inside a transaction):

* the **writer**: group-committed transcript appends and every other write;
* the **readers** (``READERS``): transcript pages and thread rows;
* the **control** connection: leases, replicas and the session-level advisory lock that
  keeps a second live process off this ``replica_id`` (released by the server when the
  process, and so the connection, dies); leases and replicas are in pg_leases.py.

Appends are group-committed as in the SQLite store: every append waiting when the writer
task comes round goes into one transaction, and each caller is told only after COMMIT. A
batch is three statements whatever its size (pg_commit.py): one ``UPDATE threads … FROM
unnest(…)`` that both brings each thread's ``last_seq``/``updated_at``/``turn_active``
forward and fences the appends that carry an epoch (``lease_owner``, ``lease_epoch`` and an
expiry still in the future on the database's clock; the row lock it takes is held to
COMMIT, so a takeover waits for this batch or this batch sees the new epoch and is refused
— never both), one ``INSERT … SELECT FROM unnest(…)`` of every event, and the thread
columns an append changes. An append that is refused (a fence, a duplicate ``client_id``
or seq) is refused alone. Unlike SQLite the derived thread columns are written in the same
transaction, not later: other replicas read them.

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
per thread it changes, all in one statement (``pg_commit.BUMP``). A deleted thread leaves
a tombstone; pruning old ones raises ``change_log.horizon``. ``read_changes`` reads in one
REPEATABLE READ snapshot. The change listeners hear of this process's commits only.

The rows, their encoding, the shared reads and the health rules are the SQLite store's
too (bridge/store/common.py, rows.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, cast

import psycopg
import structlog
from psycopg import AsyncConnection

from bridge.clock import now_iso
from bridge.errors import StoreError
from bridge.protocols.envelope import CorruptEvent, Frames, Page, checked_envelopes, checked_lines, stored_envelopes
from bridge.protocols.events import Record
from bridge.store import pg_schema, push_sql, rows, search_pg, search_text, usage, usage_pg
from bridge.store.base import (
    CHANGE_COLUMNS,
    TOMBSTONE_KEEP,
    TOMBSTONE_MAX_AGE_S,
    StoreListeners,
    ThreadFields,
    ThreadRow,
    transcript_size,
)
from bridge.store.common import CommonStore
from bridge.store.event_rows import corrupt_rows, event_rows
from bridge.store.pg_commit import BUMP, Append, commit
from bridge.store.pg_leases import PgLeases
from bridge.store.push_pg import PgPush
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
CREATION_WAIT_MS = 5000  # creation_lock: the longest wait for another replica's creation

# The connection is gone or the server refuses work for now: retried, never "refused".
_TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError)

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
_RAW_PAGE = (
    "SELECT seq, CASE WHEN source = 'agent' AND relay THEN coalesce(substring(env FROM raw_at + 1 "
    "FOR length(env) - raw_at - 1), convert_to(raw, 'UTF8')) END "
    "FROM events WHERE thread_id = %s AND seq > %s ORDER BY seq LIMIT %s"
)
# Each row's envelope when it is of the current version (rows.ENV_SQL).
_ENVELOPE_PAGE = f"SELECT seq, {rows.ENV_SQL} FROM events WHERE thread_id = %s AND seq > %s ORDER BY seq LIMIT %s"  # noqa: S608
_PAGE_EXTENT = tuple(map(rows.pg, rows.PAGE_EXTENT))
_RAW_PAGE_EXTENT = tuple(map(rows.pg, rows.RAW_PAGE_EXTENT))
# Rows a replay rebuilds from their parts (rows.NOT_CURRENT_SQL), as UTF-8 bytes.
_REBUILT = (
    "SELECT seq, convert_to(ts, 'UTF8'), convert_to(source, 'UTF8'), convert_to(kind, 'UTF8'), "  # noqa: S608
    f"convert_to({_DATA_SQL}, 'UTF8'), convert_to({_RAW_SQL}, 'UTF8') FROM events "
    f"WHERE thread_id = %s AND seq >= %s AND seq <= %s AND {rows.NOT_CURRENT_SQL} ORDER BY seq"
)


@dataclass(slots=True)
class _Conn:
    """One connection and the lock that gives it to one task at a time."""

    conn: AsyncConnection[Any] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class PostgresStore(PgLeases, PgPush, CommonStore):
    shared: ClassVar[bool] = True
    _BOOL_AS_INT: ClassVar[bool] = False

    def __init__(self, url: StoreUrl, *, replica_id: str = "local", listeners: StoreListeners | None = None) -> None:
        super().__init__(replica_id, listeners)
        self.url = url
        self._writer_conn = _Conn()
        self._readers = [_Conn() for _ in range(READERS)]
        self._next_reader = 0
        self._control = _Conn()
        # Renewing leases has a connection of its own: a renew that waits behind other
        # lease traffic (acquires, releases) could miss its deadline and fence the replica.
        self._renewer = _Conn()
        # Creating a thread holds an advisory lock on a connection of its own (creation_lock).
        self._creator = _Conn()
        self._replica_locked = False
        self._instance: str | None = None
        self._replica_url: str | None = None
        self._pending: list[Append] = []
        self._wake: asyncio.Event | None = None
        self._writer: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False

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

    @contextlib.asynccontextmanager
    async def creation_lock(self) -> AsyncIterator[None]:
        """Every replica counts and creates threads under one session-level advisory lock,
        so replicas together never pass [capacity] max_threads. It is held on a connection
        of its own for the few milliseconds of one creation; a replica that dies holding it
        loses it with its session, and one that waits more than CREATION_WAIT_MS (another
        replica frozen while holding it) gets 503 store_unavailable rather than a hang."""
        try:
            async with self._use(self._creator) as conn:
                await conn.execute(f"SET lock_timeout = {CREATION_WAIT_MS}")
                await conn.execute("SELECT pg_advisory_lock(%s, %s)", (pg_schema.LOCK_CLASS, pg_schema.CREATE_LOCK))
                try:
                    yield
                finally:
                    await conn.execute(
                        "SELECT pg_advisory_unlock(%s, %s)", (pg_schema.LOCK_CLASS, pg_schema.CREATE_LOCK)
                    )
        except psycopg.errors.LockNotAvailable as exc:  # an OperationalError: caught first
            raise StoreError(
                "another replica holds the thread creation lock: try again", code="store_unavailable"
            ) from exc
        except _TRANSIENT as exc:
            raise self._error("store unavailable", exc) from exc

    async def _write(self, fn: Callable[[AsyncConnection[Any]], Any]) -> Any:
        return await self._do(self._writer_conn, fn)

    async def _read(self, fn: Callable[[AsyncConnection[Any]], Any]) -> Any:
        slot = self._readers[self._next_reader % READERS]
        self._next_reader += 1
        return await self._do(slot, fn)

    async def _fetch(self, statement: str, params: Sequence[Any]) -> list[Any]:
        async def do(c: AsyncConnection[Any]) -> list[Any]:
            cur = await c.execute(rows.pg(statement), tuple(params))
            return await cur.fetchall()

        return cast(list[Any], await self._read(do))

    async def _snapshot(self, reads: list[tuple[str, tuple[Any, ...]]]) -> list[list[Any]]:
        async def do(c: AsyncConnection[Any]) -> list[list[Any]]:
            out: list[list[Any]] = []
            await c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                for statement, params in reads:
                    cur = await c.execute(rows.pg(statement), params)
                    out.append(await cur.fetchall())
            finally:
                await c.execute("COMMIT")  # (a ROLLBACK if a statement failed)
            return out

        return cast(list[list[Any]], await self._read(do))

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
        for slot in (self._writer_conn, *self._readers, self._control, self._renewer, self._creator):
            await _discard(slot)
        self._replica_locked = False

    # ------------------------------------------------------------------ threads

    async def create_thread(self, thread: ThreadRow) -> None:
        row = self._new_row(thread)
        # One statement (its own transaction): the counter is taken as it commits.
        sql = (
            "WITH c AS (UPDATE change_log SET latest = latest + 1 RETURNING latest) "  # noqa: S608
            f"INSERT INTO threads ({','.join(row)}, change_seq, created_seq) "
            f"VALUES ({','.join('%s' for _ in row)}, (SELECT latest FROM c), (SELECT latest FROM c))"
        )
        await self._write(lambda c: c.execute(sql, tuple(row.values())))
        self._changed()

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
                await c.execute(BUMP, {"n": 1, "ids": [thread_id]})
                return True

        if await self._write(do):
            self._changed()

    async def delete_thread(self, thread_id: str) -> bool:
        deleted_at = now_iso()

        async def do(c: AsyncConnection[Any]) -> bool:
            async with c.transaction():
                await c.execute("DELETE FROM events WHERE thread_id = %s", (thread_id,))
                await search_pg.forget(c, thread_id)
                await usage_pg.forget(c, thread_id)
                cur = await c.execute("DELETE FROM threads WHERE id = %s RETURNING owner", (thread_id,))
                gone = await cur.fetchone()
                if gone is None:
                    return False
                await c.execute(_TOMBSTONE, (thread_id, deleted_at, gone[0]))
                await c.execute(_PRUNE, {"before": rows.iso_before(TOMBSTONE_MAX_AGE_S), "keep": TOMBSTONE_KEEP})
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
                f"SELECT {rows.COLUMNS_SQL} FROM threads WHERE replica_id = %s "  # noqa: S608
                "AND (state IN ('starting', 'running', 'stopping') OR turn_active)",
                (self.replica_id,),
            )
            return [rows.thread_row(r) for r in await cur.fetchall()]

        return cast(list[ThreadRow], await self._write(do))

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
        event_list = event_rows(thread_id, records, client_ids)
        fields = self._dump(thread_fields)
        updated_at = fields.pop("updated_at", None)
        turn_active = fields.pop("turn_active", None)
        last_seq = records[-1].seq if records else None
        if self._writer is None or self._wake is None or self._closing:
            raise StoreError("store is not open")
        item = Append(
            thread_id,
            event_list,
            fields,
            (updated_at, last_seq, turn_active),
            None if epoch is None else (self.replica_id, epoch),
            asyncio.get_running_loop().create_future(),
            transcript_size(records),
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
                        failed, changed = await commit(conn, batch, retried=retried)
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

    def _settled(self, batch: list[Append], failed: dict[int, str]) -> None:
        self.batches += 1
        for i, item in enumerate(batch):
            if item.done.done():
                continue
            if i in failed:
                item.done.set_exception(rows.refusal(failed[i]))
                continue
            self.appended += len(item.rows)
            item.done.set_result(None)

    async def read_events(self, thread_id: str, after: int, limit: int, *, with_raw: bool = True) -> Page:
        sql = _READ_EVENTS if with_raw else _READ_EVENTS_NO_RAW

        async def do(c: AsyncConnection[Any]) -> Page:
            async with c.cursor() as cur:
                n, more = await _extent(cur, thread_id, after, limit)
                if not n:
                    return Page()
                await cur.execute(sql, (thread_id, after, n))
                found = await cur.fetchall()
            return Page(
                (Record(seq, ts, src, kind, None, raw, relay, data) for seq, ts, src, kind, data, raw, relay in found),
                more=more,
            )

        return cast(Page, await self._read(do))

    async def read_frames(self, thread_id: str, after: int, limit: int, *, raw: bool) -> Frames:
        async def do(c: AsyncConnection[Any]) -> Frames:
            async with c.cursor() as cur:
                n, more = await _extent(cur, thread_id, after, limit, raw)
                if not n:
                    return Frames([], 0, after, more=False)
                with corrupt_rows(thread_id):
                    found = await (_raw_page if raw else _envelope_page)(cur, thread_id, after, n)
            return Frames(found.texts, found.count, found.last, more=more)

        return cast(Frames, await self._read(do))

    async def search(
        self, q: str, *, owner: str | None, limit: int, cursor: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        groups, below = search_text.parse_query(q), search_text.decode_cursor(cursor)
        found = await self._read(lambda c: search_pg.search(c, groups, owner, limit, below))
        return cast(tuple[list[dict[str, Any]], str | None], found)

    async def usage_report(
        self, *, group_by: str, owner: str | None, since: str | None, until: str | None, limit: int
    ) -> dict[str, Any]:
        found = await self._read(lambda c: usage_pg.report(c, group_by, owner, since, until))
        return usage.report(found, group_by, limit)

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
                    await c.execute(rows.pg(push_sql.DROP_USER), (name,))
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

    async def delete_secret(self, user: str, profile: str, key: str) -> bool:
        async def do(c: AsyncConnection[Any]) -> bool:
            cur = await c.execute(
                "DELETE FROM user_secrets WHERE user_name = %s AND profile = %s AND key = %s", (user, profile, key)
            )
            return cur.rowcount > 0

        return bool(await self._write(do))


async def _discard(slot: _Conn) -> None:
    conn, slot.conn = slot.conn, None
    if conn is not None:
        with contextlib.suppress(Exception):
            await conn.close()


async def _extent(cur: Any, thread_id: str, after: int, limit: int, raw: bool = False) -> tuple[int, bool]:
    """How many rows the page after ``after`` holds and whether events may follow it
    (rows.PAGE_EXTENT): measured first, so that the page's read, which psycopg's client-side
    cursor takes whole, loads no more than PAGE_BYTES plus one row (issue #34)."""
    sizes_sql, extent_sql = _RAW_PAGE_EXTENT if raw else _PAGE_EXTENT
    await cur.execute(extent_sql, (thread_id, after, limit))
    count, total = await cur.fetchone()
    found = rows.page_extent(count, total, limit)
    if found is None:
        await cur.execute(sizes_sql, (thread_id, after, limit))
        sizes = [n for (n,) in await cur.fetchall()]
        n = rows.page_cut(sizes)
        found = n, n < len(sizes) or len(sizes) == limit
    return found


async def _raw_page(cur: Any, thread_id: str, after: int, n: int) -> Frames:
    """Raw mode relays the agent's own lines, one per stdout line (``relay``)."""
    await cur.execute(_RAW_PAGE, (thread_id, after, n))
    found: list[tuple[int, bytes | None]] = await cur.fetchall()
    return Frames(checked_lines(found), len(found), found[-1][0] if found else after, more=False)


async def _envelope_page(cur: Any, thread_id: str, after: int, n: int) -> Frames:
    """Each row's stored envelope, one column (issue #22); a row without one of the current
    version (from before it, or of another wire version: rows.ENV_SQL) is rebuilt from its
    parts."""
    await cur.execute(_ENVELOPE_PAGE, (thread_id, after, n))
    found: list[tuple[int, bytes | None]] = await cur.fetchall()
    if any(r[1] is None for r in found):
        envs = await _rebuilt(cur, thread_id, found)
    else:
        envs = [(seq, env) for seq, env in found if env is not None]
    return Frames(checked_envelopes(envs), len(envs), envs[-1][0] if envs else after, more=False)


async def _rebuilt(cur: Any, thread_id: str, found: list[tuple[int, bytes | None]]) -> list[tuple[int, bytes]]:
    """A page holding rows whose envelope is not sent as stored: theirs built from their
    parts. A row gone meanwhile (its thread was deleted between the reads) fails as
    corrupt."""
    seqs = [seq for seq, env in found if env is None]
    await cur.execute(_REBUILT, (thread_id, seqs[0], seqs[-1]))
    old = await cur.fetchall()
    built = dict(zip((r[0] for r in old), stored_envelopes(old), strict=True))
    out: list[tuple[int, bytes]] = []
    for seq, env in found:
        text = env if env is not None else built.get(seq)
        if text is None:  # deleted meanwhile
            raise CorruptEvent(seq)
        out.append((seq, text))
    return out
