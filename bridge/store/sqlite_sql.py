"""The SQL of the SQLite store that runs where the write connection lives: the writer
thread (``[store] writer = "thread"``) or the writer process (bridge/store/writer.py,
``"process"``). Nothing here imports asyncio or logging, so the writer process starts in a
few tens of milliseconds. Every write the store makes is one of ``OPS`` (a name and plain
arguments, so it can cross the pipe) or a batch of appends (``commit``).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Sequence

    from bridge.protocols.events import Record

from bridge.errors import StoreError
from bridge.protocols.envelope import json_name, json_ts
from bridge.store import push_sql
from bridge.store import search_sqlite as search
from bridge.store import sqlite_accounts_sql as accounts
from bridge.store import sqlite_leases as leases
from bridge.store import usage_sqlite as usage
from bridge.store.base import CHANGE_COLUMNS, EVENT_OVERHEAD, TOMBSTONE_KEEP
from bridge.store.rows import COLUMNS_SQL, ROW_SIZE, WIRE_VERSION

_MIGRATIONS: list[str] = [
    # 1: threads and their transcripts
    """
    CREATE TABLE threads (
        id TEXT PRIMARY KEY,
        agent TEXT NOT NULL,
        protocol TEXT NOT NULL,
        model TEXT,
        cwd TEXT NOT NULL,
        title TEXT NOT NULL DEFAULT '',
        native_session_id TEXT,
        state TEXT NOT NULL,
        turn_active INTEGER NOT NULL DEFAULT 0,
        last_seq INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        last_exit TEXT,
        options TEXT NOT NULL DEFAULT '{}',
        pid INTEGER
    );
    CREATE INDEX threads_by_activity ON threads(updated_at DESC, id DESC);
    CREATE TABLE events (
        thread_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        ts TEXT NOT NULL,
        source TEXT NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        raw TEXT,
        relay INTEGER NOT NULL DEFAULT 0,
        client_id TEXT,
        PRIMARY KEY (thread_id, seq)
    ) WITHOUT ROWID;
    CREATE INDEX events_by_client_id ON events(thread_id, client_id) WHERE client_id IS NOT NULL;
    """,
    # 2: the agent's start time, so a later daemon can tell its process group from a
    # recycled pid (process/reaper.py)
    """
    ALTER TABLE threads ADD COLUMN pid_start INTEGER;
    """,
    # 3: what an ACP agent said about itself in initialize (capabilities, info, version)
    """
    ALTER TABLE threads ADD COLUMN agent_info TEXT;
    """,
    # 4: the sub-agent / workflow task table (sessions/tasks.py, its own JSON)
    """
    ALTER TABLE threads ADD COLUMN tasks TEXT;
    """,
    # 5: browser sessions, so a daemon restart does not sign every page out. Only a keyed
    # hash of each session id is kept (api/auth.py Sessions), never the id itself.
    """
    CREATE TABLE browser_sessions (
        key TEXT PRIMARY KEY,
        expires_at REAL NOT NULL
    ) WITHOUT ROWID;
    """,
    # 6: the change log (GET /v1/events) and the pending permission count. Existing threads
    # get change_seqs 1..n in order of activity, each as its own creation.
    """
    ALTER TABLE threads ADD COLUMN pending_permissions INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE threads ADD COLUMN change_seq INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE threads ADD COLUMN created_seq INTEGER NOT NULL DEFAULT 0;
    UPDATE threads SET change_seq = (SELECT n FROM (SELECT id AS rid, row_number() OVER
        (ORDER BY updated_at, id) AS n FROM threads) WHERE rid = threads.id);
    UPDATE threads SET created_seq = change_seq;
    CREATE UNIQUE INDEX threads_by_change ON threads(change_seq);
    CREATE TABLE thread_tombstones (
        thread_id TEXT PRIMARY KEY,
        change_seq INTEGER NOT NULL,
        deleted_at TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX tombstones_by_change ON thread_tombstones(change_seq);
    CREATE TABLE change_log (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        latest INTEGER NOT NULL,
        horizon INTEGER NOT NULL
    );
    INSERT INTO change_log (id, latest, horizon) SELECT 1, coalesce(max(change_seq), 0), 0 FROM threads;
    """,
]
# 7: leases, replicas and the replica that recorded a thread's process (issue #18); the
# same schema as PostgreSQL's (bridge/store/pg_schema.py), so both stores share one
# protocol. A client_id is unique per thread in the database itself.
_MIGRATIONS.append(
    """
    ALTER TABLE threads ADD COLUMN lease_owner TEXT;
    ALTER TABLE threads ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE threads ADD COLUMN lease_expires REAL;
    ALTER TABLE threads ADD COLUMN replica_id TEXT;
    CREATE INDEX threads_by_lease_owner ON threads(lease_owner) WHERE lease_owner IS NOT NULL;
    DROP INDEX events_by_client_id;
    CREATE UNIQUE INDEX events_by_client_id ON events(thread_id, client_id) WHERE client_id IS NOT NULL;
    CREATE TABLE replicas (
        replica_id TEXT PRIMARY KEY,
        instance TEXT NOT NULL,
        url TEXT,
        started_at TEXT NOT NULL,
        heartbeat_at REAL NOT NULL
    ) WITHOUT ROWID;
    """
)

# 8: users (issue #20): who created each thread (and each deleted one), whose each browser
# session is, and the users with the hashes of their tokens (never a token). The same as
# PostgreSQL's migration 3.
_MIGRATIONS.append(
    """
    ALTER TABLE threads ADD COLUMN owner TEXT;
    CREATE INDEX threads_by_owner ON threads(owner, updated_at DESC, id DESC) WHERE owner IS NOT NULL;
    ALTER TABLE thread_tombstones ADD COLUMN owner TEXT;
    ALTER TABLE browser_sessions ADD COLUMN user_name TEXT;
    CREATE TABLE users (
        name TEXT PRIMARY KEY,
        token_hash TEXT UNIQUE,
        admin INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        revoked_at TEXT
    ) WITHOUT ROWID;
    """
)

# 9: each event's envelope stored at commit (issue #22): ``env``, the bytes a client is sent
# for it in events mode, and the offsets of ``data`` and ``raw`` in it
# (bridge/protocols/envelope.py stored_envelope), so a replayed row is one column and
# ``data``/``raw`` are not stored twice (a new row's ``data`` is '' and ``raw`` NULL). Rows
# written before stay as they are (``env`` NULL) and are read as before: no back-fill; a
# partial index of them (new rows never enter it) tells a replay page whether it holds any.
_MIGRATIONS.append(
    """
    ALTER TABLE events ADD COLUMN env BLOB;
    ALTER TABLE events ADD COLUMN data_at INTEGER;
    ALTER TABLE events ADD COLUMN raw_at INTEGER;
    CREATE INDEX events_without_env ON events(thread_id, seq) WHERE env IS NULL;
    """
)

# 10: per-user secrets (issue #32): a user's values for an agent profile, as AES-GCM nonce
# and ciphertext only (bridge/user_secrets.py). The same as PostgreSQL's migration 5.
_MIGRATIONS.append(
    """
    CREATE TABLE user_secrets (
        user_name TEXT NOT NULL,
        profile TEXT NOT NULL,
        key TEXT NOT NULL,
        nonce BLOB NOT NULL,
        ciphertext BLOB NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (user_name, profile, key)
    ) WITHOUT ROWID;
    """
)

# 11: the version of each stored envelope's format (bridge/store/rows.py WIRE_VERSION), so
# that a change of the wire format is a branch of the read path, not a rewrite of the rows.
# Rows written before stay NULL: they are version 1. The same as PostgreSQL's migration 6.
_MIGRATIONS.append(
    """
    ALTER TABLE events ADD COLUMN wire INTEGER;
    """
)

# 12: what each thread's transcript holds ([capacity] max_transcript_mb) and the seq it counts
# up to: owed to the row like last_seq, the events after it added at open (``_REPAIR_SIZE``);
# existing threads measured once here. PostgreSQL's migration 7.
_MIGRATIONS.append(
    f"""
    ALTER TABLE threads ADD COLUMN transcript_bytes INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE threads ADD COLUMN transcript_seq INTEGER NOT NULL DEFAULT 0;
    UPDATE threads SET
        transcript_bytes = (SELECT coalesce(sum({ROW_SIZE} + {EVENT_OVERHEAD}), 0) FROM events
            WHERE thread_id = threads.id),
        transcript_seq = (SELECT coalesce(max(seq), 0) FROM events WHERE thread_id = threads.id);
    """  # noqa: S608 (constants of the code)
)
_MIGRATIONS.append(search.MIGRATION)  # 13: full-text search, archived threads (issue #38); PostgreSQL's 8
_MIGRATIONS.append(usage.MIGRATION)  # 14: what turns used (issue #38); PostgreSQL's 9
# 15: where a fork came from, a thread's own git worktree (issue #38; JSON); PostgreSQL's 10.
_MIGRATIONS.append(
    """
    ALTER TABLE threads ADD COLUMN forked_from TEXT;
    ALTER TABLE threads ADD COLUMN worktree TEXT;
    """
)
_MIGRATIONS.append(push_sql.MIGRATION)  # 16: Web Push subscriptions (issue #39); PostgreSQL's 11

SCHEMA_VERSION = len(_MIGRATIONS)

# An event's data and raw, from its envelope or (rows from before migration 9) its columns.
DATA_SQL = (
    "CASE WHEN env IS NULL THEN data ELSE "
    "CAST(substr(env,data_at+1,coalesce(raw_at-7,length(env)-12)-data_at) AS TEXT) END"
)
RAW_SQL = "CASE WHEN env IS NULL THEN raw ELSE CAST(substr(env,raw_at+1,length(env)-raw_at-1) AS TEXT) END"
# An append's row as inserted (``_insert_rows``).
# The version marker is a constant of the statement: no work a row.
_WIRE = f"'',{int(WIRE_VERSION)}"
INSERT_EVENTS = (
    "INSERT INTO events (thread_id,seq,ts,source,kind,env,data_at,raw_at,relay,client_id,data,wire)"  # noqa: S608
    f" VALUES (?,?,?,?,?,?,?,?,?,?,{_WIRE})"
)
# A flood's rows go in INSERT_CHUNK at a time, in one statement (issue #22): a statement
# executed once for 64 rows costs SQLite and the sqlite3 module about 0.75 µs a row less
# than one executed 64 times (python -m bench.writer_rows). One fixed size, so one
# prepared statement; the rest of an append (and every small one) row by row.
INSERT_CHUNK = 64
INSERT_EVENTS_CHUNK = INSERT_EVENTS + f",(?,?,?,?,?,?,?,?,?,?,{_WIRE})" * (INSERT_CHUNK - 1)


# An append's events on their way to the write connection, a list a column: seq, ts,
# source, kind, data (JSON text), raw, relay (0/1), client_id, every list as long; () for
# an append without events. Columns, not a tuple a row (issue #22): marshal writes and
# reads a flood batch's columns faster (python -m bench.writer_rows: 0.85× and 0.80× a
# row), and the writer takes ``thread_id`` from the append, not from every row.
Rows = tuple[list[Any], ...]
SEQ, TS, SOURCE, KIND, DATA, RAW, RELAY, CLIENT_ID = range(8)


def rows_of(records: Sequence[Record], client_ids: Sequence[str | None]) -> Rows:
    """An append's records (and each one's client id) as ``Rows``."""
    if len(client_ids) != len(records):
        raise ValueError(f"{len(records)} records and {len(client_ids)} client ids")
    if not records:
        return ()
    if len(records) == 1:  # (most of a chat's appends: half the time of the loops below)
        r = records[0]
        return ([r.seq], [r.ts], [r.source], [r.kind], [r.data_json], [r.raw], [int(r.relay)], [client_ids[0]])
    return (
        [r.seq for r in records],
        [r.ts for r in records],
        [r.source for r in records],
        [r.kind for r in records],
        [r.data_json for r in records],
        [r.raw for r in records],
        [int(r.relay) for r in records],
        list(client_ids),
    )


def row_count(rows: Rows) -> int:
    return len(rows[SEQ]) if rows else 0


@dataclass(slots=True)
class _Append:
    thread_id: str
    rows: Rows
    fields: dict[str, Any]  # thread columns written in the same transaction
    done: asyncio.Future[None] | None  # None: nobody waits (a timed flush)
    # (updated_at, last_seq, turn_active, size): for an append, what the thread row owes
    # once it commits; for a flush item (no rows), written with max() for the first two so
    # an older value never wins (turn_active is only ever written by flush items, in order),
    # and ``size`` added to transcript_bytes once (``transcript_seq`` says whether it was).
    touch: tuple[str | None, int | None, int | None, int] | None = None
    flush: bool = False
    changed: bool = False  # its commit gave the thread row a new change_seq
    fence: tuple[str, int] | None = None  # (replica_id, epoch): the lease this append needs
    size: int = -1  # its events' text in characters (``text_size``), once counted


def text_size(item: _Append) -> int:
    """The characters of an append's data and raw text (counted once)."""
    if item.size < 0:
        rows = item.rows  # (map and filter: C loops, a quarter of a generator's time)
        item.size = sum(map(len, rows[DATA])) + sum(map(len, filter(None, rows[RAW]))) if rows else 0
    return item.size


