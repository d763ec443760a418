"""The PostgreSQL store's schema: numbered migrations, applied in order, each in its own
transaction that also records it in ``schema_version``; all of it under one advisory lock,
so of several replicas starting at once exactly one migrates and the others wait for it
and then find nothing to do (``agent-bridge migrate`` and ``serve`` both call
:func:`migrate`). A database whose version is above :data:`SCHEMA_VERSION` was written by
a newer agent-bridge and is refused (``schema_too_new``) before anything is written.

The tables mirror the SQLite store's (bridge/store/sqlite.py) column for column, so the
two stores read and write the same rows; timestamps the daemon writes (``created_at``,
``updated_at``, event ``ts``) stay the ISO text they are in SQLite, lease and heartbeat
times are the database's own ``timestamptz``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bridge.errors import StoreError
from bridge.store import push_sql, search_pg, usage_pg
from bridge.store.base import EVENT_OVERHEAD
from bridge.store.rows import ROW_SIZE

# pg_advisory_lock(int4, int4) keys: the first says "agent-bridge", the second what for.
LOCK_CLASS = 0x61620000  # "ab\0\0"
MIGRATE_LOCK = 1
CREATE_LOCK = 2  # thread creation, counted against [capacity] max_threads (PostgresStore.creation_lock)
REPLICA_LOCK_CLASS = 0x61620001  # with hashtext(replica_id) as the second key
SECRETS_LOCK_CLASS = 0x61620002  # with hashtext(user) as the second key: one user's secret writes in turn
PUSH_LOCK_CLASS = 0x61620003  # the same for one user's push subscriptions

# A step: its DDL, or a function that runs its statements on the connection (in the step's
# transaction, like DDL).
Step = str | Callable[[Any], Awaitable[Any]]

MIGRATIONS: list[Step] = [
    # 1: everything SQLite's migrations 1-6 built: threads (with leases and the replica
    # that recorded the process), transcripts, browser sessions, replicas.
    """
    CREATE TABLE threads (
        id text PRIMARY KEY,
        agent text NOT NULL,
        protocol text NOT NULL,
        model text,
        cwd text NOT NULL,
        title text NOT NULL DEFAULT '',
        native_session_id text,
        state text NOT NULL,
        turn_active boolean NOT NULL DEFAULT false,
        last_seq bigint NOT NULL DEFAULT 0,
        created_at text NOT NULL,
        updated_at text NOT NULL,
        last_exit text,
        options text NOT NULL DEFAULT '{}',
        pid integer,
        pid_start bigint,
        agent_info text,
        tasks text,
        replica_id text,
        lease_owner text,
        lease_epoch bigint NOT NULL DEFAULT 0,
        lease_expires timestamptz
    );
    CREATE INDEX threads_by_activity ON threads (updated_at DESC, id DESC);
    CREATE INDEX threads_by_lease_owner ON threads (lease_owner) WHERE lease_owner IS NOT NULL;
    CREATE INDEX threads_live ON threads (replica_id)
        WHERE state IN ('starting', 'running', 'stopping') OR turn_active;
    CREATE TABLE events (
        thread_id text NOT NULL,
        seq bigint NOT NULL,
        ts text NOT NULL,
        source text NOT NULL,
        kind text NOT NULL,
        data text NOT NULL,
        raw text,
        relay boolean NOT NULL DEFAULT false,
        client_id text,
        PRIMARY KEY (thread_id, seq)
    );
    CREATE UNIQUE INDEX events_by_client_id ON events (thread_id, client_id) WHERE client_id IS NOT NULL;
    CREATE TABLE browser_sessions (
        key text PRIMARY KEY,
        expires_at double precision NOT NULL
    );
    CREATE TABLE replicas (
        replica_id text PRIMARY KEY,
        instance text NOT NULL,
        url text,
        started_at text NOT NULL,
        heartbeat_at timestamptz NOT NULL
    );
    """,
    # 2: the change log (GET /v1/events) and the pending permission count: SQLite's
    # migration 6. Existing threads get change_seqs 1..n in order of activity, each as its
    # own creation; the one-row counter carries on from there.
    """
    ALTER TABLE threads ADD COLUMN pending_permissions integer NOT NULL DEFAULT 0;
    ALTER TABLE threads ADD COLUMN change_seq bigint NOT NULL DEFAULT 0;
    ALTER TABLE threads ADD COLUMN created_seq bigint NOT NULL DEFAULT 0;
    UPDATE threads t SET change_seq = n.n, created_seq = n.n
        FROM (SELECT id, row_number() OVER (ORDER BY updated_at, id) AS n FROM threads) n
        WHERE t.id = n.id;
    CREATE UNIQUE INDEX threads_by_change ON threads (change_seq);
    CREATE TABLE thread_tombstones (
        thread_id text PRIMARY KEY,
        change_seq bigint NOT NULL,
        deleted_at text NOT NULL
    );
    CREATE UNIQUE INDEX tombstones_by_change ON thread_tombstones (change_seq);
    CREATE TABLE change_log (
        id integer PRIMARY KEY CHECK (id = 1),
        latest bigint NOT NULL,
        horizon bigint NOT NULL
    );
    INSERT INTO change_log (id, latest, horizon) SELECT 1, coalesce(max(change_seq), 0), 0 FROM threads;
    """,
    # 3: users (issue #20), SQLite's migration 8: who created each thread (and each deleted
    # one), whose each browser session is, and the users with the hashes of their tokens.
    """
    ALTER TABLE threads ADD COLUMN owner text;
    CREATE INDEX threads_by_owner ON threads (owner, updated_at DESC, id DESC) WHERE owner IS NOT NULL;
    ALTER TABLE thread_tombstones ADD COLUMN owner text;
    ALTER TABLE browser_sessions ADD COLUMN user_name text;
    CREATE TABLE users (
        name text PRIMARY KEY,
        token_hash text UNIQUE,
        admin boolean NOT NULL DEFAULT false,
        created_at text NOT NULL,
        revoked_at text
    );
    """,
    # 4: each event's envelope stored at commit (issue #22), SQLite's migration 9: ``env``,
    # the bytes a client is sent for it in events mode, and the byte offsets of ``data``
    # and ``raw`` in it; a new row's ``data`` is '' and its ``raw`` NULL. Rows written
    # before keep their columns (``env`` NULL) and are read as before: no back-fill.
    """
    ALTER TABLE events ADD COLUMN env bytea;
    ALTER TABLE events ADD COLUMN data_at integer;
    ALTER TABLE events ADD COLUMN raw_at integer;
    """,
    # 5: per-user secrets (issue #32), SQLite's migration 10: a user's values for an agent
    # profile as AES-GCM nonce and ciphertext only (bridge/user_secrets.py).
    """
    CREATE TABLE user_secrets (
        user_name text NOT NULL,
        profile text NOT NULL,
        key text NOT NULL,
        nonce bytea NOT NULL,
        ciphertext bytea NOT NULL,
        updated_at text NOT NULL,
        PRIMARY KEY (user_name, profile, key)
    );
    """,
    # 6: the version of each stored envelope's format (bridge/store/rows.py WIRE_VERSION),
    # SQLite's migration 11; rows written before stay NULL, read as version 1. Adding a
    # column with no default rewrites nothing.
    """
    ALTER TABLE events ADD COLUMN wire smallint;
    """,
    # 7: what each thread's transcript holds (issue #36, [capacity] max_transcript_mb),
    # SQLite's migration 12: kept by the append's transaction (pg_commit), existing threads
    # measured once here by their stored rows (a TOASTed env's length is read without it).
    f"""
    ALTER TABLE threads ADD COLUMN transcript_bytes bigint NOT NULL DEFAULT 0;
    ALTER TABLE threads ADD COLUMN transcript_seq bigint NOT NULL DEFAULT 0;
    UPDATE threads t SET transcript_bytes = s.bytes, transcript_seq = s.seq
        FROM (SELECT thread_id, sum({ROW_SIZE} + {EVENT_OVERHEAD}) AS bytes, max(seq) AS seq
              FROM events GROUP BY thread_id) s
        WHERE t.id = s.thread_id;
    """,  # noqa: S608 (constants of the code)
    # 8: full-text search and archived threads (issue #38, bridge/store/search_pg.py),
    # SQLite's migration 13.
    search_pg.migrate,  # (DDL, then the events already stored indexed)
    # 9: what turns used (issue #38, bridge/store/usage_pg.py), SQLite's migration 14.
    usage_pg.migrate,  # (DDL, then the turn ends already stored recorded)
    # 10: where a fork came from, a thread's own git worktree (issue #38; JSON text), SQLite's 15.
    """
    ALTER TABLE threads ADD COLUMN forked_from text;
    ALTER TABLE threads ADD COLUMN worktree text;
    """,
    # 11: Web Push subscriptions (issue #39, bridge/store/push_sql.py), SQLite's 16.
    push_sql.PG_MIGRATION,
]

SCHEMA_VERSION = len(MIGRATIONS)

_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


def schema_too_new(version: int) -> StoreError:
    return StoreError(
        f"the PostgreSQL database has schema version {version}, newer than this agent-bridge's "
        f"({SCHEMA_VERSION}): it was written by a newer version; run that version, or use another database",
        code="schema_too_new",
    )


async def current_version(conn: Any) -> int:
    """The applied version (0: none); no table is created to find out."""
    cur = await conn.execute("SELECT to_regclass('schema_version') IS NOT NULL")
    row = await cur.fetchone()
    if not row or not row[0]:
        return 0
    cur = await conn.execute("SELECT coalesce(max(version), 0) FROM schema_version")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def check(conn: Any) -> int:
    """The version, refused (``schema_too_new``) when it is newer than ours."""
    version = await current_version(conn)
    if version > SCHEMA_VERSION:
        raise schema_too_new(version)
    return version


async def migrate(conn: Any, migrations: list[Step] | None = None) -> list[int]:
    """Bring the schema up to date on ``conn`` (an autocommit psycopg connection) under the
    migration lock; the versions this call applied (empty: it was up to date)."""
    steps = MIGRATIONS if migrations is None else migrations
    await conn.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, MIGRATE_LOCK))
    try:
        version = await check(conn) if migrations is None else await current_version(conn)
        if version > len(steps):
            raise schema_too_new(version)
        applied: list[int] = []
        for number, ddl in enumerate(steps[version:], start=version + 1):
            async with conn.transaction():
                await conn.execute(_VERSION_TABLE)
                await (ddl(conn) if callable(ddl) else conn.execute(ddl))
                await conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (number,))
            applied.append(number)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, MIGRATE_LOCK))


def replica_in_use(replica_id: str) -> StoreError:
    return StoreError(
        f"replica_id {replica_id!r} is in use by another live process on this store: "
        "give each replica its own ([cluster] replica_id, AGENT_BRIDGE_REPLICA_ID)",
        code="replica_id_in_use",
    )


async def try_replica_lock(conn: Any, replica_id: str) -> bool:
    """Take the replica's session-level lock on ``conn`` (held until it is closed)."""
    cur = await conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (REPLICA_LOCK_CLASS, replica_id))
    row = await cur.fetchone()
    return bool(row and row[0])


async def replica_locked(conn: Any, replica_id: str) -> bool:
    """Whether a live session holds the replica's lock (taken and given back at once)."""
    if not await try_replica_lock(conn, replica_id):
        return True
    await conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (REPLICA_LOCK_CLASS, replica_id))
    return False
