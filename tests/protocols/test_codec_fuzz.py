"""Property tests: agent output is untrusted input (DESIGN.md rule 4). Whatever bytes a line
holds, decoding never raises, always yields something to record, relays at most once, uses
only known kinds, and anything the codec writes back is one line of UTF-8 JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import REDACTED, expected_redaction, is_secret_key

from bridge.protocols.awp_jsonl import AwpJsonlCodec
from bridge.protocols.events import KINDS
from bridge.protocols.jsonline import dumps
from bridge.protocols.stream_json import StreamJsonCodec

HERE = Path(__file__).resolve().parent
TRANSCRIPTS = Path(
    os.environ.get("AGENT_BRIDGE_TRANSCRIPTS", HERE.parent / "fixtures" / "transcripts" / "claude-code-2.1.197")
)


def _real_lines() -> list[bytes]:
    if not TRANSCRIPTS.is_dir():
        return []
    out: list[bytes] = []
    for path in sorted(TRANSCRIPTS.glob("*.transcript.jsonl")):
        for text in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(text)
            if record.get("dir") == "<":
                out.append(record["line"].encode("utf-8"))
    return out


REAL_LINES = _real_lines()

FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
# For properties whose interesting part is a fixed edit of an otherwise ordinary object.
LIGHT = settings(FUZZ, max_examples=60)

CODECS = [StreamJsonCodec, AwpJsonlCodec]


def check_decoded(decoded, line: bytes) -> None:
    assert decoded.events, "every line must leave a trace"
    relayed = [e for e in decoded.events if e.relay]
    assert len(relayed) <= 1
    for ev in decoded.events:
        assert ev.kind in KINDS, ev.kind
        assert ev.source in ("agent", "client", "bridge")
        assert isinstance(ev.data, dict)
    for ev in decoded.events:
        # data goes into a JSON frame: no NaN/Infinity, and it must serialise at all
        json.dumps(ev.data, allow_nan=False)
    if relayed:
        # Only a JSON-object line is relayed, as the first event, with its own text, and
        # that text must be strict JSON: Record.envelope embeds it verbatim (docs/api.md §6.1).
        # The one exception: a control_response carrying secrets relays redacted.
        assert relayed[0] is decoded.events[0]
        raw = relayed[0].raw
        assert raw is not None
        assert isinstance(strict_loads(raw), dict)
        obj = json.loads(line.decode("utf-8"))
        redacted = expected_redaction(obj) if obj.get("type") == "control_response" else obj
        if redacted == obj:
            assert raw.encode("utf-8") in line
        else:
            assert raw == dumps(redacted)
            assert REDACTED in raw
        for ev in decoded.events:
            assert ev.raw == raw
    else:
        [ev] = decoded.events
        assert ev.kind == "diagnostic" and ev.raw is None
    for reply in decoded.replies:
        check_wire_line(reply)
        assert json.loads(reply)["type"] == "control_response"


def _reject(token: str):
    raise ValueError(f"not RFC 8259 JSON: {token}")


def _finite(token: str) -> float:
    value = float(token)
    if value in (float("inf"), float("-inf")):
        _reject(token)
    return value


def strict_loads(text: str):
    """A parser as strict as a browser's JSON.parse (Python's json.loads takes NaN)."""
    if text.lstrip(" \t\r\n") != text.lstrip() or text.rstrip(" \t\r\n") != text.rstrip():
        _reject("whitespace outside the JSON set")
    return json.loads(text, parse_constant=_reject, parse_float=_finite)


def check_wire_line(line: str) -> dict:
    assert "\n" not in line and "\r" not in line
    line.encode("utf-8")  # must be writable to a UTF-8 pipe: agents read UTF-8 JSON lines
    obj = strict_loads(line)
    assert isinstance(obj, dict)
    return obj


# ---------------------------------------------------------------- strategies

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
)
# st.text() never yields lone surrogates, but json.loads of a client frame can ("\ud800").
nasty_text = st.lists(
    st.characters(codec="utf-8") | st.sampled_from(["\n", "\r", "\u2028", "\u2029", "\x00", "\ud800", "\udfff"]),
    max_size=40,
).map("".join)


json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=15,
)

# Field names and values the decoder looks at, so generated objects reach every handler.
TYPES = [
    "system",
    "assistant",
    "user",
    "stream_event",
    "result",
    "control_request",
    "control_response",
    "control_cancel_request",
    "rate_limit_event",
    "tool_progress",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_stop",
    "keep_alive",
    "shutdown",
]
SUBTYPES = [
    "init",
    "session_start",
    "status",
    "session_state_changed",
    "hook_started",
    "hook_progress",
    "hook_response",
    "task_started",
    "task_progress",
    "task_updated",
    "task_notification",
    "api_retry",
    "success",
    "error",
    "error_during_execution",
    "error_max_turns",
    "can_use_tool",
    "hook_callback",
    "interrupt",
]
KEYS = [
    "type",
    "subtype",
    "session_id",
    "model",
    "tools",
    "status",
    "state",
    "hook_event",
    "hook_name",
    "outcome",
    "task_id",
    "patch",
    "message",
    "content",
    "event",
    "delta",
    "content_block",
    "is_error",
    "isReplay",
    "terminal_reason",
    "errors",
    "error",
    "result",
    "usage",
    "request_id",
    "request",
    "tool_name",
    "input",
    "rate_limit_info",
    "parent_tool_use_id",
    "text",
    "thinking",
    "id",
    "name",
    "tool_use_id",
    "workflow_progress",
]

field_leaves = (
    json_scalars
    | nasty_text
    | st.sampled_from(
        TYPES
        + SUBTYPES
        + ["text", "tool_use", "text_delta", "thinking_delta", "tool_result", "aborted_tools", "<synthetic>"]
    )
)
field_values = st.recursive(
    field_leaves,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)
shaped_objects = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), field_values, max_size=6)
top_level_objects = st.builds(
    lambda t, body: {**body, "type": t},
    st.sampled_from(TYPES) | st.text(max_size=8),
    shaped_objects,
)


# ---------------------------------------------------------------- decode properties


@pytest.mark.parametrize("codec_cls", CODECS)
@FUZZ
@given(line=st.binary(max_size=200))
def test_decode_never_raises_on_arbitrary_bytes(codec_cls, line):
    check_decoded(codec_cls().decode(line), line)


@pytest.mark.parametrize("codec_cls", CODECS)
@FUZZ
@given(line=st.text(max_size=100).map(lambda s: s.encode("utf-8", "surrogatepass")))
def test_decode_never_raises_on_arbitrary_text(codec_cls, line):
    check_decoded(codec_cls().decode(line), line)


@pytest.mark.parametrize("codec_cls", CODECS)
@FUZZ
@given(value=json_values)
def test_decode_never_raises_on_arbitrary_json_values(codec_cls, value):
    line = json.dumps(value).encode()
    decoded = codec_cls().decode(line)
    check_decoded(decoded, line)
    if isinstance(value, dict):
        redacted = expected_redaction(value) if value.get("type") == "control_response" else value
        assert decoded.events[0].relay
        assert decoded.events[0].raw == (line.decode() if redacted == value else dumps(redacted))
    else:
        assert [e.kind for e in decoded.events] == ["diagnostic"]


@pytest.mark.parametrize("codec_cls", CODECS)
@FUZZ
@given(obj=top_level_objects, ascii_only=st.booleans())
def test_decode_never_raises_on_protocol_shaped_objects(codec_cls, obj, ascii_only):
    line = json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    decoded = codec_cls().decode(line)
    check_decoded(decoded, line)
    if ascii_only:  # a lone surrogate in raw UTF-8 bytes is invalid UTF-8: a diagnostic
        assert decoded.events[0].relay


@pytest.mark.parametrize("codec_cls", CODECS)
@FUZZ
@given(obj=top_level_objects)
def test_the_same_object_always_decodes_the_same_way(codec_cls, obj):
    line = json.dumps(obj).encode()
    a, b = codec_cls().decode(line), codec_cls().decode(line)
    assert [(e.kind, e.data, e.raw, e.relay) for e in a.events] == [(e.kind, e.data, e.raw, e.relay) for e in b.events]
    assert a.replies == b.replies


non_json_number = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e400"])
non_json_space = st.sampled_from(["\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u2028", "\u3000"])


@pytest.mark.parametrize("codec_cls", CODECS)
@LIGHT
@given(obj=top_level_objects, key=st.sampled_from(KEYS), number=non_json_number)
def test_objects_with_non_json_numbers_are_diagnostics(codec_cls, obj, key, number):
    obj.pop(key, None)
    body = json.dumps(obj)
    line = (body[:-1] + ("," if obj else "") + f'"{key}":{number}}}').encode()
    [ev] = codec_cls().decode(line).events
    assert (ev.kind, ev.raw, ev.relay) == ("diagnostic", None, False)


@pytest.mark.parametrize("codec_cls", CODECS)
@LIGHT
@given(obj=top_level_objects, space=non_json_space, before=st.booleans())
def test_objects_padded_with_non_json_whitespace_are_diagnostics(codec_cls, obj, space, before):
    body = json.dumps(obj)
    line = (space + body if before else body + space).encode()
    [ev] = codec_cls().decode(line).events
    assert (ev.kind, ev.raw, ev.relay) == ("diagnostic", None, False)


@pytest.mark.parametrize("codec_cls", CODECS)
@LIGHT
@given(
    obj=top_level_objects,
    lead=st.sampled_from(["", " ", "\t", "  "]),
    trail=st.sampled_from(["", " ", "\t", "\r", " \r"]),
)
def test_json_whitespace_around_an_object_is_fine_and_kept_in_raw(codec_cls, obj, lead, trail):
    body = json.dumps(obj)
    [first, *_] = codec_cls().decode((lead + body + trail).encode()).events
    assert first.relay
    assert first.raw == (lead + body + trail).removesuffix("\r")


_ABSENT = object()
mcp_inner_messages = (
    st.just(_ABSENT)
    | json_values
    | st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "method": st.text(max_size=12)},
        optional={"id": json_scalars, "params": json_values},
    )
)


def _expected_answer(subtype: str, message) -> tuple[str, dict | str]:
    """("success", response) or ("error", message) for a CLI → host control request."""
    if subtype == "hook_callback":
        return "success", {}
    if subtype == "elicitation":  # one the bridge cannot show (here: no message)
        return "success", {"action": "decline"}
    if subtype == "mcp_message":
        inner = message if isinstance(message, dict) else {}
        if "id" not in inner:
            return "success", {"mcp_response": {"jsonrpc": "2.0", "result": {}}}
        return "success", {
            "mcp_response": {
                "jsonrpc": "2.0",
                "id": inner["id"],
                "error": {"code": -32601, "message": "no MCP server 'srv' in this host"},
            }
        }
    return "error", f"Unsupported control request subtype: {subtype}"


@FUZZ
@given(
    request_id=nasty_text,
    subtype=st.text(max_size=20)
    | st.sampled_from(["hook_callback", "mcp_message", "elicitation", "request_user_dialog", "can_use_tool"]),
    message=mcp_inner_messages,
)
def test_every_cli_control_request_gets_exactly_one_reply_with_its_id(request_id, subtype, message):
    request: dict = {"subtype": subtype, "server_name": "srv"}
    if message is not _ABSENT:
        request["message"] = message
    line = json.dumps({"type": "control_request", "request_id": request_id, "request": request}).encode()
    decoded = StreamJsonCodec().decode(line)
    check_decoded(decoded, line)
    [ev] = decoded.events
    assert ev.relay and ev.raw == line.decode()
    if subtype == "can_use_tool":
        assert ev.kind == "permission.requested"
        assert decoded.replies == []
        return
    if subtype == "elicitation" and isinstance(message, str):
        # A form with a message (no schema: an empty one) waits for the user (or the
        # conversation's policy): stream_json_elicit.py.
        assert ev.kind == "elicitation.requested" and ev.data["message"] == message
        assert decoded.replies == []
        return
    assert ev.kind == "diagnostic"
    assert (ev.data["stream"], ev.data["control"]) == ("protocol", subtype)
    [reply] = [check_wire_line(r) for r in decoded.replies]
    outcome, answer = _expected_answer(subtype, message)
    # What the agent meant: JSON cannot tell "\ud800\udfff" from U+103FF, nor can JS.
    rid = json.loads(json.dumps(request_id))
    if outcome == "success":
        assert reply == {
            "type": "control_response",
            "response": {"subtype": "success", "request_id": rid, "response": json.loads(json.dumps(answer))},
        }
    else:
        assert reply == {
            "type": "control_response",
            "response": {"subtype": "error", "request_id": rid, "error": answer},
        }


@pytest.mark.parametrize("codec_cls", CODECS)
@LIGHT
@given(request_id=json_scalars)
def test_control_cancel_requests_are_never_answered(codec_cls, request_id):
    line = json.dumps({"type": "control_cancel_request", "request_id": request_id}).encode()
    decoded = codec_cls().decode(line)
    check_decoded(decoded, line)
    assert decoded.replies == []
    [ev] = decoded.events
    if codec_cls is AwpJsonlCodec:  # no control protocol, no permission prompts
        assert (ev.kind, ev.data) == ("agent.other", {})
    else:
        assert (ev.kind, ev.data) == (
            "permission.resolved",
            {"request_id": request_id if isinstance(request_id, str) else None, "decision": "cancelled", "by": "agent"},
        )


@pytest.mark.parametrize("codec_cls", CODECS)
@LIGHT
@given(subtype=json_scalars, request_id=json_scalars)
def test_control_responses_are_agent_replies_and_never_answered(codec_cls, subtype, request_id):
    line = json.dumps({"type": "control_response", "response": {"subtype": subtype, "request_id": request_id}}).encode()
    decoded = codec_cls().decode(line)
    check_decoded(decoded, line)
    assert decoded.replies == []
    [ev] = decoded.events
    assert (ev.kind, ev.raw) == ("agent.reply", line.decode())
    assert ev.data == {
        "request_id": request_id if isinstance(request_id, str) else None,
        "subtype": subtype if isinstance(subtype, str) else None,
    }


SECRET_KEYS = [
    "token",
    "accessToken",
    "oauth_token",
    "client_secret",
    "password",
    "passwd",
    "apiKey",
    "api_key",
    "x-api-key",
    "Authorization",
    "cookie",
    "credentials",
    "email",
    "organization",
    "organisation",
    "account",
    "accountUuid",
    "sessionKey",
    "session-key",
    "private_key",
    "privateKey",
]
PUBLIC_KEYS = [
    "subtype",
    "request_id",
    "response",
    "commands",
    "models",
    "name",
    "value",
    "session_id",
    "pid",
    "auth",
    "description",
]
secretive_values = st.recursive(
    json_scalars | nasty_text,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(SECRET_KEYS + PUBLIC_KEYS) | st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=14,
)


def _secret_scalars(value, inside: bool = False) -> list:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _secret_scalars(v, inside or is_secret_key(k))]
    if isinstance(value, list):
        return [s for v in value for s in _secret_scalars(v, inside)]
    return [value] if inside and value is not None else []


@pytest.mark.parametrize("codec_cls", CODECS)
@FUZZ
@given(
    body=st.dictionaries(st.sampled_from(SECRET_KEYS + PUBLIC_KEYS), secretive_values, max_size=5),
    ascii_only=st.booleans(),
)
def test_control_responses_never_relay_a_secret(codec_cls, body, ascii_only):
    obj = {"type": "control_response", "response": {"subtype": "success", "request_id": "r1", "response": body}}
    line = json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    decoded = codec_cls().decode(line)
    check_decoded(decoded, line)  # raw is the line, or exactly its redaction
    if not ascii_only and not decoded.events[0].relay:
        return  # a lone surrogate written as raw UTF-8 bytes: not UTF-8, a diagnostic
    [ev] = decoded.events
    assert ev.kind == "agent.reply" and ev.relay
    op = body.get("subtype") if isinstance(body, dict) else None  # Qwen Code names the request answered
    assert ev.data == {"request_id": "r1", "subtype": "success", **({"op": op} if isinstance(op, str) and op else {})}
    relayed = json.loads(ev.raw)
    assert relayed == expected_redaction(json.loads(line.decode("utf-8")))
    assert all(s == REDACTED for s in _secret_scalars(relayed))


assert REAL_LINES, f"no transcripts at {TRANSCRIPTS}"  # a copy ships in tests/fixtures


def needs_transcripts(fn):  # type: ignore[no-untyped-def]
    return fn


def _flip(line: bytes, pos: int, byte: int) -> bytes:
    pos %= len(line)
    return line[:pos] + bytes([byte]) + line[pos + 1 :]


mutations = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 20), st.integers(1, 16)),
)


def mutate(line: bytes, ops) -> bytes:
    for op, pos, arg in ops:
        if not line:
            break
        at = pos % (len(line) + 1)
        if op == "flip":
            line = _flip(line, pos, arg)
        elif op == "truncate":
            line = line[:at]
        elif op == "insert":
            line = line[:at] + bytes([arg]) + line[at:]
        else:
            line = line[:at] + line[at + arg :]
    return line


@needs_transcripts
@pytest.mark.parametrize("codec_cls", CODECS)
@FUZZ
@given(data=st.data())
def test_decode_never_raises_on_mutated_real_lines(codec_cls, data):
    original = data.draw(st.sampled_from(REAL_LINES), label="line")
    ops = data.draw(st.lists(mutations, min_size=1, max_size=6), label="mutations")
    line = mutate(original, ops)
    check_decoded(codec_cls().decode(line), line)


@needs_transcripts
@pytest.mark.parametrize("codec_cls", CODECS)
@FUZZ
@given(data=st.data())
def test_structurally_mutated_real_objects_decode(codec_cls, data):
    """Keep the JSON valid but replace one field of a real line with junk."""
    original = json.loads(data.draw(st.sampled_from(REAL_LINES), label="line"))
    obj = original
    path = []
    for _ in range(data.draw(st.integers(0, 3), label="depth")):
        containers = [k for k, v in obj.items() if isinstance(v, dict)]
        if not containers:
            break
        key = data.draw(st.sampled_from(sorted(containers)), label="descend")
        path.append(key)
        obj = obj[key]
    if obj:
        key = data.draw(st.sampled_from(sorted(obj)), label="field")
        obj[key] = data.draw(json_values, label="junk")
    line = json.dumps(original).encode()
    decoded = codec_cls().decode(line)
    check_decoded(decoded, line)
    assert decoded.events[0].relay


@needs_transcripts
def test_real_lines_survive_every_single_truncation_point_of_a_sample():
    # Deterministic complement to the random mutations: every prefix of a few real lines.
    codec = StreamJsonCodec()
    for original in REAL_LINES[:: max(1, len(REAL_LINES) // 8)]:
        step = max(1, len(original) // 300)
        for cut in range(0, len(original), step):
            check_decoded(codec.decode(original[:cut]), original[:cut])


# ---------------------------------------------------------------- encode properties

content_blocks = st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=40)})
    | st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    max_size=4,
)


@pytest.mark.parametrize("codec_cls", CODECS)
@FUZZ
@given(content=content_blocks)
def test_encode_prompt_is_one_json_object_line(codec_cls, content):
    obj = check_wire_line(codec_cls().encode_prompt(content))
    assert obj["type"] == "user"
    assert obj["message"] == {"role": "user", "content": content}


@FUZZ
@given(text=nasty_text)
def test_encode_prompt_handles_newlines_separators_and_lone_surrogates(text):
    for codec in (StreamJsonCodec(), AwpJsonlCodec()):
        obj = check_wire_line(codec.encode_prompt([{"type": "text", "text": text}]))
        assert obj["message"]["content"][0]["text"] == json.loads(json.dumps(text))


@FUZZ
@given(n=st.integers(1, 20))
def test_encode_interrupt_lines_are_json_objects_with_fresh_ids(n):
    codec = StreamJsonCodec()
    ids = set()
    for _ in range(n):
        line = codec.encode_interrupt()
        assert line is not None
        obj = check_wire_line(line)
        assert obj["request"] == {"subtype": "interrupt"}
        ids.add(obj["request_id"])
    assert len(ids) == n
    assert AwpJsonlCodec().encode_interrupt() is None


@FUZZ
@given(
    request_id=st.text(max_size=40),
    allow=st.booleans(),
    updated=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    message=st.text(max_size=40),
)
def test_encode_permission_is_one_json_object_line(request_id, allow, updated, message):
    obj = check_wire_line(
        StreamJsonCodec().encode_permission(request_id, allow, updated_input=updated, message=message)
    )
    assert obj["response"]["request_id"] == request_id
    assert obj["response"]["response"]["behavior"] == ("allow" if allow else "deny")
