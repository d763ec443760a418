"""``?coalesce=1`` on the thread WebSocket (docs/api.md §5.1, issue #22): what is ready to
go out at once — a replayed page, a burst of agent output, answers and notices — leaves as
few text frames as possible, each holding complete NDJSON lines separated by ``\\n`` (no
newline after the last), at most COALESCE_BYTES of payload a frame. A line longer than
that is a frame of its own, as without coalescing. Every frame payload the server sends is
one line of JSON (an envelope, a notice, an answer, an agent line: none holds a newline,
the agent's lines being split on it), so splitting a frame on ``\\n`` gives back exactly
the frames an ordinary client would have got, in order.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from itertools import accumulate, repeat
from operator import add
from typing import cast

COALESCE_BYTES = 64 * 1024


def _ranges(sizes: Iterable[int], limit: int) -> list[tuple[int, int]]:
    """Index ranges of consecutive payloads (of these byte sizes) whose lines,
    newline-separated, fit ``limit`` bytes; a longer payload is a range of its own.
    Found by bisection on the running sums (C-speed ``accumulate``), not line by line."""
    ends = list(accumulate(map(add, sizes, repeat(1))))  # each line and its separator
    ranges: list[tuple[int, int]] = []
    start, base = 0, 0
    while start < len(ends):
        stop = max(bisect_right(ends, base + limit + 1, start), start + 1)
        ranges.append((start, stop))
        start, base = stop, ends[stop - 1]
    return ranges


def coalesce(texts: list[str] | list[bytes], limit: int = COALESCE_BYTES) -> list[str] | list[bytes]:
    """``texts`` (frame payloads, all ``str`` or all ``bytes``) joined by newlines into
    frames of at most ``limit`` bytes each, in order; a longer payload stays alone."""
    if len(texts) < 2:
        return texts
    if isinstance(texts[0], str):
        strs = cast(list[str], texts)
        joined = "\n".join(strs)
        ascii_only = joined.isascii()  # O(1) in CPython; nearly every frame is ASCII JSON
        if ascii_only and len(joined) <= limit:
            return [joined]
        sizes = map(len, strs) if ascii_only else (len(t.encode()) for t in strs)
        return ["\n".join(strs[a:b]) for a, b in _ranges(sizes, limit)]
    raw = cast(list[bytes], texts)
    return [b"\n".join(raw[a:b]) for a, b in _ranges(map(len, raw), limit)]
