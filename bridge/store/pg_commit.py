"""PostgreSQL's group commit of transcript appends (bridge/store/postgres.py runs it on its
writer connection): one transaction a batch, three statements whatever its size: the
fence-and-touch ``UPDATE … FROM unnest(…)`` (each thread's derived columns brought forward,
the appends that carry an epoch fenced in SQL), one ``INSERT … SELECT FROM unnest(…)`` of
every event, and the thread columns an append changes; then the change counter, last
(``BUMP``). An append that is refused (a fence, a duplicate ``client_id`` or seq) is refused
alone: the batch is then redone with one savepoint per append. A retried batch whose COMMIT
may have landed first drops the appends already stored exactly as sent.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection

from bridge.store import search_pg, usage_pg
from bridge.store.base import CHANGE_COLUMNS
from bridge.store.rows import LEASE_LOST, WIRE_VERSION, later

__all__ = ["BUMP", "REFUSED", "Append", "commit"]

# This append alone is bad: refused, the rest of its batch commits.
REFUSED = (psycopg.IntegrityError, psycopg.DataError, UnicodeEncodeError, ValueError)

_FENCE_TOUCH = """
UPDATE threads t SET
    last_seq = greatest(t.last_seq, coalesce(v.last_seq, t.last_seq)),
    updated_at = greatest(t.updated_at, coalesce(v.updated_at, t.updated_at)),
    turn_active = coalesce(v.turn_active, t.turn_active),
    transcript_bytes = t.transcript_bytes + v.size,
    transcript_seq = greatest(t.transcript_seq, coalesce(v.last_seq, t.transcript_seq))
FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::boolean[], %s::text[], %s::bigint[], %s::bigint[])
    AS v(id, last_seq, updated_at, turn_active, holder, epoch, size)
WHERE t.id = v.id AND (v.epoch IS NULL OR (t.lease_owner = v.holder AND t.lease_epoch = v.epoch
    AND t.lease_expires > clock_timestamp()))
RETURNING t.id
"""
# The next len(ids) counter values, given to the rows ``ids`` in that order (rows this
# transaction has already written, so locked: the counter row is always locked last).
BUMP = """
WITH c AS (UPDATE change_log SET latest = latest + %(n)s RETURNING latest)
UPDATE threads t SET change_seq = c.latest - %(n)s + v.ord
FROM c, unnest(%(ids)s::text[]) WITH ORDINALITY AS v(id, ord)
WHERE t.id = v.id
"""
_INSERT = f"""
INSERT INTO events (thread_id, seq, ts, source, kind, env, data_at, raw_at, relay, client_id, data, wire)
SELECT *, '', {int(WIRE_VERSION)} FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[], %s::bytea[],
    %s::integer[], %s::integer[], %s::boolean[], %s::text[])
"""  # noqa: S608 (a constant of the code)


@dataclass(slots=True)
class Append:
    thread_id: str
    rows: list[tuple[Any, ...]]
    fields: dict[str, Any]  # thread columns written in the same transaction
    touch: tuple[str | None, int | None, bool | None]  # updated_at, last_seq, turn_active
    fence: tuple[str, int] | None  # (replica_id, epoch)
    done: asyncio.Future[None]
    size: int = 0  # what it adds to the thread's transcript_bytes (base.transcript_size)


async def commit(conn: AsyncConnection[Any], batch: list[Append], *, retried: bool) -> tuple[dict[int, str], bool]:
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
        except REFUSED:
            pass  # someone in the batch is bad: find out who, one savepoint each
    failed, any_changed = await _commit_each(conn, todo)
    return failed, any_changed or bool(done)


async def _commit_each(conn: AsyncConnection[Any], todo: list[tuple[int, Append]]) -> tuple[dict[int, str], bool]:
    """The batch again, one savepoint per append; the counter once, for them all."""
    failed: dict[int, str] = {}
    changed_ids: dict[str, None] = {}  # in order, once each
    async with conn.transaction():
        for i, item in todo:
            try:
                async with conn.transaction():  # a savepoint
                    one_failed, one_changed = await _write(conn, [(i, item)])
            except REFUSED as exc:
                failed[i] = str(exc).strip().splitlines()[0]
                continue
            failed.update(one_failed)
            changed_ids.update(dict.fromkeys(one_changed))
        await _bump(conn, list(changed_ids))
    return failed, bool(changed_ids)


async def _bump(conn: AsyncConnection[Any], ids: list[str]) -> None:
    """The batch's last statement: the next counter values, one per changed thread."""
    if ids:
        await conn.execute(BUMP, {"n": len(ids), "ids": ids})


