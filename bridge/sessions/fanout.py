"""Fan-out of transcript records to live subscribers.

Each subscriber has a bounded buffer (``limit`` records, or one published batch, whichever
is larger). A subscriber that falls behind never blocks the agent, the store or the other
subscribers: its buffer is dropped and it is marked ``lagging``; its sender then re-reads
the missed records from the store (which holds every record before it is published) and
carries on from the buffer, skipping what it has already sent by ``seq``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from bridge.protocols.envelope import Frames
from bridge.protocols.events import Record

DEFAULT_BUFFER = 1024
REPLAY_PAGE = 1000


SIDE_LIMIT = 16  # ephemeral notices kept for a subscriber that is not reading
REPLY_LIMIT = 64  # answers to a client's own frames waiting to go out before its reader waits


class Subscriber:
    __slots__ = ("buf", "close_reason", "closed", "lagging", "limit", "raw", "replies", "room", "side", "wake")

    def __init__(self, limit: int = DEFAULT_BUFFER, *, raw: bool = False) -> None:
        self.raw = raw  # raw mode: only agent lines and responses routed to it, no notices
        self.buf: deque[Record] = deque()
        # Frames that are not transcript events (e.g. "the store is unavailable"): they
        # cannot be replayed, so a slow subscriber keeps only the newest few.
        self.side: deque[str] = deque(maxlen=SIDE_LIMIT)
        # Answers to this client's own frames (client.accepted / client.rejected): never
        # dropped, sent with whatever else is ready in one write (issue #8). The client's
        # reader waits for ``room`` when more than REPLY_LIMIT are waiting.
        self.replies: deque[str] = deque()
        self.room = asyncio.Event()
        self.room.set()
        self.limit = limit
        self.lagging = False
        self.closed = False
        self.close_reason: str | None = None
        self.wake = asyncio.Event()

    def push(self, records: Sequence[Record]) -> None:
        if self.lagging or self.closed:
            return
        if self.buf and len(self.buf) + len(records) > self.limit:
            # Behind by more than the buffer: drop it and resync from the store. One batch
            # into an empty buffer is always taken, whatever its size: it is one read of
            # agent output, already in memory, and lagging on it would send every burst
            # larger than the buffer through the store again (issue #8).
            self.buf.clear()
            self.lagging = True
        else:
            self.buf.extend(records)
        self.wake.set()

    def push_side(self, text: str) -> None:
        if not self.closed:
            self.side.append(text)
            self.wake.set()

    def push_reply(self, text: str) -> None:
        self.replies.append(text)
        if len(self.replies) >= REPLY_LIMIT:
            self.room.clear()
        self.wake.set()

    def close(self, reason: str) -> None:
        self.closed = True
        self.close_reason = reason
        self.wake.set()


class Fanout:
    def __init__(self) -> None:
        self._subs: set[Subscriber] = set()
        self._empty = asyncio.Event()
        self._empty.set()

    def __len__(self) -> int:
        return len(self._subs)

    def subscribe(self, limit: int = DEFAULT_BUFFER, *, raw: bool = False) -> Subscriber:
        sub = Subscriber(limit, raw=raw)
        self._subs.add(sub)
        self._empty.clear()
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subs.discard(sub)
        if not self._subs:
            self._empty.set()

    async def wait_empty(self) -> None:
        await self._empty.wait()

    def publish(self, records: Sequence[Record]) -> None:
        for sub in self._subs:
            sub.push(records)

    committed = publish  # the in-process Announcer (sessions/announce.py)

    def broadcast_side(self, text: str) -> None:
        """A bridge notice for every events-mode subscriber."""
        for sub in self._subs:
            if not sub.raw:
                sub.push_side(text)

    def close_all(self, reason: str) -> None:
        """Close every subscriber; each leaves (unsubscribes) once its client is told."""
        for sub in list(self._subs):
            sub.close(reason)


ReadPage = Callable[[int, int], Awaitable[list[Record]]]
Send = Callable[[Record], Awaitable[None]]
SendMany = Callable[[list[Record]], Awaitable[None]]
SendSide = Callable[[str], Awaitable[None]]
ReadFrames = Callable[[int, int], Awaitable[Frames]]
SendTexts = Callable[[list[bytes]], Awaitable[None]]
SendMixed = Callable[[list[str], list[Record]], Awaitable[None]]


async def deliver(
    sub: Subscriber,
    after: int,
    read_page: ReadPage,
    send: Send,
    send_side: SendSide | None = None,
    *,
    send_many: SendMany | None = None,
    read_frames: ReadFrames | None = None,
    send_texts: SendTexts | None = None,
    send_mixed: SendMixed | None = None,
) -> str | None:
    """Send every record with ``seq > after`` to one subscriber, in order, exactly once:
    first from the store, then live, resyncing from the store whenever it lagged.
    Returns the close reason when the subscriber is closed.

    With ``send_many``, everything ready at once (a store page, the whole live buffer) goes
    out in one call, so the transport can write it with one system call (issue #8);
    ``send_many`` must send all of its records or raise.

    With ``read_frames`` and ``send_texts``, the store pages come as frame texts joined
    from the stored rows (no Record per row) and go out with ``send_texts``; live records
    still go through ``send_many``/``send``. ``send_texts`` must send all or raise.

    With ``send_mixed``, the live loop sends the subscriber's replies and notices and its
    buffered records with one call (replies first, then notices, then records), so an
    answer and the events it caused share a write. Without it, replies go out through
    ``send_side`` like notices."""
    last = after
    if send_texts is None:
        read_frames = None

    async def out(batch: list[Record]) -> None:
        nonlocal last
        if not batch:
            return
        if send_many is not None:
            await send_many(batch)
        else:
            for rec in batch:
                await send(rec)
        last = batch[-1].seq

    async def read(after_seq: int) -> Frames | list[Record]:
        if read_frames is not None:
            return await read_frames(after_seq, REPLAY_PAGE)
        return await read_page(after_seq, REPLAY_PAGE)

    async def out_page(page: Frames | list[Record]) -> None:
        nonlocal last
        if isinstance(page, list):
            await out(page)
            return
        if page.texts:
            assert send_texts is not None
            await send_texts(page.texts)
        if page.count:
            last = page.last

    async def catch_up() -> None:
        # The next page is read while this one is sent (issue #8). Every read starts after
        # ``lagging`` was cleared, so whatever it misses (committed after the read) was
        # published after the clear: it is in the buffer, or ``lagging`` is set again.
        sub.lagging = False  # from here on, anything published is also buffered
        pending = asyncio.ensure_future(read(last))
        try:
            while True:
                page = await pending
                if isinstance(page, list):
                    count, page_last = len(page), (page[-1].seq if page else last)
                else:
                    count, page_last = page.count, page.last
                if count == REPLAY_PAGE:
                    sub.lagging = False
                    pending = asyncio.ensure_future(read(page_last))
                    await out_page(page)
                    continue
                await out_page(page)
                if not sub.lagging:
                    return
                sub.lagging = False
                pending = asyncio.ensure_future(read(last))
        finally:
            if not pending.done():
                pending.cancel()

    await catch_up()
    while True:
        if send_mixed is not None and (sub.replies or sub.side or sub.buf):
            texts = [*sub.replies, *sub.side]
            sub.replies.clear()
            sub.side.clear()
            sub.room.set()
            batch = [rec for rec in sub.buf if rec.seq > last]
            sub.buf.clear()
            await send_mixed(texts, batch)
            if batch:
                last = batch[-1].seq
        for texts_left in (sub.replies, sub.side):  # without send_mixed: replies, then notices
            while texts_left:
                text = texts_left.popleft()
                if send_side is not None:
                    await send_side(text)
        sub.room.set()
        if sub.buf:
            batch = [rec for rec in sub.buf if rec.seq > last]
            sub.buf.clear()
            await out(batch)
        if sub.lagging:
            await catch_up()
            continue
        if sub.closed:
            return sub.close_reason
        if sub.side or sub.buf or sub.replies:
            continue
        sub.wake.clear()
        await sub.wake.wait()