# At open: every thread's derived columns brought up to its newest stored event (a daemon
# killed before its last flush of _dirty). Index seeks on the events primary key only.
# Each returns the ids it changed: those rows get a new change_seq.
_REPAIR = (
    "UPDATE threads SET last_seq = (SELECT max(seq) FROM events WHERE thread_id = threads.id) "
    "WHERE last_seq < (SELECT max(seq) FROM events WHERE thread_id = threads.id) RETURNING id",
    "UPDATE threads SET updated_at = (SELECT ts FROM events WHERE thread_id = threads.id "
    "ORDER BY seq DESC LIMIT 1) WHERE updated_at < (SELECT ts FROM events "
    "WHERE thread_id = threads.id ORDER BY seq DESC LIMIT 1) RETURNING id",
    # A turn is in flight iff the thread's newest turn.started / turn.ended is a turn.started
    # (every accepted turn ends exactly once: conversation.py, registry.py recovery).
    "UPDATE threads SET turn_active = coalesce((SELECT kind = 'turn.started' FROM events "
    "WHERE thread_id = threads.id AND kind IN ('turn.started', 'turn.ended') ORDER BY seq DESC LIMIT 1), 0) "
    "WHERE state IN ('starting', 'running', 'stopping') OR turn_active = 1 RETURNING id",
)


