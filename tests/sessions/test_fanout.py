"""Fan-out: a slow subscriber is resynced from the store, never blocks the publisher, and
still receives every record exactly once, in order."""

from __future__ import annotations

import asyncio
import random

from bridge.protocols.envelope import Frames
from bridge.protocols.events import Record
from bridge.sessions.fanout import Fanout, deliver


def rec(seq: int) -> Record:
    return Record(seq, "2026-11-30T00:00:00.000Z", "agent", "agent.other", {}, None, True)


async def test_slow_subscriber_gets_everything_once_in_order_with_a_tiny_buffer() -> None:
    store: list[Record] = []
    fan = Fanout()
    sub = fan.subscribe(limit=4)
    received: list[int] = []
    rng = random.Random(7)

    async def read_page(after: int, limit: int) -> list[Record]:
        await asyncio.sleep(0)
        return [r for r in store if r.seq > after][:limit]

    async def send(r: Record) -> None:
        received.append(r.seq)
        if rng.random() < 0.3:
            await asyncio.sleep(0)  # a slow client yields to the publisher

    async def publisher() -> None:
        for seq in range(1, 2001):
            store.append(rec(seq))  # durable before visible
            fan.publish([store[-1]])
            if seq % 7 == 0:
                await asyncio.sleep(0)
        sub.close("done")

    task = asyncio.create_task(deliver(sub, 0, read_page, send))
    await asyncio.wait_for(publisher(), 10)
    assert await asyncio.wait_for(task, 10) == "done"
    assert received == list(range(1, 2001))
    assert len(sub.buf) <= 4


async def test_store_pages_as_frames_and_live_records_interleave_exactly_once_in_order() -> None:
    # The replay path of the WebSocket (issue #8): store pages arrive as frame texts, the
    # live buffer as records; a slow subscriber resyncs from the store through frames,
    # across page boundaries (REPLAY_PAGE), and nothing is sent twice or skipped.
    store: list[Record] = [rec(seq) for seq in range(1, 2501)]
    fan = Fanout()
    sub = fan.subscribe(limit=4)
    received: list[int] = []
    rng = random.Random(11)

    async def read_page(after: int, limit: int) -> list[Record]:
        raise AssertionError("pages are read as frames")

    async def read_frames(after: int, limit: int) -> Frames:
        await asyncio.sleep(0)
        page = [r for r in store if r.seq > after][:limit]
        return Frames([str(r.seq).encode() for r in page], len(page), page[-1].seq if page else after)

    async def send(r: Record) -> None:
        received.append(r.seq)
        if rng.random() < 0.3:
            await asyncio.sleep(0)

    async def send_texts(texts: list[str]) -> None:
        received.extend(int(t) for t in texts)
        await asyncio.sleep(0)

    async def publisher() -> None:
        for seq in range(2501, 5001):
            store.append(rec(seq))  # durable before visible
            fan.publish([store[-1]])
            if seq % 5 == 0:
                await asyncio.sleep(0)
        sub.close("done")

    task = asyncio.create_task(deliver(sub, 0, read_page, send, read_frames=read_frames, send_texts=send_texts))
    await asyncio.wait_for(publisher(), 10)
    assert await asyncio.wait_for(task, 10) == "done"
    assert received == list(range(1, 5001))


async def test_replay_after_a_cursor_then_live() -> None:
    store = [rec(i) for i in range(1, 11)]
    fan = Fanout()
    sub = fan.subscribe()
    received: list[int] = []

    async def read_page(after: int, limit: int) -> list[Record]:
        return [r for r in store if r.seq > after][:limit]

    async def send(r: Record) -> None:
        received.append(r.seq)

    task = asyncio.create_task(deliver(sub, 6, read_page, send))
    await asyncio.sleep(0)
    store.append(rec(11))
    fan.publish([store[-1]])
    sub.close("bye")
    assert await asyncio.wait_for(task, 5) == "bye"
    assert received == [7, 8, 9, 10, 11]


async def test_publish_to_a_full_subscriber_does_not_grow_memory() -> None:
    fan = Fanout()
    sub = fan.subscribe(limit=10)
    for seq in range(1, 10_001):
        fan.publish([rec(seq)])
    assert sub.lagging and len(sub.buf) == 0
