"""The awp-jsonl dialect (docs/api.md §7.2): a stream-json subset with top-level raw
``content_block_*`` / ``message_stop`` events, ``result.subtype == "error"``, no control
protocol, ``{"type":"shutdown"}`` for a graceful exit and no interrupt message."""

from __future__ import annotations

import json

import pytest

from bridge.protocols.awp_jsonl import PROTOCOL, AwpJsonlCodec
from bridge.protocols.codecs import make_codec
from bridge.protocols.events import KINDS
from bridge.protocols.stream_json import StreamJsonCodec

# The output sample of the AWP Agent CLI contract, verbatim, and what each line must become.
# ruff: noqa: E501  (the sample lines are kept byte-for-byte as the contract prints them)
SAMPLE = [
    (
        '{"type":"system","subtype":"init","session_id":"opaque-session-id","model":"provider-model-id"}',
        "session.started",
        {"native_session_id": "opaque-session-id", "model": "provider-model-id"},
    ),
    (
        '{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"Partial or complete text"}]}}',
        "message",
        {"role": "assistant", "text": "Partial or complete text", "message_id": None},
    ),
    (
        '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
        "message.stream",
        {"event": "content_block_start", "block_type": "text"},
    ),
    (
        '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Partial text"}}',
        "message.delta",
        {"text": "Partial text", "channel": "text"},
    ),
    ('{"type":"content_block_stop","index":0}', "message.stream", {"event": "content_block_stop"}),
    (
        '{"type":"result","subtype":"success","is_error":false,"session_id":"opaque-session-id","usage":{"input_tokens":12,"output_tokens":8}}',
        "turn.ended",
        {
            "status": "success",
            "stop_reason": None,
            "usage": {"input_tokens": 12, "output_tokens": 8},
            "native_session_id": "opaque-session-id",
        },
    ),
    (
        '{"type":"result","subtype":"error","is_error":true,"session_id":"opaque-session-id","result":"stable_machine_readable_error"}',
        "turn.ended",
        {
            "status": "error",
            "stop_reason": None,
            "error": "stable_machine_readable_error",
            "subtype": "error",
            "native_session_id": "opaque-session-id",
        },
    ),
    ('{"type":"message_stop"}', "turn.ended", {"status": "success", "stop_reason": "message_stop"}),
]


def decode(line: str, codec: AwpJsonlCodec | None = None):
    return (codec or AwpJsonlCodec()).decode(line.encode("utf-8"))


@pytest.mark.parametrize(
    ("line", "kind", "data"), SAMPLE, ids=[json.loads(s[0])["type"] + "/" + str(i) for i, s in enumerate(SAMPLE)]
)
def test_protocol_sample_lines_map_to_normalized_kinds(line, kind, data):
    decoded = decode(line)
    [ev] = decoded.events
    assert (ev.kind, ev.data) == (kind, data)
    assert ev.source == "agent"
    assert ev.relay is True
    assert ev.raw == line
    assert decoded.replies == []


def test_the_whole_sample_decodes_on_one_codec_in_order():
    codec = AwpJsonlCodec()
    kinds = [e.kind for line, _, _ in SAMPLE for e in decode(line, codec).events]
    assert kinds == [k for _, k, _ in SAMPLE]


def test_top_level_tool_use_block_start_is_a_tool_call():
    line = (
        '{"type":"content_block_start","index":1,"content_block":'
        '{"type":"tool_use","id":"toolu_1","name":"read_file","input":{"path":"a.txt"}}}'
    )
    [ev] = decode(line).events
    assert ev.kind == "tool.call"
    assert ev.data == {"tool_call_id": "toolu_1", "name": "read_file", "input": {"path": "a.txt"}}
    assert ev.relay and ev.raw == line


def test_assistant_tool_use_block_is_a_tool_call():
    line = json.dumps(
        {
            "type": "assistant",
            "message": {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_2", "name": "shell", "input": {"cmd": "ls"}}],
            },
        }
    )
    [ev] = decode(line).events
    assert ev.kind == "tool.call"
    assert (ev.data["tool_call_id"], ev.data["name"], ev.data["input"]) == ("toolu_2", "shell", {"cmd": "ls"})


def test_assistant_string_content_is_a_message():
    line = '{"type":"assistant","message":{"role":"assistant","content":"plain"}}'
    [ev] = decode(line).events
    assert (ev.kind, ev.data["text"]) == ("message", "plain")


def test_top_level_thinking_delta_is_a_thought_delta():
    line = '{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}'
    [ev] = decode(line).events
    assert (ev.kind, ev.data) == ("message.delta", {"text": "hm", "channel": "thought"})


@pytest.mark.parametrize(
    ("line", "data"),
    [
        (
            '{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{"}}',
            {"event": "content_block_delta", "delta_type": "input_json_delta"},
        ),
        (
            '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta"}}',
            {"event": "content_block_delta", "delta_type": "text_delta"},
        ),
        ('{"type":"content_block_delta","index":0}', {"event": "content_block_delta", "delta_type": None}),
        ('{"type":"content_block_start","index":0}', {"event": "content_block_start", "block_type": None}),
        (
            '{"type":"content_block_start","index":0,"content_block":"tool_use"}',
            {"event": "content_block_start", "block_type": None},
        ),
        ('{"type":"message_start","message":{"id":"m1"}}', {"event": "message_start", "message_id": "m1"}),
        (
            '{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}',
            {"event": "message_delta", "stop_reason": "end_turn"},
        ),
    ],
)
def test_other_raw_events_are_the_streams_structure(line, data):
    [ev] = decode(line).events
    assert (ev.kind, ev.data) == ("message.stream", data) and ev.relay and ev.raw == line


