"""Helpers for the store tests that run against both stores (tests/store/conftest.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from bridge.protocols.events import Record
from bridge.store.base import Store
from bridge.store.factory import make_store

StoreFactory = Callable[..., contextlib.AbstractAsyncContextManager[Store]]


def thread(tid: str, ts: str = "2026-11-30T00:00:00.000Z", **extra: Any) -> dict[str, Any]:
    return {
        "id": tid,
        "agent": "a",
        "protocol": "stream-json",
        "cwd": "/tmp",
        "title": "",
        "state": "idle",
        "turn_active": False,
        "last_seq": 0,
        "created_at": ts,
        "updated_at": ts,
        "options": {},
        **extra,
    }


def records(first: int, n: int, ts: str = "2026-11-30T00:00:01.000Z") -> list[Record]:
    return [
        Record(seq, ts, "agent", "message.delta", {"text": str(seq)}, None, False) for seq in range(first, first + n)
    ]


def user_prompt(seq: int, size: int) -> Record:
    """A prompt of ``size`` characters as stored: its text in the data and again in the
    stream-json line written to the agent (so it weighs about twice ``size``)."""
    text = "x" * size
    line = json.dumps({"type": "user", "message": {"content": [{"type": "text", "text": text}]}})
    return Record(seq, "2026-12-01T00:00:00.000Z", "client", "message", {"role": "user", "text": text}, line, False)


@contextlib.asynccontextmanager
async def opened_at(url: str, replica_id: str = "local") -> AsyncIterator[Store]:
    """A store on ``url`` for ``replica_id``, opened, and closed afterwards."""
    store = make_store(url, replica_id=replica_id)
    await store.open()
    try:
        yield store
    finally:
        await store.close()
