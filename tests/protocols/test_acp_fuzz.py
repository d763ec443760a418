"""Property tests for the ACP client codec: agent output is untrusted input (DESIGN.md
rule 4). Whatever a line holds, in whatever handshake state, decoding never raises, relays
at most once, uses only known kinds, and every line the codec writes back is one line of
JSON that is a JSON-RPC 2.0 request, notification or response (docs/api.md §7.3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.protocols.acp import FS_METHODS, AcpCodec
from bridge.protocols.acp_elicit import request_key
from bridge.protocols.codec import Decoded as AcpDecoded
from bridge.protocols.events import KINDS
from bridge.protocols.jsonline import parse_object

HERE = Path(__file__).resolve().parent
TRANSCRIPTS = HERE.parent / "fixtures" / "transcripts" / "claude-agent-acp-0.49.0"
SID = "s-1"
OLD = "old-1"

FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
LIGHT = settings(FUZZ, max_examples=80)


def _real_lines() -> list[bytes]:
    out = []
    for path in sorted(TRANSCRIPTS.glob("*.transcript.jsonl")):
        for text in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(text)
            if rec.get("dir") == "<":
                out.append(rec["line"].encode("utf-8"))
    return out


REAL_LINES = _real_lines()
assert REAL_LINES, f"no ACP transcripts at {TRANSCRIPTS}"


# ---------------------------------------------------------------- checks


def _reject(token: str) -> Any:
    raise ValueError(f"not RFC 8259 JSON: {token}")


def _finite(token: str) -> float:
    value = float(token)
    if value in (float("inf"), float("-inf")):
        _reject(token)
    return value


def strict_loads(text: str) -> Any:
    return json.loads(text, parse_constant=_reject, parse_float=_finite)


def _valid_id(v: Any) -> bool:
    return isinstance(v, (int, str)) and not isinstance(v, bool)


def check_wire(line: str) -> dict[str, Any]:
    """One line the codec writes to the agent: a JSON-RPC 2.0 message."""
    assert isinstance(line, str)
    assert "\n" not in line and "\r" not in line
    line.encode("utf-8")  # writable to a UTF-8 pipe
    obj = strict_loads(line)
    assert isinstance(obj, dict) and obj.get("jsonrpc") == "2.0", line
    if "method" in obj:  # request or notification
        assert isinstance(obj["method"], str)
        assert isinstance(obj.get("params"), dict)
        assert "result" not in obj and "error" not in obj
        if "id" in obj:
            assert isinstance(obj["id"], int) and not isinstance(obj["id"], bool)
    else:  # response
        assert "id" in obj and (obj["id"] is None or _valid_id(obj["id"]))
        assert ("result" in obj) != ("error" in obj)
        if "error" in obj:
            err = obj["error"]
            assert isinstance(err["code"], int) and isinstance(err["message"], str)
    return obj


def check_decoded(decoded: AcpDecoded, line: bytes, *, was_loading: bool) -> None:
    assert isinstance(decoded, AcpDecoded)
    for ev in decoded.events:
        assert ev.kind in KINDS, ev.kind
        assert ev.source in ("agent", "bridge")
        assert isinstance(ev.data, dict)
        json.dumps(ev.data, allow_nan=False)
        if ev.source == "bridge":
            assert ev.raw is None and not ev.relay
    relayed = [e for e in decoded.events if e.relay]
    assert len(relayed) <= 1
    obj = parse_object(line)[0]
    if obj is None:  # not a JSON object: one diagnostic, never relayed
        [ev] = decoded.events
        assert ev.kind == "diagnostic" and ev.raw is None and not ev.relay
        assert decoded.replies == [] and decoded.requests == []
    elif decoded.events:
        # The line is recorded once with its exact text, as the first event; only the agent's
        # notifications are relayed to raw-mode clients.
        first = decoded.events[0]
        assert first.source == "agent" and first.raw is not None
        assert isinstance(strict_loads(first.raw), dict)
        assert first.raw.encode("utf-8") in line
        notification = obj.get("jsonrpc") == "2.0" and isinstance(obj.get("method"), str) and "id" not in obj
        assert relayed == ([first] if notification else [])
    else:
        # Only history replayed during session/load leaves no event.
        assert was_loading and obj.get("method") == "session/update"
        assert decoded.replies == [] and decoded.requests == []
    for reply in decoded.replies:
        check_wire(reply)
    for req in decoded.requests:
        assert _valid_id(req.id) and req.method in FS_METHODS and isinstance(req.params, dict)
    if decoded.fatal is not None:
        assert decoded.fatal.reason in ("protocol_version", "auth_required", "handshake_failed")
        assert isinstance(decoded.fatal.message, str)
    if decoded.agent is not None:
        json.dumps(decoded.agent, allow_nan=False)


def decode(codec: AcpCodec, line: bytes) -> AcpDecoded:
    was_loading = codec._loading
    decoded = codec.decode(line)
    check_decoded(decoded, line, was_loading=was_loading)
    return decoded


# ---------------------------------------------------------------- codec states


def _answer(codec: AcpCodec, request: str, result: Any) -> AcpDecoded:
    rid = check_wire(request)["id"]
    return decode(codec, json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode())


def make_codec(state: str) -> AcpCodec:
    """A codec in one of the handshake states, so fuzzed lines reach every code path."""
    resume = OLD if state in ("loading", "resuming", "ready_loaded") else None
    auth = "key" if state == "authenticating" else None
    codec = AcpCodec(cwd="/w", resume_id=resume, auth_method=auth)
    [init] = codec.start()
    if state == "initializing":
        return codec
    caps: dict[str, Any] = {"loadSession": state in ("loading", "ready_loaded")}
    if state == "resuming":
        caps["sessionCapabilities"] = {"resume": {}}
    d = _answer(
        codec, init, {"protocolVersion": 1, "agentCapabilities": caps, "authMethods": [{"id": "key", "name": "K"}]}
    )
    [opening] = d.replies
    if state in ("opening", "loading", "resuming", "authenticating"):
        return codec
    d = _answer(codec, opening, {"sessionId": SID} if state == "ready" else None)
    assert d.ready
    # one prompt in flight and one pending permission, so responses and cancels can land
    codec.encode_prompt([{"type": "text", "text": "hi"}])
    decode(
        codec,
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "session/request_permission",
                "params": {"sessionId": codec.session_id, "options": []},
            }
        ).encode(),
    )
    return codec


STATES = ["initializing", "opening", "authenticating", "loading", "resuming", "ready", "ready_loaded"]
states = st.sampled_from(STATES)


# ---------------------------------------------------------------- strategies

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
nasty_text = st.lists(
    st.characters(codec="utf-8") | st.sampled_from(["\n", "\r", "\u2028", "\x00", "\ud800", "\udfff"]), max_size=20
).map("".join)

METHODS = [
    "session/update",
    "session/request_permission",
    "fs/read_text_file",
    "fs/write_text_file",
    "terminal/create",
    "elicitation/create",
    "elicitation/complete",
    "$/cancel_request",
    "_zed/x",
    "initialize",
    "session/prompt",
]
UPDATES = [
    "agent_message_chunk",
    "agent_thought_chunk",
    "user_message_chunk",
    "tool_call",
    "tool_call_update",
    "plan",
    "available_commands_update",
    "current_mode_update",
    "config_option_update",
    "session_info_update",
    "usage_update",
    "plan_update",
    "notice",
]
KEYS = [
    "sessionId",
    "update",
    "sessionUpdate",
    "content",
    "messageId",
    "toolCallId",
    "title",
    "kind",
    "status",
    "rawInput",
    "rawOutput",
    "entries",
    "currentModeId",
    "modeId",
    "toolCall",
    "options",
    "optionId",
    "path",
    "type",
    "text",
    "uri",
    "name",
    "protocolVersion",
    "agentCapabilities",
    "loadSession",
    "sessionCapabilities",
    "resume",
    "authMethods",
    "id",
    "stopReason",
    "usage",
    "code",
    "message",
    "data",
]
leaves = (
    json_scalars
    | nasty_text
    | st.sampled_from(
        [
            *UPDATES,
            SID,
            OLD,
            "other",
            "text",
            "resource_link",
            "content",
            "completed",
            "failed",
            "pending",
            "end_turn",
            "cancelled",
            "refusal",
            "allow_once",
            "reject_once",
            "key",
            1,
            0,
            -32000,
            -32603,
        ]
    )
)
field_values = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), children, max_size=4)
    ),
    max_leaves=14,
)
shaped = st.dictionaries(st.sampled_from(KEYS), field_values, max_size=6)
# Type confusion first: where the codec expects a list or an object, a number or a string.
confused = st.sampled_from([1, -1, 2.5, 7, True, "x", "", 0, False, None])
junk = st.one_of(confused, st.sampled_from([{}, [], {"k": 1}, [1, "a"], [{}], [None], [[]]]), field_values)
session_ids = st.sampled_from([SID, OLD, "other"]) | json_scalars
# Values that steer into a branch, for the fields the codec switches on.
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "status": st.sampled_from(["completed", "failed", "in_progress", "pending"]) | junk,
    "kind": st.sampled_from(["allow_once", "allow_always", "reject_once", "reject_always", "execute"]) | junk,
    "type": st.sampled_from(["text", "resource_link", "image", "content", "diff"]) | junk,
    "stopReason": st.sampled_from(["end_turn", "cancelled", "refusal", "max_tokens"]) | junk,
    "protocolVersion": st.just(1) | junk,
    "sessionId": session_ids,
}


def some_of(*keys: str, **fixed: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with any subset of ``keys`` plus the ``fixed`` ones: a field the codec reads
    is present about half the time, with a value of any JSON type."""
    return st.fixed_dictionaries(fixed, optional={k: VALUES.get(k, junk) for k in keys})


