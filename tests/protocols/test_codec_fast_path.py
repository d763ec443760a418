"""Differential tests for the decode fast path (issue #8).

``StreamJsonCodec.decode`` takes a shortcut for the lines a streaming turn is made of
(``stream_event`` lines; awp-jsonl: raw ``content_block_delta`` lines). It must decode every
line exactly as the generic path ``_decode_slow`` does, and ``parse_object`` must still
return what it returned before (``original_parse_object`` below is its text from before,
kept as the oracle; ``_decode_slow`` with it is ``decode`` as it was): same events (type,
source, kind, data with its key order and the exact type of every value, raw, relay), same
replies.
"""

from __future__ import annotations

import json
import math
from typing import Any
from unittest import mock

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_codec_fuzz import (
    FUZZ,
    KEYS,
    REAL_LINES,
    TYPES,
    json_values,
    mutate,
    mutations,
    nasty_text,
    top_level_objects,
)

from bridge.protocols.awp_jsonl import AwpJsonlCodec
from bridge.protocols.jsonline import _DIGITS_AS_ONES, _LONG_DIGITS, MAX_JSON_DEPTH, parse_object, too_deep
from bridge.protocols.stream_json import StreamJsonCodec

# Half of FUZZ's examples per property: seven properties over two dialects run in every CI
# run, and the suite has a ten-minute budget.
DIFF = settings(FUZZ, max_examples=100)

CODECS = [StreamJsonCodec, AwpJsonlCodec]


# ---------------------------------------------------------------- the oracle


def _not_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number out of range: {text}")
    return value


def original_parse_object(line: bytes) -> tuple[dict[str, Any] | None, str, str | None]:
    """bridge.protocols.stream_json.parse_object as it was before the fast path."""
    if _LONG_DIGITS not in line.translate(_DIGITS_AS_ONES):
        try:
            fast = orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
        else:
            if not isinstance(fast, dict):
                return None, line.decode("utf-8"), "line is not a JSON object"
            if line.count(b"{") + line.count(b"[") > MAX_JSON_DEPTH and too_deep(fast):
                return None, line.decode("utf-8")[:512], f"line is nested deeper than {MAX_JSON_DEPTH} levels"
            return fast, line.decode("utf-8").rstrip("\r"), None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None, line.decode("utf-8", "replace"), "line is not valid UTF-8"
    if not text.strip():
        return None, text, "empty line"
    try:
        obj = json.loads(text, parse_constant=_not_json_constant, parse_float=_finite_float)
    except (ValueError, RecursionError):
        return None, text, "line is not JSON"
    if not isinstance(obj, dict):
        return None, text, "line is not a JSON object"
    if too_deep(obj):
        return None, text[:512], f"line is nested deeper than {MAX_JSON_DEPTH} levels"
    return obj, text.rstrip("\r"), None


def exact(value: Any) -> Any:
    """A form of a decoded value that equals another only if they are identical: 1, 1.0
    and True differ, -0.0 and 0.0 differ, and so does the key order of a dict."""
    if isinstance(value, dict):
        return ("dict", [(exact(k), exact(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [exact(v) for v in value])
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def outcome(decoded: Any) -> Any:
    return (
        type(decoded).__name__,
        [(type(e).__name__, e.source, e.kind, exact(e.data), e.raw, e.relay) for e in decoded.events],
        list(decoded.replies),
    )


def check_same(codec_cls: type[StreamJsonCodec], line: bytes) -> None:
    fast = outcome(codec_cls().decode(line))
    assert fast == outcome(codec_cls()._decode_slow(line))
    with mock.patch("bridge.protocols.stream_json.parse_object", original_parse_object):
        assert fast == outcome(codec_cls()._decode_slow(line))  # decode() as it was
    assert exact(parse_object(line)) == exact(original_parse_object(line))


# ---------------------------------------------------------------- strategies

EVENT_TYPES = [
    "content_block_delta",
    "content_block_start",
    "content_block_stop",
    "message_start",
    "message_delta",
    "message_stop",
    "tool_progress",
    "ping",
    "error",
]
DELTA_TYPES = ["text_delta", "thinking_delta", "input_json_delta", "signature_delta", "citations_delta"]
DELTA_KEYS = ["text", "thinking", "partial_json", "signature"]

huge_ints = st.integers(min_value=-(10**40), max_value=10**40) | st.sampled_from(
    [2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**18, 10**19, 10**308]
)
leaves = (
    st.none()
    | st.booleans()
    | huge_ints
    | st.floats(allow_nan=False, allow_infinity=False)
    | nasty_text
    | st.text(max_size=30)
    | st.sampled_from(TYPES + EVENT_TYPES + DELTA_TYPES)
    | st.sampled_from(["1" * 19, "1234567890123456789012", "{[{[", "\\u0000"])
)
junk = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS + DELTA_KEYS) | st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=10,
)


@st.composite
def nested(draw: st.DrawFn, inner: Any = None) -> Any:
    """A value nested about MAX_JSON_DEPTH deep: just under, at or just over the cap."""
    depth = draw(
        st.sampled_from(
            [
                MAX_JSON_DEPTH - 4,
                MAX_JSON_DEPTH - 3,
                MAX_JSON_DEPTH - 2,
                MAX_JSON_DEPTH - 1,
                MAX_JSON_DEPTH,
                MAX_JSON_DEPTH + 1,
                200,
            ]
        )
    )
    value = draw(leaves) if inner is None else inner
    for _ in range(depth):
        value = {"k": value} if draw(st.booleans()) else [value]
    return value


def often(draw: st.DrawFn, odds: int) -> bool:
    """True ``odds`` times out of ``odds + 1``, and in the simplest examples (hypothesis
    starts from, and shrinks towards, the smallest choice)."""
    return draw(st.integers(0, odds)) != odds


def usually(draw: st.DrawFn, value: Any, other: st.SearchStrategy[Any], odds: int = 4) -> Any:
    """``value`` most of the time (odds to one), else something drawn from ``other``."""
    return value if often(draw, odds) else draw(other)


def optional(draw: st.DrawFn, obj: dict[str, Any], key: str, values: st.SearchStrategy[Any]) -> None:
    if often(draw, 9):  # mostly present
        obj[key] = draw(values)


texts = nasty_text | st.text(max_size=40) | st.text(max_size=300)
clean_texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=300)


