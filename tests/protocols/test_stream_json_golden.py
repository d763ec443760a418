"""stream-json decoding against real Claude Code 2.1.197 transcripts (docs/api.md §7.1,
§6.3).

Golden files live in ``tests/protocols/golden/<scenario>.json``, one per transcript. To
rewrite them after an intended mapping change::

    REGENERATE_GOLDEN=1 .venv/bin/python -m pytest tests/protocols/test_stream_json_golden.py

then read the diff: a golden file is only as good as the review it got.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from support import REDACTED, expected_redaction, is_secret_key

from bridge.protocols.awp_jsonl import AwpJsonlCodec
from bridge.protocols.codec import Decoded
from bridge.protocols.events import KINDS
from bridge.protocols.jsonline import dumps
from bridge.protocols.stream_json import LAUNCH_FLAGS, StreamJsonCodec, redact_secrets

HERE = Path(__file__).resolve().parent
GOLDEN_DIR = HERE / "golden"
# Real Claude Code transcripts ship in tests/fixtures/transcripts.
TRANSCRIPTS = Path(
    os.environ.get(
        "AGENT_BRIDGE_TRANSCRIPTS",
        HERE.parent / "fixtures" / "transcripts" / "claude-code-2.1.197",
    )
)
REGENERATE = os.environ.get("REGENERATE_GOLDEN") == "1"


def scalars(value: Any, *, secret: bool, inside: bool = False) -> list[Any]:
    """The non-null scalars under a secret key (``secret=True``) or outside any."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in scalars(v, secret=secret, inside=inside or is_secret_key(k))]
    if isinstance(value, list):
        return [s for v in value for s in scalars(v, secret=secret, inside=inside)]
    return [value] if value is not None and inside == secret else []


def expected_raw(line: str) -> str:
    """What an event may carry as ``raw`` for this agent line: the line itself, except a
    control_response carrying secrets, which is re-serialised with them redacted."""
    obj = json.loads(line)
    if obj.get("type") != "control_response":
        return line
    redacted = expected_redaction(obj)
    return line if redacted == obj else dumps(redacted)


def assert_no_secret_leaks(original: dict[str, Any], raw: str) -> None:
    assert REDACTED in raw
    public = {s for s in scalars(original, secret=False) if isinstance(s, str)}
    for value in scalars(original, secret=True):
        if isinstance(value, str) and value != REDACTED and value not in public:
            assert json.dumps(value, ensure_ascii=False) not in raw, value
            assert json.dumps(value) not in raw, value


def require_transcripts() -> None:
    if not TRANSCRIPTS.is_dir():
        raise AssertionError(f"real transcripts not found at {TRANSCRIPTS}")


def transcript_files() -> list[Path]:
    return sorted(TRANSCRIPTS.glob("*.transcript.jsonl")) if TRANSCRIPTS.is_dir() else []


def scenario_of(path: Path) -> str:
    return path.name.removesuffix(".transcript.jsonl")


def agent_lines(path: Path) -> list[str]:
    """The exact stdout lines (``dir == "<"``) of a transcript, in order."""
    require_transcripts()
    out: list[str] = []
    for record_text in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(record_text)
        if record.get("dir") == "<":
            out.append(record["line"])
    return out


def all_agent_lines() -> list[tuple[str, int, str]]:
    return [(scenario_of(p), i, line) for p in transcript_files() for i, line in enumerate(agent_lines(p))]


def decode_all(lines: list[str]) -> list[Decoded]:
    codec = StreamJsonCodec()
    return [codec.decode(line.encode("utf-8")) for line in lines]


def find_line(pred) -> tuple[str, str]:
    require_transcripts()
    for scenario, _, line in all_agent_lines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and pred(obj):
            return scenario, line
    raise AssertionError("no transcript line matches")


def decode_one(line: str) -> Decoded:
    return StreamJsonCodec().decode(line.encode("utf-8"))


# ---------------------------------------------------------------- golden summary


def _short(value: Any, limit: int = 160) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"…(+{len(value) - limit})"
    if isinstance(value, list):
        return [_short(v, limit) for v in value]
    if isinstance(value, dict):
        return {k: _short(v, limit) for k, v in value.items()}
    return value