def _fences_agree(items: Any) -> bool:
    """Every append of one thread in the batch under the same fence (so one row of the
    fence-and-touch statement stands for all of them)."""
    seen: dict[str, tuple[str, int] | None] = {}
    for item in items:
        if seen.setdefault(item.thread_id, item.fence) != item.fence:
            return False
    return True


def _touches(todo: list[tuple[int, Append]]) -> dict[str, list[Any]]:
    """One row of the fence-and-touch statement per thread: [last_seq, updated_at,
    turn_active, holder, epoch, size] (the newest of each; the last turn_active; the fence;
    the sizes added up)."""
    touches: dict[str, list[Any]] = {}
    for _, item in todo:
        updated_at, last_seq, turn_active = item.touch
        t = touches.setdefault(item.thread_id, [None, None, None, None, None, 0])
        t[5] += item.size
        t[0] = later(t[0], last_seq)
        t[1] = later(t[1], updated_at)
        if turn_active is not None:
            t[2] = turn_active
        if item.fence is not None:
            t[3], t[4] = item.fence
    return touches


def _lease_lost(item: Append) -> str:
    holder, epoch = item.fence or ("", 0)
    return f"{LEASE_LOST}thread {item.thread_id} is no longer leased to {holder} with epoch {epoch}"


async def _write(conn: AsyncConnection[Any], todo: list[tuple[int, Append]]) -> tuple[dict[int, str], list[str]]:
    """The statements of one batch (in a transaction) but the counter's: the appends
    refused by their fence, and the threads whose visible columns it changed, in order."""
    failed, passed = await _fence_and_touch(conn, todo)
    live = [item for i, item in todo if i not in failed]
    changed = _changed(live, passed)
    rows = [r for item in live for r in item.rows]
    if rows:
        await conn.execute(_INSERT, [list(col) for col in zip(*rows, strict=True)])
        await search_pg.index(conn, rows)  # in this transaction: current at commit
        await usage_pg.record(conn, rows)
    for item in live:
        if item.fields:
            sets = ",".join(f"{k} = %s" for k in item.fields)
            await conn.execute(f"UPDATE threads SET {sets} WHERE id = %s", (*item.fields.values(), item.thread_id))  # noqa: S608
    return failed, list(changed)


def _changed(live: list[Append], passed: set[str]) -> dict[str, None]:
    """The threads (in order, once each) the appends change as clients see them: the
    transcript columns of the fence-and-touch statement, or a visible field."""
    return {
        item.thread_id: None
        for item in live
        if item.thread_id in passed
        and (any(v is not None for v in item.touch) or not CHANGE_COLUMNS.isdisjoint(item.fields))
    }


async def _fence_and_touch(
    conn: AsyncConnection[Any], todo: list[tuple[int, Append]]
) -> tuple[dict[int, str], set[str]]:
    """The first statement: the thread rows brought forward and locked, the fences applied;
    the appends whose fence failed, and the threads whose row it wrote."""
    # In id order, as a renew locks them (bridge/store/pg_leases.py RENEW): fewer deadlocks.
    touches = dict(sorted(_touches(todo).items()))
    columns = [[t[k] for t in touches.values()] for k in range(6)]
    cur = await conn.execute(_FENCE_TOUCH, [list(touches), *columns])
    passed = {r[0] for r in await cur.fetchall()}
    failed = {i: _lease_lost(item) for i, item in todo if item.fence is not None and item.thread_id not in passed}
    return failed, passed


async def _already_committed(conn: AsyncConnection[Any], batch: list[Append]) -> set[int]:
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