UPDATE_KEYS = (
    "content",
    "messageId",
    "toolCallId",
    "title",
    "kind",
    "status",
    "rawInput",
    "rawOutput",
    "entries",
    "currentModeId",
    "modeId",
    "_meta",
)
VALUES["content"] = st.one_of(
    some_of("type", "text", "uri", "name"),  # a ContentBlock (message chunks)
    st.lists(some_of("type", "content", "path") | junk, max_size=3),  # ToolCallContent[] (tool calls)
    junk,
)
VALUES["entries"] = st.lists(some_of("content", "priority", "status") | junk, max_size=3) | junk
updates = st.one_of(
    some_of(*UPDATE_KEYS, sessionUpdate=st.sampled_from(UPDATES)),
    st.builds(lambda kind, body: {**body, "sessionUpdate": kind}, st.sampled_from(UPDATES) | json_scalars, shaped),
    junk,
)
update_params = some_of("_meta", sessionId=session_ids, update=updates) | junk
request_params = st.one_of(
    some_of("sessionId", "toolCall", "options", "path", "content", "line", "limit"),
    st.fixed_dictionaries(
        {
            "sessionId": session_ids,
            "toolCall": some_of("toolCallId", "title", "kind", "rawInput", "content") | junk,
            "options": st.lists(some_of("optionId", "kind", "name") | junk, max_size=4) | junk,
        }
    ),
    junk,
)
params = update_params | request_params | shaped
ids = (
    st.integers(-1, 8)
    | st.text(max_size=3)
    | st.none()
    | st.booleans()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.lists(st.integers(0, 3), max_size=2)
    | st.dictionaries(st.text(max_size=2), st.integers(), max_size=1)
    | st.integers()
)
pending_ids = st.integers(0, 6)  # the codec numbers its requests from 0
errors = st.one_of(
    some_of(
        "data",
        code=st.sampled_from([-32000, -32601, -32603, -32002, -32800]) | junk,
        message=st.text(max_size=10) | junk,
    ),
    junk,
)
results = st.one_of(
    some_of(
        "protocolVersion", "agentCapabilities", "agentInfo", "authMethods", "sessionId", "stopReason", "usage", "modes"
    ),
    st.fixed_dictionaries(
        {"protocolVersion": st.just(1)},
        optional={
            "agentCapabilities": some_of("loadSession", "sessionCapabilities") | junk,
            "authMethods": st.lists(some_of("id", "name") | junk, max_size=3) | junk,
        },
    ),
    st.fixed_dictionaries(
        {"stopReason": st.sampled_from(["end_turn", "cancelled", "refusal"]) | junk}, optional={"usage": junk}
    ),
    junk,
)

