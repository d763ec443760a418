"""Web Push subscriptions in the store (issue #39), both stores: stored, replaced by
endpoint (keeping the row's id), listed per user, deleted only by their user, forgotten
only while unchanged, capped per user, outcomes recorded, dropped with a revoked user;
and the migration from the previous schema on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest
from support.stores import StoreFactory, opened_at

from bridge.store import pg_schema, sqlite_sql
from bridge.store.base import PushRow

pytestmark = pytest.mark.timeout(60)


def sub(n: int, user: str = "alice", *, endpoint: str | None = None, key: str = "k") -> PushRow:
    return PushRow(
        f"psub_{n}",
        user,
        endpoint or f"https://push.example/{n}",
        f"{key}-p256dh",
        f"{key}-auth",
        f"2026-01-0{n}T00:00:00Z",
    )


async def test_subscriptions_are_stored_replaced_by_endpoint_listed_and_deleted(opened: StoreFactory) -> None:
    async with opened() as store, opened("b") as other:
        assert await store.put_push_subscription(sub(1), max_per_user=5) == "psub_1"
        assert await store.put_push_subscription(sub(2), max_per_user=5) == "psub_2"
        assert await store.put_push_subscription(sub(3, "bob"), max_per_user=5) == "psub_3"
        await store.record_push_outcome("psub_1", "2026-01-05T00:00:00Z", "delivered", 201)
        # The same browser again (its endpoint), now bob's with new keys: the row's id stays,
        # the outcome starts over.
        again = sub(4, "bob", endpoint="https://push.example/1", key="new")
        assert await other.put_push_subscription(again, max_per_user=5) == "psub_1"
        assert [r.id for r in await other.list_push_subscriptions("alice")] == ["psub_2"]
        bobs = await store.list_push_subscriptions("bob")
        assert [(r.id, r.p256dh, r.auth, r.last_outcome) for r in bobs] == [
            ("psub_3", "k-p256dh", "k-auth", None),
            ("psub_1", "new-p256dh", "new-auth", None),
        ]
        await store.record_push_outcome("psub_3", "2026-01-06T00:00:00Z", "gone", 410)
        got = await other.get_push_subscription("psub_3")
        assert got is not None and (got.last_at, got.last_outcome, got.last_status) == (
            "2026-01-06T00:00:00Z",
            "gone",
            410,
        )
        assert not await store.delete_push_subscription("psub_3", "alice")  # not alice's
        assert await store.delete_push_subscription("psub_3", "bob")
        assert not await store.delete_push_subscription("psub_3", "bob")
        assert await store.get_push_subscription("psub_3") is None


async def test_a_gone_subscription_is_forgotten_only_while_its_endpoint_is_unchanged(opened: StoreFactory) -> None:
    async with opened() as store:
        assert await store.put_push_subscription(sub(1), max_per_user=5) == "psub_1"
        assert not await store.forget_push_subscription("psub_1", "https://push.example/other")
        assert await store.forget_push_subscription("psub_1", "https://push.example/1")
        assert await store.list_push_subscriptions("alice") == []
        await store.record_push_outcome("psub_1", "2026-01-06T00:00:00Z", "delivered", 201)  # gone: nothing


async def test_a_user_holds_at_most_max_per_user_subscriptions_but_may_renew_one(opened: StoreFactory) -> None:
    async with opened() as store:
        assert await store.put_push_subscription(sub(1), max_per_user=2)
        assert await store.put_push_subscription(sub(2), max_per_user=2)
        assert await store.put_push_subscription(sub(3), max_per_user=2) is None
        assert await store.put_push_subscription(sub(5, endpoint="https://push.example/2"), max_per_user=2) == "psub_2"
        assert await store.put_push_subscription(sub(3, "bob"), max_per_user=2) == "psub_3"
        assert [r.id for r in await store.list_push_subscriptions("alice")] == ["psub_1", "psub_2"]


async def test_revoking_a_user_deletes_their_subscriptions(opened: StoreFactory) -> None:
    async with opened() as store:
        assert await store.add_user("alice", "h-alice", admin=False)
        assert await store.put_push_subscription(sub(1), max_per_user=5)
        assert await store.put_push_subscription(sub(2, "bob"), max_per_user=5)
        assert await store.revoke_user("alice")
        assert await store.list_push_subscriptions("alice") == []
        assert [r.id for r in await store.list_push_subscriptions("bob")] == ["psub_2"]


async def test_a_postgres_database_of_the_previous_version_gets_the_push_table(pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        assert await pg_schema.migrate(conn, pg_schema.MIGRATIONS[:10]) == list(range(1, 11))
    async with opened_at(pg_url) as store:
        assert await store.put_push_subscription(sub(1), max_per_user=5) == "psub_1"
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT max(version) FROM schema_version")
        assert (await cur.fetchone()) == (pg_schema.SCHEMA_VERSION,) == (11,)


async def test_a_sqlite_file_of_the_previous_version_gets_the_push_table(tmp_path: Path) -> None:
    path = tmp_path / "bridge.db"
    async with opened_at(f"sqlite:///{path}"):
        pass
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("DROP TABLE push_subscriptions")
    db.execute("PRAGMA user_version=15")
    db.close()
    async with opened_at(f"sqlite:///{path}") as store:
        assert await store.put_push_subscription(sub(1), max_per_user=5) == "psub_1"
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == sqlite_sql.SCHEMA_VERSION == 16
    db.close()
