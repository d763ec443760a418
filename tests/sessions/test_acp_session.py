"""The ACP gateway's mapping (sessions/acp_session.py), in process: records in, ACP
payloads out, each validated against the official SDK's schema models."""

from __future__ import annotations

import json
from typing import Any

import pytest
from acp import schema

from bridge.errors import InvalidRequest
from bridge.protocols.events import Record
from bridge.sessions import acp_session as m


def rec(kind: str, data: dict[str, Any], source: str = "agent", raw: Any = None, seq: int = 1) -> Record:
    return Record(seq, "2026-12-01T00:00:00.000Z", source, kind, data, None if raw is None else json.dumps(raw), True)


def valid(update: dict[str, Any]) -> dict[str, Any]:
    schema.SessionNotification.model_validate({"sessionId": "thr_x", "update": update})
    return update


def test_streamed_deltas_are_sent_and_the_whole_message_after_them_is_not() -> None:
    mapper = m.UpdateMapper()
    out = mapper.updates(rec("message.delta", {"text": "Hel", "channel": "text"}), own_prompt=False)
    out += mapper.updates(rec("message.delta", {"text": "lo", "channel": "text"}), own_prompt=False)
    out += mapper.updates(rec("message", {"role": "assistant", "text": "Hello"}), own_prompt=False)
    assert [valid(u)["content"]["text"] for u in out] == ["Hel", "lo"]
    # The next message was not streamed: it is sent whole.
    (whole,) = mapper.updates(rec("message", {"role": "assistant", "text": "Bye"}, seq=4), own_prompt=False)
    assert valid(whole) == {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": "Bye"},
        "messageId": ":4",
    }


def test_thoughts_user_prompts_and_the_clis_own_user_lines() -> None:
    mapper = m.UpdateMapper()
    (thought,) = mapper.updates(
        rec("message", {"role": "assistant", "text": "hmm", "channel": "thought"}), own_prompt=False
    )
    assert valid(thought)["sessionUpdate"] == "agent_thought_chunk"
    prompt = rec("message", {"role": "user", "text": "hi", "turn_id": "turn_1"}, source="client")
    (user,) = mapper.updates(prompt, own_prompt=False)
    assert valid(user) == {
        "sessionUpdate": "user_message_chunk",
        "content": {"type": "text", "text": "hi"},
        "messageId": ":1",
    }
    assert mapper.updates(prompt, own_prompt=True) == []
    assert mapper.updates(rec("message", {"role": "user", "text": "x", "origin": "replay"}), own_prompt=False) == []


def test_tool_calls_their_updates_and_results() -> None:
    mapper = m.UpdateMapper()
    (call,) = mapper.updates(
        rec("tool.call", {"tool_call_id": "t1", "name": "Read", "input": {"file_path": "/a"}}), own_prompt=False
    )
    assert valid(call) == {
        "sessionUpdate": "tool_call",
        "toolCallId": "t1",
        "title": "Read",
        "kind": "read",
        "status": "pending",
        "rawInput": {"file_path": "/a"},
    }
    acp_call = {"tool_call_id": "t2", "name": None, "title": "Edit a", "kind": "edit", "status": "in_progress"}
    assert valid(mapper.updates(rec("tool.call", acp_call), own_prompt=False)[0])["title"] == "Edit a"
    (patch,) = mapper.updates(
        rec("tool.call", {"tool_call_id": "t2", "update": True, "status": "bogus"}), own_prompt=False
    )
    assert valid(patch) == {"sessionUpdate": "tool_call_update", "toolCallId": "t2"}
    blocks = [{"type": "text", "text": "line 1"}, {"type": "text", "text": "line 2"}]
    (result,) = mapper.updates(
        rec("tool.result", {"tool_call_id": "t1", "output": blocks, "is_error": True}), own_prompt=False
    )
    assert valid(result)["status"] == "failed" and result["content"][0]["content"]["text"] == "line 1\nline 2"
    assert mapper.updates(rec("tool.call", {"tool_call_id": None}), own_prompt=False) == []


def test_plans_modes_and_slash_commands() -> None:
    mapper = m.UpdateMapper()
    entries = [{"content": "a", "priority": "high", "status": "pending"}, {"content": 3, "priority": "x"}]
    (plan,) = mapper.updates(rec("plan", {"entries": entries}), own_prompt=False)
    assert valid(plan)["entries"] == entries[:1]
    (mode,) = mapper.updates(rec("agent.status", {"status": "mode_changed", "mode": "plan"}), own_prompt=False)
    assert valid(mode) == {"sessionUpdate": "current_mode_update", "currentModeId": "plan"}
    init = {"type": "system", "subtype": "init", "slash_commands": ["compact", "/review", 7]}
    (cmds,) = mapper.updates(rec("session.started", {"native_session_id": "s"}, raw=init), own_prompt=False)
    assert [c["name"] for c in valid(cmds)["availableCommands"]] == ["compact", "review"]
    assert mapper.updates(rec("session.started", {}, raw={"type": "x"}), own_prompt=False) == []
    assert mapper.updates(rec("diagnostic", {"text": "x"}), own_prompt=False) == []


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"status": "success", "stop_reason": "end_turn"}, "end_turn"),
        ({"status": "success", "stop_reason": "refusal"}, "refusal"),
        ({"status": "success", "stop_reason": "tool_use"}, "end_turn"),
        ({"status": "success", "stop_reason": None, "subtype": "error_max_turns"}, "max_turn_requests"),
        ({"status": "cancelled", "reason": "interrupted"}, "cancelled"),
        ({"status": "error", "error": "boom"}, None),
    ],
)
def test_stop_reasons(data: dict[str, Any], reason: str | None) -> None:
    assert m.stop_reason(data) == reason
    if reason is not None:
        schema.PromptResponse.model_validate({"stopReason": reason})


