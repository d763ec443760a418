"""The rules both stores keep, written once: a thread row's columns and how each is
encoded, what text a row may hold (the NUL policy), the thread list's cursor and order,
the shared read queries, how a change-log page is assembled, and the version of a stored
envelope. Pure: no database driver, no asyncio (the SQLite writer process imports it).

Queries are written with ``?`` placeholders; PostgreSQL's store turns them into ``%s``
(:func:`pg`). Only what is the same statement on both databases lives here; what differs
(locking, the group commit, the change counter in a batch) stays with each store.
"""

from __future__ import annotations

import base64
import bisect
import functools
import itertools
import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from bridge.errors import InvalidRequest, LeaseLost, StoreError
from bridge.store.base import PAGE_BYTES, ROW_COLUMNS, Change, ChangesPruned, ThreadFields, ThreadRow, UserRow

# ---------------------------------------------------------------------- rows and columns

THREAD_COLUMNS = ROW_COLUMNS  # both stores: the same columns, in the same order
JSON_COLUMNS = ("last_exit", "options", "agent_info", "usage", "forked_from", "worktree")  # stored as JSON text
COLUMNS_SQL = ",".join(THREAD_COLUMNS)
_KNOWN = frozenset(THREAD_COLUMNS)

# A write of these columns records which replica wrote it: the process belongs to it.
STAMPED = frozenset({"state", "pid"})
# The reason an append refused by its lease fence starts with (both stores' fences).
LEASE_LOST = "lease lost: "


def thread_row(values: Sequence[Any]) -> ThreadRow:
    """A stored row (``THREAD_COLUMNS``, in order) as a ThreadRow."""
    out = dict(zip(THREAD_COLUMNS, values, strict=True))
    for col in JSON_COLUMNS:
        if out[col] is not None:
            out[col] = json.loads(out[col])
    out["turn_active"] = bool(out["turn_active"])
    out["archived"] = bool(out["archived"])
    return cast(ThreadRow, out)


def encode_fields(fields: ThreadFields, *, bool_as_int: bool) -> dict[str, Any]:
    """Columns as a store writes them: JSON columns as text, ``turn_active`` as the
    database's boolean (SQLite's 0/1 with ``bool_as_int``, else a bool). ValueError for a
    column no thread has; InvalidRequest (``invalid_request``) for text holding a NUL."""
    out = dict(fields)
    unknown = out.keys() - _KNOWN
    if unknown:
        raise ValueError(f"unknown thread columns {unknown}")
    for col in JSON_COLUMNS:
        if out.get(col) is not None:
            out[col] = json.dumps(out[col])  # a NUL in JSON is escaped: never refused
    for flag in ("turn_active", "archived"):
        if flag in out:
            on = bool(out[flag])
            out[flag] = int(on) if bool_as_int else on
    refuse_nul(out)
    return out


def refuse_nul(columns: dict[str, Any]) -> None:
    """The NUL policy, one for both stores: PostgreSQL text cannot hold a NUL, so no store
    keeps one in a thread column (a row must read the same on either, and a SQLite file can
    be moved to a shared store). Refused as the client's bad request, not a store failure."""
    nul = [k for k, v in columns.items() if isinstance(v, str) and "\x00" in v]
    if nul:
        raise InvalidRequest(f"{', '.join(nul)} cannot contain a NUL character", code="invalid_request")


def stamp(fields: dict[str, Any], replica_id: str) -> dict[str, Any]:
    """``fields`` with ``replica_id`` added when they record a process or its state."""
    if STAMPED & fields.keys():
        fields["replica_id"] = replica_id
    return fields


def refusal(reason: str) -> StoreError:
    """The error an append refused alone is raised with: LeaseLost for a fence."""
    if reason.startswith(LEASE_LOST):
        return LeaseLost(reason)
    return StoreError(f"append refused: {reason}")


def later(a: Any, b: Any) -> Any:
    """The larger of two values where None means "not known"."""
    return b if a is None else a if b is None else max(a, b)


