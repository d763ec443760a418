"""Leases, epoch fencing and replicas in the SQLite store (issue #18), in SQL as in the
PostgreSQL store, so both stores share one protocol and one code path for callers.

SQLite is one process's file (its data dir is locked), so there is never a second live
replica; the leases still work exactly as they do on PostgreSQL, with the database's
clock (``julianday('now')``) deciding every expiry, and the fence is a statement of the
append's own transaction (``fence``), never a check in Python.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from bridge.store.base import Lease, Replica, ThreadRow
from bridge.store.rows import COLUMNS_SQL, LEASE_LOST, stamp, thread_row

__all__ = ["LEASE_LOST", "OPS", "Fenced", "SqliteLeases", "fence", "fence_of", "stamp"]
T = TypeVar("T")

# Seconds since the epoch on the database's clock.
NOW = "((julianday('now') - 2440587.5) * 86400.0)"


class Fenced(Exception):
    """This append's lease is not the live one (the append alone is rolled back)."""


def fence_of(replica_id: str, epoch: int | None) -> tuple[str, int] | None:
    """What an append with ``epoch`` must find on its thread row (None: not fenced)."""
    return None if epoch is None else (replica_id, epoch)


def fence(db: sqlite3.Connection, thread_id: str, replica_id: str, epoch: int) -> None:
    """The first statement of a fenced append's transaction: zero rows, no append."""
    cur = db.execute(
        f"UPDATE threads SET lease_epoch = lease_epoch WHERE id = ? AND lease_owner = ? "  # noqa: S608
        f"AND lease_epoch = ? AND lease_expires > {NOW}",
        (thread_id, replica_id, epoch),
    )
    if cur.rowcount == 0:
        raise Fenced(f"{LEASE_LOST}thread {thread_id} is no longer leased to {replica_id} with epoch {epoch}")


def _acquire(db: sqlite3.Connection, thread_id: str, replica_id: str, ttl_s: float) -> int | None:
    row = db.execute(
        f"UPDATE threads SET lease_epoch = CASE WHEN lease_owner = ?1 AND lease_expires > {NOW} "  # noqa: S608
        f"THEN lease_epoch ELSE lease_epoch + 1 END, lease_owner = ?1, lease_expires = {NOW} + ?2 "
        f"WHERE id = ?3 AND (lease_owner IS NULL OR lease_owner = ?1 OR lease_expires <= {NOW}) "
        "RETURNING lease_epoch",
        (replica_id, float(ttl_s), thread_id),
    ).fetchone()
    return None if row is None else int(row[0])


def acquire_lease(db: sqlite3.Connection, thread_id: str, replica_id: str, ttl_s: float) -> int | None:
    return _acquire(db, thread_id, replica_id, ttl_s)


def renew_leases(db: sqlite3.Connection, replica_id: str, ttl_s: float) -> list[Any]:
    return db.execute(
        f"UPDATE threads SET lease_expires = {NOW} + ? "  # noqa: S608
        f"WHERE lease_owner = ? AND lease_expires > {NOW} RETURNING id, lease_epoch",
        (float(ttl_s), replica_id),
    ).fetchall()


def release_lease(db: sqlite3.Connection, thread_id: str, replica_id: str, epoch: int) -> bool:
    cur = db.execute(
        "UPDATE threads SET lease_owner = NULL, lease_expires = NULL "
        "WHERE id = ? AND lease_owner = ? AND lease_epoch = ?",
        (thread_id, replica_id, epoch),
    )
    return cur.rowcount > 0


def lease_row(db: sqlite3.Connection, thread_id: str) -> list[Any] | None:
    row = db.execute(
        f"SELECT lease_owner, lease_epoch, lease_expires - {NOW} FROM threads WHERE id = ?",  # noqa: S608
        (thread_id,),
    ).fetchone()
    return None if row is None else list(row)


def orphaned_rows(db: sqlite3.Connection, limit: int) -> list[Any]:
    """Rows that say a process or a turn is live while no lease on them is live (SQLite
    has no leases in use: one daemon, so this is only for the protocol's sake)."""
    return db.execute(
        f"SELECT {COLUMNS_SQL} FROM threads WHERE (state IN ('starting','running','stopping') "  # noqa: S608
        f"OR turn_active=1) AND (lease_owner IS NULL OR lease_expires IS NULL OR lease_expires <= {NOW}) "
        "ORDER BY lease_expires, id LIMIT ?",
        (int(limit),),
    ).fetchall()


def register_replica(db: sqlite3.Connection, replica_id: str, instance: str, url: str | None) -> None:
    db.execute(
        "INSERT INTO replicas (replica_id, instance, url, started_at, heartbeat_at) "  # noqa: S608
        f"VALUES (?, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), {NOW}) "
        "ON CONFLICT (replica_id) DO UPDATE SET instance = excluded.instance, url = excluded.url, "
        "started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at",
        (replica_id, instance, url),
    )


def heartbeat(db: sqlite3.Connection, replica_id: str) -> None:
    db.execute(f"UPDATE replicas SET heartbeat_at = {NOW} WHERE replica_id = ?", (replica_id,))  # noqa: S608


def replica_rows(db: sqlite3.Connection) -> list[Any]:
    return db.execute(
        f"SELECT r.replica_id, r.instance, r.url, r.started_at, {NOW} - r.heartbeat_at, "  # noqa: S608
        "(SELECT count(*) FROM threads t WHERE t.lease_owner = r.replica_id "
        f"AND t.lease_expires > {NOW}) FROM replicas r ORDER BY r.replica_id"
    ).fetchall()


# The writes above, by name (sqlite_sql.OPS): they run where the write connection is.
OPS = (acquire_lease, renew_leases, release_lease, lease_row, orphaned_rows, register_replica, heartbeat, replica_rows)


class SqliteLeases:
    """The :class:`~bridge.store.base.LeaseStore` half of SqliteStore."""

    replica_id: str
    _run: Callable[..., Any]  # SqliteStore._run(op, *args): an op where the write connection is

    async def acquire_lease(self, thread_id: str, replica_id: str, ttl_s: float) -> int | None:
        result = await self._run(acquire_lease, thread_id, replica_id, float(ttl_s))
        return None if result is None else int(result)

    async def renew_leases(self, replica_id: str, ttl_s: float) -> dict[str, int]:
        rows = await self._run(renew_leases, replica_id, float(ttl_s))
        return {str(tid): int(epoch) for tid, epoch in rows}

    async def release_lease(self, thread_id: str, replica_id: str, epoch: int) -> bool:
        return bool(await self._run(release_lease, thread_id, replica_id, int(epoch)))

    async def lease_of(self, thread_id: str) -> Lease | None:
        row = await self._run(lease_row, thread_id)
        if row is None:
            return None
        holder, epoch, left = row
        live = holder is not None and left is not None and left > 0
        return Lease(holder, int(epoch), None if holder is None else float(left), live)

    async def orphaned_threads(self, limit: int) -> list[ThreadRow]:
        return [thread_row(r) for r in await self._run(orphaned_rows, int(limit))]

    async def register_replica(self, instance: str, url: str | None) -> None:
        """The data-dir lock already keeps a second process off this file: recorded only."""
        await self._run(register_replica, self.replica_id, instance, url)

    async def heartbeat(self) -> None:
        await self._run(heartbeat, self.replica_id)

    async def list_replicas(self) -> list[Replica]:
        rows = await self._run(replica_rows)
        return [Replica(r[0], r[1], r[2], r[3], float(r[4]), int(r[5])) for r in rows]