def test_permission_requests_and_answers_without_options() -> None:
    data = {"request_id": "r1", "tool": "Bash", "input": {"command": "ls"}, "options": [], "tool_call_id": "toolu_1"}
    params = m.permission_request("thr_x", data)
    schema.RequestPermissionRequest.model_validate(params)
    assert params["toolCall"] == {
        "toolCallId": "toolu_1",
        "title": "Bash",
        "status": "pending",
        "kind": "execute",
        "rawInput": {"command": "ls"},
    }
    assert m.permission_answer(data, {"outcome": {"outcome": "selected", "optionId": "allow"}}) == ("allow", None)
    assert m.permission_answer(data, {"outcome": {"outcome": "selected", "optionId": "deny"}}) == ("deny", None)
    assert m.permission_answer(data, {"outcome": {"outcome": "cancelled"}}) == ("deny", None)
    assert m.permission_answer(data, {"outcome": {"outcome": "selected", "optionId": "other"}}) is None
    assert m.permission_answer(data, "garbage") is None


def test_an_acp_agents_own_options_are_offered_and_answered_by_id() -> None:
    opts = [
        {"optionId": "yes", "name": "Yes", "kind": "allow_always"},
        {"optionId": "no", "name": "No", "kind": "reject_once"},
        {"optionId": "bad", "name": "Bad", "kind": "maybe"},
    ]
    data = {"request_id": "r1", "tool": "edit", "title": "Edit x", "input": None, "options": opts}
    params = m.permission_request("thr_x", data)
    schema.RequestPermissionRequest.model_validate(params)
    assert [o["optionId"] for o in params["options"]] == ["yes", "no"]
    assert params["toolCall"]["title"] == "Edit x" and params["toolCall"]["toolCallId"] == "r1"
    assert m.permission_answer(data, {"outcome": {"outcome": "selected", "optionId": "yes"}}) == ("allow", "yes")
    assert m.permission_answer(data, {"outcome": {"outcome": "selected", "optionId": "no"}}) == ("deny", "no")


def test_prompt_blocks() -> None:
    blocks = m.prompt_blocks(
        [
            {"type": "text", "text": "look"},
            {"type": "image", "data": "aGk=", "mimeType": "image/png"},
            {"type": "resource_link", "uri": "file:///a.py", "name": "a.py"},
            {"type": "resource", "resource": {"uri": "file:///b.txt", "text": "hi"}},
        ]
    )
    assert blocks == [
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}},
        {"type": "text", "text": "[a.py](file:///a.py)"},
        {"type": "document", "source": {"type": "base64", "media_type": "text/plain", "data": "aGk="}},
    ]
    for bad in ([], None, [{"type": "audio", "data": "aGk=", "mimeType": "audio/wav"}], ["x"]):
        with pytest.raises(InvalidRequest):
            m.prompt_blocks(bad)


# ---------------------------------------------------------------- message ids


def transcript() -> list[Record]:
    """A Claude Code turn streamed with message ids, a tool, then a dialect without ids."""
    start = {"type": "stream_event", "event": {"type": "message_start", "message": {"id": "msg_A", "usage": {}}}}
    kinds: list[tuple[str, dict[str, Any], str]] = [
        ("message", {"role": "user", "text": "go", "turn_id": "t1"}, "client"),
        ("message.stream", {"event": "message_start", "message_id": "msg_A"}, "agent"),
        ("message.delta", {"text": "hm", "channel": "thought"}, "agent"),
        ("message.delta", {"text": "Hel", "channel": "text"}, "agent"),
        ("message.delta", {"text": "lo", "channel": "text"}, "agent"),
        ("message", {"role": "assistant", "text": "hm", "channel": "thought", "message_id": "msg_A"}, "agent"),
        ("message", {"role": "assistant", "text": "Hello", "message_id": "msg_A"}, "agent"),
        ("tool.call", {"tool_call_id": "t1", "name": "Bash", "input": {}}, "agent"),
        ("tool.result", {"tool_call_id": "t1", "output": "ok"}, "agent"),
        ("message.delta", {"text": "no", "channel": "text"}, "agent"),
        ("message.delta", {"text": " id", "channel": "text"}, "agent"),
        ("message.delta", {"text": "acp", "channel": "text", "message_id": "m-acp"}, "agent"),
        ("message", {"role": "assistant", "text": "whole"}, "agent"),
        ("turn.ended", {"turn_id": "t1", "status": "success"}, "bridge"),
    ]
    out = []
    for i, (kind, data, source) in enumerate(kinds, start=1):
        raw = json.dumps(start) if data.get("event") == "message_start" else None
        out.append(Record(i, "2026-12-01T00:00:00.000Z", source, kind, data, raw, True))
    return out


