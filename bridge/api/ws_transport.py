"""uvicorn's WebSocket protocol plus two ASGI extensions: send many text frames at once,
and read the client's messages without the ASGI receive queue.

ASGI sends one frame per ``websocket.send`` message, and uvicorn writes each one to the
socket straight away: one system call per frame. A conversation relaying a burst of agent
lines has hundreds of frames ready at once, so the WebSocket handler (ws.py) looks for the
``agent-bridge.send_texts`` extension in the scope and, when present, hands it the whole
batch: every frame goes through the websockets protocol object as usual (framing,
compression when negotiated, state checks), and the bytes leave in one ``transport.write``.
Flow control is uvicorn's own: a paused transport makes the next batch wait.

The receive side (``agent-bridge.receive``, issue #22): after the handshake the handler
asks for the connection's ``Inbox`` once, and every later client message goes from the
protocol's ``data_received`` straight into it as a ``str`` (text) or ``bytes`` (binary),
the websockets parser having checked framing, masking and the size limit and the inbox
the UTF-8 (1007 as before). uvicorn hands each message over as an ASGI dict through an
``asyncio.Queue`` and pauses reading from the socket after every one of them (resuming on
the next ``receive()``): two ``epoll_ctl`` system calls and a queue round per message. The
inbox pauses reading only when ``Inbox.HIGH`` messages or ``Inbox.HIGH_BYTES`` of them wait
unread, and resumes when the handler has taken them all. A read beyond ``FEED_BYTES`` is
parsed a slice at a time while the inbox has room, the rest kept unparsed until the handler
has taken what waits: a client that floods us is bounded by the mark plus what one slice
holds (with permessage-deflate, what 16 KiB inflate to, each message at most the server's
``ws_max_size``), where uvicorn's queue took whatever one 256 KiB read held. uvicorn's own
events (the client's close, a lost connection, the server shutting down) arrive as the
ASGI ``websocket.disconnect`` dict they always were.

The class extends uvicorn's sans-I/O websockets implementation (the one uvicorn picks by
default with websockets installed), through ws_handshake.WebSocketProtocol (an answer for
every upgrade the handshake parser refuses). Should a uvicorn release move it, ``PROTOCOL`` is None,
uvicorn's default is used, and the handler falls back to one ASGI send per frame.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

SEND_TEXTS = "agent-bridge.send_texts"
RECEIVE = "agent-bridge.receive"
FEED_BYTES = 16 * 1024  # a read beyond this is parsed in slices of it, while the inbox has room
_HEADS: dict[int, bytes] = {}  # frame header by payload length
_HEADS_STR: dict[int, str] = {}  # the same, as Latin-1 text


def _head(n: int) -> bytes:
    head = _HEADS.get(n)
    if head is None:
        if n < 126:
            head = bytes((0x81, n))
        elif n < 65536:
            head = b"\x81\x7e" + n.to_bytes(2, "big")
        else:
            head = b"\x81\x7f" + n.to_bytes(8, "big")
        if n < 65536:  # bounded: at most one entry per length below 64 KiB
            _HEADS[n] = head
            _HEADS_STR[n] = head.decode("latin-1")
    return head


def frames(texts: list[str] | list[bytes]) -> bytes:
    """Unmasked text frames (FIN + text opcode, RFC 6455 §5.2) for UTF-8 payloads given as
    ``bytes`` or as ``str``. ASCII text (nearly every frame: JSON with escapes) is joined as
    text with its headers written as Latin-1 characters and encoded once, which is exactly
    the frames' bytes (issue #8); anything else is encoded frame by frame."""
    parts: list[bytes] = []
    if texts and isinstance(texts[0], str):
        heads = _HEADS_STR
        sparts: list[str] = []
        for i, text in enumerate(texts):
            assert isinstance(text, str)
            if not text.isascii():
                parts.append("".join(sparts).encode("latin-1"))
                parts.append(frames([t.encode() for t in texts[i:] if isinstance(t, str)]))
                return b"".join(parts)
            n = len(text)
            head = heads.get(n)
            sparts.append(head if head is not None else _head(n).decode("latin-1"))
            sparts.append(text)
        return "".join(sparts).encode("latin-1")
    for data in texts:
        assert isinstance(data, bytes)
        n = len(data)
        head_b = _HEADS.get(n)
        parts.append(head_b if head_b is not None else _head(n))
        parts.append(data)
    return b"".join(parts)


