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