MISSING = object()


def _rpc(jsonrpc: Any, rid: Any, method: Any, par: Any, result: Any, error: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in (
        ("jsonrpc", jsonrpc),
        ("id", rid),
        ("method", method),
        ("params", par),
        ("result", result),
        ("error", error),
    ):
        if value is not MISSING:
            obj[key] = value
    return obj


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(MISSING), strategy)


notifications = st.builds(
    lambda method, par: {"jsonrpc": "2.0", "method": method, "params": par},
    st.just("session/update") | st.sampled_from(METHODS),
    update_params,
)
agent_requests = st.builds(
    lambda rid, method, par: {"jsonrpc": "2.0", "id": rid, "method": method, "params": par},
    ids,
    st.sampled_from(METHODS) | st.text(max_size=8),
    request_params,
)
responses = st.builds(
    lambda rid, body: {"jsonrpc": "2.0", "id": rid, **body},
    pending_ids | ids,
    st.builds(lambda r: {"result": r}, results)
    | st.builds(lambda e: {"error": e}, errors)
    | st.builds(lambda r, e: {"result": r, "error": e}, results, errors),
)
anything = st.builds(
    _rpc,
    maybe(st.just("2.0") | json_scalars),
    maybe(ids),
    maybe(st.sampled_from(METHODS) | json_scalars),
    maybe(params),
    maybe(results),
    maybe(errors),
)
rpc_objects = st.one_of(notifications, agent_requests, responses, anything)


