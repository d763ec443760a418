"""Per-user secrets in the store (issue #32), both stores: stored and replaced by (user,
profile, key), listed per user (and per profile), deleted, capped per user, shared by
replicas; and the migration from the previous schema on SQLite and PostgreSQL. Real
SQLite files and a real PostgreSQL server."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest
from support.stores import StoreFactory, opened_at

from bridge.store import pg_schema, sqlite_sql

pytestmark = pytest.mark.timeout(60)


async def test_secrets_are_stored_replaced_listed_and_deleted_per_user(opened: StoreFactory) -> None:
    async with opened() as store, opened("b") as other:
        assert await store.put_secret("alice", "claude", "TOKEN", b"n" * 12, b"c1", max_per_user=5)
        assert await store.put_secret("alice", "claude", "TOKEN", b"m" * 12, b"c2", max_per_user=5)  # replaced
        assert await store.put_secret("alice", "qwen", "TOKEN", b"q" * 12, b"c3", max_per_user=5)
        assert await store.put_secret("alice", "claude", "A_FIRST", b"a" * 12, b"c4", max_per_user=5)
        assert await store.put_secret("bob", "claude", "TOKEN", b"b" * 12, b"c5", max_per_user=5)

        mine = await other.list_secrets("alice")  # another replica on the same store
        assert [(r.user, r.profile, r.key, r.nonce, r.ciphertext) for r in mine] == [
            ("alice", "claude", "A_FIRST", b"a" * 12, b"c4"),
            ("alice", "claude", "TOKEN", b"m" * 12, b"c2"),
            ("alice", "qwen", "TOKEN", b"q" * 12, b"c3"),
        ]
        assert all(r.updated_at.endswith("Z") for r in mine)
        assert [r.key for r in await store.list_secrets("alice", "qwen")] == ["TOKEN"]
        assert [r.ciphertext for r in await store.list_secrets("bob")] == [b"c5"]
        assert await store.list_secrets("carol") == []

        assert await other.delete_secret("alice", "claude", "TOKEN")
        assert not await other.delete_secret("alice", "claude", "TOKEN")
        assert not await store.delete_secret("alice", "nope", "A_FIRST")
        assert [(r.profile, r.key) for r in await store.list_secrets("alice")] == [
            ("claude", "A_FIRST"),
            ("qwen", "TOKEN"),
        ]


async def test_revoking_a_user_deletes_their_secrets(opened: StoreFactory) -> None:
    async with opened() as store:
        assert await store.add_user("alice", "h-alice", admin=False)
        for user in ("alice", "bob"):
            assert await store.put_secret(user, "p", "K", b"n" * 12, b"c", max_per_user=5)
        assert await store.revoke_user("alice")
        assert await store.list_secrets("alice") == []
        assert [r.user for r in await store.list_secrets("bob")] == ["bob"]


async def test_a_user_holds_at_most_max_per_user_secrets_but_may_replace_them(opened: StoreFactory) -> None:
    async with opened() as store:
        for key in ("A", "B"):
            assert await store.put_secret("alice", "p", key, b"n" * 12, b"c", max_per_user=2)
        assert not await store.put_secret("alice", "p", "C", b"n" * 12, b"c", max_per_user=2)
        assert await store.put_secret("alice", "p", "B", b"n" * 12, b"new", max_per_user=2)
        assert await store.put_secret("bob", "p", "C", b"n" * 12, b"c", max_per_user=2)  # bob's own count
        assert [r.key for r in await store.list_secrets("alice")] == ["A", "B"]


async def test_a_postgres_database_of_the_previous_version_gets_the_secrets_table(pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        assert await pg_schema.migrate(conn, pg_schema.MIGRATIONS[:4]) == [1, 2, 3, 4]
        await conn.execute("INSERT INTO users (name, token_hash, created_at) VALUES ('alice', 'h', 't')")
    async with opened_at(pg_url) as store:
        assert await store.list_secrets("alice") == []
        assert await store.put_secret("alice", "p", "K", b"n" * 12, b"c", max_per_user=5)
        assert (await store.get_user("alice")) is not None
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT max(version) FROM schema_version")
        assert (await cur.fetchone()) == (pg_schema.SCHEMA_VERSION,) == (11,)


async def test_a_sqlite_file_of_the_previous_version_gets_the_secrets_table(tmp_path: Path) -> None:
    path = tmp_path / "bridge.db"
    db = sqlite3.connect(path, isolation_level=None)
    for i, ddl in enumerate(sqlite_sql._MIGRATIONS[:9], start=1):
        for stmt in filter(str.strip, ddl.split(";")):
            db.execute(stmt)
        db.execute(f"PRAGMA user_version={i}")
    db.execute("INSERT INTO users (name, token_hash, created_at) VALUES ('alice', 'h', 't')")
    db.close()
    async with opened_at(f"sqlite:///{path}") as store:
        assert await store.put_secret("alice", "p", "K", b"n" * 12, b"c", max_per_user=5)
        assert [r.key for r in await store.list_secrets("alice")] == ["K"]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == sqlite_sql.SCHEMA_VERSION == 16
    db.close()
