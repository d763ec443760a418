"""uvicorn's WebSocket protocol plus one ASGI extension: send many text frames at once.

ASGI sends one frame per ``websocket.send`` message, and uvicorn writes each one to the
socket straight away: one system call per frame. A conversation relaying a burst of agent
lines has hundreds of frames ready at once, so the WebSocket handler (ws.py) looks for the
``agent-bridge.send_texts`` extension in the scope and, when present, hands it the whole
batch: every frame goes through the websockets protocol object as usual (framing,
compression when negotiated, state checks), and the bytes leave in one ``transport.write``.
Flow control is uvicorn's own: a paused transport makes the next batch wait.

The class extends uvicorn's sans-I/O websockets implementation (the one uvicorn picks by
default with websockets installed), through ws_handshake.WebSocketProtocol (an answer for
every upgrade the handshake parser refuses). Should a uvicorn release move it, ``PROTOCOL`` is None,
uvicorn's default is used, and the handler falls back to one ASGI send per frame.
"""

from __future__ import annotations

from typing import Any

SEND_TEXTS = "agent-bridge.send_texts"
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
        def handle_connect(self, event: Any) -> None:
            super().handle_connect(event)
            scope = getattr(self, "scope", None)
            if scope is not None and self.response.status_code == 101:
                scope.setdefault("extensions", {})[SEND_TEXTS] = self._send_texts

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
