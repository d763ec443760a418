"""Versioned migrations of the PostgreSQL store (issue #18): a fresh database gets every
step, a second run none, replicas starting at once migrate exactly once (the advisory
lock), a newer schema is refused untouched; ``agent-bridge migrate`` for both stores; a
store URL's password is never shown."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.postgres import PASSWORD

from bridge.config import load_settings
from bridge.errors import ConfigError, StoreError
from bridge.store import factory, pg_schema, urls
from bridge.store.postgres import PostgresStore
from bridge.store.sqlite import SCHEMA_VERSION as SQLITE_VERSION

pytestmark = pytest.mark.timeout(60)


async def versions(url: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT version FROM schema_version ORDER BY version")
        return [r[0] for r in await cur.fetchall()]


async def test_fresh_then_idempotent(pg_url: str) -> None:
    async with asyncio.timeout(30):
        assert await factory.migrate(pg_url) == list(range(1, pg_schema.SCHEMA_VERSION + 1))
        assert await factory.migrate(pg_url) == []
        assert await versions(pg_url) == list(range(1, pg_schema.SCHEMA_VERSION + 1))
        store = PostgresStore(urls.parse(pg_url))
        await store.open()  # migrated already: opens, applies nothing
        await store.close()
        assert await versions(pg_url) == list(range(1, pg_schema.SCHEMA_VERSION + 1))


async def test_concurrent_migrations_run_exactly_once(pg_url: str) -> None:
    """Six replicas start at once against an empty database: one applies each step (the
    others wait on the lock, then find it done), and a slow step shows they did wait."""
    slow = ["CREATE TABLE a (x int); SELECT pg_sleep(0.3)", "CREATE TABLE b (x int)"]
    conns = [await psycopg.AsyncConnection.connect(pg_url, autocommit=True) for _ in range(6)]
    try:
        async with asyncio.timeout(30):
            applied = await asyncio.gather(*(pg_schema.migrate(c, slow) for c in conns))
    finally:
        for c in conns:
            await c.close()
    assert sorted(applied, key=len) == [[]] * 5 + [[1, 2]]
    assert await versions(pg_url) == [1, 2]


async def test_store_opens_concurrently_on_an_empty_database(pg_url: str) -> None:
    stores = [PostgresStore(urls.parse(pg_url), replica_id=f"r{i}") for i in range(4)]
    async with asyncio.timeout(30):
        await asyncio.gather(*(s.open() for s in stores))
        for s in stores:
            await s.close()
    assert await versions(pg_url) == list(range(1, pg_schema.SCHEMA_VERSION + 1))


async def test_a_newer_schema_is_refused_untouched(pg_url: str) -> None:
    async with asyncio.timeout(30):
        await factory.migrate(pg_url)
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute("INSERT INTO schema_version (version) VALUES (99)")
        with pytest.raises(StoreError) as exc:
            await factory.migrate(pg_url)
        assert exc.value.code == "schema_too_new" and "99" in exc.value.message
        store = PostgresStore(urls.parse(pg_url))
        with pytest.raises(StoreError) as exc:
            await store.open()
        assert exc.value.code == "schema_too_new"
        await store.close()
        assert (await versions(pg_url))[-1] == 99


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    return subprocess.run(
        [sys.executable, "-m", "bridge", "migrate", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**base, **(env or {})},
        check=False,
    )


def test_migrate_command_postgres(pg_url: str) -> None:
    first = cli("--store-url", pg_url)
    assert first.returncode == 0, first.stderr
    assert f"applied {', '.join(map(str, range(1, pg_schema.SCHEMA_VERSION + 1)))}" in first.stdout
    again = cli(env={"AGENT_BRIDGE_STORE_URL": pg_url})
    assert again.returncode == 0 and "up to date" in again.stdout, again.stderr
    for out in (first, again):
        assert PASSWORD not in out.stdout + out.stderr and "bridge:***@" in out.stdout


def test_migrate_command_sqlite(tmp_path: Path) -> None:
    first = cli("--data-dir", str(tmp_path / "data"))
    assert first.returncode == 0, first.stderr
    assert f"applied {', '.join(map(str, range(1, SQLITE_VERSION + 1)))}" in first.stdout
    assert (tmp_path / "data" / "bridge.db").exists()
    again = cli("--store-url", f"sqlite:///{tmp_path / 'data' / 'bridge.db'}")
    assert again.returncode == 0 and "up to date" in again.stdout, again.stderr


def test_an_unreachable_store_is_one_clear_line_without_the_password(postgres: Any) -> None:
    wrong_db = postgres.url("no_such_database")
    r = cli("--store-url", wrong_db)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "no_such_database" in r.stderr and "bridge:***@" in r.stderr
    assert PASSWORD not in r.stdout + r.stderr
    wrong_password = postgres.url("postgres", password="not-the-password-42")
    r = cli("--store-url", wrong_password)
    assert r.returncode == 2 and "password authentication failed" in r.stderr, r.stderr
    assert "not-the-password-42" not in r.stderr


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://u:hunter2@h/db", "scheme must be sqlite or postgresql"),
        ("sqlite://u:hunter2@relative/path.db", "sqlite:///<absolute path>"),
        ("postgresql://u:hunter2@h:port/db", "port is not a number"),
        ("postgresql://u:hunter2@h/db?bogus=1", "bogus"),
        ("postgresql://u@h/db?password=hunter2&bogus=1", "bogus"),
    ],
)
def test_a_bad_store_url_is_a_config_error_without_the_password(url: str, says: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(env={"AGENT_BRIDGE_STORE_URL": url, "HOME": str(tmp_path)}, discover_path=False)
    assert exc.value.code == "invalid_store_url" and says in exc.value.message
    assert "hunter2" not in exc.value.message and "***" in exc.value.message


def test_redact_and_scrub() -> None:
    url = "postgresql://bridge:p%40ss%2Fw@db:5432/bridge?sslmode=require&password=other"
    shown = urls.redact(url)
    assert "p%40ss" not in shown and "other" not in shown and shown.startswith("postgresql://bridge:***@db:5432/")
    text = "failed for p@ss/w and p%40ss%2Fw and other"
    assert urls.scrub(text, url) == "failed for *** and *** and ***"
    assert urls.redact("postgresql://db/bridge") == "postgresql://db/bridge"


def test_store_and_cluster_settings(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    s = load_settings(env=env, data_dir=str(tmp_path / "d"), discover_path=False)
    assert s.store_url == f"sqlite:///{tmp_path / 'd' / 'bridge.db'}"
    assert s.cluster.lease_ttl_s == 15 and s.cluster.replica_id.endswith(f"-{os.getpid()}")
    cfg = tmp_path / "c.toml"
    cfg.write_text('[store]\nurl = "postgresql://db/x"\n[cluster]\nreplica_id = "a"\nlease_ttl_s = 5\n')
    s = load_settings(config=str(cfg), env=env, discover_path=False)
    assert (s.store_url, s.cluster.replica_id, s.cluster.lease_ttl_s) == ("postgresql://db/x", "a", 5)
    s = load_settings(
        config=str(cfg),
        env={**env, "AGENT_BRIDGE_STORE_URL": "postgresql://db2/y", "AGENT_BRIDGE_REPLICA_ID": "b"},
        discover_path=False,
    )
    assert (s.store_url, s.cluster.replica_id) == ("postgresql://db2/y", "b")
    cfg.write_text("[cluster]\nlease_ttl_s = 0\n")
    with pytest.raises(ConfigError, match=r"\[cluster\]"):
        load_settings(config=str(cfg), env=env, discover_path=False)
    cfg.write_text("[store]\nuri = 'x'\n")
    with pytest.raises(ConfigError, match=r"\[store\]"):
        load_settings(config=str(cfg), env=env, discover_path=False)


def test_bus_url_and_replica_id_are_checked_and_the_password_never_shown(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    base = {"env": env, "data_dir": str(tmp_path / "d"), "discover_path": False}
    assert load_settings(**base).cluster.bus_url is None
    s = load_settings(**{**base, "env": {**env, "AGENT_BRIDGE_BUS_URL": "redis://:pw@r:6379/0"}})
    assert s.cluster.bus_url == "redis://:pw@r:6379/0"
    for bad in ("http://:hunter2@r/0", "r:6379"):
        with pytest.raises(ConfigError, match="bus_url") as err:
            load_settings(**{**base, "env": {**env, "AGENT_BRIDGE_BUS_URL": bad}})
        assert "hunter2" not in str(err.value)
    for bad_id in ("a b", "-a", "x" * 129, "a/b"):
        with pytest.raises(ConfigError, match="replica_id"):
            load_settings(**{**base, "env": {**env, "AGENT_BRIDGE_REPLICA_ID": bad_id}})