def select(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """The event data worth pinning, with bulky fields reduced to what a reviewer checks."""
    out: dict[str, Any] = {}
    for key, value in sorted(data.items()):
        if key == "tools" and isinstance(value, list):
            out["tools#"] = len(value)
            out["tools_has_Bash"] = "Bash" in value
        elif key == "usage" and isinstance(value, dict):
            out[key] = {k: value.get(k) for k in ("input_tokens", "output_tokens")}
        elif key == "suggestions" and isinstance(value, list):
            out[key] = [s.get("type") if isinstance(s, dict) else s for s in value]
        else:
            out[key] = _short(value)
    return out


def line_label(line: str) -> str:
    obj = json.loads(line)
    parts = [str(obj.get("type"))]
    for sub in (obj.get("subtype"), (obj.get("request") or {}).get("subtype"), (obj.get("event") or {}).get("type")):
        if isinstance(sub, str):
            parts.append(sub)
    if obj.get("isReplay"):
        parts.append("replay")
    return "/".join(parts)


def summarize(lines: list[str]) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    replies: list[dict[str, Any]] = []
    for n, (line, decoded) in enumerate(zip(lines, decode_all(lines), strict=True)):
        for ev in decoded.events:
            events.append(
                {
                    "line": n,
                    "in": line_label(line),
                    "kind": ev.kind,
                    "relay": ev.relay,
                    "data": select(ev.kind, ev.data),
                }
            )
        for reply in decoded.replies:
            replies.append({"line": n, "reply": json.loads(reply)})
    return {"events": events, "replies": replies}


def render_golden(summary: dict[str, Any]) -> str:
    """JSON with one event per line, so a diff shows exactly which mapping moved."""
    parts = []
    for key, items in summary.items():
        rows = ",\n".join("  " + json.dumps(item, ensure_ascii=False) for item in items)
        parts.append(f' "{key}": [\n{rows}\n ]' if items else f' "{key}": []')
    return "{\n" + ",\n".join(parts) + "\n}\n"


@pytest.mark.parametrize("path", transcript_files(), ids=scenario_of)
def test_transcript_matches_golden(path):
    got = summarize(agent_lines(path))
    golden = GOLDEN_DIR / f"{scenario_of(path)}.json"
    if REGENERATE:
        GOLDEN_DIR.mkdir(exist_ok=True)
        golden.write_text(render_golden(got), encoding="utf-8")
    assert golden.exists(), f"missing {golden}; run with REGENERATE_GOLDEN=1 and review it"
    assert got == json.loads(golden.read_text(encoding="utf-8"))


def test_every_transcript_has_a_golden_and_no_golden_is_stale():
    require_transcripts()
    scenarios = {scenario_of(p) for p in transcript_files()}
    goldens = {p.stem for p in GOLDEN_DIR.glob("*.json")}
    assert scenarios, "no transcripts found"
    assert goldens == scenarios


# ---------------------------------------------------------------- whole-transcript invariants


@pytest.mark.parametrize("path", transcript_files(), ids=scenario_of)
def test_every_line_relays_exactly_once_with_its_exact_text(path):
    # The exact text, except a control_response that carried secrets (issue #5 item 5): that
    # one relays as its redacted JSON, and no secret value survives in it.
    lines = agent_lines(path)
    assert lines
    for line, decoded in zip(lines, decode_all(lines), strict=True):
        obj = json.loads(line)
        assert isinstance(obj, dict)
        assert decoded.events, line[:120]
        relayed = [e for e in decoded.events if e.relay]
        assert len(relayed) == 1
        assert relayed[0] is decoded.events[0]
        raw = expected_raw(line)
        if raw != line:
            assert obj["type"] == "control_response"
            assert "\n" not in raw
            assert json.loads(raw) == expected_redaction(obj)
            assert_no_secret_leaks(obj, raw)
        for ev in decoded.events:
            assert ev.source == "agent"
            assert ev.kind in KINDS
            assert ev.raw == raw
            json.dumps(ev.data)  # data is plain JSON


def test_redacted_transcript_lines_are_exactly_the_control_responses_with_secrets():
    require_transcripts()
    redacted: set[tuple[str, str]] = set()
    for scenario, _, line in all_agent_lines():
        [first, *_] = decode_one(line).events
        if first.raw != line:
            obj = json.loads(line)
            assert obj["type"] == "control_response"
            assert first.raw == dumps(expected_redaction(obj))
            redacted.add((scenario, obj["response"]["request_id"]))
    # Every initialize response (it carries "account"), and nothing that is not a
    # control_response. (full's req_6, get_context_usage, is also rewritten today: see
    # test_context_usage_token_counts_are_not_secrets.)
    assert {("cancelperm", "req_1"), ("deny", "req_1"), ("full", "req_1")} <= redacted
    assert redacted <= {("cancelperm", "req_1"), ("deny", "req_1"), ("full", "req_1"), ("full", "req_6")}


def test_exactly_one_turn_end_per_result_line_and_nowhere_else():
    require_transcripts()
    for path in transcript_files():
        lines = agent_lines(path)
        for line, decoded in zip(lines, decode_all(lines), strict=True):
            ends = [e for e in decoded.events if e.kind == "turn.ended"]
            assert len(ends) == (1 if json.loads(line)["type"] == "result" else 0), line[:120]


def test_transcripts_only_produce_replies_for_cli_requests_the_user_does_not_answer():
    require_transcripts()
    seen = 0
    for path in transcript_files():
        lines = agent_lines(path)
        for line, decoded in zip(lines, decode_all(lines), strict=True):
            obj = json.loads(line)
            answered_by_codec = obj["type"] == "control_request" and obj["request"]["subtype"] != "can_use_tool"
            assert len(decoded.replies) == (1 if answered_by_codec else 0), line[:120]
            seen += answered_by_codec
    assert seen >= 1


# ---------------------------------------------------------------- explicit mappings


def test_system_init_becomes_session_started_with_the_native_session_id():
    _, line = find_line(lambda o: o.get("subtype") == "init")
    obj = json.loads(line)
    [ev] = decode_one(line).events
    assert ev.kind == "session.started"
    assert ev.data["native_session_id"] == obj["session_id"]
    assert ev.data["model"] == obj["model"]
    assert ev.data["tools"] == obj["tools"]


def test_session_id_flag_is_what_init_reports():
    path = TRANSCRIPTS / "sessid.transcript.jsonl"
    started = [e for d in decode_all(agent_lines(path)) for e in d.events if e.kind == "session.started"]
    assert [e.data["native_session_id"] for e in started] == ["22222222-2222-4222-8222-222222222222"]


def test_resume_keeps_and_fork_changes_the_session_id():
    def ids(name: str) -> set[str]:
        lines = agent_lines(TRANSCRIPTS / f"{name}.transcript.jsonl")
        return {e.data["native_session_id"] for d in decode_all(lines) for e in d.events if e.kind == "session.started"}

    assert ids("resume") == {"c8aaeb44-0c48-4a75-9150-f93a46012192"}
    assert ids("fork") and ids("fork") != ids("resume")


def test_result_success_becomes_turn_ended_success():
    _, line = find_line(
        lambda o: o.get("type") == "result" and o.get("subtype") == "success" and o.get("is_error") is False
    )
    obj = json.loads(line)
    [ev] = decode_one(line).events
    assert ev.kind == "turn.ended"
    assert ev.data["status"] == "success"
    assert ev.data["stop_reason"] == obj["stop_reason"] == "end_turn"
    # The CLI's usage as it gave it, with the turn's cost (the first turn of a process: all of it).
    usd = {"amount": obj["total_cost_usd"], "currency": "USD"}
    assert ev.data["usage"] == {**obj["usage"], "cost": usd, "session_cost": usd}
    assert ev.data["native_session_id"] == obj["session_id"]
    assert "error" not in ev.data


def test_each_turn_end_costs_what_the_process_total_grew_by():
    # Claude Code's total_cost_usd is the process's running total (0.00055, 0.00165, 0.00165,
    # 0.0022 in this recording): each turn.ended costs its own share, and the shares add up.
    lines = agent_lines(TRANSCRIPTS / "full.transcript.jsonl")
    ends = [e for d in decode_all(lines) for e in d.events if e.kind == "turn.ended"]
    assert [e.data["usage"]["cost"]["amount"] for e in ends] == [0.00055, 0.0011, 0.0, 0.00055]
    assert [e.data["usage"]["session_cost"]["amount"] for e in ends] == [0.00055, 0.00165, 0.00165, 0.0022]
    assert {e.data["usage"]["cost"]["currency"] for e in ends} == {"USD"}


def test_success_subtype_with_is_error_is_an_error_turn_end():
    # Claude Code writes subtype success + is_error true when the turn ended on an API error.
    for scenario in ("errors", "err529"):
        lines = agent_lines(TRANSCRIPTS / f"{scenario}.transcript.jsonl")
        results = [
            (json.loads(line), d)
            for line, d in zip(lines, decode_all(lines), strict=True)
            if json.loads(line)["type"] == "result"
        ]
        assert results
        for obj, decoded in results:
            assert obj["subtype"] == "success" and obj["is_error"] is True
            [ev] = decoded.events
            assert ev.data["status"] == "error"
            assert ev.data["error"] == obj["result"]


def test_synthetic_assistant_message_carries_the_api_error():
    _, line = find_line(lambda o: o.get("type") == "assistant" and o["message"].get("model") == "<synthetic>")
    obj = json.loads(line)
    [ev] = decode_one(line).events
    assert ev.kind == "message"
    assert ev.data["text"].startswith("API Error:")
    assert ev.data["error"] == obj["error"]


@pytest.mark.parametrize("reason", ["aborted_streaming", "aborted_tools"])
def test_interrupted_turn_is_cancelled(reason):
    _, line = find_line(
        lambda o: (
            o.get("type") == "result"
            and o.get("subtype") == "error_during_execution"
            and o.get("terminal_reason") == reason
        )
    )
    diag, ev = decode_one(line).events
    assert ev.kind == "turn.ended"
    assert ev.data["status"] == "cancelled"
    assert ev.data["terminal_reason"] == reason
    # It reads as what happened; Claude Code's internal account is a diagnostic, and raw.
    assert ev.data["reason"] == "interrupted" and "error" not in ev.data
    assert "ede_diagnostic" not in json.dumps(ev.data)
    assert (diag.kind, diag.data["stream"], diag.raw) == ("diagnostic", "protocol", line)
    assert diag.data["text"].startswith("[ede_diagnostic] ") and diag.data["text"] in line


def test_error_during_execution_without_an_abort_reason_is_an_error():
    _, line = find_line(lambda o: o.get("type") == "result" and o.get("subtype") == "error_during_execution")
    obj = json.loads(line)
    obj["terminal_reason"] = "model_error"
    diag, ev = StreamJsonCodec().decode(json.dumps(obj).encode()).events
    assert ev.data["status"] == "error"
    # The CLI's internal diagnostic is not the error users read: that says what failed.
    assert ev.data["error"] == "the turn failed during execution"
    assert diag.kind == "diagnostic" and diag.data["text"].startswith("[ede_diagnostic] ")
    del obj["terminal_reason"]
    _, ev = StreamJsonCodec().decode(json.dumps(obj).encode()).events
    assert ev.data["status"] == "error"


def test_error_max_turns_is_an_error_with_the_cli_message():
    _, line = find_line(lambda o: o.get("subtype") == "error_max_turns")
    [ev] = decode_one(line).events
    assert ev.kind == "turn.ended"
    assert ev.data["status"] == "error"
    assert ev.data["subtype"] == "error_max_turns"
    assert ev.data["error"] == "Reached maximum number of turns (1)"
    assert ev.data["terminal_reason"] == "max_turns"


def test_can_use_tool_becomes_permission_requested_without_a_reply():
    _, line = find_line(lambda o: o.get("type") == "control_request" and o["request"].get("subtype") == "can_use_tool")
    obj = json.loads(line)
    decoded = decode_one(line)
    [ev] = decoded.events
    assert decoded.replies == []  # the user answers this one, not the codec
    assert ev.kind == "permission.requested"
    assert ev.data["request_id"] == obj["request_id"]
    assert ev.data["tool"] == obj["request"]["tool_name"] == "Bash"
    assert ev.data["input"] == obj["request"]["input"]
    assert ev.data["options"] == []
    assert ev.data["tool_call_id"] == obj["request"]["tool_use_id"]


def answered_with_default(sub: str, default: dict[str, Any]) -> dict[str, Any]:
    return {
        "stream": "protocol",
        "control": sub,
        "text": f"answered control request {sub!r} with the default {dumps(default)}",
    }


def answered_with_error(sub: str) -> dict[str, Any]:
    return {
        "stream": "protocol",
        "control": sub,
        "text": f"answered control request {sub!r} with an error: not supported by the bridge",
    }


def assert_one_success_reply(decoded: Decoded, request_id: str, response: dict[str, Any]) -> None:
    [reply_line] = decoded.replies
    assert "\n" not in reply_line
    assert json.loads(reply_line) == {
        "type": "control_response",
        "response": {"subtype": "success", "request_id": request_id, "response": response},
    }


def test_hook_callback_gets_a_success_reply_with_an_empty_response():
    scenario, line = find_line(
        lambda o: o.get("type") == "control_request" and o["request"].get("subtype") == "hook_callback"
    )
    assert scenario == "deny"  # the only transcript whose host registered a hook
    obj = json.loads(line)
    decoded = decode_one(line)
    [ev] = decoded.events
    assert (ev.kind, ev.relay, ev.raw) == ("diagnostic", True, line)
    assert ev.data == answered_with_default("hook_callback", {})
    # {} = "no opinion": the hook lets the agent go on (docs/api.md §7.1).
    assert_one_success_reply(decoded, obj["request_id"], {})


def test_elicitation_is_a_request_for_clients():
    # Claude Code's elicitation control request (an MCP server asks the user): the same
    # event an ACP agent's elicitation/create makes; the conversation asks or declines.
    line = json.dumps(
        {
            "type": "control_request",
            "request_id": "el-1",
            "request": {
                "subtype": "elicitation",
                "mcp_server_name": "gh",
                "message": "Which repo?",
                "requested_schema": {"type": "object", "properties": {"repo": {"type": "string"}}},
            },
        }
    )
    decoded = decode_one(line)
    [ev] = decoded.events
    assert (ev.kind, ev.relay, ev.raw) == ("elicitation.requested", True, line)
    assert ev.data == {
        "request_id": "el-1",
        "mode": "form",
        "message": "Which repo?",
        "scope": "session",
        "server": "gh",
        "requested_schema": {"type": "object", "properties": {"repo": {"type": "string"}}, "required": []},
    }
    assert decoded.replies == []
    answer = StreamJsonCodec().answer_elicitation("el-1", "accept", {"repo": "a/b"})
    assert json.loads(answer or "") == {
        "type": "control_response",
        "response": {
            "subtype": "success",
            "request_id": "el-1",
            "response": {"action": "accept", "content": {"repo": "a/b"}},
        },
    }


def test_an_elicitation_the_bridge_cannot_show_is_declined_at_once():
    line = json.dumps(
        {
            "type": "control_request",
            "request_id": "el-2",
            "request": {
                "subtype": "elicitation",
                "message": "Nested?",
                "requested_schema": {"type": "object", "properties": {"x": {"type": "object"}}},
            },
        }
    )
    decoded = decode_one(line)
    [ev] = decoded.events
    assert (ev.kind, ev.data["control"]) == ("diagnostic", "elicitation")
    assert_one_success_reply(decoded, "el-2", {"action": "decline"})


@pytest.mark.parametrize("inner_id", [7, 0, "call-3", None], ids=repr)
def test_mcp_message_request_is_answered_with_a_json_rpc_method_not_found(inner_id):
    # The bridge hosts no SDK MCP server: the JSON-RPC request inside gets -32601, same id.
    line = json.dumps(
        {
            "type": "control_request",
            "request_id": "mcp-1",
            "request": {
                "subtype": "mcp_message",
                "server_name": "sdk-tools",
                "message": {"jsonrpc": "2.0", "id": inner_id, "method": "tools/list", "params": {}},
            },
        }
    )
    decoded = decode_one(line)
    expected = {
        "mcp_response": {
            "jsonrpc": "2.0",
            "id": inner_id,
            "error": {"code": -32601, "message": "no MCP server 'sdk-tools' in this host"},
        }
    }
    assert_one_success_reply(decoded, "mcp-1", expected)
    [ev] = decoded.events
    assert (ev.kind, ev.relay, ev.raw) == ("diagnostic", True, line)
    assert ev.data == answered_with_default("mcp_message", expected)


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {},
        None,
        "not an object",
    ],
    ids=["notification", "empty", "null", "string"],
)
def test_mcp_message_without_an_inner_id_gets_an_empty_result(message):
    request: dict[str, Any] = {"subtype": "mcp_message", "server_name": "sdk-tools"}
    if message is not None:
        request["message"] = message
    line = json.dumps({"type": "control_request", "request_id": "mcp-2", "request": request})
    decoded = decode_one(line)
    expected = {"mcp_response": {"jsonrpc": "2.0", "result": {}}}
    assert_one_success_reply(decoded, "mcp-2", expected)
    [ev] = decoded.events
    assert (ev.kind, ev.relay, ev.raw) == ("diagnostic", True, line)
    assert ev.data == answered_with_default("mcp_message", expected)