@st.composite
def deltas(draw: st.DrawFn) -> Any:
    if not often(draw, 9):
        return draw(junk)
    delta: dict[str, Any] = {}
    dtype = draw(st.sampled_from(["text_delta", "thinking_delta", *DELTA_TYPES]))
    optional(draw, delta, "type", st.just(usually(draw, dtype, junk, odds=9)))
    matching = {
        "text_delta": "text",
        "thinking_delta": "thinking",
        "input_json_delta": "partial_json",
        "signature_delta": "signature",
    }.get(dtype, "text")
    key = usually(draw, matching, st.sampled_from(DELTA_KEYS), odds=3)
    optional(draw, delta, key, texts if often(draw, 7) else junk)
    if not often(draw, 3):
        delta[draw(st.sampled_from(DELTA_KEYS))] = draw(texts | junk)
    return delta


@st.composite
def stream_events(draw: st.DrawFn) -> Any:
    """The ``event`` of a stream_event line (or a whole awp-jsonl raw line's body)."""
    if not often(draw, 9):
        return draw(junk)
    ev: dict[str, Any] = {}
    optional(draw, ev, "type", st.just(usually(draw, "content_block_delta", st.sampled_from(EVENT_TYPES) | junk)))
    optional(draw, ev, "index", st.integers(0, 3) | huge_ints | junk)
    optional(draw, ev, "delta", deltas())
    if not often(draw, 3):
        ev["content_block"] = draw(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "tool_use"])}, optional={"id": junk, "name": junk, "input": junk}
            )
        )
    if not often(draw, 3):
        ev[draw(st.sampled_from(["usage", "message", "extra"]))] = draw(junk)
    return ev


@st.composite
def stream_lines(draw: st.DrawFn, fast_for_awp: bool | None = None) -> bytes:
    """A stream_event line, or an awp-jsonl raw event line, with random and wrong fields.
    With ``fast_for_awp``, one that begins as the fast path of that dialect wants."""
    awp_style = draw(st.booleans()) if fast_for_awp is None else fast_for_awp
    if awp_style:
        obj = draw(stream_events())
        if not isinstance(obj, dict):
            obj = {"type": "content_block_delta", "delta": obj}
        if often(draw, 9):
            obj["type"] = usually(
                draw,
                "content_block_delta",
                st.sampled_from(["content_block_start", "content_block_stop", "message_stop", "stream_event"]),
            )
    else:
        obj = {}
        optional(draw, obj, "type", st.just(usually(draw, "stream_event", st.sampled_from(TYPES) | junk)))
        optional(draw, obj, "event", stream_events())
        optional(draw, obj, "session_id", st.sampled_from(["4f0b6a8e-1c2d-4e5f-9a0b-1c2d3e4f5a6b"]) | junk)
        optional(draw, obj, "parent_tool_use_id", st.none() | junk)
        optional(draw, obj, "uuid", st.uuids().map(str) | junk)
    if fast_for_awp is not None:
        obj["type"] = "content_block_delta" if fast_for_awp else "stream_event"
    for _ in range(draw(st.integers(0, 2))):
        obj[draw(st.sampled_from(KEYS) | st.text(max_size=6))] = draw(junk)
    if not often(draw, 7):  # something nested about MAX_JSON_DEPTH deep, next to the delta or in it
        holder = obj.get("event", obj)
        holder = holder if isinstance(holder, dict) else obj
        if isinstance(holder.get("delta"), dict) and draw(st.booleans()):
            holder = holder["delta"]
        holder[draw(st.sampled_from(["extra", "delta"]))] = draw(
            nested(usually(draw, {"type": "text_delta", "text": draw(st.text(max_size=300))}, leaves))
        )
    items = draw(st.permutations(list(obj.items())))
    if "type" in obj and (fast_for_awp is not None or often(draw, 3)):  # agents write "type" first
        items = [("type", obj["type"]), *(item for item in items if item[0] != "type")]
    text = json.dumps(
        dict(items), ensure_ascii=draw(st.booleans()), separators=draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    )
    if not often(draw, 7):  # a duplicate key: the last one wins in both parsers
        retyped = draw(st.sampled_from(["content_block_delta", "stream_event", "assistant"]) | junk)
        text = text[:-1] + (", " if len(items) else "") + f'"type": {json.dumps(retyped)}}}'
    lead = "" if fast_for_awp is not None else usually(draw, "", st.sampled_from([" ", "\t"]))
    text = lead + text + draw(st.sampled_from(["", " ", "\r", " \r"]))
    return text.encode("utf-8", "surrogatepass")


