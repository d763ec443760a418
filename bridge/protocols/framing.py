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
    __slots__ = ("_buf", "max_line")

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self.max_line = max_line
        self._buf = bytearray()  # the unterminated tail so far (holds no newline)

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return every complete line (without its ``\\n``). A read is split
        in one call (bytes.split, issue #22: a third of a loop over ``find``); only the
        new bytes are ever scanned, so a long line arriving in many reads costs linear
        time."""
        buf = self._buf
        limit = self.max_line
        if b"\n" not in data:
            buf += data
            if len(buf) > limit:
                raise LineTooLong(limit)
            return []
        lines = data.split(b"\n")
        if buf:  # the first line began in an earlier read
            buf += lines[0]
            lines[0] = bytes(buf)
            buf.clear()
        buf += lines.pop()  # what follows the last newline: the next line's beginning
        if max(map(len, lines)) > limit or len(buf) > limit:
            for i, line in enumerate(lines):
                if len(line) > limit:
                    raise LineTooLong(limit, lines[:i])
            raise LineTooLong(limit, lines)
        return lines

    def close(self) -> bytes | None:
        """End of stream: the unterminated tail, if any, is the last line."""
        if not self._buf:
            return None
        tail = bytes(self._buf)
        self._buf.clear()
        return tail
