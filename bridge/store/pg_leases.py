"""Leases, epoch fencing and replicas in the PostgreSQL store (docs/DESIGN.md "Leases and
fencing"): the :class:`~bridge.store.base.LeaseStore` half of PostgresStore. Every expiry
is decided on the database's clock (``clock_timestamp()``). Acquires and releases run on
the control connection, which also holds the replica's session-level advisory lock;
renewals have a connection of their own, so that one never waits behind other lease
traffic and misses its deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import psycopg
from psycopg import AsyncConnection

from bridge.store import pg_schema, rows
from bridge.store.base import Lease, Replica, ThreadRow

RENEW = """
UPDATE threads t SET lease_expires = clock_timestamp() + make_interval(secs => %s)
FROM (SELECT id FROM threads WHERE lease_owner = %s AND lease_expires > clock_timestamp()
      ORDER BY id FOR UPDATE) AS mine
WHERE t.id = mine.id
RETURNING t.id, t.lease_epoch
"""
RENEW_ATTEMPTS = 3
# Rows that say a process or a turn is live while nobody holds their lease. The first
# condition is the predicate of the partial index threads_live, so the scan reads only
# live rows (a few per running agent), never the whole table.
ORPHANED = f"""
SELECT {rows.COLUMNS_SQL} FROM threads
WHERE (state IN ('starting', 'running', 'stopping') OR turn_active)
  AND (lease_owner IS NULL OR lease_expires IS NULL OR lease_expires <= clock_timestamp())
ORDER BY lease_expires NULLS FIRST, id LIMIT %s
"""  # noqa: S608


class PgLeases:
    """Needs the store's connection slots and ``_do(slot, fn)`` / ``_read(fn)``."""

    replica_id: str
    _control: Any
    _renewer: Any
    _replica_locked: bool
    _instance: str | None
    _replica_url: str | None
    _do: Callable[..., Any]
    _read: Callable[..., Any]

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
                        cur = await c.execute(RENEW, (float(ttl_s), replica_id))
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
            holder, epoch, left = row
            live = holder is not None and left is not None and left > 0
            return Lease(holder, int(epoch), None if holder is None else float(left), live)

        return cast(Lease | None, await self._read(do))  # a read: any reader connection

    async def orphaned_threads(self, limit: int) -> list[ThreadRow]:
        async def do(c: AsyncConnection[Any]) -> list[ThreadRow]:
            cur = await c.execute(ORPHANED, (int(limit),))
            return [rows.thread_row(r) for r in await cur.fetchall()]

        return cast(list[ThreadRow], await self._read(do))

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