usage_values = st.dictionaries(
    st.sampled_from(["input_tokens", "output_tokens", "cache_read_input_tokens", "service_tier", "server_tool_use"]),
    st.integers(0, 10**6) | huge_ints | st.floats(allow_nan=False, allow_infinity=False) | junk,
    max_size=4,
)


@st.composite
def content_blocks(draw: st.DrawFn, typ: str) -> Any:
    """One block of an assistant or user message: mostly well formed, sometimes not."""
    if not often(draw, 19):
        return draw(junk)
    kinds = ["text", "thinking", "tool_use"] if typ == "assistant" else ["tool_result", "text"]
    kind = draw(st.sampled_from(kinds) if often(draw, 9) else st.sampled_from(["image", "tool_result", "tool_use"]))
    block: dict[str, Any] = {}
    if often(draw, 19):
        block["type"] = usually(draw, kind, junk | st.sampled_from(["text", "thinking"]), odds=19)
    key = {"text": "text", "thinking": "thinking", "tool_result": "content"}.get(kind, "input")
    if often(draw, 19):
        block[key] = draw(texts if often(draw, 9) else junk)
    if kind == "tool_result":
        optional(draw, block, "tool_use_id", texts | junk)
        if not often(draw, 2):
            block["is_error"] = draw(st.booleans() | junk)
        if not often(draw, 2):
            block["content"] = draw(st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}) | junk))
    if kind == "tool_use":
        optional(draw, block, "id", texts | junk)
        optional(draw, block, "name", texts | junk)
        if often(draw, 2):
            numbers = huge_ints | st.floats(allow_nan=False, allow_infinity=False)
            block["input"] = draw(
                st.dictionaries(st.sampled_from(["command", "n"]), texts | numbers | junk, max_size=3)
            )
    if not often(draw, 4):
        block[draw(st.sampled_from(["signature", "citations", "extra", *DELTA_KEYS]))] = draw(texts | junk)
    return block


@st.composite
def message_objects(draw: st.DrawFn, typ: str) -> dict[str, Any]:
    """The body of an ``assistant``, ``user`` or ``result`` line, random and wrong fields."""
    obj: dict[str, Any] = {}
    if typ == "result":
        optional(draw, obj, "subtype", st.sampled_from(["success", "error_during_execution", "error_max_turns"]) | junk)
        optional(draw, obj, "is_error", st.booleans() | junk)
        optional(draw, obj, "result", texts | junk)
        optional(draw, obj, "usage", usage_values | junk)
        for key in ("terminal_reason", "stop_reason", "errors", "error", "session_id", "duration_ms"):
            if not often(draw, 2):
                obj[key] = draw(
                    st.sampled_from(["aborted_tools", "end_turn", "[ede_diagnostic] x"]) | texts | junk | huge_ints
                )
        return obj
    message: dict[str, Any] = {}
    optional(draw, message, "id", st.sampled_from(["msg_01"]) | junk)
    optional(draw, message, "role", st.just(typ))
    optional(draw, message, "model", st.sampled_from(["claude-opus-4-8", "<synthetic>"]) | junk)
    if often(draw, 19):
        message["content"] = draw(
            st.lists(content_blocks(typ), min_size=1, max_size=3) if often(draw, 9) else texts | junk
        )
    optional(draw, message, "usage", usage_values)
    optional(draw, obj, "message", st.just(message) | junk if not often(draw, 9) else st.just(message))
    optional(draw, obj, "parent_tool_use_id", st.none() | texts | junk)
    optional(draw, obj, "session_id", st.sampled_from(["4f0b6a8e-1c2d-4e5f-9a0b-1c2d3e4f5a6b"]) | junk)
    if not often(draw, 3):
        obj["error"] = draw(st.none() | st.sampled_from(["rate_limit", ""]) | junk)
    if typ == "user" and not often(draw, 3):
        obj["isReplay"] = draw(st.booleans() | junk)
    return obj