@pytest.mark.parametrize(
    "request_body",
    [
        {"subtype": "bogus_subtype"},
        {"subtype": "request_user_dialog", "dialog": "x"},
        {"subtype": ""},
        {},
        {"subtype": 42},
    ],
    ids=["bogus", "request_user_dialog", "empty", "missing", "not-a-string"],
)
def test_other_cli_requests_are_answered_with_an_error(request_body):
    sub = request_body.get("subtype")
    sub = sub if isinstance(sub, str) else ""
    line = json.dumps({"type": "control_request", "request_id": "r-42", "request": request_body})
    decoded = decode_one(line)
    [reply] = [json.loads(r) for r in decoded.replies]
    assert reply == {
        "type": "control_response",
        "response": {"subtype": "error", "request_id": "r-42", "error": f"Unsupported control request subtype: {sub}"},
    }
    [ev] = decoded.events
    assert (ev.kind, ev.relay, ev.raw) == ("diagnostic", True, line)
    assert ev.data == answered_with_error(sub)


@pytest.mark.parametrize("sub", ["hook_callback", "elicitation", "mcp_message", "can_use_tool", "bogus"])
@pytest.mark.parametrize("request_id", ["missing", None, 42], ids=repr)
def test_control_request_without_a_request_id_gets_no_reply(sub, request_id):
    obj: dict[str, Any] = {"type": "control_request", "request": {"subtype": sub}}
    if request_id != "missing":
        obj["request_id"] = request_id
    line = json.dumps(obj)
    decoded = decode_one(line)
    assert decoded.replies == []  # nothing to answer to
    [ev] = decoded.events
    assert (ev.kind, ev.relay, ev.raw) == ("diagnostic", True, line)
    assert ev.data["stream"] == "protocol"
    assert ev.data["text"] == f"control request {sub!r} without a request_id"
    assert set(ev.data) <= {"stream", "text", "control"}


