"""Fan-out: a slow subscriber is resynced from the store, never blocks the publisher, and
still receives every record exactly once, in order."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from bridge.protocols.envelope import Frames, Page
from bridge.protocols.events import Record
from bridge.sessions.fanout import Fanout, deliver


def rec(seq: int) -> Record:
    return Record(seq, "2026-11-30T00:00:00.000Z", "agent", "agent.other", {}, None, True)


class Transcript:
    """fanout.Transcript over a list; pages as Records or (``frames``) as frame texts."""

    def __init__(self, store: list[Record]) -> None:
        self.store = store

    async def read_page(self, after: int, limit: int) -> Page:
        await asyncio.sleep(0)
        page = [r for r in self.store if r.seq > after][:limit]
        return Page(page, more=len(page) == limit)

    async def read_frames(self, after: int, limit: int, *, raw: bool) -> Frames:
        page = await self.read_page(after, limit)
        return Frames([str(r.seq).encode() for r in page], len(page), page[-1].seq if page else after, more=page.more)


class Sink:
    """fanout.Sink that records seqs; ``rng`` makes it a slow client that yields often."""

    def __init__(self, *, replay_frames: bool = False, rng: random.Random | None = None) -> None:
        self.replay_frames = replay_frames
        self.rng = rng
        self.received: list[int] = []

    async def send(self, texts: list[str], records: list[Record]) -> None:
        for r in records:
            self.received.append(r.seq)
            if self.rng is not None and self.rng.random() < 0.3:
                await asyncio.sleep(0)  # a slow client yields to the publisher

    async def send_frames(self, frames: list[bytes]) -> None:
        assert self.replay_frames
        self.received.extend(int(t) for t in frames)
        await asyncio.sleep(0)


async def test_slow_subscriber_gets_everything_once_in_order_with_a_tiny_buffer() -> None:
    store: list[Record] = []
    fan = Fanout()
    sub = fan.subscribe(limit=4)
    sink = Sink(rng=random.Random(7))

    async def publisher() -> None:
        for seq in range(1, 2001):
            store.append(rec(seq))  # durable before visible
            fan.publish([store[-1]])
            if seq % 7 == 0:
                await asyncio.sleep(0)
        sub.close("done")

    task = asyncio.create_task(deliver(sub, 0, Transcript(store), sink))
    await asyncio.wait_for(publisher(), 10)
    assert await asyncio.wait_for(task, 10) == "done"
    assert sink.received == list(range(1, 2001))
    assert len(sub.buf) <= 4


async def test_store_pages_as_frames_and_live_records_interleave_exactly_once_in_order() -> None:
    # The replay path of the WebSocket (issue #8): store pages arrive as frame texts, the
    # live buffer as records; a slow subscriber resyncs from the store through frames,
    # across page boundaries (REPLAY_PAGE), and nothing is sent twice or skipped.
    store: list[Record] = [rec(seq) for seq in range(1, 2501)]
    fan = Fanout()
    sub = fan.subscribe(limit=4)
    sink = Sink(replay_frames=True, rng=random.Random(11))

    async def publisher() -> None:
        for seq in range(2501, 5001):
            store.append(rec(seq))  # durable before visible
            fan.publish([store[-1]])
            if seq % 5 == 0:
                await asyncio.sleep(0)
        sub.close("done")

    task = asyncio.create_task(deliver(sub, 0, Transcript(store), sink))
    await asyncio.wait_for(publisher(), 10)
    assert await asyncio.wait_for(task, 10) == "done"
    assert sink.received == list(range(1, 5001))


async def test_replay_after_a_cursor_then_live() -> None:
    store = [rec(i) for i in range(1, 11)]
    fan = Fanout()
    sub = fan.subscribe()
    sink = Sink()

    task = asyncio.create_task(deliver(sub, 6, Transcript(store), sink))
    await asyncio.sleep(0)
    store.append(rec(11))
    fan.publish([store[-1]])
    sub.close("bye")
    assert await asyncio.wait_for(task, 5) == "bye"
    assert sink.received == [7, 8, 9, 10, 11]


async def test_publish_to_a_full_subscriber_does_not_grow_memory() -> None:
    fan = Fanout()
    sub = fan.subscribe(limit=10)
    for seq in range(1, 10_001):
        fan.publish([rec(seq)])
    assert sub.lagging and len(sub.buf) == 0


class TextSink(Sink):
    def __init__(self) -> None:
        super().__init__()
        self.order: list[str | int] = []
        self.sent = asyncio.Event()

    async def send(self, texts: list[str], records: list[Record]) -> None:
        self.order += [*texts, *(r.seq for r in records)]
        self.sent.set()


async def test_a_routed_response_never_overtakes_the_events_committed_before_it() -> None:
    """A raw client's response used to go out before the notifications the agent wrote
    before it, when both came in one read."""
    store = [rec(i) for i in range(1, 4)]
    fan = Fanout()
    sub = fan.subscribe()
    sink = TextSink()
    task = asyncio.create_task(deliver(sub, 3, Transcript(store), sink))
    await asyncio.sleep(0)
    store += [rec(4), rec(5)]
    fan.publish(store[-2:])
    sub.push_routed("response", 5)  # the same loop round: committed 4 and 5, then routed
    sub.push_routed("late", 6)  # waits for seq 6
    sub.push_reply("answer")
    async with asyncio.timeout(5):
        while "response" not in sink.order:
            sink.sent.clear()
            await sink.sent.wait()
    assert sink.order.index("response") > max(sink.order.index(4), sink.order.index(5))
    assert "late" not in sink.order and "answer" in sink.order
    store.append(rec(6))
    fan.publish(store[-1:])
    sub.close("bye")
    assert await asyncio.wait_for(task, 5) == "bye"
    assert sink.order[-2:] == [6, "late"]


async def test_an_answer_pushed_during_the_replay_goes_out_before_the_next_store_page() -> None:
    # A client that prompts while its replay is still reading the store: its answer must
    # not wait behind a replay that already holds the turn the prompt started.
    store = [rec(seq) for seq in range(1, 11)]
    fan = Fanout()
    sub = fan.subscribe(limit=64)
    order: list[str | int] = []

    class Slow(Transcript):
        async def read_page(self, after: int, limit: int) -> list[Record]:
            if after == 0:
                sub.push_reply("accepted")  # the answer arrives while the first page is read
            return await super().read_page(after, limit)

    class Recording(Sink):
        async def send(self, texts: list[str], records: list[Record]) -> None:
            order.extend(texts)
            order.extend(r.seq for r in records)

    task = asyncio.create_task(deliver(sub, 0, Slow(store), Recording()))
    await asyncio.sleep(0)
    for _ in range(50):
        if 10 in order:
            break
        await asyncio.sleep(0)
    sub.close("done")
    assert await asyncio.wait_for(task, 5) == "done"
    assert order == ["accepted", *range(1, 11)]


class CallSink(Sink):
    """fanout.Sink that keeps each send's frames (answers as text, records as seqs)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str | int]] = []
        self.sent = asyncio.Event()

    @property
    def order(self) -> list[str | int]:
        return [x for call in self.calls for x in call]

    async def send(self, texts: list[str], records: list[Record]) -> None:
        self.calls.append([*texts, *(r.seq for r in records)])
        self.sent.set()

    async def until(self, pred: Callable[[], bool]) -> None:
        async with asyncio.timeout(5):
            while not pred():
                self.sent.clear()
                await self.sent.wait()


