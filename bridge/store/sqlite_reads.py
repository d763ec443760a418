"""The SQLite store's transcript reads, on its reader thread: pages of records, and pages
of frames joined straight from the stored rows (issue #8: no Record per replayed row, no
text decoded) in events mode (each row's stored envelope, issue #22) or raw mode (the
agent's relayed lines). Every page is bounded by PAGE_BYTES, measured before it is read
(``extent``), and says whether events may follow it (``more``).
"""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Iterator
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
_SECOND = operator.itemgetter(1)


def _chunks(cur: sqlite3.Cursor) -> Iterator[list[Any]]:
    """The cursor's rows, 8 at first and twice as many each time up to 128. A page stops
    in the chunk that reaches PAGE_BYTES, and SQLite has by then stepped through the rest
    of that chunk: in this table (WITHOUT ROWID) it loads a row's whole record to step
    past it (the row's key is compared with the loop's bound), so every row stepped
    through costs as much as reading it (measured: 12 ms a 16 MiB row). Small chunks first
    keep that waste to a few rows when the rows are large; larger ones after keep the
    calls few when they are not."""
    size = 8
    while chunk := cur.fetchmany(size):
        yield chunk
        size = min(size * 2, 128)


def extent(db: sqlite3.Connection, thread_id: str, after: int, limit: int, raw: bool = False) -> tuple[int, bool]:
    """How many rows the page after ``after`` holds (at most ``limit``, cut at PAGE_BYTES by
    the rows' stored sizes: rows.PAGE_EXTENT) and whether events may follow it. Only
    sizes reach Python; the rows' content is loaded by SQLite one row at a time."""
    cur = db.execute((rows.RAW_PAGE_EXTENT if raw else rows.PAGE_EXTENT)[0], (thread_id, after, limit))
    n = total = 0
    for chunk in _chunks(cur):
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
    db.text_factory = bytes
    try:
        return (_raw_page if raw else _envelope_page)(db, thread_id, after, limit)
    finally:
        db.text_factory = str


def _raw_page(db: sqlite3.Connection, thread_id: str, after: int, limit: int) -> Frames:
    """Raw mode relays the agent's own lines, one per stdout line (``relay``)."""
    n, more = extent(db, thread_id, after, limit, raw=True)
    found: list[tuple[int, bytes | None]] = db.execute(
        "SELECT seq,CASE WHEN source='agent' AND relay=1 THEN"
        " coalesce(substr(env,raw_at+1,length(env)-raw_at-1),raw) END FROM events"
        " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?",
        (thread_id, after, n),
    ).fetchall()
    return Frames(checked_lines(found), len(found), found[-1][0] if found else after, more=more)


# A replay page in events mode is one pass (a second one, to measure the rows first, cost
# a fifth of the read of a page of small rows): each row's envelope when it is at most
# _SMALL bytes, else NULL; a larger one is read on its own, only while the page has room
# for it. So a chunk of rows holds at most 128 x _SMALL bytes of envelopes, and a page
# PAGE_BYTES plus one row.
_SMALL = 64 * 1024
_ENVELOPES = (
    f"SELECT seq,CASE WHEN length(env)<=? THEN {ENV_SQL} END FROM events"  # noqa: S608
    " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?"
)
_ONE_ENVELOPE = f"SELECT {ENV_SQL} FROM events WHERE thread_id=? AND seq=?"  # noqa: S608


def _envelope_page(db: sqlite3.Connection, thread_id: str, after: int, limit: int) -> Frames:
    """Each row's stored envelope, one column (issue #22), if it is of the current wire
    version (rows.ENV_SQL). A page that may hold rows from before migration 9 (the
    transcript is gapless, so its seqs are ``after+1 .. after+limit``; the partial index
    ``events_without_env`` answers), or that turns out to hold a row of another version,
    is read with their parts, and theirs are built from those (``_rebuilt``)."""
    old = db.execute(
        "SELECT 1 FROM events INDEXED BY events_without_env"
        " WHERE thread_id=? AND seq>? AND seq<=? AND env IS NULL LIMIT 1",
        (thread_id, after, after + limit),
    ).fetchone()
    page = _envelope_rows(db, thread_id, after, limit) if old is None else None
    if page is None:
        n, more = extent(db, thread_id, after, limit)
        found = _rebuilt(db, thread_id, after, n) if n else []
    else:
        found, more = page
    return Frames(checked_envelopes(found), len(found), found[-1][0] if found else after, more=more)


def _envelope_rows(db: sqlite3.Connection, thread_id: str, after: int, limit: int) -> tuple[list[Any], bool] | None:
    """The page's ``(seq, env)`` rows and whether events may follow it; None at a row with
    no envelope to send as it is (the page is read again with its parts); CorruptEvent at
    an envelope that is not bytes. A chunk of envelopes under the bound is taken whole, its
    sizes summed in C (a NULL or a number fails the sum: that chunk is looked at row by
    row)."""
    cur = db.execute(_ENVELOPES, (_SMALL, thread_id, after, limit))
    found: list[Any] = []
    total = 0
    for chunk in _chunks(cur):
        try:
            size = sum(map(len, map(_SECOND, chunk)))
        except TypeError:
            size = PAGE_BYTES
        if total + size < PAGE_BYTES:
            found += chunk
            total += size
            continue
        for seq, small in chunk:
            env = small if small is not None else db.execute(_ONE_ENVELOPE, (thread_id, seq)).fetchone()[0]
            if env is None:  # not of the current version
                return None
            if env.__class__ is not bytes:
                raise CorruptEvent(seq)
            found.append((seq, env))
            total += len(env)
            if total >= PAGE_BYTES:
                return found, True
    return found, len(found) == limit


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