def test_awp_control_requests_get_no_reply():
    # awp-jsonl has no control protocol: never write back a line it does not define.
    for sub in ("hook_callback", "elicitation", "mcp_message", "can_use_tool", "bogus"):
        line = json.dumps({"type": "control_request", "request_id": "r1", "request": {"subtype": sub}})
        decoded = AwpJsonlCodec().decode(line.encode())
        assert decoded.replies == []
        [ev] = decoded.events
        assert (ev.kind, ev.data, ev.relay, ev.raw) == ("agent.other", {}, True, line)


def test_text_delta_becomes_message_delta():
    _, line = find_line(
        lambda o: (
            o.get("type") == "stream_event"
            and o["event"].get("type") == "content_block_delta"
            and o["event"]["delta"].get("type") == "text_delta"
        )
    )
    obj = json.loads(line)
    [ev] = decode_one(line).events
    assert ev.kind == "message.delta"
    assert ev.data == {"text": obj["event"]["delta"]["text"], "channel": "text"}


def test_thinking_delta_is_a_thought_channel_delta():
    line = json.dumps(
        {
            "type": "stream_event",
            "event": {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "hmm"},
            },
        }
    )
    [ev] = decode_one(line).events
    assert (ev.kind, ev.data) == ("message.delta", {"text": "hmm", "channel": "thought"})


@pytest.mark.parametrize(
    "event", ["message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop"]
)
def test_other_stream_events_are_the_messages_structure(event):
    _, line = find_line(lambda o: o.get("type") == "stream_event" and o["event"].get("type") == event)
    [ev] = decode_one(line).events
    assert (ev.kind, ev.data["event"], ev.relay, ev.raw) == ("message.stream", event, True, line)


def test_top_level_awp_events_are_not_stream_json():
    # stream-json wraps raw events in stream_event; a bare message_stop is not a turn end.
    for line in (
        '{"type":"message_stop"}',
        '{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}',
        '{"type":"content_block_start","content_block":{"type":"tool_use","id":"t"}}',
    ):
        assert [e.kind for e in decode_one(line).events] == ["agent.other"]


def test_assistant_tool_use_becomes_tool_call():
    _, line = find_line(lambda o: o.get("type") == "assistant" and o["message"]["content"][0].get("type") == "tool_use")
    block = json.loads(line)["message"]["content"][0]
    [ev] = decode_one(line).events
    assert ev.kind == "tool.call"
    assert ev.data["tool_call_id"] == block["id"]
    assert ev.data["name"] == block["name"]
    assert ev.data["input"] == block["input"]


def test_assistant_text_becomes_message():
    _, line = find_line(
        lambda o: (
            o.get("type") == "assistant"
            and o["message"]["content"][0].get("type") == "text"
            and o["message"].get("model") != "<synthetic>"
        )
    )
    msg = json.loads(line)["message"]
    [ev] = decode_one(line).events
    assert ev.kind == "message"
    assert ev.data == {"role": "assistant", "text": msg["content"][0]["text"], "message_id": msg["id"]}


