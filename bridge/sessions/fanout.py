"""Fan-out of transcript records to live subscribers.

Each subscriber has a bounded buffer (``limit`` records, or one published batch, whichever
is larger). A subscriber that falls behind never blocks the agent, the store or the other
subscribers: its buffer is dropped and it is marked ``lagging``; its sender then re-reads
the missed records from the store (which holds every record before it is published) and
carries on from the buffer, skipping what it has already sent by ``seq``.

While a subscriber's client has a frame of its own forwarded to another replica (the one
that runs the thread's agent, sessions/remote.py), the subscriber is *held*: nothing is
sent to it until that frame's answer has been pushed (or the hold's deadline passed, or it
is closed), so the answer goes out before the events the frame caused (docs/api.md §5.4)
— the answer comes back over the bus, the events through the store, and either may be
first to arrive. What is published meanwhile is buffered within the same limit; past it
the subscriber lags and is resent from the store after the answer, as a slow one is.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from bridge.protocols.envelope import Frames, Page
from bridge.protocols.events import Record

DEFAULT_BUFFER = 1024
REPLAY_PAGE = 1000


SIDE_LIMIT = 16  # ephemeral notices kept for a subscriber that is not reading
REPLY_LIMIT = 64  # answers to a client's own frames waiting to go out before its reader waits


class Subscriber:
    __slots__ = (
        "buf",
        "close_reason",
        "closed",
        "held_until",
        "lagging",
        "limit",
        "raw",
        "replies",
        "room",
        "routed",
        "side",
        "wake",
    )

    def __init__(self, limit: int = DEFAULT_BUFFER, *, raw: bool = False) -> None:
        self.raw = raw  # raw mode: only agent lines and responses routed to it, no notices
        self.buf: deque[Record] = deque()
        # Frames that are not transcript events (e.g. "the store is unavailable"): they
        # cannot be replayed, so a slow subscriber keeps only the newest few.
        self.side: deque[str] = deque(maxlen=SIDE_LIMIT)
        # Responses routed to this client only (a raw client's own request), each with the
        # seq of the newest event committed before it: it goes out after that event, so a
        # response never overtakes the notifications the agent wrote before it.
        self.routed: deque[tuple[int, str]] = deque()
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
        # While its client's own frame is forwarded and unanswered (hold/release): the
        # monotonic time the hold ends by itself; 0.0 when not held.
        self.held_until = 0.0

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

    def push_routed(self, text: str, after_seq: int) -> None:
        if not self.closed:
            self.routed.append((after_seq, text))
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

    def hold(self, seconds: float) -> None:
        """The client's own frame went to another replica: send it nothing until
        :meth:`release` (its answer was pushed), for at most ``seconds`` from the first
        hold (a frame routed again after its lease holder died does not extend it)."""
        if not self.held_until:
            self.held_until = time.monotonic() + seconds

    def release(self) -> None:
        """The held frame's answer is pushed: it goes out first, then what waited."""
        if self.held_until:
            self.held_until = 0.0
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

    def resync_all(self) -> None:
        """Every subscriber re-reads from the store after what it was sent (events were
        committed that were never published here: another replica's, before a takeover)."""
        for sub in self._subs:
            sub.buf.clear()
            sub.lagging = True
            sub.wake.set()

    def close_all(self, reason: str) -> None:
        """Close every subscriber; each leaves (unsubscribes) once its client is told."""
        for sub in list(self._subs):
            sub.close(reason)


class Transcript(Protocol):
    """Where a subscriber's missed records are read from (a thread's Journal)."""

    async def read_page(self, after: int, limit: int) -> Page: ...
    async def read_frames(self, after: int, limit: int, *, raw: bool) -> Frames: ...


class Sink(Protocol):
    """One client's side of delivery: a WebSocket, an SSE stream. Each call must send all
    it is given, in order, or raise."""

    # Store pages may come as frames joined straight from the stored rows (no Record per
    # row, issue #8): events-mode envelopes or, for a raw subscriber, the relayed lines.
    replay_frames: bool

    async def send(self, texts: list[str], records: list[Record]) -> None:
        """Ready frames (answers to the client's own frames, then notices) and then
        records: one write where the transport allows, so an answer and the events it
        caused leave together."""
        ...

    async def send_frames(self, frames: list[bytes]) -> None: ...


