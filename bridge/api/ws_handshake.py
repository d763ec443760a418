"""An answer for every WebSocket upgrade request, even one the handshake parser refuses.

uvicorn hands an upgrade request to websockets' sans-I/O ``ServerProtocol``. When that
parser refuses the request — a request line or a header line over 8 KiB, more than 128
headers, or bytes that are not HTTP — it records ``handshake_exc`` and produces no event.
An older uvicorn protocol only acts on events and never writes the response (the client
waits on an open socket until it gives up); a newer one, with ``handle_handshake_exception``,
answers in websockets' plain text. This subclass writes a clear refusal in the daemon's error body (414, 431 or
400) with either, and closes the connection.

It also stops a false error in the log: when the app refuses an upgrade with an HTTP
response (401, 403, 421 from ``security.RequestGuard``), uvicorn checks whether the
handshake completed as soon as the app returns, before its own ``connection_lost`` marks
the refused connection done, and logs "ASGI callable returned without completing
handshake" at error level for a refusal that went out as intended.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidMessage
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS

from bridge.errors import error_json

_REFUSALS: dict[str, tuple[int, str, str, str]] = {
    "RequestLineTooLong": (
        414,
        "URI Too Long",
        "request_line_too_long",
        f"the request line is longer than {MAX_LINE_LENGTH} bytes",
    ),
    "HeaderLineTooLong": (
        431,
        "Request Header Fields Too Large",
        "headers_too_large",
        f"a header line is longer than {MAX_LINE_LENGTH} bytes",
    ),
    "TooManyHeaders": (
        431,
        "Request Header Fields Too Large",
        "headers_too_large",
        f"more than {MAX_NUM_HEADERS} header lines",
    ),
}
_BAD_REQUEST = (400, "Bad Request", "bad_request", "not a valid HTTP upgrade request")


def refusal(exc: BaseException) -> bytes:
    """The HTTP response for a handshake the parser refused."""
    cause = exc.__cause__ if isinstance(exc, InvalidMessage) and exc.__cause__ else exc
    status, phrase, code, message = _REFUSALS.get(type(cause).__name__, _BAD_REQUEST)
    body = error_json(code, message)
    head = (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


# After a refusal the rest of the client's request is read and dropped for at most this
# long before the socket is closed: closing with unread bytes makes the kernel send a reset,
# which can destroy the answer before the client has read it.
LINGER_S = 1.0


class WebSocketProtocol(WebSocketsSansIOProtocol):
    _lingering: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None:
            return  # the refused request's remainder: dropped
        super().data_received(data)
        exc = self.conn.handshake_exc
        if exc is None or self._lingering is not None or self.handshake_complete or self.transport.is_closing():
            return
        self._refuse(exc)  # an older uvicorn never answers it

    def handle_handshake_exception(self) -> None:
        """A newer uvicorn answers a refused handshake itself, with websockets' plain-text
        414/431 (or a 400): the daemon's error body instead, as with older versions."""
        exc = self.conn.handshake_exc
        assert exc is not None
        self._refuse(exc)

    def _refuse(self, exc: BaseException) -> None:
        self.conn.data_to_send()  # websockets' own plain-text refusal, replaced by ours
        self.transport.write(refusal(exc))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()  # the answer, then FIN; the client's bytes are drained
        self._lingering = asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)

    def eof_received(self) -> None:
        if self._lingering is not None:
            self.transport.close()  # the client is done sending: close now
            return
        super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lingering is not None:
            self._lingering.cancel()
        super().connection_lost(exc)

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True  # refused and answered; connection_lost says so a moment later