def test_assistant_line_with_several_blocks_yields_one_event_each_and_relays_once():
    line = json.dumps(
        {
            "type": "assistant",
            "message": {
                "id": "m1",
                "content": [
                    {"type": "thinking", "thinking": "plan", "signature": "s"},
                    {"type": "text", "text": "doing it"},
                    {"type": "tool_use", "id": "tu1", "name": "Read", "input": {"file_path": "/x"}},
                ],
            },
            "parent_tool_use_id": "tu0",
        }
    )
    events = decode_one(line).events
    assert [e.kind for e in events] == ["message", "message", "tool.call"]
    assert events[0].data["channel"] == "thought"
    assert [e.relay for e in events] == [True, False, False]
    assert all(e.raw == line for e in events)
    assert events[2].data["parent_tool_use_id"] == "tu0"


@pytest.mark.parametrize("is_error", [False, True])
def test_tool_result_becomes_tool_result(is_error):
    _, line = find_line(
        lambda o: (
            o.get("type") == "user"
            and not o.get("isReplay")
            and isinstance(o["message"]["content"], list)
            and o["message"]["content"][0].get("type") == "tool_result"
            and o["message"]["content"][0].get("is_error") is is_error
        )
    )
    block = json.loads(line)["message"]["content"][0]
    [ev] = decode_one(line).events
    assert ev.kind == "tool.result"
    assert ev.data == {"tool_call_id": block["tool_use_id"], "output": block["content"], "is_error": is_error}


def test_replayed_user_lines_are_user_messages_from_the_agent():
    _, line = find_line(lambda o: o.get("type") == "user" and o.get("isReplay") is True)
    [ev] = decode_one(line).events
    assert ev.kind == "message" and ev.source == "agent" and ev.relay and ev.raw == line
    text = json.loads(line)["message"]["content"]
    text = text if isinstance(text, str) else "".join(b["text"] for b in text if b.get("type") == "text")
    assert ev.data == {"role": "user", "text": text, "origin": "replay"}


def test_replayed_tool_result_is_still_agent_other():
    line = json.dumps(
        {
            "type": "user",
            "isReplay": True,
            "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]},
        }
    )
    assert [e.kind for e in decode_one(line).events] == ["agent.other"]


def test_interrupt_marker_user_line_is_a_user_message_with_its_origin():
    _, line = find_line(
        lambda o: o.get("type") == "user" and "[Request interrupted by user" in json.dumps(o["message"])
    )
    [ev] = decode_one(line).events
    assert (ev.kind, ev.data["role"], ev.data["origin"]) == ("message", "user", "interrupt")


@pytest.mark.parametrize("phase", ["started", "response"])
def test_hook_lines_become_hook_events(phase):
    _, line = find_line(lambda o: o.get("subtype") == f"hook_{phase}")
    obj = json.loads(line)
    [ev] = decode_one(line).events
    assert ev.kind == "hook"
    assert ev.data["phase"] == phase
    assert ev.data["hook_event"] == obj["hook_event"] == "UserPromptSubmit"
    assert ev.data["hook_name"] == obj["hook_name"]
    if phase == "response":
        assert ev.data["outcome"] == "success"
    else:
        assert "outcome" not in ev.data


def test_session_state_changed_becomes_agent_status_state():
    path = TRANSCRIPTS / "cancelperm.transcript.jsonl"
    lines = agent_lines(path)
    states = [
        e.data
        for line, d in zip(lines, decode_all(lines), strict=True)
        for e in d.events
        if json.loads(line).get("subtype") == "session_state_changed"
    ]
    assert states == [
        {"event": "session_state_changed", "state": s}
        for s in ("running", "requires_action", "running", "idle", "running", "idle")
    ]
    assert all(e.kind == "agent.status" for d in decode_all(lines) for e in d.events if "state" in e.data)


def test_system_status_becomes_agent_status_status():
    _, line = find_line(lambda o: o.get("subtype") == "status" and o.get("status") == "requesting")
    [ev] = decode_one(line).events
    assert (ev.kind, ev.data) == ("agent.status", {"event": "status", "status": "requesting"})


def test_api_retry_is_the_agent_retrying():
    _, line = find_line(lambda o: line_label(json.dumps(o)).startswith("system/api_retry"))
    [ev] = decode_one(line).events
    assert (ev.kind, ev.relay, ev.raw) == ("agent.status", True, line)
    assert ev.data == {
        "event": "api_retry",
        "status": "retrying",
        "attempt": 1,
        "max_retries": 1,
        "retry_delay_ms": json.loads(line)["retry_delay_ms"],
        "error_status": 529,
        "error": "overloaded",
    }


@pytest.mark.parametrize(
    ("scenario", "request_id", "subtype"),
    [
        ("cancelperm", "req_2", "success"),  # an interrupt ack: no response body
        ("full", "req_2", "success"),  # set_permission_mode: {"mode": ...}
        ("full", "req_7", "error"),  # the CLI refused a request
    ],
)
def test_agent_control_responses_are_agent_replies_with_their_subtype_and_id(scenario, request_id, subtype):
    [line] = [
        line
        for line in agent_lines(TRANSCRIPTS / f"{scenario}.transcript.jsonl")
        if json.loads(line)["type"] == "control_response" and json.loads(line)["response"]["request_id"] == request_id
    ]
    decoded = decode_one(line)
    assert decoded.replies == []
    [ev] = decoded.events
    assert (ev.kind, ev.relay, ev.raw) == ("agent.reply", True, line)  # no secrets: exact text
    assert ev.data["request_id"] == request_id and ev.data["subtype"] == subtype
    assert ("error" in ev.data) == (subtype == "error")


@pytest.mark.parametrize(
    "line",
    [
        '{"type":"control_response"}',
        '{"type":"control_response","response":"ok"}',
        '{"type":"control_response","response":{"subtype":1,"request_id":["x"]}}',
    ],
)
def test_malformed_control_responses_are_agent_replies_with_nulls(line):
    for codec in (StreamJsonCodec(), AwpJsonlCodec()):
        [ev] = codec.decode(line.encode()).events
        assert (ev.kind, ev.relay, ev.raw) == ("agent.reply", True, line)
        assert ev.data == {"request_id": None, "subtype": None}