@st.composite
def message_lines(draw: st.DrawFn, typ: str | None = None) -> bytes:
    """An ``assistant``, ``user`` or ``result`` line as agents write it ("type" first),
    with random and wrong fields, deep nesting, long digit runs, duplicate keys."""
    typ = typ or draw(st.sampled_from(["assistant", "user", "result"]))
    obj = draw(message_objects(typ))
    for _ in range(draw(st.integers(0, 2))):
        obj[draw(st.sampled_from(KEYS) | st.text(max_size=6))] = draw(junk)
    if not often(draw, 7):  # something nested about MAX_JSON_DEPTH deep, beside the blocks or in them
        holder = obj
        message = obj.get("message")
        if isinstance(message, dict) and draw(st.booleans()):
            holder = message
            content = message.get("content")
            if isinstance(content, list) and content and isinstance(content[0], dict) and draw(st.booleans()):
                holder = content[0]
        holder[draw(st.sampled_from(["extra", "usage", "input", "content"]))] = draw(
            nested(usually(draw, {"type": "text", "text": draw(st.text(max_size=300))}, leaves))
        )
    items = [("type", typ), *draw(st.permutations([item for item in obj.items() if item[0] != "type"]))]
    text = json.dumps(
        dict(items), ensure_ascii=draw(st.booleans()), separators=draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    )
    if not often(draw, 7):  # a duplicate key: the last one wins in both parsers
        retyped = draw(st.sampled_from(["assistant", "user", "result", "stream_event"]) | junk)
        text = text[:-1] + f', "type": {json.dumps(retyped)}}}'
    if not often(draw, 9):  # a long digit run where a number is
        text = text.replace("0", "1" * draw(st.integers(18, 400)), 1)
    text += draw(st.sampled_from(["", " ", "\r", " \r"]))
    return text.encode("utf-8", "surrogatepass")


def flood_line(size: int, text: str) -> bytes:
    """A line as bench/agents/flood_agent.py writes it."""
    head = (
        '{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"'
    )
    tail = '"}},"session_id":"bench-4f0b6a8e-1c2d-4e5f-9a0b-1c2d3e4f5a6b"}'
    return (head + text + "x" * max(0, size - len(head) - len(tail) - len(text)) + tail).encode()


STREAM_REAL_LINES = [line for line in REAL_LINES if b'"stream_event"' in line] + [
    flood_line(200, "00000001 "),
    flood_line(300, "00000002 "),
    b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Partial text"}}',
    b'{"type":"content_block_delta","index":1,"delta":{"type":"thinking_delta","thinking":"hmm"}}',
    b'{"type":"message_stop"}',
]


MESSAGE_REAL_LINES = [
    line for line in REAL_LINES if line.startswith((b'{"type":"assistant"', b'{"type":"user"', b'{"type":"result"'))
]
assert MESSAGE_REAL_LINES


# ---------------------------------------------------------------- properties


@pytest.mark.parametrize("codec_cls", CODECS)
@DIFF
@given(line=stream_lines())
def test_stream_shaped_lines_decode_as_the_generic_path_does(codec_cls, line):
    check_same(codec_cls, line)


@pytest.mark.parametrize("codec_cls", CODECS)
@DIFF
@given(data=st.data())
def test_lines_that_begin_as_the_fast_path_wants_decode_as_the_generic_path_does(codec_cls, data):
    check_same(codec_cls, data.draw(stream_lines(fast_for_awp=codec_cls is AwpJsonlCodec), label="line"))


@pytest.mark.parametrize("codec_cls", CODECS)
@DIFF
@given(line=message_lines())
def test_message_lines_decode_as_the_generic_path_does(codec_cls, line):
    """assistant, user and result lines (issue #22's shortcuts)."""
    check_same(codec_cls, line)


