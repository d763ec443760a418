"""Web Push subscriptions in both stores (issue #39; docs/api.md "Push subscriptions"): the
migration of each, the SQLite store's writes as ops of ``sqlite_sql.OPS`` (run where its
write connection is: no asyncio here, the writer process imports this), and the reads both
stores run (``common.py``).

A row is one browser's subscription: the push service's endpoint (a capability URL, unique:
the same browser subscribing again, under any user, replaces its row), the browser's
P-256 key and auth secret (RFC 8291), whose it is, and the last delivery's outcome.
"""

from __future__ import annotations

import sqlite3
from typing import Any

# SQLite's migration 16 (sqlite_sql._MIGRATIONS); PostgreSQL's 11 is PG_MIGRATION.
MIGRATION = """
    CREATE TABLE push_subscriptions (
        id TEXT PRIMARY KEY,
        user_name TEXT NOT NULL,
        endpoint TEXT NOT NULL UNIQUE,
        p256dh TEXT NOT NULL,
        auth TEXT NOT NULL,
        created_at TEXT NOT NULL,
        last_at TEXT,
        last_outcome TEXT,
        last_status INTEGER
    );
    CREATE INDEX push_subscriptions_user ON push_subscriptions(user_name);
    """
PG_MIGRATION = """
    CREATE TABLE push_subscriptions (
        id text PRIMARY KEY,
        user_name text NOT NULL,
        endpoint text NOT NULL UNIQUE,
        p256dh text NOT NULL,
        auth text NOT NULL,
        created_at text NOT NULL,
        last_at text,
        last_outcome text,
        last_status integer
    );
    CREATE INDEX push_subscriptions_user ON push_subscriptions(user_name);
    """

COLUMNS = "id, user_name, endpoint, p256dh, auth, created_at, last_at, last_outcome, last_status"
LIST = f"SELECT {COLUMNS} FROM push_subscriptions WHERE user_name = ? ORDER BY created_at, id"  # noqa: S608
GET = f"SELECT {COLUMNS} FROM push_subscriptions WHERE id = ?"  # noqa: S608

# The write statements, in SQLite's placeholders (rows.pg turns them into PostgreSQL's).
COUNT_OTHERS = "SELECT count(*) FROM push_subscriptions WHERE user_name = ? AND endpoint <> ?"
# A browser subscribing again (the same endpoint) keeps its row's id and takes the new
# keys and owner; its last outcome starts over.
UPSERT = (
    f"INSERT INTO push_subscriptions ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, NULL, NULL) "  # noqa: S608
    "ON CONFLICT (endpoint) DO UPDATE SET user_name = excluded.user_name, p256dh = excluded.p256dh, "
    "auth = excluded.auth, created_at = excluded.created_at, last_at = NULL, last_outcome = NULL, "
    "last_status = NULL RETURNING id"
)
DELETE = "DELETE FROM push_subscriptions WHERE id = ? AND user_name = ?"
# Gone (404/410 from the push service): only the row that was used, not one a new
# subscription of the same browser replaced meanwhile.
FORGET = "DELETE FROM push_subscriptions WHERE id = ? AND endpoint = ?"
OUTCOME = "UPDATE push_subscriptions SET last_at = ?, last_outcome = ?, last_status = ? WHERE id = ?"
DROP_USER = "DELETE FROM push_subscriptions WHERE user_name = ?"


def put_push_subscription(db: sqlite3.Connection, row: list[Any], max_per_user: int) -> str | None:
    """Store (or replace by endpoint) a subscription; the id it is stored under (a replaced
    row keeps its own), or None when the user already holds ``max_per_user`` others."""
    user, endpoint = row[1], row[2]
    db.execute("BEGIN IMMEDIATE")
    (held,) = db.execute(COUNT_OTHERS, (user, endpoint)).fetchone()
    if held >= max_per_user:
        db.execute("ROLLBACK")
        return None
    (kept,) = db.execute(UPSERT, row).fetchone()
    db.execute("COMMIT")
    return str(kept)


def delete_push_subscription(db: sqlite3.Connection, sub_id: str, user: str) -> bool:
    return db.execute(DELETE, (sub_id, user)).rowcount > 0


def forget_push_subscription(db: sqlite3.Connection, sub_id: str, endpoint: str) -> bool:
    return db.execute(FORGET, (sub_id, endpoint)).rowcount > 0


def record_push_outcome(db: sqlite3.Connection, sub_id: str, at: str, outcome: str, status: int | None) -> None:
    db.execute(OUTCOME, (at, outcome, status, sub_id))


OPS = (put_push_subscription, delete_push_subscription, forget_push_subscription, record_push_outcome)