def test_an_answer_to_the_bridges_own_request_names_it():
    codec = StreamJsonCodec()
    rid = json.loads(codec.encode_interrupt() or "")["request_id"]
    [ev] = codec.decode(
        dumps({"type": "control_response", "response": {"subtype": "success", "request_id": rid}}).encode()
    ).events
    assert ev.data == {"request_id": rid, "subtype": "success", "op": "interrupt"}


def test_control_cancel_request_resolves_the_permission_as_cancelled_by_the_agent():
    _, line = find_line(lambda o: o.get("type") == "control_cancel_request")
    obj = json.loads(line)
    decoded = decode_one(line)
    assert decoded.replies == []  # the agent withdrew it: nothing to write back (docs/api.md §6.4)
    [ev] = decoded.events
    assert (ev.kind, ev.relay, ev.raw) == ("permission.resolved", True, line)
    assert ev.data == {"request_id": obj["request_id"], "decision": "cancelled", "by": "agent"}


def test_control_cancel_request_without_a_string_id_still_resolves_with_a_null_id():
    for line in ('{"type":"control_cancel_request"}', '{"type":"control_cancel_request","request_id":7}'):
        [ev] = decode_one(line).events
        assert (ev.kind, ev.relay, ev.raw) == ("permission.resolved", True, line)
        assert ev.data == {"request_id": None, "decision": "cancelled", "by": "agent"}


def test_awp_control_cancel_request_is_agent_other():
    # awp-jsonl defines no control protocol and no permission prompts.
    _, line = find_line(lambda o: o.get("type") == "control_cancel_request")
    decoded = AwpJsonlCodec().decode(line.encode())
    assert decoded.replies == []
    [ev] = decoded.events
    assert (ev.kind, ev.data, ev.relay, ev.raw) == ("agent.other", {}, True, line)


def test_cancelperm_sequence():
    # Claude Code's interrupt with a pending permission prompt (withdraw the prompt, ack,
    # abort), as the normalized kinds a client sees (docs/api.md §6.4, §6.5).
    lines = agent_lines(TRANSCRIPTS / "cancelperm.transcript.jsonl")
    decoded = decode_all(lines)
    events = [e for d in decoded for e in d.events]
    kinds = [e.kind for e in events]
    start = kinds.index("permission.requested")
    assert kinds[start : kinds.index("turn.ended") + 1] == [
        "permission.requested",
        "permission.resolved",
        "agent.reply",  # the interrupt's ack
        "agent.status",
        "tool.result",
        "message",  # [Request interrupted by user for tool use]
        "diagnostic",  # what Claude Code said about the aborted turn
        "turn.ended",
    ]
    end = events[kinds.index("turn.ended")]
    assert (end.data["status"], end.data["reason"], "error" in end.data) == ("cancelled", "interrupted", False)
    # The agent withdrew exactly the prompt it had raised.
    asked, withdrawn = events[start], events[start + 1]
    assert withdrawn.data == {"request_id": asked.data["request_id"], "decision": "cancelled", "by": "agent"}
    assert all(d.replies == [] for d in decoded)


# ---------------------------------------------------------------- secrets (issue #5 item 5)

INIT_RESPONSE: dict[str, Any] = {
    "type": "control_response",
    "response": {
        "subtype": "success",
        "request_id": "req_1",
        "response": {
            "commands": [
                {"name": "review", "description": "Review a pull request", "argumentHint": "<pr>"},
                {"name": "compact", "description": "Clear history but keep a summary", "argumentHint": ""},
            ],
            "agents": [{"name": "Explore", "description": "Fast read-only search agent"}],
            "output_style": "default",
            "available_output_styles": ["default", "Explanatory"],
            "models": [
                {
                    "value": "default",
                    "resolvedModel": "claude-opus-4-8[1m]",
                    "displayName": "Default (recommended)",
                    "description": "Opus 4.8 · $5/$25 per Mtok",
                    "supportsEffort": True,
                    "supportedEffortLevels": ["low", "high"],
                },
                {"value": "haiku", "displayName": "Haiku", "description": "Fastest"},
            ],
            "account": {
                "email": "ada.lovelace@example.com",
                "organization": "Analytical Engines Ltd",
                "tokenSource": "claude.ai",
                "apiKeySource": "/login managed key",
                "subscriptionType": "max",
            },
            "mcp": {
                "servers": [
                    {
                        "name": "github",
                        "status": "connected",
                        "auth": {
                            "kind": "oauth",
                            "oauth_token": {
                                "access": "gho_4xQmS3cr3tV4lue",
                                "expires_in": 3600,
                                "scopes": ["repo", "read:org"],
                                "refresh": None,
                            },
                        },
                    }
                ]
            },
            "pid": 4242,
        },
    },
}
ACCOUNT_SECRETS = ["ada.lovelace@example.com", "Analytical Engines Ltd", "claude.ai", "/login managed key", "max"]


@pytest.mark.parametrize("codec_cls", [StreamJsonCodec, AwpJsonlCodec])
def test_initialize_response_relays_with_account_and_tokens_redacted(codec_cls):
    line = json.dumps(INIT_RESPONSE, indent=1)  # bytes the re-serialisation cannot reproduce
    decoded = codec_cls().decode(line.encode())
    assert decoded.replies == []
    [ev] = decoded.events
    assert (ev.kind, ev.relay) == ("agent.reply", True)
    assert ev.data == {"request_id": "req_1", "subtype": "success"}
    assert ev.raw is not None and ev.raw != line and "\n" not in ev.raw
    got = json.loads(ev.raw)
    body = got["response"]["response"]
    assert body["account"] == dict.fromkeys(INIT_RESPONSE["response"]["response"]["account"], REDACTED)
    assert body["mcp"]["servers"][0]["auth"] == {
        "kind": "oauth",
        "oauth_token": {"access": REDACTED, "expires_in": REDACTED, "scopes": [REDACTED, REDACTED], "refresh": None},
    }
    for secret in [*ACCOUNT_SECRETS, "gho_4xQmS3cr3tV4lue", "read:org"]:
        assert secret not in ev.raw
    assert ev.raw.count(json.dumps(REDACTED)) == 5 + 4
    assert ev.raw == dumps(expected_redaction(INIT_RESPONSE))


def test_redaction_leaves_everything_that_is_not_a_secret_unchanged():
    [ev] = decode_one(json.dumps(INIT_RESPONSE)).events
    got = json.loads(ev.raw or "")
    original = INIT_RESPONSE["response"]["response"]
    body = got["response"]["response"]
    for key in ("commands", "agents", "output_style", "available_output_styles", "models", "pid"):
        assert body[key] == original[key], key
    assert body["mcp"]["servers"][0]["name"] == "github"
    assert body["mcp"]["servers"][0]["status"] == "connected"
    assert got["type"] == "control_response"
    assert {k: v for k, v in got["response"].items() if k != "response"} == {
        "subtype": "success",
        "request_id": "req_1",
    }
    assert list(body) == list(original)  # key order survives too