@pytest.mark.parametrize("codec_cls", CODECS)
@DIFF
@given(
    tool_input=st.dictionaries(
        st.sampled_from(["command", "n", "path"]),
        huge_ints | st.floats(allow_nan=False, allow_infinity=False) | texts | junk,
        max_size=3,
    )
    | junk,
    text_first=st.booleans(),
    tool_type=st.sampled_from(["tool_use", "server_tool_use"]),
)
def test_tool_use_lines_decode_as_the_generic_path_does(codec_cls, tool_input, text_first, tool_type):
    """A tool call's input holds numbers, which orjson and json may read differently."""
    block = {"type": tool_type, "id": "toolu_01", "name": "Bash", "input": tool_input}
    content = [{"type": "text", "text": "I'll run it."}, block] if text_first else [block]
    line = json.dumps({"type": "assistant", "message": {"id": "m", "content": content}, "session_id": "s"})
    check_same(codec_cls, line.encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize("codec_cls", CODECS)
@DIFF
@given(data=st.data())
def test_structurally_mutated_message_lines_decode_as_the_generic_path_does(codec_cls, data):
    """Valid JSON, one field of a real assistant/user/result line replaced."""
    original = json.loads(data.draw(st.sampled_from(MESSAGE_REAL_LINES), label="line"))
    obj = original
    for _ in range(data.draw(st.integers(0, 4), label="depth")):
        containers = [k for k, v in obj.items() if isinstance(v, dict)] if isinstance(obj, dict) else []
        lists = [k for k, v in obj.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
        if lists and data.draw(st.booleans(), label="into a list"):
            obj = obj[data.draw(st.sampled_from(sorted(lists)), label="list")][0]
        elif containers:
            obj = obj[data.draw(st.sampled_from(sorted(containers)), label="descend")]
        else:
            break
    key = data.draw(st.sampled_from([*sorted(obj), "extra"]), label="field")
    obj[key] = data.draw(junk | nested() | huge_ints | st.floats(allow_nan=False, allow_infinity=False), label="junk")
    check_same(codec_cls, json.dumps(original, separators=(",", ":")).encode())


@pytest.mark.parametrize("codec_cls", CODECS)
@DIFF
@given(obj=top_level_objects, ascii_only=st.booleans())
def test_protocol_shaped_lines_decode_as_the_generic_path_does(codec_cls, obj, ascii_only):
    check_same(codec_cls, json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize("codec_cls", CODECS)
@DIFF
@given(line=st.binary(max_size=300) | st.text(max_size=100).map(lambda s: s.encode("utf-8", "surrogatepass")))
def test_arbitrary_bytes_decode_as_the_generic_path_does(codec_cls, line):
    check_same(codec_cls, line)


@pytest.mark.parametrize("codec_cls", CODECS)
@DIFF
@given(data=st.data())
def test_mutated_stream_lines_decode_as_the_generic_path_does(codec_cls, data):
    original = data.draw(st.sampled_from(STREAM_REAL_LINES + REAL_LINES), label="line")
    line = mutate(original, data.draw(st.lists(mutations, min_size=1, max_size=6), label="mutations"))
    check_same(codec_cls, line)


@pytest.mark.parametrize("codec_cls", CODECS)
@DIFF
@given(data=st.data())
def test_structurally_mutated_stream_lines_decode_as_the_generic_path_does(codec_cls, data):
    """Valid JSON, one field of a real or flood line replaced (wrong types, huge ints, depth)."""
    original = json.loads(data.draw(st.sampled_from(STREAM_REAL_LINES), label="line"))
    obj = original
    for _ in range(data.draw(st.integers(0, 3), label="depth")):
        containers = [k for k, v in obj.items() if isinstance(v, dict)]
        if not containers:
            break
        obj = obj[data.draw(st.sampled_from(sorted(containers)), label="descend")]
    key = data.draw(st.sampled_from([*sorted(obj), "extra"]), label="field")
    obj[key] = data.draw(junk | nested(), label="junk")
    check_same(codec_cls, json.dumps(original).encode())


@pytest.mark.parametrize("codec_cls", CODECS)
@DIFF
@given(value=json_values, digits=st.integers(17, 400), where=st.sampled_from(["index", "uuid", "extra", "text"]))
@example(value=None, digits=5000, where="index")  # json refuses it (int digit limit), orjson too
def test_long_digit_runs_decode_as_the_generic_path_does(codec_cls, value, digits, where):
    """Lines parse_object reads with json (19 digits in a row, as a number or in a string)."""
    number = "9" * digits
    event = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}
    obj: dict[str, Any] = {"type": "stream_event", "event": event, "uuid": "u", "other": value}
    token = f'"{number}"' if where in ("uuid", "text") else number
    text = json.dumps(obj).replace('"u"' if where == "uuid" else '"hi"' if where == "text" else "0", token, 1)
    if where == "extra":
        text = text[:-1] + f', "extra": [{number}, -{number}.5e3]}}'
    check_same(codec_cls, text.encode())
    # The same number where the decoded data holds it (a line the fast path must not take).
    check_same(codec_cls, b'{"type":"result","subtype":"success","usage":{"n":%s}}' % number.encode())
    check_same(
        codec_cls,
        b'{"type":"assistant","message":{"content":[{"type":"tool_use","input":{"n":%s}}]}}' % number.encode(),
    )


def deep_line(template: dict[str, Any], depth: int) -> bytes:
    """``template`` as JSON, its "DEEP" string replaced by lists nested ``depth`` levels
    (json.dumps itself cannot write 1000 levels)."""
    return json.dumps(template, separators=(",", ":")).replace('"DEEP"', "[" * depth + "]" * depth).encode()


@pytest.mark.parametrize("codec_cls", CODECS)
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, 990, 1000, 1030])
@pytest.mark.parametrize("text_len", [0, 10, 300])
@pytest.mark.parametrize("digits", ["", "1" * 19])
def test_deep_lines_decode_as_the_generic_path_does(codec_cls, depth, text_len, digits):
    """Nesting at the cap, past it, and where json's recursion limit and orjson's bite
    (one level for the line itself: depth MAX_JSON_DEPTH - 1 is the deepest line allowed)."""
    text_delta = {"type": "text_delta", "text": "x" * text_len}
    thinking_delta = {"type": "thinking_delta", "thinking": "{" * text_len}
    templates = [  # (line, how many containers hold "DEEP")
        (
            {
                "type": "stream_event",
                "event": {"type": "content_block_delta", "index": 0, "delta": text_delta},
                "extra": "DEEP",
                "uuid": digits,
            },
            1,
        ),
        (
            {
                "type": "stream_event",
                "event": {"type": "content_block_delta", "delta": thinking_delta, "extra": "DEEP"},
                "uuid": digits,
            },
            2,
        ),
        ({"type": "content_block_delta", "delta": thinking_delta, "extra": "DEEP", "uuid": digits}, 1),
        ({"type": "content_block_delta", "delta": {**text_delta, "extra": "DEEP"}, "uuid": digits}, 2),
        ({"type": "message_stop", "extra": "DEEP", "uuid": digits}, 1),
        ({"type": "stream_event", "event": {"type": "message_start", "message": "DEEP"}, "uuid": digits}, 2),
        ({"type": "keep_alive", "extra": "DEEP", "uuid": digits}, 1),
        ({"type": "result", "usage": "DEEP", "uuid": digits}, 1),
    ]
    for template, level in templates:
        line = deep_line(template, depth)
        check_same(codec_cls, line)
        [first, *_] = codec_cls().decode(line).events
        if level + depth <= MAX_JSON_DEPTH:
            assert first.relay
        elif depth < 900:
            assert first.kind == "diagnostic" and "nested deeper" in first.data["text"]


