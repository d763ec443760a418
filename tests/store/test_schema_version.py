"""A database a newer agent-bridge wrote (``PRAGMA user_version`` above ours) is refused
with a clear message and left exactly as it was (issue #15)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.errors import StoreError
from bridge.store.base import EVENT_OVERHEAD
from bridge.store.sqlite import SCHEMA_VERSION, SqliteStore


def newer_db(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE future (x)")
    db.execute("PRAGMA user_version=99")
    db.commit()
    db.close()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def untouched(path: Path, digest: str) -> None:
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 99
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # never switched to WAL
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["future"]
    finally:
        db.close()


async def test_the_store_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "bridge.db"
    digest = newer_db(path)
    store = SqliteStore(path)
    with pytest.raises(StoreError) as exc:
        await store.open()
    assert exc.value.code == "schema_too_new"
    assert "99" in exc.value.message and str(SCHEMA_VERSION) in exc.value.message
    await store.close()
    untouched(path, digest)


def test_serve_refuses_a_newer_schema_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    digest = newer_db(data / "bridge.db")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    r = subprocess.run(
        [sys.executable, "-m", "bridge", "serve", "--port", "0", "--no-auth", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "listening" not in r.stdout
    assert "schema version 99" in r.stderr and "newer" in r.stderr, r.stderr
    untouched(data / "bridge.db", digest)


async def test_a_database_of_the_previous_version_is_upgraded_with_its_rows(tmp_path: Path) -> None:
    """Migrations 6 (the change log), 7 (leases, replicas, unique client ids) and 8 (users,
    thread owners) on a file an older daemon wrote."""
    import bridge.store.sqlite as sqlite_store

    path = tmp_path / "bridge.db"
    db = sqlite3.connect(path)
    for i, ddl in enumerate(sqlite_store._MIGRATIONS[:5], start=1):
        db.executescript(ddl)
        db.execute(f"PRAGMA user_version={i}")
    db.execute(
        "INSERT INTO threads (id, agent, protocol, cwd, state, created_at, updated_at) "
        "VALUES ('thr_1', 'a', 'stream-json', '/tmp', 'running', 't', 't')"
    )
    db.execute(
        "INSERT INTO events (thread_id, seq, ts, source, kind, data, client_id) "
        "VALUES ('thr_1', 1, 't', 'client', 'message', '{}', 'c1')"
    )
    db.commit()
    db.close()
    store = SqliteStore(path, replica_id="r")
    await store.open()
    try:
        assert [r["id"] for r in await store.live_threads()] == ["thr_1"]  # its rows are still this replica's
        assert await store.find_client_event("thr_1", "c1") == 1
        assert await store.acquire_lease("thr_1", "r", 5) == 1
        row = await store.get_thread("thr_1")
        assert row is not None and row["owner"] is None  # a thread from before users: admins only
        # migration 12 measured its transcript: the one event's data and its row (issue #36)
        assert row["transcript_bytes"] == len("{}") + EVENT_OVERHEAD
        assert await store.list_users() == []
    finally:
        await store.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 16
    finally:
        db.close()