def test_redact_secrets_does_not_modify_its_argument():
    before = json.dumps(INIT_RESPONSE)
    redact_secrets(INIT_RESPONSE)
    assert json.dumps(INIT_RESPONSE) == before


@pytest.mark.parametrize(
    "key",
    [
        "token",
        "accessToken",
        "refresh_token",
        "oauth_token",
        "client_secret",
        "password",
        "passwd",
        "apiKey",
        "api_key",
        "x-api-key",
        "API_KEY",
        "Authorization",
        "cookie",
        "Set-Cookie",
        "credentials",
        "email",
        "emailAddress",
        "organization",
        "organisation",
        "organizationUuid",
        "account",
        "accountUuid",
        "sessionKey",
        "session_key",
        "session-key",
        "private_key",
        "privateKey",
    ],
)
def test_every_secret_key_name_is_redacted_at_any_depth(key):
    obj = {
        "type": "control_response",
        "response": {
            "subtype": "success",
            "request_id": "r1",
            "response": {"outer": [{key: {"a": ["s3cr3t", 1, True]}}]},
        },
    }
    line = json.dumps(obj)
    [ev] = decode_one(line).events
    assert ev.raw == dumps(expected_redaction(obj)) != line
    assert json.loads(ev.raw)["response"]["response"]["outer"] == [{key: {"a": [REDACTED, REDACTED, REDACTED]}}]
    assert "s3cr3t" not in ev.raw


@pytest.mark.parametrize("key", ["session_id", "name", "auth", "key", "api", "mode", "description"])
def test_ordinary_key_names_are_not_secrets(key):
    line = json.dumps(
        {
            "type": "control_response",
            "response": {"subtype": "success", "request_id": "r1", "response": {key: "visible", "nested": {key: 1}}},
        }
    )
    [ev] = decode_one(line).events
    assert ev.raw == line


def test_a_control_response_without_secrets_keeps_its_exact_bytes():
    line = (
        '{"type": "control_response",  "response": {"subtype": "success", "request_id": "r9",'
        ' "response": {"mode": "plan"}}}'
    )
    [ev] = decode_one(line).events
    assert (ev.kind, ev.raw) == ("agent.reply", line)


def test_null_or_already_redacted_secrets_keep_the_exact_bytes():
    # Nothing changes, so nothing is re-serialised.
    line = (
        '{"type": "control_response", "response": {"subtype": "success", "request_id": "r9",'
        ' "response": {"account": {"email": "[redacted]", "organization": null}}}}'
    )
    [ev] = decode_one(line).events
    assert ev.raw == line


def test_secrets_are_only_redacted_in_control_responses():
    # Other lines (system/init carries apiKeySource) relay verbatim: the redaction is for the
    # initialize response's account details.
    line = '{"type":"system","subtype":"init","session_id":"s1","model":"m","apiKeySource":"ANTHROPIC_API_KEY"}'
    [ev] = decode_one(line).events
    assert (ev.kind, ev.raw) == ("session.started", line)


def test_a_redacted_line_with_a_lone_surrogate_is_still_utf8_json():
    line = (
        '{"type":"control_response","response":{"subtype":"success","request_id":"r\\udc00",'
        '"response":{"account":{"email":"x"},"note":"\\ud800"}}}'
    )
    [ev] = decode_one(line).events
    assert ev.raw is not None
    ev.raw.encode("utf-8")
    got = json.loads(ev.raw)
    assert got["response"]["response"] == {"account": {"email": REDACTED}, "note": "\ud800"}
    assert ev.data == {"request_id": "r\udc00", "subtype": "success"}


def test_context_usage_token_counts_are_not_secrets():
    _, line = find_line(
        lambda o: (
            o.get("type") == "control_response" and "categories" in ((o.get("response") or {}).get("response") or {})
        )
    )
    [ev] = decode_one(line).events
    assert ev.raw == line


def test_each_turn_of_full_ends_with_the_expected_status():
    lines = agent_lines(TRANSCRIPTS / "full.transcript.jsonl")
    ends = [e.data["status"] for d in decode_all(lines) for e in d.events if e.kind == "turn.ended"]
    assert ends == ["success", "success", "cancelled", "success"]


def test_task_and_auxiliary_messages_from_the_types():
    # Task and auxiliary line shapes Claude Code writes (not produced by the fake model).
    cases = {
        '{"type":"system","subtype":"task_started","task_id":"t_01","tool_use_id":"toolu_01",'
        '"description":"Explore repo","subagent_type":"Explore"}': (
            "task.updated",
            {
                "task_id": "t_01",
                "task_type": "Explore",
                "status": "running",
                "event": "task_started",
                "description": "Explore repo",
                "tool_use_id": "toolu_01",
            },
        ),
        '{"type":"system","subtype":"task_updated","task_id":"t_01","patch":{"status":"completed","end_time":1}}': (
            "task.updated",
            {"task_id": "t_01", "task_type": None, "status": "completed", "event": "task_updated"},
        ),
        '{"type":"system","subtype":"task_notification","task_id":"t_01","status":"failed",'
        '"summary":"boom","output_file":"/x"}': (
            "task.updated",
            {"task_id": "t_01", "task_type": None, "status": "failed", "event": "task_notification", "summary": "boom"},
        ),
        '{"type":"tool_progress","tool_use_id":"toolu_01","tool_name":"Bash","elapsed_time_seconds":12}': (
            "tool.progress",
            {"tool_call_id": "toolu_01", "name": "Bash", "elapsed_s": 12},
        ),
        '{"type":"rate_limit_event","rate_limit_info":{"status":"allowed_warning",'
        '"resetsAt":1764470000,"rateLimitType":"five_hour","utilization":0.82}}': (
            "rate_limit",
            {"status": "allowed_warning", "resets_at": 1764470000, "utilization": 0.82},
        ),
        '{"type":"system","subtype":"compacting"}': ("agent.other", {}),
        '{"type":"keep_alive"}': ("agent.status", {"event": "keep_alive"}),
        '{"type":"system","subtype":"session_start","session_id":"q1","model":"qwen3"}': (
            "session.started",
            {"native_session_id": "q1", "model": "qwen3"},
        ),
    }
    for line, expected in cases.items():
        [ev] = decode_one(line).events
        assert (ev.kind, ev.data) == expected, line