def dump(obj: Any, ascii_only: bool = True) -> bytes:
    return json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


# ---------------------------------------------------------------- decode properties


@FUZZ
@given(state=states, line=st.binary(max_size=200))
def test_decode_never_raises_on_arbitrary_bytes(state, line):
    decode(make_codec(state), line)


@FUZZ
@given(state=states, value=json_values)
def test_decode_never_raises_on_arbitrary_json_values(state, value):
    line = dump(value)
    d = decode(make_codec(state), line)
    if not isinstance(value, dict):
        assert [e.kind for e in d.events] == ["diagnostic"] and d.replies == []


@FUZZ
@given(state=states, obj=rpc_objects, ascii_only=st.booleans())
def test_decode_never_raises_on_json_rpc_shaped_objects(state, obj, ascii_only):
    decode(make_codec(state), dump(obj, ascii_only))


@FUZZ
@given(state=states, objs=st.lists(rpc_objects, min_size=1, max_size=12))
def test_a_sequence_of_json_rpc_objects_keeps_every_invariant(state, objs):
    codec = make_codec(state)
    for obj in objs:
        decode(codec, dump(obj))


@FUZZ
@given(state=states, variant=st.sampled_from(UPDATES), fields=some_of(*UPDATE_KEYS), sid=st.sampled_from([SID, OLD]))
def test_every_session_update_variant_with_junk_fields(state, variant, fields, sid):
    codec = make_codec(state)
    line = dump(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": sid, "update": {**fields, "sessionUpdate": variant}},
        }
    )
    d = decode(codec, line)
    assert d.replies == [] and d.requests == [] and d.fatal is None


@FUZZ
@given(
    state=states,
    rid=pending_ids,
    body=st.builds(lambda r: {"result": r}, results) | st.builds(lambda e: {"error": e}, errors),
)
def test_responses_to_pending_requests_with_junk_results(state, rid, body):
    decode(make_codec(state), dump({"jsonrpc": "2.0", "id": rid, **body}))


@FUZZ
@given(
    state=states,
    rid=st.integers(0, 3) | st.text(max_size=2),
    method=st.sampled_from(["session/request_permission", *sorted(FS_METHODS), "terminal/create"]),
    par=request_params,
)
def test_agent_requests_with_junk_params(state, rid, method, par):
    d = decode(make_codec(state), dump({"jsonrpc": "2.0", "id": rid, "method": method, "params": par}))
    assert d.events and d.events[0].raw is not None


