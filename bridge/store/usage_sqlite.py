"""The SQLite store's usage (bridge/store/usage.py): a ``turn_usage`` row for every
``turn.ended`` event and the thread's totals (``threads.usage``, JSON), both written in the
transaction of the append that holds the event (``record``, called by
sqlite_sql._write_item wherever that runs), so they never disagree with the transcript.
``GET /v1/usage`` sums the small table, not the events: a time window is a range of its
``ts`` index, a user's turns a range of ``(owner, ts)``. No asyncio here: the writer
process imports this.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from bridge.store import usage

# The migration (sqlite_sql._MIGRATIONS, 14; PostgreSQL's 9).
MIGRATION = """
    CREATE TABLE turn_usage (
        thread_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        ts TEXT NOT NULL,
        owner TEXT,
        agent TEXT NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cache_read_input_tokens INTEGER NOT NULL,
        cache_creation_input_tokens INTEGER NOT NULL,
        thought_tokens INTEGER NOT NULL,
        cost REAL,
        currency TEXT,
        PRIMARY KEY (thread_id, seq)
    ) WITHOUT ROWID;
    CREATE INDEX turn_usage_by_ts ON turn_usage(ts);
    CREATE INDEX turn_usage_by_owner ON turn_usage(owner, ts);
    ALTER TABLE threads ADD COLUMN usage TEXT;
"""

SEQ, TS, KIND, DATA = 0, 1, 3, 4  # sqlite_sql.Rows' columns


def after_migration(db: sqlite3.Connection, ddl: str) -> None:
    """After this module's migration, in its transaction: the ``turn.ended`` events already
    stored recorded as the appends would have (a row each, the thread's totals)."""
    if ddl is not MIGRATION:
        return
    from bridge.store.sqlite_sql import DATA_SQL  # (that module imports this one)

    owner_agent = "(SELECT owner FROM threads WHERE id = thread_id), (SELECT agent FROM threads WHERE id = thread_id)"
    cur = db.execute(
        f"SELECT thread_id, seq, ts, {owner_agent}, {DATA_SQL} FROM events "  # noqa: S608 (constants of the code)
        "WHERE kind = 'turn.ended' ORDER BY thread_id, seq"
    )
    totals: dict[str, Any] = {}
    while chunk := cur.fetchmany(1000):
        made = [(tid, seq, ts, owner, agent, usage.of_json(data)) for tid, seq, ts, owner, agent, data in chunk]
        db.executemany(usage.INSERT_ROW, [usage.row(*m) for m in made])
        for tid, *_, turn in made:
            totals[tid] = usage.add(totals.get(tid), turn)
    db.executemany("UPDATE threads SET usage = ? WHERE id = ?", [(json.dumps(t), tid) for tid, t in totals.items()])


def record(db: sqlite3.Connection, thread_id: str, rows: Any) -> None:
    """An append's ``turn.ended`` events (``sqlite_sql.Rows``), in the caller's transaction."""
    kinds = rows[KIND]
    if "turn.ended" not in kinds:  # (a C loop: most appends hold none)
        return
    found = db.execute("SELECT owner, agent, usage, forked_from FROM threads WHERE id = ?", (thread_id,)).fetchone()
    if found is None:
        return
    owner, agent, kept, forked_from = found
    copied = usage.copied_upto(forked_from)  # a fork's copy of its source's turns
    totals = json.loads(kept) if kept else None
    made = []
    for seq, ts, kind, data in zip(rows[SEQ], rows[TS], kinds, rows[DATA], strict=True):
        if kind == "turn.ended" and seq > copied:
            turn = usage.of_json(data)
            made.append(usage.row(thread_id, seq, ts, owner, agent, turn))
            totals = usage.add(totals, turn)
    if made:
        db.executemany(usage.INSERT_ROW, made)
        db.execute("UPDATE threads SET usage = ? WHERE id = ?", (json.dumps(totals), thread_id))


def forget(db: sqlite3.Connection, thread_id: str) -> None:
    """A deleted thread's turns (in the delete's transaction)."""
    db.execute("DELETE FROM turn_usage WHERE thread_id = ?", (thread_id,))


def report(db: sqlite3.Connection, group_by: str, owner: str | None, since: str | None, until: str | None) -> Any:
    statement, params = usage.report_query(group_by, owner, since, until)
    return db.execute(statement, params).fetchall()
