"""A minimal asyncio WebSocket client (RFC 6455) for the benchmarks.

The benchmarks relay hundreds of thousands of small frames per second; a general-purpose
client spends more time per frame than the servers under test, and the ratios would then
measure the client. This one reads large chunks and splits frames with a few slice
operations; it offers no extensions (so no server compresses), answers pings, and masks
what it sends, as a client must. Text frames only, which is all the servers under test send.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct

READ_CHUNK = 256 * 1024


class Closed(Exception):
    """The server closed the connection (close frame or EOF)."""


def _mask(payload: bytes, key: bytes) -> bytes:
    if not payload:
        return payload
    n = len(payload)
    repeated = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(n, "big")


def _frame(opcode: int, payload: bytes) -> bytes:
    key = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    return head + key + _mask(payload, key)


class WSClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, leftover: bytes) -> None:
        self._reader = reader
        self._writer = writer
        self._buf = bytearray(leftover)
        self._frag = bytearray()
        self._unread: list[bytes] = []
        self.closed = False

    @classmethod
    async def connect(
        cls, host: str, port: int, path: str, headers: dict[str, str] | None = None, timeout: float = 10.0
    ) -> WSClient:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=READ_CHUNK * 4), timeout)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = await asyncio.wait_for(reader.read(65536), timeout)
            if not chunk:
                writer.close()
                raise Closed(f"connection closed during the handshake: {buf[:200]!r}")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            writer.close()
            raise Closed(f"handshake refused: {status.decode(errors='replace')}")
        return cls(reader, writer, rest)

    async def send_text(self, text: str) -> None:
        self._writer.write(_frame(0x1, text.encode()))
        await self._writer.drain()

    async def _fill(self) -> None:
        chunk = await self._reader.read(READ_CHUNK)
        if not chunk:
            self.closed = True
            raise Closed("connection closed by the server")
        self._buf += chunk

    def _parse(self, out: list[bytes]) -> None:
        """Move every complete frame of the buffer into ``out`` (text payloads)."""
        buf = self._buf
        pos, end = 0, len(buf)
        while end - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            n = b1 & 0x7F
            hl = 2
            if n == 126:
                if end - pos < 4:
                    break
                n = (buf[pos + 2] << 8) | buf[pos + 3]
                hl = 4
            elif n == 127:
                if end - pos < 10:
                    break
                n = int.from_bytes(buf[pos + 2 : pos + 10], "big")
                hl = 10
            if b1 & 0x80:  # servers never mask; tolerate it anyway
                hl += 4
            if end - pos < hl + n:
                break
            payload = bytes(buf[pos + hl : pos + hl + n])
            pos += hl + n
            opcode = b0 & 0x0F
            fin = b0 & 0x80
            if opcode in (0x1, 0x2, 0x0):
                if fin and not self._frag:
                    out.append(payload)
                else:
                    self._frag += payload
                    if fin:
                        out.append(bytes(self._frag))
                        self._frag.clear()
            elif opcode == 0x9:  # ping → pong
                self._writer.write(_frame(0xA, payload))
            elif opcode == 0x8:
                self.closed = True
                code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                del buf[:pos]
                raise Closed(f"closed by the server: {code} {payload[2:].decode(errors='replace')}")
        del buf[:pos]

    async def recv_batch(self) -> list[bytes]:
        """Every complete frame available now (at least one), in order."""
        if self._unread:
            out, self._unread = self._unread, []
            return out
        out = []
        self._parse(out)
        while not out:
            await self._fill()
            self._parse(out)
        return out

    def unread(self, frames: list[bytes]) -> None:
        """Give back frames a reader took but did not consume; the next recv_batch returns them."""
        if frames:
            self._unread = frames + self._unread

    async def close(self) -> None:
        if not self._writer.is_closing():
            try:
                self._writer.write(_frame(0x8, struct.pack("!H", 1000)))
                await self._writer.drain()
            except (ConnectionError, RuntimeError):
                pass
            self._writer.close()
        try:
            await asyncio.wait_for(self._writer.wait_closed(), 2)
        except (TimeoutError, ConnectionError, OSError):
            pass
