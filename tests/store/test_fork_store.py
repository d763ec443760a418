"""A fork's transcript in both stores (issue #38 item 1, docs/api.md §4.26): the copied
``turn.ended`` events (seqs up to ``forked_from.seq``) are its source's turns, so the
fork's totals and ``usage_report`` count only the turns after them; the copy is searched
under the fork."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.stores import StoreFactory, thread

from bridge.protocols.events import Record

pytestmark = pytest.mark.timeout(60)
TS = "2026-12-01T10:00:00.000Z"


def said(seq: int, text: str) -> Record:
    return Record(seq, TS, "client", "message", {"role": "user", "text": text}, None, False)


def end(seq: int) -> Record:
    usage = {"input_tokens": 3, "output_tokens": 5, "cost": {"amount": 0.5, "currency": "USD"}}
    return Record(
        seq, TS, "agent", "turn.ended", {"turn_id": f"t{seq}", "status": "success", "usage": usage}, None, False
    )


async def test_a_forks_copied_turns_are_counted_once_in_its_source(opened: StoreFactory) -> None:
    async with asyncio.timeout(30):
        async with opened() as store:
            source = [said(1, "zucchini one"), end(2), said(3, "zucchini two"), end(4)]
            await store.create_thread(thread("src"))  # type: ignore[arg-type]
            await store.append("src", source, [None] * 4, {})
            fork: Any = thread("fork", forked_from={"thread": "src", "seq": 4, "session": "s", "at": None})
            await store.create_thread(fork)
            await store.append("fork", source[:2], [None] * 2, {})  # the copy, a page at a time
            await store.append("fork", source[2:], [None] * 2, {})
            await store.append("fork", [said(5, "zucchini three"), end(6)], [None] * 2, {})  # its own turn
            row = await store.get_thread("fork")
            assert row is not None and row["usage"]["turns"] == 1 and row["usage"]["cost"] == {"USD": 0.5}
            assert row["forked_from"]["seq"] == 4
            report = await store.usage_report(group_by="thread", owner=None, since=None, until=None, limit=10)
            assert {g["key"]: g["usage"]["turns"] for g in report["groups"]} == {"src": 2, "fork": 1}
            assert report["total"]["turns"] == 3
            hits, _ = await store.search("zucchini", owner=None, limit=20, cursor=None)
            assert sorted((h["thread"], h["seq"]) for h in hits) == [
                ("fork", 1),
                ("fork", 3),
                ("fork", 5),
                ("src", 1),
                ("src", 3),
            ]