def chunks(mapper: m.UpdateMapper, records: list[Record]) -> list[tuple[int, str, str]]:
    return [
        (r.seq, valid(u)["sessionUpdate"], u["messageId"])
        for r in records
        for u in mapper.updates(r, own_prompt=False)
        if "messageId" in u
    ]


def test_message_ids_are_the_agents_own_else_the_seq_where_the_message_began() -> None:
    got = chunks(m.UpdateMapper("thr_x"), transcript())
    assert got == [
        (1, "user_message_chunk", "thr_x:1"),
        (3, "agent_thought_chunk", "msg_A"),  # message_start named it
        (4, "agent_message_chunk", "msg_A"),
        (5, "agent_message_chunk", "msg_A"),
        (10, "agent_message_chunk", "thr_x:10"),  # no id after the tool: the seq it began at
        (11, "agent_message_chunk", "thr_x:10"),
        (12, "agent_message_chunk", "m-acp"),  # an ACP agent's own
    ]  # (13: the whole message after its deltas is not sent again)


@pytest.mark.parametrize("cut", range(15))
def test_a_session_attached_mid_message_gives_its_chunks_the_ids_a_full_replay_gives(cut: int) -> None:
    records = transcript()
    full = [c for c in chunks(m.UpdateMapper("thr_x"), records) if c[0] > cut]
    before = records[:cut]
    starts = [i for i, r in enumerate(before) if m.resets(r)]
    mapper = m.UpdateMapper("thr_x")
    mapper.prime(before[starts[-1] :] if starts else before)
    assert chunks(mapper, records[cut:]) == full


# ---------------------------------------------------------------- usage


CLAUDE = "tests/fixtures/transcripts/claude-code-2.1.197/full.transcript.jsonl"


def claude_lines() -> list[dict[str, Any]]:
    with open(CLAUDE, encoding="utf-8") as fh:
        return [json.loads(json.loads(line)["line"]) for line in fh if '"dir": "<"' in line]


def test_usage_update_from_claude_codes_result_line_and_its_last_model_call() -> None:
    lines = claude_lines()
    start = next(x for x in lines if x.get("event", {}).get("type") == "message_start")
    delta = next(x for x in lines if x.get("event", {}).get("type") == "message_delta")
    result = next(x for x in lines if x.get("type") == "result")
    mapper = m.UpdateMapper("thr_x")
    stream = [
        rec("message.stream", {"event": "message_start", "message_id": "msg_1"}, raw=start, seq=1),
        rec("message.stream", {"event": "message_delta"}, raw=delta, seq=2),
    ]
    for r in stream:
        assert mapper.updates(r, own_prompt=False) == []
    (usage,) = mapper.updates(rec("turn.ended", {"status": "success"}, raw=result, seq=3), own_prompt=False)
    # 50 tokens read and 12 written by the last call; the window of the model it named.
    assert valid(usage) == {
        "sessionUpdate": "usage_update",
        "used": 62,
        "size": 1000000,
        "cost": {"amount": result["total_cost_usd"], "currency": "USD"},
    }
    # The next turn without a model call seen (replayed from its end): nothing is made up.
    assert mapper.updates(rec("turn.ended", {"status": "success"}, raw=result, seq=4), own_prompt=False) == []


def test_usage_update_of_an_acp_agent_is_passed_on_and_a_partial_one_is_dropped() -> None:
    mapper = m.UpdateMapper("thr_x")
    report = {"used": 10, "size": 100, "cost": {"amount": 0.5, "currency": "EUR"}}
    (update,) = mapper.updates(rec("usage", report), own_prompt=False)
    assert valid(update) == {"sessionUpdate": "usage_update", **report}
    # The turn's end carries the same last report: not told twice.
    usage = {"input_tokens": 3, "context": {"used": 10, "size": 100}, "session_cost": report["cost"]}
    assert mapper.updates(rec("turn.ended", {"status": "success", "usage": usage}), own_prompt=False) == []
    # One the live session did not see (a replay from the turn's end): told at the end.
    (end,) = m.UpdateMapper("thr_x").updates(rec("turn.ended", {"usage": usage}), own_prompt=False)
    assert valid(end) == {"sessionUpdate": "usage_update", **report}
    for bad in ({"used": 10}, {"used": -1, "size": 5}, {"input_tokens": 3, "output_tokens": 5}):
        assert mapper.updates(rec("usage", bad), own_prompt=False) == []
        assert mapper.updates(rec("turn.ended", {"status": "success", "usage": bad}), own_prompt=False) == []
    (no_cost,) = mapper.updates(rec("usage", {"used": 1, "size": 2, "cost": {"amount": 1}}), own_prompt=False)
    assert "cost" not in valid(no_cost)