STREAM_HOT_LINES = [
    (
        b'{"type":"stream_event","event":{"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"hi"}},"session_id":"s","uuid":"u"}',
        "message.delta",
        {"text": "hi", "channel": "text"},
    ),
    (
        b'{"type": "stream_event", "event": {"type": "content_block_delta", "index": 0, '
        b'"delta": {"type": "thinking_delta", "thinking": "hm"}}, "session_id": "s"}\r',
        "message.delta",
        {"text": "hm", "channel": "thought"},
    ),
    (
        b'{"type":"stream_event","event":{"type":"content_block_delta","index":1,'
        b'"delta":{"type":"input_json_delta","partial_json":"{\\"a"}},"uuid":"u"}',
        "message.stream",
        {"event": "content_block_delta", "delta_type": "input_json_delta"},
    ),
    (
        b'{"type":"stream_event","event":{"type":"message_start","message":{"usage":{"input_tokens":'
        + b"1" * 30
        + b'}}},"uuid":"u"}',
        "message.stream",
        {"event": "message_start", "message_id": None},
    ),
    (
        b'{"type":"stream_event","event":{"type":"content_block_stop","index":0},"uuid":"u"}',
        "message.stream",
        {"event": "content_block_stop"},
    ),
    (
        b'{"type":"stream_event","event":{"type":"content_block_delta","index":'
        + b"9" * 40
        + b',"delta":{"type":"text_delta","text":"'
        + b"{[" * 80
        + b'"}}}',
        "message.delta",
        {"text": "{[" * 80, "channel": "text"},
    ),
]
AWP_HOT_LINES = [
    (
        b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}',
        "message.delta",
        {"text": "hi", "channel": "text"},
    ),
    (
        b'{"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}}',
        "message.delta",
        {"text": "hm", "channel": "thought"},
    ),
    (
        b'{"type":"content_block_delta","index":' + b"9" * 40 + b',"delta":{"type":"signature_delta"}}',
        "message.stream",
        {"event": "content_block_delta", "delta_type": "signature_delta"},
    ),
]


def _assistant_line(content: list[Any], **extra: Any) -> bytes:
    message = {"id": "msg_01", "role": "assistant", "model": "claude-opus-4-8", "content": content}
    message.update(extra.pop("message", {}))
    return json.dumps(
        {"type": "assistant", "message": message, "session_id": "s", **extra}, separators=(",", ":")
    ).encode()