class Inbox:
    """One WebSocket's client messages after the handshake, in order: ``str`` for a text
    message, ``bytes`` for a binary one, a ``dict`` for an ASGI event of uvicorn's (the
    ``websocket.disconnect`` of a close, a lost connection or a shutdown). One reader."""

    HIGH = 64  # messages waiting unread before the socket is no longer read
    HIGH_BYTES = 1024 * 1024  # or this many characters/bytes of them

    def __init__(self, protocol: Any) -> None:
        # Its transport, its read_paused flag (shared with uvicorn) and inbox_drained().
        self._protocol = protocol
        self._items: deque[str | bytes | dict[str, Any]] = deque()
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size(self) -> int:
        """Characters of text and bytes of binary messages waiting unread."""
        return self._size

    @property
    def reading(self) -> bool:
        """Whether the socket is being read (False while the inbox is full)."""
        return not self._protocol.read_paused

    def push(self, item: str | bytes | dict[str, Any]) -> None:
        items = self._items
        items.append(item)
        if not isinstance(item, dict):
            self._size += len(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if len(items) >= self.HIGH or self._size >= self.HIGH_BYTES:
            proto = self._protocol
            if not proto.read_paused:
                proto.read_paused = True
                proto.transport.pause_reading()

    @property
    def full(self) -> bool:
        return len(self._items) >= self.HIGH or self._size >= self.HIGH_BYTES

    # uvicorn's names for its receive queue: it puts its own events with put_nowait.
    put_nowait = push

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> str | bytes | dict[str, Any]:
        items = self._items
        while not items:
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None
        item = items.popleft()
        if not isinstance(item, dict):
            self._size -= len(item)
        if not items and self._protocol.read_paused:
            self._protocol.inbox_drained()
        return item


PROTOCOL: type[Any] | None
try:
    from uvicorn.protocols.utils import ClientDisconnected
    from websockets.exceptions import InvalidState
    from websockets.protocol import State

    from bridge.api.ws_handshake import WebSocketProtocol
except ImportError:  # pragma: no cover - depends on the installed uvicorn
    PROTOCOL = None
else:

    class BatchingWebSocketProtocol(WebSocketProtocol):
        inbox: Inbox | None = None
        _unfed = b""  # bytes read from the socket but not yet parsed: the inbox was full

        def handle_connect(self, event: Any) -> None:
            super().handle_connect(event)
            scope = getattr(self, "scope", None)
            if scope is not None and self.response.status_code == 101:
                extensions = scope.setdefault("extensions", {})
                extensions[SEND_TEXTS] = self._send_texts
                extensions[RECEIVE] = self._direct_inbox

        def _direct_inbox(self) -> Inbox:
            """From now on client messages go to the returned inbox, not to ``receive()``;
            what the ASGI queue still holds moves there first, in order."""
            inbox = self.inbox
            if inbox is not None:
                return inbox
            inbox = Inbox(self)
            old = self.queue
            while not old.empty():
                message = old.get_nowait()
                if message["type"] == "websocket.receive":
                    text = message.get("text")
                    inbox.push(text if text is not None else message.get("bytes") or b"")
                else:
                    inbox.push(dict(message))
            self.inbox = inbox
            self.queue = inbox  # type: ignore[assignment]  # uvicorn's events: put_nowait, empty
            if not inbox.full and self.read_paused and not self.close_sent:
                self.read_paused = False
                self.transport.resume_reading()
            return inbox

        def data_received(self, data: bytes) -> None:
            if self.inbox is None:
                super().data_received(data)
                return
            if not self._unfed and len(data) <= FEED_BYTES:
                super().data_received(data)  # nearly always: one small read
                return
            self._unfed += data
            self._feed()

        def _feed(self) -> None:
            """Parse what was read, a slice at a time, while the inbox has room: one socket
            read (or a compressed message) cannot fill it far beyond its mark."""
            inbox = self.inbox
            assert inbox is not None
            unfed, at = self._unfed, 0
            while at < len(unfed) and not inbox.full:
                super().data_received(unfed[at : at + FEED_BYTES])
                at += FEED_BYTES
            self._unfed = unfed[at:] if at < len(unfed) else b""
            if self._unfed and not self.read_paused:
                self.read_paused = True
                self.transport.pause_reading()

        def inbox_drained(self) -> None:
            """The handler took every waiting message: parse the rest, then read again."""
            if self._unfed:
                self._feed()
            inbox = self.inbox
            if not self._unfed and inbox is not None and not inbox.full and self.read_paused:
                if not self.close_sent:  # after our close uvicorn reads on its own
                    self.read_paused = False
                    self.transport.resume_reading()

        def send_receive_event_to_app(self) -> None:
            inbox = self.inbox
            if inbox is None:
                super().send_receive_event_to_app()
                return
            frames = self.frames
            data = frames[0] if len(frames) == 1 else b"".join(frames)
            self.frames = []
            if self.close_sent:
                return  # past our close: dropped, as uvicorn does
            if self.curr_msg_data_type == "text":
                try:
                    inbox.push(data.decode())
                except UnicodeDecodeError:
                    self.conn.send_close(1007)  # uvicorn's answer: invalid frame payload data
                    self.handle_parser_exception()
            else:
                inbox.push(bytes(data))

        async def receive(self) -> Any:
            if self.inbox is not None:
                raise RuntimeError("this WebSocket's messages are read from its agent-bridge.receive inbox")
            return await super().receive()

        async def _send_texts(self, texts: list[str] | list[bytes]) -> None:
            await self.writable.wait()
            if self.disconnected or self.close_sent or not self.handshake_complete:
                raise ClientDisconnected()
            if self.conn.state is not State.OPEN:
                raise ClientDisconnected()
            if self.conn.extensions:
                # Compression negotiated: the frames go through its (stateful) encoder.
                try:
                    for text in texts:
                        self.conn.send_text(text.encode() if isinstance(text, str) else text)
                except InvalidState:
                    raise ClientDisconnected() from None
                self.transport.write(b"".join(self.conn.data_to_send()))
                return
            # No extension: a server frame is a fixed header and the payload (RFC 6455 §5.2,
            # unmasked, FIN + text opcode), which is cheaper to write here than through a
            # Frame object per text; the protocol object keeps no state per data frame.
            self.transport.write(frames(texts))

    PROTOCOL = BatchingWebSocketProtocol