def test_error_result_uses_the_result_text_or_falls_back_to_the_subtype():
    [ev] = decode('{"type":"result","subtype":"error","is_error":true}').events
    assert ev.data["status"] == "error"
    assert ev.data["error"] == "error"


def test_result_with_is_error_but_success_subtype_is_an_error():
    [ev] = decode('{"type":"result","subtype":"success","is_error":true,"result":"boom"}').events
    assert (ev.data["status"], ev.data["error"]) == ("error", "boom")


def test_malformed_lines_are_unrelayed_diagnostics():
    for raw in (b"garbage", b"[]", b"\xff", b""):
        [ev] = AwpJsonlCodec().decode(raw).events
        assert (ev.kind, ev.relay, ev.raw) == ("diagnostic", False, None)


def test_stream_event_wrapper_is_also_accepted():
    # Part 2: "one parser can cover both dialects".
    line = '{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}}'
    [ev] = decode(line).events
    assert (ev.kind, ev.data["text"]) == ("message.delta", "x")


def test_message_stop_is_a_turn_end_only_in_awp():
    line = b'{"type":"message_stop"}'
    assert [e.kind for e in AwpJsonlCodec().decode(line).events] == ["turn.ended"]
    assert [e.kind for e in StreamJsonCodec().decode(line).events] == ["agent.other"]  # not a stream-json type


# ---------------------------------------------------------------- encoding


def test_encode_prompt_is_the_contract_user_line():
    content = [{"type": "text", "text": "Explain this failure"}]
    line = AwpJsonlCodec().encode_prompt(content)
    assert "\n" not in line
    assert json.loads(line) == {"type": "user", "message": {"role": "user", "content": content}}


def test_encode_prompt_keeps_image_and_document_blocks_and_escapes_newlines():
    content = [
        {"type": "text", "text": "first\nsecond\r\nthird"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}},
    ]
    line = AwpJsonlCodec().encode_prompt(content)
    assert "\n" not in line and "\r" not in line
    assert json.loads(line)["message"]["content"] == content


def test_encode_shutdown_is_the_shutdown_line():
    line = AwpJsonlCodec().encode_shutdown()
    assert line is not None and "\n" not in line
    assert json.loads(line) == {"type": "shutdown"}


def test_awp_has_no_interrupt_message():
    assert AwpJsonlCodec().encode_interrupt() is None
    assert AwpJsonlCodec().interrupt() is None  # the conversation stops the process instead


def test_awp_identity_and_launch_flags():
    codec = AwpJsonlCodec()
    assert codec.protocol == PROTOCOL == "awp-jsonl"
    # the AWP host passes only --model/--resume/--mcp-config, whatever the thread's options
    assert codec.launch_flags({}) == []
    assert codec.launch_flags({"permission_prompts": True, "permission_mode": "plan"}) == []
    assert codec.prompts_to_clients({"permission_prompts": True}) is False


def test_make_codec_picks_the_dialect():
    assert type(make_codec("awp-jsonl")) is AwpJsonlCodec
    assert type(make_codec("stream-json")) is StreamJsonCodec
    with pytest.raises(ValueError, match="acp-ish"):
        make_codec("acp-ish")


def test_every_sample_kind_is_a_known_kind():
    assert {k for _, k, _ in SAMPLE} <= KINDS


def test_resume_is_two_arguments_in_awp_and_one_in_stream_json():
    # The contract's argv: "--model <model> [--resume <native-session-id>] [--mcp-config <path>]";
    # the reference adapter refuses "--resume=ID" (unsupported_argument). Claude Code takes "--resume=ID".
    assert AwpJsonlCodec().resume_args("s-1") == ["--resume", "s-1"]
    assert StreamJsonCodec().resume_args("s-1") == ["--resume=s-1"]
    assert make_codec("acp").resume_args("s-1") == []  # session/load or session/resume instead
    assert all(make_codec(p).resume_on_argv for p in ("awp-jsonl", "stream-json"))


def test_startup_error_result_is_a_failed_start_with_its_machine_readable_reason():
    line = '{"type":"result","subtype":"startup_error","is_error":true,"result":"unsupported_argument:--bogus"}'
    out = AwpJsonlCodec().decode(line.encode())
    ended, notice = out.events
    assert (ended.kind, ended.raw, ended.relay) == ("turn.ended", line, True)
    assert ended.data == {
        "status": "error",
        "stop_reason": None,
        "error": "unsupported_argument:--bogus",
        "subtype": "startup_error",
        "error_code": "startup_error",
    }
    assert (notice.source, notice.kind, notice.data["code"]) == ("bridge", "notice", "startup_error")
    assert out.fatal is not None and (out.fatal.reason, out.fatal.message) == (
        "startup_error",
        "unsupported_argument:--bogus",
    )
    # An agent's reason is bounded; an ordinary error result is not a failed start.
    long = AwpJsonlCodec().decode(
        json.dumps({"type": "result", "subtype": "startup_error", "result": "x" * 9000}).encode()
    )
    assert long.fatal is not None and len(long.fatal.message) == 512
    plain = AwpJsonlCodec().decode(b'{"type":"result","subtype":"error","is_error":true,"result":"provider_timeout"}')
    assert plain.fatal is None and plain.events[0].data["error"] == "provider_timeout"
    # stream-json is unchanged: the same line is an ordinary error result there.
    assert StreamJsonCodec().decode(line.encode()).fatal is None