def iso_before(seconds: float) -> str:
    """The wall-clock time ``seconds`` ago, in the transcript's format (so it compares as text)."""
    return datetime.fromtimestamp(time.time() - seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def user_row(row: Sequence[Any]) -> UserRow:
    return UserRow(str(row[0]), bool(row[1]), str(row[2]), row[3])


# ---------------------------------------------------------------------- the thread list

# Newest activity first; the cursor is the last row's (updated_at, id), opaque to clients.
_LIST_ORDER = "ORDER BY updated_at DESC, id DESC LIMIT ?"


def encode_cursor(updated_at: str, thread_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([updated_at, thread_id]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        pad = "=" * (-len(cursor) % 4)
        value = json.loads(base64.urlsafe_b64decode(cursor + pad))
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            return value[0], value[1]
    except (ValueError, UnicodeDecodeError):
        pass
    raise InvalidRequest("cursor is not valid", code="invalid_cursor")


def list_query(
    limit: int, cursor: str | None, agent: str | None, owner: str | None, archived: bool | None = False
) -> tuple[str, list[Any]]:
    """The statement of one page of the thread list (one row more than ``limit``: whether
    there is a next page) and its parameters (``archived``: base.ThreadStore.list_threads)."""
    where: list[str] = []
    params: list[Any] = []
    if archived is not None:
        where.append("archived = ?")  # (a bool: SQLite's 0/1 as PostgreSQL's boolean)
        params.append(archived)
    if owner is not None:
        where.append("owner = ?")
        params.append(owner)
    if cursor:
        updated_at, tid = decode_cursor(cursor)
        where.append("(updated_at < ? OR (updated_at = ? AND id < ?))")
        params += [updated_at, updated_at, tid]
    if agent:
        where.append("agent = ?")
        params.append(agent)
    clause = f"WHERE {' AND '.join(where)} " if where else ""
    return f"SELECT {COLUMNS_SQL} FROM threads {clause}{_LIST_ORDER}", [*params, limit + 1]  # noqa: S608


def list_page(rows: list[ThreadRow], limit: int) -> tuple[list[ThreadRow], str | None]:
    """The page and the cursor of the next one (None: this was the last)."""
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, encode_cursor(rows[-1]["updated_at"], rows[-1]["id"])


# ---------------------------------------------------------------------- shared reads

GET_THREAD = f"SELECT {COLUMNS_SQL} FROM threads WHERE id = ?"  # noqa: S608
FIND_CLIENT_EVENT = "SELECT seq FROM events WHERE thread_id = ? AND client_id = ?"
# The newest turn starts before a seq (the compacted history pages at turn starts,
# bridge/sessions/history.py): walks the primary key backwards and stops at the last asked.
TURN_STARTS_BEFORE = (
    "SELECT seq FROM events WHERE thread_id = ? AND seq < ? AND kind = 'turn.started' ORDER BY seq DESC LIMIT ?"
)
_USER_COLS = "name, admin, created_at, revoked_at"
USER_BY_TOKEN = f"SELECT {_USER_COLS}, token_hash FROM users WHERE token_hash = ? AND revoked_at IS NULL"  # noqa: S608
GET_USER = f"SELECT {_USER_COLS} FROM users WHERE name = ?"  # noqa: S608
LIST_USERS = f"SELECT {_USER_COLS} FROM users ORDER BY name"  # noqa: S608
LIST_SECRETS = (
    "SELECT user_name, profile, key, nonce, ciphertext, updated_at FROM user_secrets "
    "WHERE user_name = ? AND (CAST(? AS TEXT) IS NULL OR profile = ?) ORDER BY profile, key"
)
LATEST_CHANGE = "SELECT latest FROM change_log"
CHANGE_HORIZON = "SELECT horizon FROM change_log"

# ---------------------------------------------------------------------- the change log

CHANGED_THREADS = (
    f"SELECT change_seq, created_seq, {COLUMNS_SQL} FROM threads "  # noqa: S608
    "WHERE change_seq > ? ORDER BY change_seq LIMIT ?"
)
TOMBSTONES = (
    "SELECT change_seq, thread_id, deleted_at, owner FROM thread_tombstones "
    "WHERE change_seq > ? ORDER BY change_seq LIMIT ?"
)


def changes_queries(after: int, limit: int) -> list[tuple[str, tuple[Any, ...]]]:
    """The three reads of ``read_changes``, to run in one snapshot (:func:`changes`)."""
    return [(CHANGE_HORIZON, ()), (CHANGED_THREADS, (after, limit)), (TOMBSTONES, (after, limit))]


def changes(results: list[list[Any]], after: int, limit: int) -> list[Change]:
    """The change-log page from the three reads of :func:`changes_queries` (ChangesPruned
    when ``after`` is below the horizon): rows and tombstones merged in cursor order."""
    horizon_rows, rows, gone = results
    horizon = int(horizon_rows[0][0]) if horizon_rows else 0
    if after < horizon:
        raise ChangesPruned(after, horizon)
    out = [
        Change(int(r[0]), "thread.created" if r[1] > after else "thread.updated", r[2], thread_row(r[2:])) for r in rows
    ]
    out += [Change(int(seq), "thread.deleted", tid, None, at, owner) for seq, tid, at, owner in gone]
    out.sort(key=lambda c: c.cursor)
    return out[:limit]


# ---------------------------------------------------------------------- the stored envelope

# The version of the stored envelope's format (``events.wire``). A row is written with the
# version of the daemon that wrote it; a row written before the column existed (NULL) is
# version 1, the format of issue #22. A replay page reads ``env`` only from rows of the
# current version (``ENV_SQL``): any other row comes back without it and is rebuilt from
# its parts (its data and raw, cut out of its envelope by their offsets), so a change of
# the wire format is a branch of the read path, never a rewrite of stored rows.
WIRE_VERSION = 1
UNMARKED_WIRE = 1  # what a row without a marker is
ENV_SQL = f"CASE WHEN coalesce(wire, {UNMARKED_WIRE}) = {WIRE_VERSION} THEN env END"
# A row whose ``env`` a replay cannot send as it is: none (rows from before the stored
# envelope), or one of another version.
NOT_CURRENT_SQL = f"(env IS NULL OR coalesce(wire, {UNMARKED_WIRE}) <> {WIRE_VERSION})"


@functools.cache
def pg(statement: str) -> str:
    """A statement of this module with PostgreSQL's placeholders."""
    return statement.replace("?", "%s")


# ---------------------------------------------------------------------- transcript pages

# What a page of the transcript is cut by (base.PAGE_BYTES): each row's stored size. Only
# its length reaches the caller, never its content (PostgreSQL reads a TOASTed bytea's
# length without the value; SQLite: sqlite_reads._chunks). Rows from before the stored
# envelope are measured by their columns. A raw-mode page counts only the agent lines it
# relays (its other rows send nothing, and its read does not load them).
ROW_SIZE = "coalesce(length(env), length(data) + coalesce(length(raw), 0))"
_RELAYED_SIZE = "CASE WHEN source='agent' AND relay THEN coalesce(length(env)-raw_at-1, length(raw), 0) ELSE 0 END"
# A page's extent is measured before the page is read with an exact LIMIT, so that no more
# than PAGE_BYTES plus one row is ever loaded (issue #34: a read that took rows a chunk at
# a time before measuring them loaded up to 128 rows of 16 MiB for one page, and
# PostgreSQL's client-side cursor every row of the LIMIT). The sizes' statement, and an
# aggregate of it: PostgreSQL asks the aggregate (its index scan reads no row content, so
# measuring up to ``limit`` rows is cheap) and the sizes only for a page that reaches the
# bound. SQLite measures and reads in one pass instead: a row's size comes with it, and its
# content only when it is small (sqlite_reads._chunks says why).
_SIZES = "SELECT {} FROM events WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?"
_EXTENT = (
    "SELECT count(*), sum(n) FROM (SELECT {} AS n FROM events WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?) AS p"
)
# (sizes, extent) of a page of events or envelopes, and of a raw-mode page.
PAGE_EXTENT = (_SIZES.format(ROW_SIZE), _EXTENT.format(ROW_SIZE))
RAW_PAGE_EXTENT = (_SIZES.format(_RELAYED_SIZE), _EXTENT.format(_RELAYED_SIZE))


def page_extent(count: int, total: int | None, limit: int) -> tuple[int, bool] | None:
    """From the aggregate's answer: (rows the page holds, whether events may follow it), or
    None when the rows reach the byte bound and their sizes must be read (:func:`page_cut`)."""
    if not count or (total or 0) < PAGE_BYTES:
        return count, count == limit
    return None


def page_cut(sizes: Sequence[int], budget: int = PAGE_BYTES) -> int:
    """How many of these rows a page takes: it stops after the row that brings it to
    ``budget`` bytes (so it holds at least one row, and at most the budget plus one row)."""
    return min(bisect.bisect_left(list(itertools.accumulate(sizes)), budget) + 1, len(sizes))