@FUZZ
@given(rid=ids, method=st.sampled_from(METHODS) | st.text(max_size=8), par=params)
def test_every_agent_request_is_answered_or_handed_over_or_pending(rid, method, par):
    """A request is never silently dropped: it gets a reply, becomes an AgentRequest, or
    becomes a pending permission answered later."""
    codec = make_codec("ready")
    line = dump({"jsonrpc": "2.0", "id": rid, "method": method, "params": par})
    before = set(codec.pending_permissions())
    d = decode(codec, line)
    if not (isinstance(rid, (int, str)) and not isinstance(rid, bool)):
        [reply] = d.replies
        assert check_wire(reply)["id"] is None
        return
    answered = [r for r in (check_wire(x) for x in d.replies) if r.get("id") == json.loads(json.dumps(rid))]
    if method == "session/request_permission":
        assert str(rid) in codec.pending_permissions() and not d.replies
        line = codec.answer_permission(str(rid), "deny", options=d.events[0].data["options"])
        assert line is not None and check_wire(line)["id"] == json.loads(json.dumps(rid))
        assert set(codec.pending_permissions()) == before - {str(rid)}
    elif method in FS_METHODS:
        assert [r.id for r in d.requests] == [rid] and not d.replies
    elif method == "elicitation/create":
        # A well-formed question waits for a client's answer; anything else is refused
        # as invalid params (the method is known), never dropped.
        if answered:
            assert len(answered) == 1 and answered[0]["error"]["code"] == -32602
        else:
            asked = [e for e in d.events if e.kind == "elicitation.requested"]
            assert len(asked) == 1 and asked[0].data["request_id"] == request_key(rid) and not d.replies
    else:
        assert len(answered) == 1 and answered[0]["error"]["code"] == -32601


# ---------------------------------------------------------------- real lines, mutated

mutations = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 20), st.integers(1, 16)),
)


