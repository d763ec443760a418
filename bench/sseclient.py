"""A minimal asyncio Server-Sent Events client for the benchmarks (``bench/qwen_peer.py``).

Like ``bench/wsclient.py`` it reads large chunks and splits them with a few slice
operations, so that the client costs less per event than the servers under test. It speaks
HTTP/1.1, undoes chunked transfer encoding, and hands out each event as its raw block of
lines (``id: …\\nevent: …\\ndata: …``), comments and ``retry:`` blocks included.
"""

from __future__ import annotations

import asyncio
import socket

READ_CHUNK = 256 * 1024


class SSEClosed(Exception):
    """The server ended the stream."""


class SSEClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rest: bytes, chunked: bool) -> None:
        self._reader = reader
        self._writer = writer
        self._raw = bytearray(rest)  # bytes as they came (still chunk-framed when chunked)
        self._body = bytearray()  # the decoded body not yet split into events
        self._chunked = chunked
        self._unread: list[bytes] = []

    @classmethod
    async def connect(
        cls, host: str, port: int, path: str, headers: dict[str, str] | None = None, timeout: float = 30.0
    ) -> SSEClient:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=READ_CHUNK * 4), timeout)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Accept: text/event-stream"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = await asyncio.wait_for(reader.read(65536), timeout)
            if not chunk:
                writer.close()
                raise SSEClosed(f"connection closed before the response: {buf[:200]!r}")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        status, *fields = head.decode("latin-1").split("\r\n")
        if status.split()[1:2] != ["200"]:
            writer.close()
            raise SSEClosed(f"refused: {status}")
        chunked = any(f.lower().replace(" ", "") == "transfer-encoding:chunked" for f in fields)
        return cls(reader, writer, rest, chunked)

    def _decode(self) -> None:
        if not self._chunked:
            self._body += self._raw
            self._raw.clear()
            return
        raw, pos = self._raw, 0
        while True:
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(bytes(raw[pos:eol]).split(b";", 1)[0], 16)
            if size == 0:
                raise SSEClosed("the stream ended")
            if len(raw) < eol + 2 + size + 2:
                break
            self._body += raw[eol + 2 : eol + 2 + size]
            pos = eol + 2 + size + 2
        del raw[:pos]

    def _split(self, out: list[bytes]) -> None:
        body = self._body.replace(b"\r\n", b"\n") if b"\r" in self._body else self._body
        *blocks, tail = bytes(body).split(b"\n\n")
        out.extend(b for b in blocks if b)
        self._body = bytearray(tail)

    async def recv_batch(self) -> list[bytes]:
        """Every complete event available now (at least one), in order."""
        if self._unread:
            ready, self._unread = self._unread, []
            return ready
        out: list[bytes] = []
        while not out:
            chunk = await self._reader.read(READ_CHUNK)
            if not chunk:
                raise SSEClosed("connection closed by the server")
            self._raw += chunk
            self._decode()
            self._split(out)
        return out

    def unread(self, events: list[bytes]) -> None:
        if events:
            self._unread = events + self._unread

    async def close(self) -> None:
        if not self._writer.is_closing():
            self._writer.close()
        try:
            await asyncio.wait_for(self._writer.wait_closed(), 2)
        except (TimeoutError, ConnectionError, OSError):
            pass
