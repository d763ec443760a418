"""JSON as the bridge reads and writes it: one strict parser for everything that comes
in (agent lines, client frames, REST bodies' raw messages) and one writer for everything
that goes out (agent stdin, the store, frames).

Strict means RFC 8259 and what the bridge can write back unchanged: no NaN/Infinity, no
number that is infinite as a float (``1e400``), no nesting deeper than MAX_JSON_DEPTH.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson


def dumps(obj: Any) -> str:
    """One line of compact JSON (never contains a raw newline) that always encodes as UTF-8.

    A lone surrogate is legal in a parsed JSON string (``"\\ud800"``) but not in UTF-8, so
    such a value falls back to ``\\uXXXX`` escapes, which a reader decodes to the same string
    (a request_id echoed in a reply must round-trip exactly). Used for
    everything the bridge writes: agent stdin, the store, WebSocket frames.

    orjson writes the common case (issue #8: several times faster than ``json``); what it
    refuses — lone surrogates, integers beyond 64 bits, non-string keys — goes through
    ``json`` exactly as before. The one difference: orjson writes a non-finite float as
    ``null`` where ``json`` wrote the non-JSON ``NaN``/``Infinity``.
    """
    try:
        return orjson.dumps(obj).decode()
    except (TypeError, orjson.JSONEncodeError):
        pass
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"))
    return text


# JSON nested deeper than this is refused wherever it comes from (agent lines, client
# frames): Python's json recursion limit would otherwise bite later, when the value is
# serialised again deeper in the stack (store, envelopes, REST pages).
MAX_JSON_DEPTH = 128


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in item)
    return False


def _not_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number out of range: {text}")
    return value


# 19 digits in a row may be an integer beyond 64 bits, which orjson would read as a float.
# Found with two C-speed passes (digits → "1", the rest → "0"; then a substring search):
# a regular expression costs more than the parse itself on a line full of digits.
_DIGITS_AS_ONES = bytes(0x31 if 0x30 <= i <= 0x39 else 0x30 for i in range(256))
_LONG_DIGITS = b"1" * 19
# Nesting deeper than MAX_JSON_DEPTH takes more than that many opening brackets, and as many
# closing ones: a shorter valid line cannot be too deep (and a long one is counted in one C
# pass that keeps only the opening brackets).
_DEPTH_CHECK_LEN = 2 * (MAX_JSON_DEPTH + 1)
_NOT_OPENING_BRACKETS = bytes(i for i in range(256) if i not in b"{[")


def _may_be_too_deep(line: bytes, in_strings: int) -> bool:
    """False when ``line`` (valid JSON) is certainly nested at most MAX_JSON_DEPTH deep.
    ``in_strings`` is a number of its bytes known to lie inside string literals."""
    return (
        len(line) - in_strings >= _DEPTH_CHECK_LEN and len(line.translate(None, _NOT_OPENING_BRACKETS)) > MAX_JSON_DEPTH
    )


def parse_object(line: bytes) -> tuple[dict[str, Any] | None, str, str | None]:
    """Return ``(obj, text, problem)``; ``obj`` is None when the line is not a JSON object."""
    # Fast path (issue #8): orjson parses strict RFC 8259 UTF-8 JSON and refuses everything
    # the slow path below would refuse (NaN/Infinity, out-of-range floats, invalid UTF-8),
    # plus a few things the slow path accepts (lone surrogate escapes, a BOM), which then
    # take the slow path. Lines that may carry a huge integer always take the slow path, so
    # the parsed values are exactly those of ``json``.
    if _LONG_DIGITS not in line.translate(_DIGITS_AS_ONES):
        try:
            fast = orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
        else:
            if not isinstance(fast, dict):
                return None, line.decode("utf-8"), "line is not a JSON object"
            # Depth cannot exceed the number of brackets: walk the tree only when it might.
            if _may_be_too_deep(line, 0) and too_deep(fast):
                return None, line.decode("utf-8")[:512], f"line is nested deeper than {MAX_JSON_DEPTH} levels"
            return fast, line.decode("utf-8").rstrip("\r"), None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None, line.decode("utf-8", "replace"), "line is not valid UTF-8"
    if not text.strip():
        return None, text, "empty line"
    try:
        # Strict RFC 8259: ``raw`` is embedded verbatim in events-mode frames (docs/api.md §6.1), so
        # NaN/Infinity, out-of-range numbers and non-JSON whitespace (str.strip() would drop
        # \x0c or U+3000) must not pass as an object.
        obj = _STRICT.decode(text)
    except (ValueError, RecursionError):
        return None, text, "line is not JSON"
    if not isinstance(obj, dict):
        return None, text, "line is not a JSON object"
    if too_deep(obj):
        return None, text[:512], f"line is nested deeper than {MAX_JSON_DEPTH} levels"
    return obj, text.rstrip("\r"), None


_STRICT = json.JSONDecoder(parse_constant=_not_json_constant, parse_float=_finite_float)


def loads_strict(text: str) -> Any:
    """Parse one JSON text strictly (see the module docstring); ValueError otherwise.

    The same fast path as :func:`parse_object` (a raw-mode client's line is parsed once per
    turn: issue #22): orjson where it gives exactly ``json``'s values, ``json`` otherwise."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: only json takes (and refuses) it
        data = None
    if data is not None and _LONG_DIGITS not in data.translate(_DIGITS_AS_ONES):
        try:
            fast = orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
        else:
            if _may_be_too_deep(data, 0) and too_deep(fast):
                raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
            return fast
    value = _STRICT.decode(text)  # one decoder for all (json.loads would build one per call)
    if too_deep(value):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value