def mutate(line: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    for op, pos, arg in ops:
        if not line:
            break
        at = pos % (len(line) + 1)
        if op == "flip":
            line = line[: pos % len(line)] + bytes([arg]) + line[pos % len(line) + 1 :]
        elif op == "truncate":
            line = line[:at]
        elif op == "insert":
            line = line[:at] + bytes([arg]) + line[at:]
        else:
            line = line[:at] + line[at + arg :]
    return line


@FUZZ
@given(state=states, data=st.data())
def test_decode_never_raises_on_mutated_real_lines(state, data):
    original = data.draw(st.sampled_from(REAL_LINES), label="line")
    line = mutate(original, data.draw(st.lists(mutations, min_size=1, max_size=6), label="mutations"))
    decode(make_codec(state), line)


@FUZZ
@given(state=states, data=st.data())
def test_structurally_mutated_real_objects_decode_and_are_recorded(state, data):
    """Keep the JSON valid but replace one field of a real line with junk."""
    original = json.loads(data.draw(st.sampled_from(REAL_LINES), label="line"))
    obj = original
    for _ in range(data.draw(st.integers(0, 4), label="depth")):
        containers = [k for k, v in obj.items() if isinstance(v, dict)]
        if not containers:
            break
        obj = obj[data.draw(st.sampled_from(sorted(containers)), label="descend")]
    if obj:
        obj[data.draw(st.sampled_from(sorted(obj)), label="field")] = data.draw(field_values, label="junk")
    codec = make_codec(state)
    was_loading = codec._loading
    d = decode(codec, dump(original))
    if not was_loading:
        assert d.events and d.events[0].raw is not None


@LIGHT
@given(state=states)
def test_every_real_line_unmutated_in_every_state(state):
    codec = make_codec(state)
    for line in REAL_LINES:
        decode(codec, line)


# ---------------------------------------------------------------- type confusion, exhaustively

WRONG_TYPES: list[Any] = [0, 7, -1.5, True, None, "x", "", {}, {"k": 1}, [], [1], [None]]


def _real(pred: Any) -> dict[str, Any]:
    return next(o for o in map(json.loads, REAL_LINES) if pred(o))


def _update_line(variant: str) -> dict[str, Any]:
    return _real(lambda o: ((o.get("params") or {}).get("update") or {}).get("sessionUpdate") == variant)


def _templates() -> list[tuple[str, dict[str, Any]]]:
    """One message of every shape the codec reads, in the state where it reads it."""
    init = _real(lambda o: o.get("id") == 0 and "agentCapabilities" in (o.get("result") or {}))
    init["result"]["authMethods"] = [{"id": "key", "name": "K", "type": "agent"}]
    new = _real(lambda o: "modes" in (o.get("result") or {}))
    new["result"] = {**new["result"], "id": 1, "modes": {}, "configOptions": []}
    new["id"] = 1
    ready_sid = {"sessionId": SID}
    out: list[tuple[str, dict[str, Any]]] = [
        ("initializing", init),
        ("initializing", {"jsonrpc": "2.0", "id": 0, "error": {"code": -32603, "message": "m", "data": {}}}),
        ("opening", new),
        ("opening", {"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "login"}}),
        ("authenticating", {"jsonrpc": "2.0", "id": 1, "result": {}}),
        ("loading", {"jsonrpc": "2.0", "id": 1, "result": {"sessionId": OLD}}),
        ("loading", {"jsonrpc": "2.0", "id": 1, "error": {"code": -32002, "message": "gone"}}),
        ("resuming", {"jsonrpc": "2.0", "id": 1, "result": {"sessionId": OLD}}),
        ("ready", {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn", "usage": {"totalTokens": 1}}}),
        ("ready", {"jsonrpc": "2.0", "id": 2, "error": {"code": -32603, "message": "m", "data": {"d": 1}}}),
        ("ready", _real(lambda o: o.get("method") == "session/request_permission")),
        (
            "ready",
            {
                "jsonrpc": "2.0",
                "id": 5,
                "method": "fs/read_text_file",
                "params": {**ready_sid, "path": "/w/a", "line": 1, "limit": 2},
            },
        ),
        (
            "ready",
            {
                "jsonrpc": "2.0",
                "id": 6,
                "method": "fs/write_text_file",
                "params": {**ready_sid, "path": "/w/a", "content": "x"},
            },
        ),
        ("ready", {"jsonrpc": "2.0", "id": 7, "method": "terminal/create", "params": {**ready_sid, "command": "ls"}}),
        (
            "ready",
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    **ready_sid,
                    "update": {
                        "sessionUpdate": "plan",
                        "entries": [{"content": "a", "priority": "high", "status": "pending"}],
                    },
                },
            },
        ),
        (
            "ready",
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    **ready_sid,
                    "update": {"sessionUpdate": "current_mode_update", "currentModeId": "plan", "modeId": "plan"},
                },
            },
        ),
        (
            "ready",
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    **ready_sid,
                    "update": {
                        "sessionUpdate": "agent_thought_chunk",
                        "content": {"type": "resource_link", "uri": "u", "name": "n"},
                        "messageId": "m",
                    },
                },
            },
        ),
        (
            "ready",
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    **ready_sid,
                    "update": {
                        "sessionUpdate": "tool_call_update",
                        "toolCallId": "t",
                        "status": "failed",
                        "content": [{"type": "content", "content": {"type": "text", "text": "a"}}],
                    },
                },
            },
        ),
        ("loading", _update_line("user_message_chunk")),
    ]
    for variant in (
        "agent_message_chunk",
        "tool_call",
        "tool_call_update",
        "usage_update",
        "available_commands_update",
        "user_message_chunk",
    ):
        out.append(("ready_loaded", _update_line(variant)))
    return out


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into an object (only the first element of each list)."""
    out: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list) and value:
        out.append((*prefix, 0))
        out += _paths(value[0], (*prefix, 0))
    return out


def _replaced(obj: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(obj) if isinstance(obj, dict) else list(obj)
    copy[path[0]] = _replaced(obj[path[0]], path[1:], new)
    return copy


def test_every_field_of_every_message_shape_with_every_wrong_type():
    """Deterministic complement to the random properties: each field the agent can send,
    replaced in turn by a value of each JSON type (a list where an object belongs, a number
    where a list belongs, ...), decoded in the state that reads it."""
    count = 0
    for state, template in _templates():
        for path in [(), *_paths(template)]:
            if path[:1] == ("jsonrpc",) or len(path) > 6:
                continue
            for wrong in WRONG_TYPES:
                decode(make_codec(state), dump(_replaced(template, path, wrong)))
                count += 1
    assert count > 2000


# ---------------------------------------------------------------- client operations interleaved

client_ops = st.one_of(
    st.tuples(
        st.just("prompt"),
        st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.sampled_from(["text", "image", "document", "other"]),
                    "text": nasty_text,
                    "source": field_values,
                }
            ),
            max_size=3,
        ),
    ),
    st.tuples(st.just("interrupt"), st.none()),
    st.tuples(
        st.just("answer"),
        st.tuples(
            st.sampled_from(["allow", "deny", "cancel", "bogus"]),
            st.integers(0, 3),
            st.none() | nasty_text,
            st.none()
            | st.lists(
                field_values.filter(lambda v: isinstance(v, dict))
                | st.fixed_dictionaries(
                    {
                        "optionId": json_scalars,
                        "kind": st.sampled_from(["allow_once", "allow_always", "reject_once", "reject_always"]),
                    }
                ),
                max_size=4,
            ),
        ),
    ),
    st.tuples(st.just("line"), rpc_objects),
    st.tuples(st.just("permission"), ids),
    # a raw-mode client's own request, forwarded under one of the codec's ids
    st.tuples(
        st.just("forward"),
        st.fixed_dictionaries(
            {"jsonrpc": st.just("2.0"), "method": st.sampled_from(["session/set_mode", "session/list", "_x"])},
            optional={"id": ids, "params": junk},
        ),
    ),
)


@FUZZ
@given(state=states, ops=st.lists(client_ops, min_size=1, max_size=15))
def test_interleaved_client_operations_write_only_valid_json_rpc(state, ops):
    codec = make_codec(state)
    request_ids: list[int] = []
    forwarded: dict[int, Any] = {}  # codec id → the raw client's id
    for op, arg in ops:
        if op == "prompt":
            if not codec.ready:
                continue
            obj = check_wire(codec.encode_prompt(arg))
            assert obj["method"] == "session/prompt" and obj["params"]["sessionId"] == codec.session_id
            assert all(b["type"] in ("text", "image", "resource") for b in obj["params"]["prompt"])
            request_ids.append(obj["id"])
        elif op == "interrupt":
            pending = codec.pending_permissions()
            lines = codec.interrupt() or []
            objs = [check_wire(x) for x in lines]
            if codec.session_id is None:  # no session to cancel: nothing is written
                assert objs == [] and codec.pending_permissions() == pending
                continue
            else:
                assert objs[0]["method"] == "session/cancel" and "id" not in objs[0]
                assert [o["result"] for o in objs[1:]] == [{"outcome": {"outcome": "cancelled"}}] * len(pending)
            assert codec.pending_permissions() == []
        elif op == "answer":
            decision, index, option_id, options = arg
            pending = codec.pending_permissions()
            target = pending[index % len(pending)] if pending else "none"
            line = codec.answer_permission(target, decision, option_id=option_id, options=options)
            if not pending:
                assert line is None
            else:
                assert line is not None
                outcome = check_wire(line)["result"]["outcome"]
                assert outcome["outcome"] in ("selected", "cancelled")
                assert target not in codec.pending_permissions()
                assert codec.answer_permission(target, decision, options=options) is None
        elif op == "forward":
            line = codec.forward_raw(arg, "client-1")
            assert "\n" not in line and "\r" not in line
            obj = strict_loads(line)
            if "id" not in arg:  # a notification goes out unchanged
                assert obj == strict_loads(json.dumps(arg))
                continue
            assert isinstance(obj["id"], int) and obj["method"] == arg["method"]
            request_ids.append(obj["id"])
            forwarded[obj["id"]] = arg.get("id")
        elif op == "permission":
            decode(
                codec,
                dump(
                    {
                        "jsonrpc": "2.0",
                        "id": arg,
                        "method": "session/request_permission",
                        "params": {"sessionId": codec.session_id or SID, "options": []},
                    }
                ),
            )
        else:
            d = decode(codec, dump(arg))
            for route, routed in d.routed:
                assert route == "client-1"
                assert "\n" not in routed and "\r" not in routed
                back = strict_loads(routed)
                assert back["id"] == json.loads(json.dumps(forwarded.pop(arg["id"])))
                assert {k: v for k, v in back.items() if k != "id"} == {k: v for k, v in arg.items() if k != "id"}
            request_ids += [o["id"] for o in map(check_wire, d.replies) if "method" in o and "id" in o]
    assert len(request_ids) == len(set(request_ids)), "the codec reused one of its own request ids"


@FUZZ
@given(text=nasty_text, rid=st.integers() | nasty_text)
def test_encoders_write_one_line_of_json(text, rid):
    codec = make_codec("ready")
    obj = check_wire(codec.encode_prompt([{"type": "text", "text": text}]))
    assert obj["params"]["prompt"][0]["text"] == json.loads(json.dumps(text))
    assert check_wire(codec.encode_result(rid, {"content": text}))["id"] == json.loads(json.dumps(rid))
    err = check_wire(codec.encode_error(rid, -32002, text, {"path": text}))
    assert err["error"]["message"] == json.loads(json.dumps(text))
