"""The exact shortcuts of the stream-json decoder (issue #8, issue #22): the lines a turn
is mostly made of, decoded from one orjson parse without the generic path's checks where
they cannot change the outcome.

:meth:`StreamJsonCodec.decode` sniffs the line's ``"type"`` from its first bytes (agents
write it first: ``{"type":"assistant",…``, compact or as Python's ``json.dumps`` writes
it), parses the line once with orjson and hands it to the shortcut for the type it holds. A
shortcut returns the very events of the :class:`Decoded` the generic path
(``_decode_slow``) would return (such a line has no replies and no control items), or
None, and the generic path then decodes the line as always (``decode_many`` merges the
events of such lines back to back into one Decoded). What makes a shortcut exact:

* orjson reads a line it accepts exactly as ``json`` does but for integers beyond 64
  bits, which it reads as floats (an integer too large for a float it refuses, as ``json``
  refuses those beyond 4300 digits). The generic path therefore scans every line for 19
  digits in a row and lets ``json`` read such lines. A shortcut skips the scan only where
  the outcome cannot depend on a number: what it reads is strings and containers (and a
  number read as a float is still a number, never a string, list, dict or None, with the
  same truthiness), and the events it returns hold no float (an event that holds one is
  decoded by the generic path).
* The nesting check (``too_deep``) is skipped when the line, minus the bytes of strings
  the shortcut read (none of which is a bracket), is too short to nest 129 levels.
* Lone surrogate escapes, a BOM, non-finite numbers, invalid UTF-8: orjson refuses the
  line and the generic path decodes it.
* The shortcut is chosen by the ``"type"`` orjson read, not by the line's first bytes (a
  key may come twice; the last wins in both parsers).

tests/protocols/test_codec_fast_path.py checks with hypothesis (random, mutated and real
lines of every shape, both dialects) that every shortcut agrees with the generic path and
with the decoder as it was before any shortcut.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bridge.protocols import stream_json_map as smap
from bridge.protocols.events import Event
from bridge.protocols.jsonline import _may_be_too_deep

if TYPE_CHECKING:
    from bridge.protocols.stream_json import StreamJsonCodec

# A shortcut returns the events of the line (what the generic path's Decoded holds: such a
# line has no replies and no control items), or None.
FastHandler = Callable[["StreamJsonCodec", dict[str, Any], bytes], "list[Event] | None"]

# Characters of the strings every line of a shape holds, for _may_be_too_deep: a text or
# thinking delta holds at least the keys and values of an awp-jsonl text delta, any raw
# streaming event at least those of "type":"stream_event","event" (21 characters; an
# awp-jsonl "type":"content_block_delta" has 23); an assistant line with a text block at
# least "type":"assistant","message":{"content":[{"type":"text","text":…}]}.
_DELTA_LITERALS = len("typecontent_block_deltadeltatypetext_deltatext")
_RAW_STREAM_LITERALS = len("typestream_eventevent")
_ASSISTANT_LITERALS = len("typeassistantmessagecontent")
_BLOCK_LITERALS = len("typetexttext")


def prefixes(handlers: dict[str, FastHandler]) -> tuple[bytes, ...]:
    """How the lines of the types in ``handlers`` begin as agents write them: ``"type"``
    first, compact or as Python's ``json.dumps`` writes it. Only a filter: which shortcut
    decodes a line is chosen by the type orjson read (a key may come twice)."""
    return tuple(head % name.encode() for name in handlers for head in (b'{"type":"%b"', b'{"type": "%b"'))


def _raw(line: bytes) -> str:
    return line.decode("utf-8").rstrip("\r")


def stream(codec: StreamJsonCodec, obj: dict[str, Any], line: bytes) -> list[Event] | None:
    """A ``stream_event`` line (awp-jsonl: a top-level ``content_block_delta``): a
    ``message.delta`` or a ``message.stream``, which depend on string values only.
    Subscripts, not .get(): on values straight from orjson, x["k"] succeeds only when x is
    a dict holding "k" (else KeyError/TypeError, and the generic path decodes the line)."""
    typ = obj["type"]
    if typ == "stream_event":
        ev = obj["event"]  # (an event that is null fails below: the generic path decodes it)
    elif typ in codec._toplevel_deltas:
        ev = obj
    else:
        return None
    text = None
    if ev["type"] == "content_block_delta":
        # What _raw_stream makes of it: a text or thinking delta, else message.stream.
        delta = ev["delta"]
        dtype = delta["type"]
        if dtype == "text_delta":
            text, channel = delta["text"], "text"
        elif dtype == "thinking_delta":
            text, channel = delta["thinking"], "thought"
    data: dict[str, Any] | None
    if type(text) is str:
        kind, data, literals = "message.delta", {"text": text, "channel": channel}, len(text) + _DELTA_LITERALS
    else:
        # The stream's structure (message_start, content_block_stop, …): string values
        # only, so orjson's reading is json's; anything else takes the generic path.
        kind, data, literals = "message.stream", smap.stream_structure(ev), _RAW_STREAM_LITERALS
    if data is None or _may_be_too_deep(line, literals):
        return None
    return [Event("agent", kind, data, _raw(line), True)]


def assistant(codec: StreamJsonCodec, obj: dict[str, Any], line: bytes) -> list[Event] | None:
    """An ``assistant`` line (Claude Code's whole message) whose content is text, thinking
    and tool-use blocks: one ``message`` or ``tool.call`` per block, exactly as
    ``_assistant`` makes them; a line with any other block takes the generic path."""
    msg = obj["message"]
    content = msg["content"]
    if type(content) is not list or not content:
        return None
    mid = _str(msg.get("id"))
    error = _message_error(obj, msg)
    raw = _raw(line)
    events: list[Event] = []
    literals = _ASSISTANT_LITERALS
    for block in content:
        btype = block["type"]
        if btype in _TOOL_BLOCKS:
            # A tool call's input may hold numbers: one holding a float (it may have been
            # an integer beyond 64 bits) is decoded by the generic path.
            tool_input = block.get("input")
            if _has_float(tool_input):
                return None
            data = {
                "tool_call_id": _str(block.get("id")),
                "name": _str(block.get("name")),
                "input": tool_input,
                "parent_tool_use_id": _str(obj.get("parent_tool_use_id")),
            }
            events.append(Event("agent", "tool.call", data, raw, not events))
            continue
        message = _text_block(btype, block, mid, error)
        if message is None:
            return None
        events.append(Event("agent", "message", message, raw, not events))
        literals += len(message["text"]) + _BLOCK_LITERALS
    if _may_be_too_deep(line, literals):
        return None
    return events


_TOOL_BLOCKS = ("tool_use", "server_tool_use")


def _str(value: Any) -> str | None:
    return value if type(value) is str else None


def _message_error(obj: dict[str, Any], msg: dict[str, Any]) -> str | None:
    """What ``_assistant`` writes as a text block's ``error``: None when there is none."""
    if obj.get("error") is None and msg.get("model") != "<synthetic>":
        return None
    error = obj.get("error")
    return error if type(error) is str and error else "unknown"


def _text_block(btype: Any, block: dict[str, Any], mid: str | None, error: str | None) -> dict[str, Any] | None:
    """The ``message`` data of a text or thinking block; None for any other block."""
    if btype == "text":
        text = block["text"]
        if type(text) is not str:
            return None
        data: dict[str, Any] = {"role": "assistant", "text": text, "message_id": mid}
        if error is not None:
            data["error"] = error
        return data
    if btype == "thinking":
        text = block["thinking"]
        if type(text) is str:
            return {"role": "assistant", "text": text, "channel": "thought", "message_id": mid}
    return None


def _has_float(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
        elif type(item) is float:
            return True
    return False


# The shortcut for each line type.
STREAM_JSON: dict[str, FastHandler] = {
    "stream_event": stream,
    "assistant": assistant,
}
