"""Bounding the untrusted values a task event carries (spec §9), for :mod:`bridge.sessions.tasks`.

Every string is capped (a longer one keeps its first ``limit - 1`` characters and ends with
"…"); containers keep at most 1000 items and 32 levels; non-finite floats and integers
beyond 64 bits become null; anything that is not JSON becomes null. Pure functions, no state.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "MAX_SNAPSHOT_BYTES",
    "MAX_STR",
    "MAX_USAGE_BYTES",
    "as_number",
    "as_str",
    "bounded_snapshot",
    "cap",
    "clean",
    "clean_error",
    "clean_usage",
    "json_size",
]

MAX_STR: Final = 4096
MAX_SNAPSHOT_BYTES: Final = 256 * 1024
MAX_USAGE_BYTES: Final = 16 * 1024
_MAX_DEPTH: Final = 32
_MAX_ITEMS: Final = 1000
_INT_LIMIT: Final = 2**64


def cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + "…"


def clean(value: Any, limit: int, depth: int = 0) -> Any:
    """A JSON-only, bounded copy of an untrusted value."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -_INT_LIMIT < value < _INT_LIMIT else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return cap(value, limit)
    if depth >= _MAX_DEPTH:
        return None
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for i, (key, val) in enumerate(value.items()):
            if i >= _MAX_ITEMS:
                break
            out[cap(key if isinstance(key, str) else str(key), limit)] = clean(val, limit, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [clean(v, limit, depth + 1) for v in value[:_MAX_ITEMS]]
    return None


def json_size(value: Any) -> int:
    """Length of the compact, ASCII-escaped JSON text of ``value``."""
    return len(json.dumps(value, separators=(",", ":"), allow_nan=False))


def bounded_snapshot(entries: list[Any], limit: int, max_bytes: int) -> tuple[list[Any], bool]:
    """The leading cleaned ``entries`` whose JSON list fits ``max_bytes``, and whether any were dropped."""
    out: list[Any] = []
    size = 2  # "[]"
    for entry in entries:
        cleaned = clean(entry, limit, 1)
        cost = json_size(cleaned) + (1 if out else 0)
        if size + cost > max_bytes:
            return out, True
        out.append(cleaned)
        size += cost
    return out, False


def clean_usage(value: Any, limit: int) -> dict[str, Any] | None:
    """A cleaned ``usage`` object, or None when it is not an object or is larger than 16 KiB."""
    if not isinstance(value, Mapping):
        return None
    cleaned: dict[str, Any] = clean(value, limit)
    return cleaned if json_size(cleaned) <= MAX_USAGE_BYTES else None


def clean_error(value: Any, limit: int) -> str | None:
    """An ``error`` as a capped string: a string as is, any other non-null value as its JSON."""
    if isinstance(value, str):
        return cap(value, limit)
    if value is None:
        return None
    return cap(json.dumps(clean(value, limit), allow_nan=False), limit)


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_number(value: Any) -> int | float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -_INT_LIMIT < value < _INT_LIMIT else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return None
