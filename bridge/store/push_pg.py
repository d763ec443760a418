"""Web Push subscriptions in the PostgreSQL store: the writes of the
:class:`~bridge.store.base.PushStore` half of PostgresStore (the reads are common.py's), the
same statements as SQLite's (bridge/store/push_sql.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg import AsyncConnection

from bridge.store import pg_schema, push_sql
from bridge.store.base import PushRow
from bridge.store.rows import pg


class PgPush:
    _write: Callable[..., Any]  # PostgresStore._write(fn): fn on the writer connection

    async def put_push_subscription(self, row: PushRow, *, max_per_user: int) -> str | None:
        async def do(c: AsyncConnection[Any]) -> str | None:
            async with c.transaction():
                # One user's subscribes in turn, so the count below is exact.
                await c.execute(
                    "SELECT pg_advisory_xact_lock(%s::int, hashtext(%s))", (pg_schema.PUSH_LOCK_CLASS, row.user)
                )
                cur = await c.execute(pg(push_sql.COUNT_OTHERS), (row.user, row.endpoint))
                held = await cur.fetchone()
                if held is not None and int(held[0]) >= max_per_user:
                    return None
                values = (row.id, row.user, row.endpoint, row.p256dh, row.auth, row.created_at)
                cur = await c.execute(pg(push_sql.UPSERT), values)
                kept = await cur.fetchone()
                return None if kept is None else str(kept[0])

        found = await self._write(do)
        return None if found is None else str(found)

    async def delete_push_subscription(self, sub_id: str, user: str) -> bool:
        return await self._rowcount(push_sql.DELETE, (sub_id, user)) > 0

    async def forget_push_subscription(self, sub_id: str, endpoint: str) -> bool:
        return await self._rowcount(push_sql.FORGET, (sub_id, endpoint)) > 0

    async def record_push_outcome(self, sub_id: str, at: str, outcome: str, status: int | None) -> None:
        await self._rowcount(push_sql.OUTCOME, (at, outcome, status, sub_id))

    async def _rowcount(self, statement: str, params: tuple[Any, ...]) -> int:
        async def do(c: AsyncConnection[Any]) -> int:
            cur = await c.execute(pg(statement), params)
            return int(cur.rowcount)

        return int(await self._write(do))
