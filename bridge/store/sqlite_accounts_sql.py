"""The writes of browser sessions, users and per-user secrets in the SQLite store: ops of
``sqlite_sql.OPS`` (plain arguments in, plain values out), run where the write connection
is (the writer thread or process; bridge/store/sqlite_accounts.py calls them). No asyncio
here: the writer process imports this.
"""

from __future__ import annotations

import sqlite3
from typing import Any


def load_sessions(db: sqlite3.Connection, now: float) -> list[Any]:
    db.execute("DELETE FROM browser_sessions WHERE expires_at <= ?", (now,))
    return db.execute("SELECT key, expires_at, user_name FROM browser_sessions ORDER BY expires_at").fetchall()


def save_session(db: sqlite3.Connection, key: str, expires_at: float, evicted: list[str], user: str | None) -> None:
    db.execute("BEGIN IMMEDIATE")
    db.executemany("DELETE FROM browser_sessions WHERE key = ?", [(k,) for k in evicted])
    db.execute(
        "INSERT OR REPLACE INTO browser_sessions (key, expires_at, user_name) VALUES (?, ?, ?)",
        (key, expires_at, user),
    )
    db.execute("COMMIT")


def delete_session(db: sqlite3.Connection, key: str) -> None:
    db.execute("DELETE FROM browser_sessions WHERE key = ?", (key,))


def add_user(db: sqlite3.Connection, name: str, token_hash: str, admin: bool, created_at: str) -> bool:
    cur = db.execute(
        "INSERT INTO users (name, token_hash, admin, created_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (name) DO UPDATE SET token_hash = excluded.token_hash, admin = excluded.admin, "
        "revoked_at = NULL WHERE users.revoked_at IS NOT NULL",
        (name, token_hash, int(admin), created_at),
    )
    return cur.rowcount > 0


def revoke_user(db: sqlite3.Connection, name: str, revoked_at: str) -> bool:
    db.execute("BEGIN IMMEDIATE")
    cur = db.execute(
        "UPDATE users SET token_hash = NULL, revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
        (revoked_at, name),
    )
    db.execute("DELETE FROM browser_sessions WHERE user_name = ?", (name,))
    if cur.rowcount > 0:
        db.execute("DELETE FROM user_secrets WHERE user_name = ?", (name,))
        db.execute("DELETE FROM push_subscriptions WHERE user_name = ?", (name,))
    db.execute("COMMIT")
    return cur.rowcount > 0


def put_secret(
    db: sqlite3.Connection,
    user: str,
    profile: str,
    key: str,
    nonce: bytes,
    ciphertext: bytes,
    updated_at: str,
    max_per_user: int,
) -> bool:
    """Store or replace a secret; False (nothing written) when it is new and the user holds
    ``max_per_user`` already."""
    db.execute("BEGIN IMMEDIATE")
    there = db.execute(
        "SELECT 1 FROM user_secrets WHERE user_name = ? AND profile = ? AND key = ?", (user, profile, key)
    ).fetchone()
    held = db.execute("SELECT count(*) FROM user_secrets WHERE user_name = ?", (user,)).fetchone()[0]
    if there is None and held >= max_per_user:
        db.execute("ROLLBACK")
        return False
    db.execute(
        "INSERT INTO user_secrets (user_name, profile, key, nonce, ciphertext, updated_at) VALUES (?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (user_name, profile, key) DO UPDATE SET nonce = excluded.nonce, "
        "ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
        (user, profile, key, nonce, ciphertext, updated_at),
    )
    db.execute("COMMIT")
    return True


def delete_secret(db: sqlite3.Connection, user: str, profile: str, key: str) -> bool:
    cur = db.execute("DELETE FROM user_secrets WHERE user_name = ? AND profile = ? AND key = ?", (user, profile, key))
    return cur.rowcount > 0


OPS = (load_sessions, save_session, delete_session, add_user, revoke_user, put_secret, delete_secret)
