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

from collections.abc import Sequence
from typing import cast

COALESCE_BYTES = 64 * 1024


def _size(text: str | bytes) -> int:
    # str.isascii() is O(1) in CPython; nearly every frame is ASCII JSON.
    return len(text) if isinstance(text, bytes) or text.isascii() else len(text.encode())


def _groups(texts: Sequence[str | bytes], limit: int) -> list[tuple[int, int]]:
    """Index ranges of consecutive payloads whose lines, newline-separated, fit ``limit``
    bytes (a longer payload is a range of its own)."""
    ranges: list[tuple[int, int]] = []
    start, size = 0, -1  # -1: the separators are one fewer than the lines
    for i, text in enumerate(texts):
        n = _size(text) + 1
        if i > start and size + n > limit:
            ranges.append((start, i))
            start, size = i, -1
        size += n
    ranges.append((start, len(texts)))
    return ranges


def coalesce(texts: list[str] | list[bytes], limit: int = COALESCE_BYTES) -> list[str] | list[bytes]:
    """``texts`` (frame payloads, all ``str`` or all ``bytes``) joined by newlines into
    frames of at most ``limit`` bytes each, in order; a longer payload stays alone."""
    if len(texts) < 2:
        return texts
    ranges = _groups(texts, limit)
    if isinstance(texts[0], str):
        strs = cast(list[str], texts)
        return ["\n".join(strs[a:b]) for a, b in ranges]
    raw = cast(list[bytes], texts)
    return [b"\n".join(raw[a:b]) for a, b in ranges]
