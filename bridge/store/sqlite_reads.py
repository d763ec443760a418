"""The SQLite store's transcript reads, on its reader thread: pages of records, and pages
of frames joined straight from the stored rows (issue #8: no Record per replayed row, no
text decoded) in events mode (each row's stored envelope, issue #22) or raw mode (the
agent's relayed lines). Every page is bounded by PAGE_BYTES, measured before it is read
(``extent``), and says whether events may follow it (``more``).
"""

from __future__ import annotations

import operator
import sqlite3
from itertools import repeat
from typing import Any

from bridge.protocols.envelope import CorruptEvent, Frames, Page, checked_envelopes, checked_lines, stored_envelopes
from bridge.protocols.events import Record
from bridge.store import rows
from bridge.store import sqlite_sql as sql
from bridge.store.base import PAGE_BYTES
from bridge.store.rows import ENV_SQL

_READ_EVENTS = (
    f"SELECT seq,ts,source,kind,{sql.DATA_SQL},{sql.RAW_SQL},relay FROM events"  # noqa: S608
    " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?"
)
_READ_EVENTS_NO_RAW = _READ_EVENTS.replace(sql.RAW_SQL, "NULL", 1)


_FIRST = operator.itemgetter(0)
_SIZE_CHUNK = 64  # sizes stepped through at a time


def extent(db: sqlite3.Connection, thread_id: str, after: int, limit: int, raw: bool = False) -> tuple[int, bool]:
    """How many rows the page after ``after`` holds (at most ``limit``, cut at PAGE_BYTES by
    the rows' stored sizes) and whether events may follow it. The sizes are stepped
    through a chunk at a time, no further than the chunk that reaches the bound: in this
    table (WITHOUT ROWID) SQLite loads a row's whole record to step past it (its key is
    compared with the loop's bound), so measuring rows far beyond the page would cost as
    much as reading them (measured: 12 ms a 16 MiB row, 84 ms for the 280 rows of twelve
    8 MiB prompts). Only what is stepped through is loaded, one row at a time, by SQLite."""
    cur = db.execute((rows.RAW_PAGE_EXTENT if raw else rows.PAGE_EXTENT)[0], (thread_id, after, limit))
    n = total = 0
    while chunk := cur.fetchmany(_SIZE_CHUNK):
        size = sum(map(_FIRST, chunk))
        if total + size < PAGE_BYTES:
            n += len(chunk)
            total += size
            continue
        return n + rows.page_cut(list(map(_FIRST, chunk)), PAGE_BYTES - total), True
    return n, n == limit


def events_page(db: sqlite3.Connection, thread_id: str, after: int, limit: int, with_raw: bool) -> Page:
    """Records after ``after``. The stored text is kept as it is: a replay relays it without
    parsing it. (Assembling the whole envelope in SQL instead was measured slower.)"""
    n, more = extent(db, thread_id, after, limit)
    if not n:
        return Page()
    cur = db.execute(_READ_EVENTS if with_raw else _READ_EVENTS_NO_RAW, (thread_id, after, n))
    return Page(
        (Record(seq, ts, source, kind, None, raw, relay == 1, data) for seq, ts, source, kind, data, raw, relay in cur),
        more=more,
    )


def frames_page(db: sqlite3.Connection, thread_id: str, after: int, limit: int, raw: bool) -> Frames:
    """Read as UTF-8 bytes: the frames are sent without decoding or encoding any text, and
    without a Record per row (issue #8); in events mode each row is its stored envelope,
    one column (issue #22)."""
    n, more = extent(db, thread_id, after, limit, raw)
    if not n:
        return Frames([], 0, after, more=False)
    db.text_factory = bytes
    try:
        found = (_raw_page if raw else _envelope_page)(db, thread_id, after, n)
    finally:
        db.text_factory = str
    return Frames(found.texts, found.count, found.last, more=more)


def _raw_page(db: sqlite3.Connection, thread_id: str, after: int, n: int) -> Frames:
    """Raw mode relays the agent's own lines, one per stdout line (``relay``)."""
    found: list[tuple[int, bytes | None]] = db.execute(
        "SELECT seq,CASE WHEN source='agent' AND relay=1 THEN"
        " coalesce(substr(env,raw_at+1,length(env)-raw_at-1),raw) END FROM events"
        " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?",
        (thread_id, after, n),
    ).fetchall()
    return Frames(checked_lines(found), len(found), found[-1][0] if found else after, more=False)


def _envelope_page(db: sqlite3.Connection, thread_id: str, after: int, n: int) -> Frames:
    """Each row's stored envelope, one column (issue #22), if it is of the current wire
    version (rows.ENV_SQL). A page that may hold rows from before migration 9 (the
    transcript is gapless, so its seqs are ``after+1 .. after+n``; the partial index
    ``events_without_env`` answers), or that turns out to hold a row of another version,
    is read with their parts, and theirs are built from those (``_rebuilt``)."""
    old = db.execute(
        "SELECT 1 FROM events INDEXED BY events_without_env"
        " WHERE thread_id=? AND seq>? AND seq<=? AND env IS NULL LIMIT 1",
        (thread_id, after, after + n),
    ).fetchone()
    found = None
    if old is None:
        cur = db.execute(
            f"SELECT seq,{ENV_SQL} FROM events WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?",  # noqa: S608
            (thread_id, after, n),
        )
        found = _envelope_rows(cur.fetchall())
    if found is None:
        found = _rebuilt(db, thread_id, after, n)
    return Frames(checked_envelopes(found), len(found), found[-1][0] if found else after, more=False)


_SECOND = operator.itemgetter(1)


def _envelope_rows(found: list[tuple[int, Any]]) -> list[tuple[int, bytes]] | None:
    """The page's ``(seq, env)`` rows; None when a row has no envelope to send as it is
    (the page is read again with its parts); CorruptEvent at an envelope that is not bytes
    (both checks iterate in C)."""
    envs = list(map(_SECOND, found))
    if None in envs:
        return None
    if not all(map(isinstance, envs, repeat(bytes))):
        raise CorruptEvent(next(seq for seq, env in found if not isinstance(env, bytes)))
    return found


def _rebuilt(db: sqlite3.Connection, thread_id: str, after: int, n: int) -> list[tuple[int, bytes]]:
    """A page holding rows whose envelope is not sent as stored (from before migration 9,
    or of another wire version), each built from its parts by ``stored_envelopes``: the
    columns of an old row, the ``data`` and ``raw`` of a newer one cut out of its envelope
    (which joins a current one back byte for byte). A row whose data cannot be had:
    CorruptEvent."""
    found = db.execute(
        f"SELECT seq,ts,source,kind,{sql.DATA_SQL},{sql.RAW_SQL} FROM events"  # noqa: S608
        " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?",
        (thread_id, after, n),
    ).fetchall()
    try:
        return list(zip([r[0] for r in found], stored_envelopes(found), strict=True))
    except TypeError:  # a NULL where data must be
        raise CorruptEvent(next(r[0] for r in found if not isinstance(r[4], bytes))) from None