def _prune_tombstones(db: sqlite3.Connection, older_than: str, keep: int = TOMBSTONE_KEEP) -> None:
    """Drop the tombstones beyond the newest TOMBSTONE_KEEP, and those deleted before
    ``older_than``; the horizon moves up to the newest one dropped (a cursor below it could
    miss a deletion)."""
    (upto,) = db.execute(
        "SELECT max(change_seq) FROM thread_tombstones WHERE deleted_at < ? OR change_seq <= "
        "(SELECT change_seq FROM thread_tombstones ORDER BY change_seq DESC LIMIT 1 OFFSET ?)",
        (older_than, keep),
    ).fetchone()
    if upto is None:
        return
    db.execute("DELETE FROM thread_tombstones WHERE change_seq <= ?", (upto,))
    db.execute("UPDATE change_log SET horizon = max(horizon, ?)", (upto,))


def _next_change(db: sqlite3.Connection) -> int:
    """The next cursor, taken inside the caller's transaction (so cursors follow commit
    order; a rolled-back transaction or savepoint gives its value back)."""
    return int(db.execute("UPDATE change_log SET latest = latest + 1 RETURNING latest").fetchall()[0][0])


# What a killed daemon committed but had not counted (the events after transcript_seq),
# measured by their stored rows. No change_seq: a private column.
_REPAIR_SIZE = (
    f"UPDATE threads SET transcript_bytes = transcript_bytes + (SELECT coalesce(sum({ROW_SIZE} + {EVENT_OVERHEAD}), 0) "  # noqa: S608
    "FROM events WHERE thread_id = threads.id AND seq > threads.transcript_seq), "
    "transcript_seq = (SELECT max(seq) FROM events WHERE thread_id = threads.id) "
    "WHERE transcript_seq < (SELECT max(seq) FROM events WHERE thread_id = threads.id)"
)


