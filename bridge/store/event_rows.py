"""Stored envelopes (issue #22), shared by the stores: PostgreSQL's append rows (each
event's envelope stored as the bytes a client is sent for it in events mode, with the
offsets of its ``data`` and ``raw``: bridge/protocols/envelope.py ``stored_envelope``;
SQLite builds the same in sqlite_sql._insert_rows, where its write connection is), and the
guard that keeps a corrupt stored row from any client."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import structlog

from bridge.errors import StoreError
from bridge.protocols.envelope import CorruptEvent, stored_envelope
from bridge.protocols.events import Record

log = structlog.get_logger("bridge.store")


def event_rows(thread_id: str, records: Sequence[Record], client_ids: Sequence[str | None]) -> list[tuple[Any, ...]]:
    """``(thread_id, seq, ts, source, kind, env, data_at, raw_at, relay, client_id)`` per
    record (PostgreSQL's append, on the event loop like the rest of its writes). The
    envelope is built here once and kept by the record for its publish.
    StoreError (the append is refused) for text that cannot be UTF-8 (a lone surrogate),
    as a database would refuse it."""
    try:
        return [
            (thread_id, r.seq, r.ts, r.source, r.kind, *stored_envelope(r.envelope(), r.data_json, r.raw), r.relay, cid)
            for r, cid in zip(records, client_ids, strict=True)
        ]
    except UnicodeEncodeError as exc:
        raise StoreError(f"append refused: {exc}") from None


@contextlib.contextmanager
def corrupt_rows(thread_id: str) -> Iterator[None]:
    """A stored row that is not what it must be (another replica or a damaged disk wrote
    it: envelope.CorruptEvent) is never sent as it is: it is logged and the read fails
    (StoreError)."""
    try:
        yield
    except CorruptEvent as exc:
        log.error("store.corrupt_event", thread_id=thread_id, seq=exc.seq)
        raise StoreError(f"thread {thread_id}: {exc}") from None
