"""The PostgreSQL store's usage (bridge/store/usage.py), as SQLite's (usage_sqlite.py): a
``turn_usage`` row for every ``turn.ended`` event and the thread's totals
(``threads.usage``), written by the group commit (pg_commit._write) in the batch's
transaction, three statements for a batch that holds turn ends and none for one that does
not. The thread rows are already locked by then (the batch's fence-and-touch statement),
so reading and rewriting their totals races with no other writer.
"""

from __future__ import annotations

import json
from typing import Any

from psycopg import AsyncConnection

from bridge.store import usage
from bridge.store.rows import pg

# pg_schema.MIGRATIONS 9: SQLite's migration 14 (usage_sqlite.MIGRATION).
MIGRATION = """
CREATE TABLE turn_usage (
    thread_id text NOT NULL,
    seq bigint NOT NULL,
    ts text NOT NULL,
    owner text,
    agent text NOT NULL,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    cache_read_input_tokens bigint NOT NULL,
    cache_creation_input_tokens bigint NOT NULL,
    thought_tokens bigint NOT NULL,
    cost double precision,
    currency text,
    PRIMARY KEY (thread_id, seq)
);
CREATE INDEX turn_usage_by_ts ON turn_usage (ts);
CREATE INDEX turn_usage_by_owner ON turn_usage (owner, ts);
ALTER TABLE threads ADD COLUMN usage text;
"""

_INSERT = (
    f"INSERT INTO turn_usage ({','.join(usage.COLUMNS)}) SELECT * FROM unnest(%s::text[], %s::bigint[], "  # noqa: S608
    "%s::text[], %s::text[], %s::text[], %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], "
    "%s::double precision[], %s::text[])"
)
_SET_TOTALS = "UPDATE threads t SET usage = v.u FROM unnest(%s::text[], %s::text[]) AS v(id, u) WHERE t.id = v.id"
_DATA = (
    "CASE WHEN env IS NULL THEN data ELSE convert_from(substring(env FROM data_at + 1 "
    "FOR coalesce(raw_at - 7, length(env) - 12) - data_at), 'UTF8') END"
)

_BACKFILL = f"SELECT thread_id, seq, ts, {_DATA} FROM events WHERE kind = 'turn.ended' ORDER BY thread_id, seq"  # noqa: S608


def _data_json(env: bytes, data_at: int, raw_at: int | None) -> str:
    """An event's data cut out of its stored envelope (rows.DATA_SQL's offsets)."""
    end = raw_at - 7 if raw_at is not None else len(env) - 12
    return env[data_at:end].decode()


async def _write(
    conn: AsyncConnection[Any], ended: list[tuple[str, int, str, usage.Turn]], *, forks: bool = True
) -> None:
    """The turn ends (thread, seq, ts, numbers; in order) recorded: rows, then totals.
    ``forks``: a fork's copy of its source's turns is left out (the column exists from
    migration 10 on; migration 9's back-fill predates every fork)."""
    tids = list(dict.fromkeys(t[0] for t in ended))
    columns = "id, owner, agent, usage, forked_from" if forks else "id, owner, agent, usage, NULL"
    cur = await conn.execute(f"SELECT {columns} FROM threads WHERE id = ANY(%s)", (tids,))  # noqa: S608 (constants)
    threads = {r[0]: r[1:] for r in await cur.fetchall()}
    made: list[tuple[Any, ...]] = []
    totals: dict[str, dict[str, Any]] = {}
    for tid, seq, ts, turn in ended:
        if tid not in threads:
            continue
        owner, agent, kept, forked_from = threads[tid]
        if seq <= usage.copied_upto(forked_from):
            continue
        made.append(usage.row(tid, seq, ts, owner, agent, turn))
        totals[tid] = usage.add(totals.get(tid, json.loads(kept) if kept else None), turn)
    if made:
        await conn.execute(_INSERT, [list(c) for c in zip(*made, strict=True)])
        await conn.execute(_SET_TOTALS, [list(totals), [json.dumps(t) for t in totals.values()]])


async def record(conn: AsyncConnection[Any], rows: list[tuple[Any, ...]]) -> None:
    """A batch's event rows (pg_commit's tuples), in the caller's transaction."""
    ended = [
        (tid, seq, ts, usage.of_json(_data_json(env, data_at, raw_at)))
        for tid, seq, ts, _source, kind, env, data_at, raw_at, *_ in rows
        if kind == "turn.ended"
    ]
    if ended:
        await _write(conn, ended)


async def migrate(conn: AsyncConnection[Any]) -> None:
    """Migration 9, in its transaction: the tables, then the turn ends already stored
    recorded (read through a server-side cursor, a thousand at a time)."""
    await conn.execute(MIGRATION)
    async with conn.cursor(name="usage_backfill") as cur:
        await cur.execute(_BACKFILL)
        while chunk := await cur.fetchmany(1000):
            await _write(conn, [(tid, seq, ts, usage.of_json(data)) for tid, seq, ts, data in chunk], forks=False)


async def forget(conn: AsyncConnection[Any], thread_id: str) -> None:
    """A deleted thread's turns (in the delete's transaction)."""
    await conn.execute("DELETE FROM turn_usage WHERE thread_id = %s", (thread_id,))


async def report(
    conn: AsyncConnection[Any], group_by: str, owner: str | None, since: str | None, until: str | None
) -> Any:
    statement, params = usage.report_query(group_by, owner, since, until)
    cur = await conn.execute(pg(statement), params)
    return await cur.fetchall()
