"""Which store a URL names, made and opened (``serve``), or only migrated (``migrate``).

``sqlite:///…`` is the embedded default (one daemon per data dir); ``postgresql://…`` the
shared store several replicas use at once. The PostgreSQL driver (psycopg) is an optional
extra, imported only when such a URL is used.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from bridge.errors import StoreError
from bridge.store import urls
from bridge.store.base import Store, StoreListeners

log = structlog.get_logger("bridge.store")


def make_store(
    url: str, *, replica_id: str = "local", writer: str = "process", listeners: StoreListeners | None = None
) -> Store:
    """The store the URL names, not yet opened (ConfigError ``invalid_store_url``).
    ``writer``: SQLite's write connection in a writer process or on a thread;
    ``listeners``: who hears of its health and row changes (the store makes its own
    otherwise; more can subscribe later with ``store.listeners.add``)."""
    parsed = urls.parse(url)
    if parsed.kind == "sqlite":
        from bridge.store.sqlite import SqliteStore, WriterMode

        assert parsed.path is not None
        mode: WriterMode = "thread" if writer == "thread" else "process"
        return SqliteStore(parsed.path, replica_id=replica_id, writer=mode, listeners=listeners)
    from bridge.store.postgres import PostgresStore

    return PostgresStore(parsed, replica_id=replica_id, listeners=listeners)


async def open_store(
    url: str, *, replica_id: str = "local", writer: str = "process", listeners: StoreListeners | None = None
) -> Store:
    """Made and opened: the schema checked and migrated (PostgreSQL: under the migration
    advisory lock, so of several replicas starting at once exactly one migrates)."""
    store = make_store(url, replica_id=replica_id, writer=writer, listeners=listeners)
    await store.open()
    return store


def _shared(parsed: urls.StoreUrl) -> bool:
    """The ``shared`` capability of the store a URL names, asked of its class (not made)."""
    if parsed.kind == "sqlite":
        from bridge.store.sqlite import SqliteStore

        return SqliteStore.shared
    from bridge.store.postgres import PostgresStore

    return PostgresStore.shared


def check_before_serve(url: str, *, replica_id: str) -> None:
    """``serve``, before anything listens: a newer version's database is refused; a shared
    store is migrated here, under its advisory lock, and its replica_id checked, so a
    store that cannot be reached or an id in use is one clear line. (A SQLite store
    migrates itself when it opens.)"""
    check_schema(url)
    if _shared(urls.parse(url)):
        asyncio.run(migrate(url, replica_id=replica_id))


def check_schema(url: str) -> None:
    """Before anything opens a SQLite store for writing: a newer version's file refused.
    (PostgreSQL's version is checked under the migration lock, at open.)"""
    parsed = urls.parse(url)
    if parsed.kind == "sqlite":
        from bridge.store.sqlite import check_schema as check_sqlite

        assert parsed.path is not None
        check_sqlite(parsed.path)


async def migrate(url: str, *, replica_id: str | None = None) -> list[int]:
    """Create or upgrade the schema the URL names; the versions applied (``agent-bridge
    migrate``, and ``serve`` before it starts). SQLite migrates itself at open, so this
    opens and closes it. With ``replica_id`` (PostgreSQL), also refuse
    (``replica_id_in_use``) when a live process holds that replica's lock, so ``serve``
    says so in one line before it starts (the lock itself is taken by the store at open)."""
    parsed = urls.parse(url)
    if parsed.kind == "sqlite":
        from bridge.store.sqlite import SCHEMA_VERSION, SqliteStore
        from bridge.store.sqlite import check_schema as check_sqlite

        assert parsed.path is not None
        before = _sqlite_version(parsed.path)
        check_sqlite(parsed.path)
        store = SqliteStore(parsed.path, writer="thread")  # one migration: no process to start
        await store.open()
        await store.close()
        return list(range(before + 1, SCHEMA_VERSION + 1))
    import psycopg

    from bridge.store import pg_schema

    try:
        conn = await psycopg.AsyncConnection.connect(parsed.url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise StoreError(
            f"cannot connect to {parsed.shown}: {parsed.scrub(str(exc)).strip()}", code="store_unavailable"
        ) from exc
    try:
        applied = await pg_schema.migrate(conn)
        if replica_id is not None and await pg_schema.replica_locked(conn, replica_id):
            raise pg_schema.replica_in_use(replica_id)
        return applied
    except psycopg.Error as exc:
        raise StoreError(f"migration failed on {parsed.shown}: {parsed.scrub(str(exc)).strip()}") from exc
    finally:
        await conn.close()


def _sqlite_version(path: Path) -> int:
    import sqlite3

    if not path.exists():
        return 0
    db = sqlite3.connect(path)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()
