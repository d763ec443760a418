"""Bytes → lines, with a hard cap on line length.

Agents write one JSON object per ``\\n``-terminated line (docs/api.md §6.7). A line longer
than ``max_line`` bytes without a newline is a protocol violation that would otherwise
grow our memory without bound: the framer raises :class:`LineTooLong` and the caller ends
that agent with reason ``line_too_long`` (AWP contract: "an unbroken stdout buffer over
4 MiB terminates the runtime"). This is a security limit, not a tuning knob.
"""

from __future__ import annotations

MAX_LINE_BYTES = 4 * 1024 * 1024


class LineTooLong(Exception):
    def __init__(self, limit: int, lines: list[bytes] | None = None) -> None:
        super().__init__(f"agent wrote more than {limit} bytes without a newline")
        self.limit = limit
        # Complete lines that came before the offending one in the same feed: they are
        # valid output and still belong in the transcript.
        self.lines = lines or []


class LineFramer:
    __slots__ = ("_buf", "_scanned", "max_line")

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already known to hold no newline

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return every complete line (without its ``\\n``)."""
        self._buf += data
        lines: list[bytes] = []
        start = 0
        buf = self._buf
        pos = buf.find(b"\n", self._scanned)
        while pos != -1:
            if pos - start > self.max_line:
                raise LineTooLong(self.max_line, lines)
            lines.append(bytes(buf[start:pos]))
            start = pos + 1
            pos = buf.find(b"\n", start)
        if start:
            del buf[:start]
        self._scanned = len(buf)
        if len(buf) > self.max_line:
            raise LineTooLong(self.max_line, lines)
        return lines

    def close(self) -> bytes | None:
        """End of stream: the unterminated tail, if any, is the last line."""
        if not self._buf:
            return None
        tail = bytes(self._buf)
        self._buf.clear()
        self._scanned = 0
        return tail