def test_qwen_error_object_is_the_error_text():
    line = (
        '{"type":"result","subtype":"error_during_execution","is_error":true,'
        '"error":{"type":"x","message":"qwen broke"}}'
    )
    [ev] = decode_one(line).events
    assert ev.data["status"] == "error"
    assert ev.data["error"] == "qwen broke"


# ---------------------------------------------------------------- malformed lines


@pytest.mark.parametrize(
    "line",
    [
        b"not json at all",
        b"[1, 2, 3]",
        b'["type", "result"]',
        b'"a string"',
        b"42",
        b"null",
        b'{"type": "result"',  # truncated
        b'\xff\xfe{"type":"result"}',  # invalid UTF-8
        b'{"type":"assistant","text":"\xc3"}',  # truncated multi-byte sequence
        b"",
        b"   ",
        b"\r",
        # Python's json.loads accepts these; RFC 8259 (and a browser's JSON.parse) does not, and
        # raw is embedded verbatim in events-mode frames.
        b'{"type":"result","subtype":"success","total_cost_usd":NaN}',
        b'{"type":"tool_progress","elapsed_time_seconds":Infinity}',
        b'{"type":"tool_progress","elapsed_time_seconds":-1e999}',
        b'\x0c{"type":"result","subtype":"success"}',
        '{"type":"result","subtype":"success"}\u3000'.encode(),
    ],
)
def test_non_object_lines_become_a_single_unrelayed_diagnostic(line):
    decoded = StreamJsonCodec().decode(line)
    [ev] = decoded.events
    assert ev.kind == "diagnostic"
    assert ev.relay is False
    assert ev.raw is None
    assert ev.data["stream"] == "protocol"
    assert isinstance(ev.data["text"], str) and ev.data["text"]
    assert decoded.replies == []


def test_diagnostic_text_is_bounded():
    [ev] = StreamJsonCodec().decode(b"x" * 100_000).events
    assert ev.kind == "diagnostic"
    assert len(ev.data["text"]) < 1000


def test_crlf_terminated_line_relays_without_the_carriage_return():
    line = '{"type":"system","subtype":"init","session_id":"s1","model":"m"}'
    decoded = StreamJsonCodec().decode(line.encode() + b"\r")
    [ev] = decoded.events
    assert ev.kind == "session.started" and ev.raw == line and ev.relay


def test_unknown_type_is_agent_other_with_the_raw_line():
    line = '{"type":"worker_shutting_down","whatever":[1,2]}'
    [ev] = decode_one(line).events
    assert (ev.kind, ev.data, ev.raw, ev.relay) == ("agent.other", {}, line, True)


def test_non_ascii_text_decodes_and_raw_keeps_the_escapes():
    line = '{"type":"assistant","message":{"content":[{"type":"text","text":"h\\u00e9 ✓"}]}}'
    [ev] = decode_one(line).events
    assert ev.raw == line and ev.data["text"] == "hé ✓"


# ---------------------------------------------------------------- encoding


def test_launch_flags_include_verbose():
    assert StreamJsonCodec().launch_flags({}) == list(LAUNCH_FLAGS)
    assert "--verbose" in LAUNCH_FLAGS
    i = LAUNCH_FLAGS.index("--output-format")
    assert LAUNCH_FLAGS[i + 1] == "stream-json"
    i = LAUNCH_FLAGS.index("--input-format")
    assert LAUNCH_FLAGS[i + 1] == "stream-json"


def test_encode_prompt_matches_the_writer_shape():
    content = [{"type": "text", "text": "line one\nline two"}]
    line = StreamJsonCodec().encode_prompt(content)
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["type"] == "user"
    assert obj["message"] == {"role": "user", "content": content}
    assert obj["parent_tool_use_id"] is None
    assert obj["session_id"] == ""
    assert uuid.UUID(obj["uuid"]).version == 4


def test_encode_prompt_keeps_non_ascii_readable():
    line = StreamJsonCodec().encode_prompt([{"type": "text", "text": "héllo ✓ 日本"}])
    assert "héllo ✓ 日本" in line


def test_encode_prompt_escapes_a_lone_surrogate_so_the_line_is_valid_utf8():
    # A client frame '{"op":"prompt","text":"\\ud800"}' parses to a lone surrogate.
    text = json.loads('"a\\ud800b é"')
    line = StreamJsonCodec().encode_prompt([{"type": "text", "text": text}])
    line.encode("utf-8")
    assert "\\ud800" in line
    assert json.loads(line)["message"]["content"][0]["text"] == text


def test_error_reply_echoes_a_lone_surrogate_request_id_exactly():
    decoded = StreamJsonCodec().decode(b'{"type":"control_request","request_id":"r\\udc00","request":{"subtype":"x"}}')
    [reply] = decoded.replies
    reply.encode("utf-8")
    assert json.loads(reply)["response"]["request_id"] == "r\udc00"


def test_encode_prompt_uuids_are_unique():
    codec = StreamJsonCodec()
    assert len({json.loads(codec.encode_prompt([]))["uuid"] for _ in range(50)}) == 50


def test_encode_interrupt_uses_unique_sdk_style_request_ids():
    codec = StreamJsonCodec()
    objs = [json.loads(codec.encode_interrupt() or "") for _ in range(3)]
    assert all(o["type"] == "control_request" for o in objs)
    assert all(o["request"] == {"subtype": "interrupt"} for o in objs)
    ids = [o["request_id"] for o in objs]
    assert len(set(ids)) == 3
    for n, rid in enumerate(ids, start=1):
        prefix, counter, hexpart = rid.split("_")
        assert (prefix, counter) == ("req", str(n))
        assert len(hexpart) == 8 and int(hexpart, 16) >= 0


def test_stream_json_shuts_down_by_closing_stdin():
    assert StreamJsonCodec().encode_shutdown() is None
    assert StreamJsonCodec().interrupt() is not None


def test_encode_permission_allow_and_deny():
    codec = StreamJsonCodec()
    allow = json.loads(codec.encode_permission("p1", True, updated_input={"command": "ls"}))
    assert allow == {
        "type": "control_response",
        "response": {
            "subtype": "success",
            "request_id": "p1",
            "response": {"behavior": "allow", "updatedInput": {"command": "ls"}},
        },
    }
    deny = json.loads(codec.encode_permission("p2", False, updated_input={}, message="no"))
    assert deny["response"]["response"] == {"behavior": "deny", "message": "no"}
    default = json.loads(codec.encode_permission("p3", False, updated_input={}))
    assert default["response"]["response"]["message"]


def test_encode_control_error_shape():
    assert json.loads(StreamJsonCodec.encode_control_error("r1", "nope")) == {
        "type": "control_response",
        "response": {"subtype": "error", "request_id": "r1", "error": "nope"},
    }