async def spin(rounds: int = 50) -> None:
    """Let every other task run (what a held subscriber must not do in that time: send)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def test_a_held_subscriber_sends_its_answer_first_then_what_waited_in_one_write() -> None:
    # docs/api.md §5.4 on a replica that forwards a frame: the events it caused may arrive
    # (through the store) before its answer (over the bus); they wait for the answer.
    store = [rec(i) for i in range(1, 4)]
    fan = Fanout()
    sub = fan.subscribe()
    sink = CallSink()
    task = asyncio.create_task(deliver(sub, 3, Transcript(store), sink))
    await spin()
    sub.hold(30)
    store += [rec(4), rec(5)]
    fan.publish(store[-2:])
    await spin()
    assert sink.calls == [] and len(sub.buf) == 2  # nothing sent to this client meanwhile
    sub.push_reply("accepted")
    sub.release()
    await sink.until(lambda: 5 in sink.order)
    assert sink.calls == [["accepted", 4, 5]]
    store.append(rec(6))
    fan.publish(store[-1:])  # released: live again
    await sink.until(lambda: 6 in sink.order)
    sub.close("bye")
    assert await asyncio.wait_for(task, 5) == "bye"


async def test_a_hold_ends_by_itself_at_its_deadline() -> None:
    # A holder that never answers: the events go out once the hold's time is up (the
    # forward's own timeout then refuses the frame), and a later release changes nothing.
    fan = Fanout()
    sub = fan.subscribe()
    sink = CallSink()
    task = asyncio.create_task(deliver(sub, 0, Transcript([]), sink))
    await spin()
    loop = asyncio.get_running_loop()
    began = loop.time()
    sub.hold(0.2)
    fan.publish([rec(1)])
    await sink.until(lambda: 1 in sink.order)
    assert loop.time() - began >= 0.15 and sub.held_until == 0.0
    sub.push_reply("rejected")
    sub.release()
    await sink.until(lambda: "rejected" in sink.order)
    assert sink.order == [1, "rejected"]
    sub.close("bye")
    assert await asyncio.wait_for(task, 5) == "bye"


async def test_a_held_backlog_past_the_buffer_is_resent_from_the_store_after_the_answer() -> None:
    # What waits for the answer is bounded by the subscriber's buffer: past it the buffer
    # is dropped (as for a slow client), and after the answer the store is read again.
    store: list[Record] = []
    fan = Fanout()
    sub = fan.subscribe(limit=4)
    sink = CallSink()
    task = asyncio.create_task(deliver(sub, 0, Transcript(store), sink))
    await spin()
    sub.hold(30)
    for seq in range(1, 101):
        store.append(rec(seq))  # durable before visible
        fan.publish([store[-1]])
    assert sub.lagging and len(sub.buf) == 0  # memory stays bounded while held
    await spin()
    assert sink.calls == []
    sub.push_reply("accepted")
    sub.release()
    await sink.until(lambda: 100 in sink.order)
    assert sink.order == ["accepted", *range(1, 101)]
    sub.close("bye")
    assert await asyncio.wait_for(task, 5) == "bye"


async def test_a_hold_during_the_replay_stops_the_store_pages_until_the_answer() -> None:
    # A client that prompts (through another replica) while its replay is still reading:
    # the next page may already hold the turn its prompt started.
    store = [rec(seq) for seq in range(1, 2501)]
    fan = Fanout()
    sub = fan.subscribe(limit=64)
    sink = CallSink()
    sub.hold(30)
    task = asyncio.create_task(deliver(sub, 0, Transcript(store), sink))
    await spin()
    assert sink.calls == []
    sub.push_reply("accepted")
    sub.release()
    await sink.until(lambda: 2500 in sink.order)
    assert sink.order == ["accepted", *range(1, 2501)]
    sub.close("bye")
    assert await asyncio.wait_for(task, 5) == "bye"


async def test_a_held_subscriber_that_is_closed_leaves_at_once() -> None:
    fan = Fanout()
    sub = fan.subscribe()
    sink = CallSink()
    task = asyncio.create_task(deliver(sub, 0, Transcript([]), sink))
    await spin()
    sub.hold(30)
    sub.close("deleted")
    assert await asyncio.wait_for(task, 5) == "deleted"