MESSAGE_HOT_LINES = [
    _assistant_line([{"type": "text", "text": "Hello"}]),
    _assistant_line([{"type": "text", "text": "x" * 5000}], uuid="1" * 40),  # long, digits in a string
    _assistant_line([{"type": "thinking", "thinking": "hm", "signature": "sig"}, {"type": "text", "text": "A"}]),
    _assistant_line([{"type": "text", "text": "oops"}], error=""),
    _assistant_line([{"type": "text", "text": "oops"}], error="rate_limit"),
    _assistant_line([{"type": "text", "text": "API Error"}], message={"model": "<synthetic>", "id": 7}),
    _assistant_line([{"type": "text", "text": "{[" * 200}]),  # brackets inside the text only
    _assistant_line(
        [{"type": "tool_use", "id": "t", "name": "Bash", "input": {"n": 1, "c": "ls"}}], parent_tool_use_id="p"
    ),
    _assistant_line([{"type": "text", "text": "a"}, {"type": "server_tool_use", "id": 5, "input": None}]),
    _assistant_line(
        [{"type": "text", "text": "n"}], message={"usage": {"input_tokens": 10**30, "output_tokens": 1.5}}
    ),  # numbers no event holds
]
MESSAGE_GENERIC_LINES = [  # shapes the shortcuts leave to the generic path
    b'{"type": "user", "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", '
    b'"content": [{"type": "text", "text": "ok"}], "is_error": false}]}, "session_id": "s"}',
    b'{"type":"user","message":{"role":"user","content":"a prompt"},"isReplay":true,"uuid":"u"}\r',
    b'{"type":"result","subtype":"success","is_error":false,"result":"Done.","session_id":"s",'
    b'"usage":{"input_tokens":50,"output_tokens":12},"total_cost_usd":0.0123}',
    b'{"type":"result","subtype":"error_during_execution","is_error":true,"terminal_reason":"aborted_tools",'
    b'"errors":["[ede_diagnostic] x"],"duration_ms":12345678901234567890123}',
    _assistant_line([{"type": "tool_use", "id": "t", "name": "Bash", "input": {"n": 12345678901234567890123}}]),
    _assistant_line([{"type": "server_tool_use", "id": "t", "input": [0.5]}]),
    _assistant_line([{"type": "redacted_thinking", "data": "x"}]),
    _assistant_line([{"type": "text", "text": "a"}, "not a block"]),
    _assistant_line([]),
    _assistant_line([{"type": "text", "text": "deep"}], extra=json.loads("[" * 130 + "]" * 130)),
    b'{"type":"user","message":{"content":[{"type":"tool_result","content":[{"n":12345678901234567890123}]}]}}',
    b'{"type":"user","message":{"content":[{"type":"tool_result","content":[{"n":1.5}]}]}}',
    b'{"type":"result","subtype":"success","usage":{"n":12345678901234567890123}}',
    b'{"type":"result","subtype":"success","usage":{"n":1e400}}',
    b'{"type":"assistant","message":{"content":[{"type":"text","text":"\\ud800"}]}}',
]


@pytest.mark.parametrize("codec_cls", CODECS)
@pytest.mark.parametrize("line", MESSAGE_HOT_LINES)
def test_message_lines_take_the_shortcut(codec_cls, line, monkeypatch):
    """Assistant lines with text, thinking and tool-use blocks: never the generic parser,
    and the same events as the generic path (issue #22)."""
    check_same(codec_cls, line)
    expected = outcome(codec_cls()._decode_slow(line))

    def generic(*_: Any) -> Any:
        raise AssertionError("the generic path was taken")

    monkeypatch.setattr("bridge.protocols.stream_json.parse_object", generic)
    decoded = codec_cls().decode(line)
    assert outcome(decoded) == expected
    assert decoded.events[0].relay and decoded.events[0].raw == line.decode().removesuffix("\r")


@pytest.mark.parametrize("codec_cls", CODECS)
@pytest.mark.parametrize("line", MESSAGE_GENERIC_LINES)
def test_message_lines_the_shortcuts_decline_decode_as_the_generic_path_does(codec_cls, line):
    check_same(codec_cls, line)
    decoded = codec_cls()._decode_slow(line)
    calls: list[bytes] = []
    with mock.patch("bridge.protocols.stream_json.parse_object", lambda b: calls.append(b) or parse_object(b)):
        assert outcome(codec_cls().decode(line)) == outcome(decoded)
    assert calls == [line]