def _repair(db: sqlite3.Connection) -> None:
    db.execute(_REPAIR_SIZE)
    changed: dict[str, None] = {}
    for stmt in _REPAIR:
        changed.update(dict.fromkeys(r[0] for r in db.execute(stmt).fetchall()))
    for tid in changed:
        db.execute("UPDATE threads SET change_seq=? WHERE id=?", (_next_change(db), tid))


def _write_item(db: sqlite3.Connection, item: _Append) -> None:
    # A flush writes client-visible columns; an append's own fields may. Either is one
    # change of the row: one counter step per item (i.e. per thread per commit) at most.
    item.changed = item.flush or not CHANGE_COLUMNS.isdisjoint(item.fields)
    if item.flush:
        assert item.touch is not None
        updated_at, last_seq, turn_active, size = item.touch
        # The size is added once: a flush written again (its writer died before it
        # answered, ``commit_again``) finds transcript_seq already at its seq.
        db.execute(
            "UPDATE threads SET updated_at=max(updated_at, coalesce(?, updated_at)), "
            "last_seq=max(last_seq, coalesce(?, last_seq)), turn_active=coalesce(?, turn_active), "
            "transcript_bytes=transcript_bytes + CASE WHEN transcript_seq < coalesce(?, 0) THEN ? ELSE 0 END, "
            "transcript_seq=max(transcript_seq, coalesce(?, 0)), change_seq=? WHERE id=?",
            (updated_at, last_seq, turn_active, last_seq, size, last_seq, _next_change(db), item.thread_id),
        )
        return
    if item.fence is not None:
        leases.fence(db, item.thread_id, *item.fence)
    if item.rows:
        _insert(db, _insert_rows(item.thread_id, item.rows))
        search.index(db, item.thread_id, item.rows)  # in this transaction: current at commit
        usage.record(db, item.thread_id, item.rows)
    if item.fields:
        sets = ",".join(f"{k}=?" for k in item.fields)
        bump = [_next_change(db)] if item.changed else []
        db.execute(
            f"UPDATE threads SET {sets}{',change_seq=?' if item.changed else ''} WHERE id=?",  # noqa: S608
            (*item.fields.values(), *bump, item.thread_id),
        )


