"""Users in the store (issue #20), both stores: users and the hashes of their tokens, a
revocation that also ends the user's browser sessions, thread owners in lists and in the
change log (a deleted thread's tombstone keeps its owner), and the migration from the
previous schema on PostgreSQL. Real SQLite files and a real PostgreSQL server."""

from __future__ import annotations

import psycopg
import pytest
from support.stores import StoreFactory, opened_at, thread

from bridge.store import pg_schema

pytestmark = pytest.mark.timeout(60)


async def test_users_are_added_found_by_token_hash_listed_and_revoked(opened: StoreFactory) -> None:
    async with opened() as store, opened("b") as other:
        assert await store.add_user("alice", "h-alice", admin=False)
        assert await store.add_user("root", "h-root", admin=True)
        assert not await store.add_user("alice", "h-again", admin=True)  # active: refused, unchanged
        found = await other.user_by_token("h-alice")  # another replica on the same store knows her
        assert found is not None and found[1] == "h-alice"
        assert (found[0].name, found[0].admin, found[0].revoked_at) == ("alice", False, None)
        assert await store.user_by_token("h-again") is None
        assert [(u.name, u.admin) for u in await store.list_users()] == [("alice", False), ("root", True)]

        await store.save_session("k-alice", 2e9, user="alice")
        await store.save_session("k-root", 2e9, user="root")
        await store.save_session("k-operator", 2e9)
        assert sorted(await store.load_sessions(0)) == [
            ("k-alice", 2e9, "alice"),
            ("k-operator", 2e9, None),
            ("k-root", 2e9, "root"),
        ]
        assert await other.revoke_user("alice")
        assert not await other.revoke_user("alice")  # already revoked
        assert not await other.revoke_user("nobody")
        assert await store.user_by_token("h-alice") is None
        gone = await store.get_user("alice")
        assert gone is not None and gone.revoked_at is not None
        assert sorted(k for k, _, _ in await store.load_sessions(0)) == ["k-operator", "k-root"]

        assert await store.add_user("alice", "h-new", admin=False)  # revoked: a new token, active again
        assert await store.user_by_token("h-alice") is None
        back = await store.user_by_token("h-new")
        assert back is not None and back[0].revoked_at is None


async def test_threads_are_listed_by_owner_and_the_change_log_keeps_a_deleted_threads_owner(
    opened: StoreFactory,
) -> None:
    async with opened() as store:
        await store.create_thread(thread("thr_a1", owner="alice"))  # type: ignore[arg-type]
        await store.create_thread(thread("thr_b1", "2026-11-30T00:00:01.000Z", owner="bob"))  # type: ignore[arg-type]
        await store.create_thread(thread("thr_a2", "2026-11-30T00:00:02.000Z", owner="alice"))  # type: ignore[arg-type]
        await store.create_thread(thread("thr_none", "2026-11-30T00:00:03.000Z"))  # type: ignore[arg-type]
        rows, _ = await store.list_threads(limit=10, cursor=None, agent=None, owner="alice")
        assert [r["id"] for r in rows] == ["thr_a2", "thr_a1"]
        page, cursor = await store.list_threads(limit=1, cursor=None, agent=None, owner="alice")
        assert [r["id"] for r in page] == ["thr_a2"] and cursor is not None
        page, cursor = await store.list_threads(limit=1, cursor=cursor, agent=None, owner="alice")
        assert [r["id"] for r in page] == ["thr_a1"] and cursor is None
        everyone, _ = await store.list_threads(limit=10, cursor=None, agent=None)
        assert [r["id"] for r in everyone] == ["thr_none", "thr_a2", "thr_b1", "thr_a1"]
        assert [r["owner"] for r in everyone] == [None, "alice", "bob", "alice"]

        assert await store.delete_thread("thr_b1")
        changes = await store.read_changes(0, 100)
        owners = {c.thread_id: (c.kind, c.owner if c.thread is None else c.thread.get("owner")) for c in changes}
        assert owners == {
            "thr_a1": ("thread.created", "alice"),
            "thr_a2": ("thread.created", "alice"),
            "thr_none": ("thread.created", None),
            "thr_b1": ("thread.deleted", "bob"),
        }


async def test_a_postgres_database_of_the_previous_version_gets_users_and_owners(pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        assert await pg_schema.migrate(conn, pg_schema.MIGRATIONS[:2]) == [1, 2]
        await conn.execute(
            "INSERT INTO threads (id, agent, protocol, cwd, state, created_at, updated_at) "
            "VALUES ('thr_old', 'a', 'stream-json', '/tmp', 'idle', 't', 't')"
        )
        await conn.execute("INSERT INTO browser_sessions (key, expires_at) VALUES ('k', 2e9)")
    async with opened_at(pg_url) as store:
        old = await store.get_thread("thr_old")
        assert old is not None and old["owner"] is None  # from before users: admins only
        assert await store.load_sessions(0) == [("k", 2e9, None)]
        assert await store.list_users() == []
        assert await store.add_user("alice", "h", admin=False)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT max(version) FROM schema_version")
        assert (await cur.fetchone()) == (pg_schema.SCHEMA_VERSION,) == (11,)