@pytest.mark.parametrize(
    ("codec_cls", "line", "kind", "data"),
    [(StreamJsonCodec, *hot) for hot in STREAM_HOT_LINES] + [(AwpJsonlCodec, *hot) for hot in AWP_HOT_LINES],
)
def test_hot_lines_take_the_fast_path(codec_cls, line, kind, data, monkeypatch):
    """The lines of a streaming turn never reach the generic parser, whatever digits or
    brackets they hold (so the differential tests above do compare two different paths)."""
    expected = outcome(codec_cls()._decode_slow(line))

    def generic(*_: Any) -> Any:
        raise AssertionError("the generic path was taken")

    monkeypatch.setattr("bridge.protocols.stream_json.parse_object", generic)
    decoded = codec_cls().decode(line)
    assert outcome(decoded) == expected
    [ev] = decoded.events
    assert (ev.kind, ev.data, ev.relay, ev.raw) == (kind, data, True, line.decode().removesuffix("\r"))


@pytest.mark.parametrize("codec_cls", CODECS)
@pytest.mark.parametrize(
    "line",
    [
        b'\xef\xbb\xbf{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":"a"}}}',
        b'{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":"\\ud800"}}}',
        b'{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":"\xed\xa0\x80"}}}',
        b'{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":"\xff"}}}',
        b'{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":NaN}}}',
        b'{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":"a"}},"x":1e999}',
        b'{"type":"stream_event","event":null}',
        b'{"type":"stream_event"}',
        b'{"type":"content_block_delta"}',
        b'{"type":"message_stop"}\r',
        b'{"type":["stream_event"]}',
        b'{"type":{"a":1}}',
        b'{"type":"stream_event","type":"result","subtype":"success"}',
        b'{"type":"stream_event","delta":{"type":"text_delta","text":"a"},"type":"content_block_delta"}',
        b'{"type":"content_block_delta","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":"a"}},'
        b'"type":"stream_event"}',
        b'{"type":"result","type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":"a"}}}',
        b'{"type":"control_response","response":{"subtype":"success","request_id":"r","response":{"token":"t"}}}',
        b'["stream_event"]',
        b'"stream_event"',
        b"  \r",
        b"",
    ],
)
def test_edge_lines_decode_as_the_generic_path_does(codec_cls, line):
    check_same(codec_cls, line)


def test_codec_bench_runs_every_shape_through_both_paths():
    """`python -m bench.codec` (docs/benchmarks.md): one row per line shape, each shape
    decoded alike by both paths (the bench asserts it). Structure only, never timing."""
    from bench.codec import SHAPES, run

    out: list[str] = []
    rows = run(rounds=1, number=3, print_=out.append)
    assert [r["shape"] for r in rows] == [name for name, _, _ in SHAPES]
    assert len(out) == 3 + len(SHAPES) and all(line.startswith("|") for line in out[1:])
    kinds = {name: [e.kind for e in codec_cls().decode(line).events] for name, codec_cls, line in SHAPES}
    assert (
        kinds["flood_agent text delta, 200 B"]
        == kinds["text_delta"]
        == kinds["thinking_delta"]
        == kinds["awp-jsonl content_block_delta"]
        == ["message.delta"]
    )
    assert kinds["assistant (text block)"] == ["message"] and kinds["result"] == ["turn.ended"]


# ---------------------------------------------------------------- a read at once


def item_stream(decoded: list[Any]) -> list[Any]:
    """What agent_output takes from a read, in its order: each Decoded's events, then its
    replies, then its control items."""
    items: list[Any] = []
    for d in decoded:
        items += [("event", *outcome_of(e)) for e in d.events]
        items += [("reply", r) for r in d.replies]
        items += [("control", repr(c)) for c in d.control]
    return items


def outcome_of(e: Any) -> tuple[Any, ...]:
    return (type(e).__name__, e.source, e.kind, exact(e.data), e.raw, e.relay)


@pytest.mark.parametrize("codec_cls", CODECS)
@DIFF
@given(
    lines=st.lists(
        stream_lines() | message_lines() | st.sampled_from(REAL_LINES) | st.binary(max_size=40),
        max_size=12,
    )
)
def test_a_read_decoded_at_once_is_each_line_decoded_in_turn(codec_cls, lines):
    # decode_many (issue #22) merges the lines a shortcut decodes back to back: what the
    # conversation core takes from them, in order, is what line-by-line decode gives (two
    # codecs: decoding may change a codec's state).
    many = codec_cls().decode_many(lines)
    one = codec_cls()
    each = [one.decode(line) for line in lines]

    assert item_stream(many) == item_stream(each)
    assert len(many) <= len(lines)


def test_a_flood_read_is_one_decoded():
    lines = [flood_line(200, f"{i:08d} ") for i in range(50)]
    [merged] = StreamJsonCodec().decode_many(lines)
    assert [e.data["text"][:8] for e in merged.events] == [f"{i:08d}" for i in range(50)]
    assert all(e.relay for e in merged.events)