def _insert_rows(thread_id: str, rows: Rows) -> list[tuple[Any, ...]]:
    """An append's ``Rows`` as stored, a tuple a row (``INSERT_EVENTS``): each event's
    envelope bytes and the offsets of ``data`` and ``raw`` in them (migration 9), built
    here, where the write connection is (the writer process, by default: off the event
    loop), byte for byte ``Record.envelope()`` (``stored_envelope`` of it, inlined: an
    append's rows share one ``ts``, and the head before ``data`` is ASCII, so ``data_at``
    is its length in characters). UnicodeEncodeError for text that is not UTF-8, and
    ValueError for columns of different lengths (the append is refused)."""
    out: list[tuple[Any, ...]] = []
    append = out.append
    last_ts: str | None = None
    tsj = ""
    for seq, ts, source, kind, data, raw, relay, client_id in zip(*rows, strict=True):
        if ts is not last_ts:
            tsj, last_ts = json_ts(ts), ts
        head = f'{{"seq":{seq},"ts":{tsj},"source":{json_name(source)},"kind":{json_name(kind)},"data":'
        data_at = len(head)
        raw_at: int | None = None
        if raw is None:
            env = f'{head}{data},"raw":null}}'.encode()
        else:
            text = f'{head}{data},"raw":{raw}}}'
            env = text.encode()
            # All ASCII: characters are bytes. Otherwise counted from the end.
            raw_at = data_at + len(data) + 7 if len(env) == len(text) else len(env) - 1 - len(raw.encode())
        append((thread_id, seq, ts, source, kind, env, data_at, raw_at, relay, client_id))
    return out