async def deliver(sub: Subscriber, after: int, transcript: Transcript, sink: Sink) -> str | None:
    """Send every record with ``seq > after`` to one subscriber, in order, exactly once:
    first from the store, then live, resyncing from the store whenever it lagged.
    Returns the close reason when the subscriber is closed."""
    cursor = _Cursor(after)
    await _catch_up(sub, cursor, transcript, sink)
    while True:
        if sub.held_until:
            await _until_answered(sub)
        await _send_ready(sub, cursor, sink)
        sub.room.set()
        if sub.lagging:
            await _catch_up(sub, cursor, transcript, sink)
            continue
        if sub.closed:
            return sub.close_reason
        if sub.side or sub.buf or sub.replies or (sub.routed and sub.routed[0][0] <= cursor.last):
            continue
        sub.wake.clear()
        await sub.wake.wait()


async def _send_ready(sub: Subscriber, cursor: _Cursor, sink: Sink) -> None:
    """Everything the subscriber has ready: answers and notices, then records (one send),
    then the routed responses those records were waiting for."""
    if sub.replies or sub.side or sub.buf:
        texts = [*sub.replies, *sub.side]
        sub.replies.clear()
        sub.side.clear()
        sub.room.set()
        batch = [rec for rec in sub.buf if rec.seq > cursor.last]
        sub.buf.clear()
        await sink.send(texts, batch)
        if batch:
            cursor.last = batch[-1].seq
    if due := _due(sub, cursor.last):
        await sink.send(due, [])


async def _until_answered(sub: Subscriber) -> None:
    """While the subscriber is held: until it is released, closed, or its hold expires
    (then the hold is over: an answer that comes later goes out with the events)."""
    while not sub.closed and (left := sub.held_until - time.monotonic()) > 0:
        sub.wake.clear()
        try:
            async with asyncio.timeout(left):
                await sub.wake.wait()
        except TimeoutError:
            break
    sub.held_until = 0.0


def _due(sub: Subscriber, last: int) -> list[str]:
    """The routed responses whose preceding events have been sent."""
    out = []
    while sub.routed and sub.routed[0][0] <= last:
        out.append(sub.routed.popleft()[1])
    return out


class _Cursor:
    __slots__ = ("last",)

    def __init__(self, last: int) -> None:
        self.last = last  # the seq of the newest record this subscriber was sent


async def _read(sub: Subscriber, after: int, transcript: Transcript, sink: Sink) -> Frames | Page:
    if sink.replay_frames:
        return await transcript.read_frames(after, REPLAY_PAGE, raw=sub.raw)
    return await transcript.read_page(after, REPLAY_PAGE)


async def _send_answers(sub: Subscriber, sink: Sink) -> None:
    """Answers to the subscriber's own frames go out between store pages too: a client that
    prompts while its replay is still running hears "accepted" before the turn's events,
    not after a replay that already holds the whole turn (docs/api.md §5.4)."""
    if sub.replies:
        texts = list(sub.replies)
        sub.replies.clear()
        sub.room.set()
        await sink.send(texts, [])


async def _send_page(sub: Subscriber, page: Frames | Page, cursor: _Cursor, sink: Sink) -> None:
    """Send one store page, after the answers waiting for the subscriber (once its hold,
    if any, is over)."""
    if sub.held_until:
        await _until_answered(sub)
    await _send_answers(sub, sink)
    if isinstance(page, list):
        if page:
            await sink.send([], page)
            cursor.last = page[-1].seq
        return
    if page.texts:
        await sink.send_frames(page.texts)
    if page.count:
        cursor.last = page.last


async def _catch_up(sub: Subscriber, cursor: _Cursor, transcript: Transcript, sink: Sink) -> None:
    # The next page is read while this one is sent (issue #8). Every read starts after
    # ``lagging`` was cleared, so whatever it misses (committed after the read) was
    # published after the clear: it is in the buffer, or ``lagging`` is set again. What a
    # page stopped short of (its count, or the store's byte bound: ``more``) is read next;
    # a page that stopped at a few MiB is not the end (issue #34: taking it for the end
    # left a replay waiting, after the first 8 MiB prompt, for live events that were
    # already stored).
    sub.lagging = False  # from here on, anything published is also buffered
    pending = asyncio.ensure_future(_read(sub, cursor.last, transcript, sink))
    try:
        while True:
            page = await pending
            if page.more:
                sub.lagging = False
                page_last = page.last if isinstance(page, Frames) else page[-1].seq
                pending = asyncio.ensure_future(_read(sub, page_last, transcript, sink))
                await _send_page(sub, page, cursor, sink)
                continue
            await _send_page(sub, page, cursor, sink)
            if not sub.lagging:
                return
            sub.lagging = False
            pending = asyncio.ensure_future(_read(sub, cursor.last, transcript, sink))
    finally:
        if not pending.done():
            pending.cancel()
