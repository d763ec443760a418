"""Request body size limit, as a pure ASGI middleware (streaming and WebSockets pass
through untouched). A body over ``max_bytes`` — by its Content-Length or as it streams in,
chunked — is answered 413 with the standard error body before the app sees it."""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bridge.errors import error_json

MAX_BODY_BYTES = 8 * 1024 * 1024  # the same cap as one WebSocket frame (api/ws.py)


DRAIN_LIMIT = 64 * 1024 * 1024  # past this much of an oversized body, stop reading it


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        # Buffer the body (at most max_bytes) before the app runs, so an oversized one is
        # refused cleanly: the client gets its 413 after its upload, not a reset mid-way.
        chunks: list[bytes] = []
        size = 0
        drained = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            if size <= self.max_bytes:
                size += len(body)
                if size <= self.max_bytes:
                    chunks.append(body)
                else:
                    chunks.clear()
            else:
                drained += len(body)
                if drained > DRAIN_LIMIT:  # not worth reading further: just answer and close
                    break
            if not message.get("more_body", False):
                break
        if size > self.max_bytes:
            await self._refuse(send)
            return
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        body = error_json("body_too_large", f"request body over {self.max_bytes} bytes")
        headers: list[Any] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