def _insert(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Insert an append's rows: whole chunks of INSERT_CHUNK in one statement each, the
    rest one statement a row. A row SQLite refuses fails its statement, and the caller
    rolls the whole append back either way."""
    whole = len(rows) - len(rows) % INSERT_CHUNK
    for at in range(0, whole, INSERT_CHUNK):
        db.execute(INSERT_EVENTS_CHUNK, list(chain.from_iterable(rows[at : at + INSERT_CHUNK])))
    if whole < len(rows):
        db.executemany(INSERT_EVENTS, rows[whole:] if whole else rows)


# This append alone is bad (a constraint, or text SQLite cannot encode): it is refused, the
# rest of the batch commits, and the writer never stalls on it.
_REFUSED = (sqlite3.IntegrityError, UnicodeEncodeError, ValueError, OverflowError, leases.Fenced)


def _commit(db: sqlite3.Connection, batch: list[_Append]) -> dict[int, str]:
    """One transaction for the whole batch; an append that violates a constraint is rolled
    back alone (its savepoint; a batch of one needs none) and reported, the rest commit."""
    failed: dict[int, str] = {}
    db.execute("BEGIN IMMEDIATE")
    if len(batch) == 1:
        try:
            _write_item(db, batch[0])
        except _REFUSED as exc:
            db.execute("ROLLBACK")
            return {0: str(exc)}
        db.execute("COMMIT")
        return failed
    for i, item in enumerate(batch):
        db.execute("SAVEPOINT a")
        try:
            _write_item(db, item)
        except _REFUSED as exc:
            db.execute("ROLLBACK TO a")
            failed[i] = str(exc)
        db.execute("RELEASE a")
    db.execute("COMMIT")
    return failed


# ---------------------------------------------------------------------- the connection
def connect(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


class SchemaTooNew(Exception):
    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version


def schema_too_new(path: Path, version: int) -> str:
    return (
        f"database {path} has schema version {version}, newer than this agent-bridge's "
        f"({SCHEMA_VERSION}): it was written by a newer version; run that version, or use another data dir"
    )


def check_schema(path: Path) -> None:
    """Refuse (StoreError) a database a newer agent-bridge wrote, before anything opens
    it for writing; a missing file is fine (it is created at open)."""
    if not path.exists():
        return
    try:
        db = sqlite3.connect(path)  # reads only: nothing is written before the check
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read database {path}: {exc}") from exc
    if version > SCHEMA_VERSION:
        raise StoreError(schema_too_new(path, version), code="schema_too_new")


def open_writer(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    """The write connection: WAL, migrated, the derived columns repaired (SchemaTooNew
    for a newer version's file, which is then left untouched)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = connect(path, busy_timeout_ms)
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        db.close()
        raise SchemaTooNew(version)
    db.execute("PRAGMA journal_mode=WAL")
    for i, ddl in enumerate(_MIGRATIONS[version:], start=version + 1):
        db.execute("BEGIN IMMEDIATE")
        for stmt in filter(str.strip, ddl.split(";")):
            db.execute(stmt)
        search.after_migration(db, ddl)  # (the events stored before the index: indexed once)
        usage.after_migration(db, ddl)
        db.execute(f"PRAGMA user_version={i}")
        db.execute("COMMIT")
    db.execute("BEGIN IMMEDIATE")
    _repair(db)
    db.execute("COMMIT")
    return db


# ---------------------------------------------------------------------- the writes (OPS)
# Plain arguments in, plain values out (lists, numbers, text, None): the same functions
# run on the writer thread and, by name, in the writer process.


def create_thread(db: sqlite3.Connection, row: dict[str, Any]) -> None:
    cols = ",".join(row)
    marks = ",".join("?" for _ in row)
    db.execute("BEGIN IMMEDIATE")
    seq = _next_change(db)
    db.execute(
        f"INSERT INTO threads ({cols},change_seq,created_seq) VALUES ({marks},?,?)",  # noqa: S608
        (*row.values(), seq, seq),
    )
    db.execute("COMMIT")


def update_thread(db: sqlite3.Connection, thread_id: str, row: dict[str, Any], visible: bool) -> None:
    sets = ",".join(f"{k}=?" for k in row)
    db.execute("BEGIN IMMEDIATE")
    bump = [_next_change(db)] if visible else []
    db.execute(
        f"UPDATE threads SET {sets}{',change_seq=?' if visible else ''} WHERE id=?",  # noqa: S608
        (*row.values(), *bump, thread_id),
    )
    db.execute("COMMIT")


def delete_thread(db: sqlite3.Connection, thread_id: str, deleted_at: str, older_than: str, keep: int) -> bool:
    """``older_than`` and ``keep``: which tombstones are pruned (_prune_tombstones)."""
    db.execute("BEGIN IMMEDIATE")
    db.execute("DELETE FROM events WHERE thread_id=?", (thread_id,))
    search.forget(db, thread_id)
    usage.forget(db, thread_id)
    gone = db.execute("DELETE FROM threads WHERE id=? RETURNING owner", (thread_id,)).fetchall()
    found = bool(gone)
    if found:
        db.execute(
            "INSERT OR REPLACE INTO thread_tombstones (thread_id, change_seq, deleted_at, owner) VALUES (?,?,?,?)",
            (thread_id, _next_change(db), deleted_at, gone[0][0]),
        )
        _prune_tombstones(db, older_than, keep)
    db.execute("COMMIT")
    return found


def live_threads(db: sqlite3.Connection) -> list[Any]:
    return db.execute(
        f"SELECT {COLUMNS_SQL} FROM threads "  # noqa: S608
        "WHERE state IN ('starting','running','stopping') OR turn_active=1"
    ).fetchall()


def checkpoint(db: sqlite3.Connection) -> list[Any]:
    """PASSIVE: never blocks a writer or a reader; (busy, WAL frames, frames checkpointed)."""
    return list(db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone())


def execute(db: sqlite3.Connection, sql: str, params: list[Any]) -> list[Any]:
    """One statement in its own transaction (maintenance and tests)."""
    return db.execute(sql, params).fetchall()


OPS = {
    f.__name__: f
    for f in (
        create_thread,
        update_thread,
        delete_thread,
        live_threads,
        *accounts.OPS,
        checkpoint,
        execute,
        *leases.OPS,
        *push_sql.OPS,
    )
}


# ---------------------------------------------------------------------- appends
def item_of(wire: tuple[Any, ...]) -> _Append:
    """An append as shipped to the writer process (``wire_item``): no future."""
    thread_id, rows, fields, touch, flush, fence, size = wire
    return _Append(thread_id, rows, fields, None, touch, flush=flush, fence=fence, size=size)


def wire_item(item: _Append) -> tuple[Any, ...]:
    """An append for the writer process, with its text size if the store counted it (the
    batch cap does), so the writer's checkpoint count does not count it again."""
    return (item.thread_id, item.rows, item.fields, item.touch, item.flush, item.fence, item.size)


def already_written(db: sqlite3.Connection, item: _Append) -> bool:
    """A batch sent again after its writer died: was this append's transaction committed
    before the death? (Its first event is there with the same time and data.)"""
    rows = item.rows
    if not rows:
        return False
    found = db.execute(
        f"SELECT ts, {DATA_SQL} FROM events WHERE thread_id=? AND seq=?",  # noqa: S608
        (item.thread_id, rows[SEQ][0]),
    ).fetchone()
    return found is not None and tuple(found) == (rows[TS][0], rows[DATA][0])


def commit_again(db: sqlite3.Connection, batch: list[_Append]) -> dict[int, str]:
    """``_commit`` for a batch that may already be committed (its writer died before the
    answer): what is already there is not written twice, the rest is written now."""
    todo = [i for i, item in enumerate(batch) if not already_written(db, item)]
    if not todo:
        return {}
    failed = _commit(db, [batch[i] for i in todo])
    return {todo[k]: reason for k, reason in failed.items()}
