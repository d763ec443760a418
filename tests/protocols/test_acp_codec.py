"""ACP client codec (docs/api.md §7.3, §6.3): golden decoding of real
claude-agent-acp 0.49.0 / Python SDK transcripts, and the handshake, id routing,
cancellation and permission rules one at a time.

The recorder that made the transcripts was its own ACP client with its own request ids, so
its ``>`` lines cannot be replayed verbatim. :class:`Replay` drives a fresh
:class:`AcpCodec` through the same conversation instead: every request the recorder sent is
matched with the one the codec sends (or produces for the recorder's prompt / cancel /
permission answer), and the ids of the agent's responses are rewritten from the recorder's
id to the codec's before decoding. Requests the codec never sends (set_mode, list, ...) get
a sentinel id, so their responses must come out as "unknown id" diagnostics.

Golden files live in ``tests/protocols/golden_acp/<scenario>.json``. To rewrite them after
an intended mapping change::

    REGENERATE_GOLDEN=1 .venv/bin/python -m pytest tests/protocols/test_acp_codec.py

then read the diff: a golden file is only as good as the review it got.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from bridge.protocols.acp import (
    AUTH_REQUIRED,
    CLIENT_CAPABILITIES,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    AcpCodec,
    to_acp_blocks,
)
from bridge.protocols.codec import AgentRequest
from bridge.protocols.codec import Decoded as AcpDecoded
from bridge.protocols.events import KINDS

HERE = Path(__file__).resolve().parent
GOLDEN_DIR = HERE / "golden_acp"
TRANSCRIPTS = HERE.parent / "fixtures" / "transcripts" / "claude-agent-acp-0.49.0"
REGENERATE = os.environ.get("REGENERATE_GOLDEN") == "1"
CWD = "/home/user/project/work"  # what the recorder sent, so session/new params compare equal
SENTINEL = 1_000_000  # id offset for responses to requests the codec never sends


def transcript_files() -> list[Path]:
    return sorted(TRANSCRIPTS.glob("*.transcript.jsonl")) if TRANSCRIPTS.is_dir() else []


def scenario_of(path: Path) -> str:
    return path.name.removesuffix(".transcript.jsonl")


def records(path: Path) -> list[dict[str, Any]]:
    """The ``<``/``>`` records of a transcript, in order (step/argv/exit markers skipped)."""
    out = []
    for text in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(text)
        if rec.get("dir") in ("<", ">"):
            out.append(rec)
    return out


def _short(value: Any, limit: int = 100) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"…(+{len(value) - limit})"
    if isinstance(value, list):
        return [_short(v, limit) for v in value]
    if isinstance(value, dict):
        return {k: _short(v, limit) for k, v in value.items()}
    return value


def select(data: dict[str, Any]) -> dict[str, Any]:
    """The event data worth pinning, with bulky fields reduced to what a reviewer checks."""
    out: dict[str, Any] = {}
    for key, value in sorted(data.items()):
        if key == "options" and isinstance(value, list):
            out[key] = [{k: o.get(k) for k in ("optionId", "kind")} for o in value]
        elif key == "capabilities" and isinstance(value, dict):
            out[key] = sorted(value)
        else:
            out[key] = _short(value)
    return out


_ID_PREFIX = re.compile(r'^\{"jsonrpc":"2\.0","id":(\d+),')


def with_id(line: str, new_id: int) -> str:
    """The agent's response line with only its id changed, every other byte kept."""
    m = _ID_PREFIX.match(line)
    assert m, f"unexpected response layout: {line[:80]}"
    return f'{{"jsonrpc":"2.0","id":{new_id},' + line[m.end() :]


class Replay:
    """Drive a fresh codec through one recorded conversation (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.records = records(path)
        resume = None
        for rec in self.records:
            obj = json.loads(rec["line"])
            if rec["dir"] == ">" and obj.get("method") in ("session/load", "session/resume"):
                resume = obj["params"]["sessionId"]
                break
        self.codec = AcpCodec(cwd=CWD, resume_id=resume)
        self.id_map: dict[Any, int] = {}  # recorder's request id → codec's request id
        self.methods: dict[Any, str] = {}  # recorder's request id → method
        self.unmapped: set[Any] = set()  # recorder requests the codec never sends
        self.emitted: list[dict[str, Any]] = []  # codec requests not yet matched to the recorder's
        self.answers: list[dict[str, Any]] = []  # codec answers (from interrupt) not yet matched
        self.options: dict[str, list[dict[str, Any]]] = {}  # permission request_id → options
        self.agent_lines: list[str] = []  # exactly what was fed to decode()
        self.decoded: list[AcpDecoded] = []
        self.labels: list[str] = []
        self.client: list[dict[str, Any]] = []
        self.loading_lines: set[int] = set()  # agent lines decoded while session/load ran

    def _wrote(self, op: str, lines: list[str]) -> None:
        for text in lines:
            assert "\n" not in text
            obj = json.loads(text)
            self.client.append({"after": len(self.agent_lines), "op": op, "line": obj})
            if "method" in obj and "id" in obj:
                self.emitted.append(obj)

    def run(self) -> Replay:
        self._wrote("start", self.codec.start())
        for rec in self.records:
            obj = json.loads(rec["line"])
            if rec["dir"] == ">":
                self._client_line(obj)
            else:
                self._agent_line(rec["line"], obj)
        assert not self.emitted, f"codec requests the recorder never sent: {self.emitted}"
        assert not self.answers, f"codec answers the recorder never sent: {self.answers}"
        return self

    def _client_line(self, obj: dict[str, Any]) -> None:
        method = obj.get("method")
        if method is not None and "id" in obj:
            rid = obj["id"]
            self.methods[rid] = method
            if method == "session/prompt":
                content = [
                    {"type": "text", "text": b["text"]} for b in obj["params"]["prompt"] if b.get("type") == "text"
                ]
                self._wrote("prompt", [self.codec.encode_prompt(content)])
            mine = next((o for o in self.emitted if o["method"] == method), None)
            if mine is None:
                self.unmapped.add(rid)
                self.client.append({"after": len(self.agent_lines), "op": "not_sent", "method": method})
                return
            self.emitted.remove(mine)
            self.id_map[rid] = mine["id"]
            if method in ("session/new", "session/load", "session/resume"):
                assert mine["params"] == obj["params"]
            if method == "session/prompt":
                assert mine["params"]["sessionId"] == self.codec.session_id
        elif method == "session/cancel":
            lines = self.codec.interrupt()
            assert lines
            first, *rest = (json.loads(x) for x in lines)
            assert first == obj  # same notification, same sessionId
            self.client.append({"after": len(self.agent_lines), "op": "interrupt", "line": first})
            for answer in rest:
                self.client.append({"after": len(self.agent_lines), "op": "interrupt", "line": answer})
                self.answers.append(answer)
        else:
            assert method is None, obj
            self._permission_answer(obj)

    def _permission_answer(self, obj: dict[str, Any]) -> None:
        """The recorder answered a session/request_permission: the codec must produce the
        same answer (from interrupt(), or from answer_permission picking by kind)."""
        if obj in self.answers:
            self.answers.remove(obj)
            return
        rid = obj["id"]
        outcome = obj["result"]["outcome"]
        options = self.options[str(rid)]
        if outcome["outcome"] == "selected":
            [kind] = [o["kind"] for o in options if o["optionId"] == outcome["optionId"]]
            decision = "allow" if kind.startswith("allow") else "deny"
        else:
            decision = "cancel"
        line = self.codec.answer_permission(str(rid), decision, options=options)
        assert line is not None
        assert json.loads(line) == obj
        self.client.append({"after": len(self.agent_lines), "op": "permission", "line": json.loads(line)})

    def _agent_line(self, line: str, obj: dict[str, Any]) -> None:
        if "method" not in obj and "id" in obj:
            rid = obj["id"]
            method = self.methods[rid]
            label = ("error/" if "error" in obj else "result/") + method
            if rid in self.id_map:
                line = with_id(line, self.id_map.pop(rid))
            else:
                assert rid in self.unmapped
                line = with_id(line, SENTINEL + rid)
                label += " (not sent by the codec)"
        elif "id" in obj:
            label = "request/" + obj["method"]
        else:
            update = (obj.get("params") or {}).get("update") or {}
            label = "/".join(filter(None, [obj["method"], update.get("sessionUpdate")]))
        if self.codec._loading:
            self.loading_lines.add(len(self.agent_lines))
        decoded = self.codec.decode(line.encode("utf-8"))
        self.agent_lines.append(line)
        self.decoded.append(decoded)
        self.labels.append(label)
        for ev in decoded.events:
            if ev.kind == "permission.requested":
                self.options[ev.data["request_id"]] = ev.data["options"]
        self._wrote("auto_reply", decoded.replies)

    def summary(self) -> dict[str, Any]:
        events, state = [], []
        for n, (label, d) in enumerate(zip(self.labels, self.decoded, strict=True)):
            for ev in d.events:
                events.append(
                    {
                        "line": n,
                        "in": label,
                        "src": ev.source,
                        "kind": ev.kind,
                        "relay": ev.relay,
                        "data": select(ev.data),
                    }
                )
            if d.ready:
                state.append({"line": n, "ready": True})
            if d.fatal is not None:
                state.append({"line": n, "fatal": d.fatal.reason})
            if d.agent is not None:
                state.append({"line": n, "agent": select(d.agent)})
            for req in d.requests:
                state.append({"line": n, "request": {"id": req.id, "method": req.method}})
        client = [{**c, "line": _short(c["line"])} if "line" in c else c for c in self.client]
        return {"events": events, "state": state, "client": client}


def render_golden(summary: dict[str, Any]) -> str:
    """JSON with one item per line, so a diff shows exactly which mapping moved."""
    parts = []
    for key, items in summary.items():
        rows = ",\n".join("  " + json.dumps(item, ensure_ascii=False) for item in items)
        parts.append(f' "{key}": [\n{rows}\n ]' if items else f' "{key}": []')
    return "{\n" + ",\n".join(parts) + "\n}\n"


_REPLAYS: dict[str, Replay] = {}


def replay(name: str) -> Replay:
    if name not in _REPLAYS:
        _REPLAYS[name] = Replay(TRANSCRIPTS / f"{name}.transcript.jsonl").run()
    return _REPLAYS[name]


def is_notification(obj: dict[str, Any]) -> bool:
    return obj.get("jsonrpc") == "2.0" and isinstance(obj.get("method"), str) and "id" not in obj


def events_of(r: Replay, kind: str) -> list[Any]:
    return [ev for d in r.decoded for ev in d.events if ev.kind == kind]


# ---------------------------------------------------------------- golden decoding


def test_the_acp_transcripts_are_there():
    assert {scenario_of(p) for p in transcript_files()} == {"acp_echo_py_sdk_0.12.1", "acpcancel", "acpload", "acpmain"}


@pytest.mark.parametrize("path", transcript_files(), ids=scenario_of)
def test_transcript_matches_golden(path):
    got = replay(scenario_of(path)).summary()
    golden = GOLDEN_DIR / f"{scenario_of(path)}.json"
    if REGENERATE:
        GOLDEN_DIR.mkdir(exist_ok=True)
        golden.write_text(render_golden(got), encoding="utf-8")
    assert golden.exists(), f"missing {golden}; run with REGENERATE_GOLDEN=1 and review it"
    assert got == json.loads(golden.read_text(encoding="utf-8"))


def test_every_transcript_has_a_golden_and_no_golden_is_stale():
    assert {scenario_of(p) for p in transcript_files()} == {p.stem for p in GOLDEN_DIR.glob("*.json")}


@pytest.mark.parametrize("path", transcript_files(), ids=scenario_of)
def test_notifications_relay_once_with_their_exact_text_responses_and_requests_never(path):
    """Raw mode sees the agent's notifications as they are; responses and agent requests
    are the bridge's business (or routed to the raw client that asked). History replayed
    during session/load leaves no event at all."""
    r = replay(scenario_of(path))
    for n, (line, d) in enumerate(zip(r.agent_lines, r.decoded, strict=True)):
        obj = json.loads(line)
        if n in r.loading_lines and obj.get("method") == "session/update":
            assert d.events == [] and d.replies == [], line[:120]
            continue
        assert d.events and d.events[0].source == "agent" and d.events[0].raw == line
        relayed = [e for e in d.events if e.relay]
        if is_notification(obj):
            assert len(relayed) == 1 and relayed[0] is d.events[0], line[:120]
        else:
            assert relayed == [], line[:120]
        for ev in d.events:
            assert ev.kind in KINDS
            json.dumps(ev.data, allow_nan=False)
            if ev.source == "agent":
                assert ev.raw == line
        assert d.fatal is None


@pytest.mark.parametrize("path", transcript_files(), ids=scenario_of)
def test_one_turn_end_per_prompt_response_and_nowhere_else(path):
    r = replay(scenario_of(path))
    for label, d in zip(r.labels, r.decoded, strict=True):
        ends = [e for e in d.events if e.kind == "turn.ended"]
        assert len(ends) == (1 if label.endswith("/session/prompt") else 0), label


def test_main_handshake_session_started_and_ready_only_on_the_session_new_result():
    r = replay("acpmain")
    ready = [n for n, d in enumerate(r.decoded) if d.ready]
    assert [r.labels[n] for n in ready] == ["result/session/new"]
    [started] = events_of(r, "session.started")
    # the model: the current value of the agent's first model-category config option
    assert started.data == {
        "native_session_id": "945856eb-d200-4bd3-bb31-5cc719c11a1a",
        "model": "default",
        "resumed": "new",
    }
    assert r.decoded[0].agent is not None
    assert r.decoded[0].agent["info"]["version"] == "0.49.0"
    assert r.decoded[0].agent["protocol_version"] == 1


def test_main_message_chunks_are_text_deltas_with_the_message_id():
    r = replay("acpmain")
    deltas = events_of(r, "message.delta")
    assert deltas and all(d.data["channel"] == "text" for d in deltas)
    first_turn = [d.data["text"] for d in deltas if d.data["message_id"] == "msg_fake_76d870e667d74667"]
    assert "".join(first_turn) == "Hello from the fake server."


def test_main_tool_call_updates_and_results():
    r = replay("acpmain")
    calls = events_of(r, "tool.call")
    bash = [c.data for c in calls if c.data["tool_call_id"] == "toolu_fake_72f9636044ba"]
    # name is the stable _meta.claudeCode.toolName, not the changing human title
    assert bash[0] == {
        "tool_call_id": "toolu_fake_72f9636044ba",
        "name": "Bash",
        "input": {},
        "title": "Terminal",
        "kind": "execute",
        "status": "pending",
    }
    assert bash[1]["update"] is True
    assert bash[1]["input"] == {"command": "touch /home/user/project/wtest.txt", "description": "Create file"}
    results = {e.data["tool_call_id"]: e.data for e in events_of(r, "tool.result")}
    assert results["toolu_fake_72f9636044ba"] == {
        "tool_call_id": "toolu_fake_72f9636044ba",
        "output": "(Bash completed with no output)",
        "is_error": False,
    }
    assert results["toolu_fake_7dcc939e8974"]["is_error"] is False
    assert results["toolu_fake_7dcc939e8974"]["output"].startswith("File created successfully")


def test_main_permission_requests_carry_the_agent_id_and_options():
    r = replay("acpmain")
    perms = [e.data for e in events_of(r, "permission.requested")]
    assert [p["request_id"] for p in perms] == ["0", "1", "2"]
    # the tool's stable name, as its tool.call gave it (issue #9: real claude-agent-acp);
    # the human title travels beside it
    assert perms[0]["tool"] == "Bash" and perms[0]["title"] == "touch /home/user/project/wtest.txt"
    assert perms[0]["tool_call_id"] == "toolu_fake_72f9636044ba"
    assert perms[0]["input"] == {"command": "touch /home/user/project/wtest.txt", "description": "Create file"}
    assert [(o["optionId"], o["kind"]) for o in perms[0]["options"]] == [
        ("allow_always", "allow_always"),
        ("allow", "allow_once"),
        ("reject", "reject_once"),
    ]
    # the codec answered the first two by kind (allow_once → "allow"), the third by interrupt
    answers = [c["line"] for c in r.client if c["op"] in ("permission", "interrupt") and "id" in c["line"]]
    assert answers == [
        {"jsonrpc": "2.0", "id": 0, "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}},
        {"jsonrpc": "2.0", "id": 1, "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}},
        {"jsonrpc": "2.0", "id": 2, "result": {"outcome": {"outcome": "cancelled"}}},
    ]


def test_main_turn_ends_and_their_stop_reasons():
    r = replay("acpmain")
    ends = [e.data for e in events_of(r, "turn.ended")]
    assert [(e["status"], e["stop_reason"]) for e in ends] == [
        ("success", "end_turn"),
        ("success", "end_turn"),
        ("success", "end_turn"),
        ("cancelled", "cancelled"),
        ("success", "end_turn"),
        # the unknown-session prompt; the recorder's session/cancel came after the SLOW
        # prompt had already ended, so this error is an error, not a cancellation
        ("error", None),
    ]
    # the prompt answer's tokens under stream-json's names, the context and cost of the
    # turn's last usage_update (a new session: its first turn's share is the whole cost),
    # and what the agent sent, unchanged
    sent = {"inputTokens": 50, "outputTokens": 12, "cachedReadTokens": 0, "cachedWriteTokens": 0, "totalTokens": 62}
    assert ends[0]["usage"] == {
        "input_tokens": 50,
        "output_tokens": 12,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "total_tokens": 62,
        "context": {"used": 62, "size": 1000000},
        "session_cost": {"amount": 0.00055, "currency": "USD"},
        "cost": {"amount": 0.00055, "currency": "USD"},
        "acp": {
            "usage": sent,
            "usage_update": {"used": 62, "size": 1000000, "cost": {"amount": 0.00055, "currency": "USD"}},
        },
    }
    # every turn's cost is its share of the agent's cumulative cost: they add up to it
    shares = [e["usage"]["cost"]["amount"] for e in ends if "cost" in e.get("usage", {})]
    assert sum(shares) == pytest.approx(ends[-2]["usage"]["session_cost"]["amount"])
    assert ends[-1]["error"] == "Internal error (-32603)"


def test_main_responses_to_requests_the_codec_never_sends_are_unknown_id_diagnostics():
    r = replay("acpmain")
    for label, d in zip(r.labels, r.decoded, strict=True):
        if label.endswith("(not sent by the codec)"):
            [ev] = d.events
            assert ev.kind == "diagnostic" and not ev.relay
            assert ev.data["text"].startswith("response to unknown request id")
    skipped = [c["method"] for c in r.client if c["op"] == "not_sent"]
    assert skipped == [
        "session/set_mode",
        "session/set_config_option",
        "session/set_model",
        "session/set_mode",
        "session/list",
        "session/bogus",
    ]


def test_main_other_updates_are_agent_other():
    r = replay("acpmain")
    for label, d in zip(r.labels, r.decoded, strict=True):
        if label.split("/")[-1] == "available_commands_update":
            [ev] = d.events
            assert ev.kind == "agent.other"
            assert ev.data == {"session_update": label.split("/")[-1]}


def test_main_usage_and_config_updates_are_events_and_config_options_follow():
    r = replay("acpmain")
    for label, d in zip(r.labels, r.decoded, strict=True):
        if label.endswith("/usage_update"):
            [ev] = d.events
            assert ev.kind == "usage" and set(ev.data) <= {"used", "size", "cost"}
        if label.endswith("/config_option_update"):
            [ev] = d.events
            assert ev.kind == "agent.status" and ev.data["status"] == "config_changed"
            assert d.agent is not None and d.agent["config_options"] == ev.data["config_options"]
    [first] = [d.agent for d in r.decoded if d.ready]
    assert first is not None
    assert [(o["id"], o.get("category"), o["currentValue"]) for o in first["config_options"]] == [
        ("mode", "mode", "default"),
        ("model", "model", "default"),
        ("effort", "thought_level", "default"),
    ]


def test_cancel_while_streaming_ends_the_turn_cancelled():
    r = replay("acpcancel")
    ends = [e.data for e in events_of(r, "turn.ended")]
    assert [(e["status"], e["stop_reason"]) for e in ends] == [("cancelled", "cancelled"), ("success", "end_turn")]
    assert "error" not in ends[0]
    [cancel] = [c for c in r.client if c["op"] == "interrupt"]
    assert cancel["line"]["method"] == "session/cancel"


def test_load_replays_history_silently_then_starts_the_resumed_session():
    r = replay("acpload")
    assert r.client[1]["line"]["method"] == "session/load"
    assert r.client[1]["line"]["params"]["sessionId"] == "945856eb-d200-4bd3-bb31-5cc719c11a1a"
    replayed = [n for n in r.loading_lines if r.labels[n].startswith("session/update")]
    assert len(replayed) == 17
    assert all(r.decoded[n].events == [] for n in replayed)
    [started] = events_of(r, "session.started")
    assert started.data == {
        "native_session_id": "945856eb-d200-4bd3-bb31-5cc719c11a1a",
        "model": "default",
        "resumed": "load",
        "replayed_updates": 17,
    }
    # nothing before the load result became a tool or message event
    first_ready = next(n for n, d in enumerate(r.decoded) if d.ready)
    assert r.labels[first_ready] == "result/session/load"
    assert not any(d.events for d in r.decoded[1:first_ready])
    assert [e.data["status"] for e in events_of(r, "turn.ended")] == ["success"]


def test_echo_sdk_agent_minimal_handshake():
    r = replay("acp_echo_py_sdk_0.12.1")
    assert r.decoded[0].agent == {"protocol_version": 1, "info": {}, "capabilities": {}, "auth_methods": []}
    [started] = events_of(r, "session.started")
    assert started.data["native_session_id"] == "9a42e8c2dbd647b2877c6242a149b395"
    [delta] = events_of(r, "message.delta")
    assert delta.data == {"text": "ping", "channel": "text", "message_id": None}
    [end] = events_of(r, "turn.ended")
    assert end.data == {"status": "success", "stop_reason": "end_turn"}


# ---------------------------------------------------------------- helpers for explicit tests

SID = "sess-1"
PERM_OPTIONS = [
    {"kind": "allow_always", "name": "Always", "optionId": "always"},
    {"kind": "allow_once", "name": "Allow", "optionId": "yes"},
    {"kind": "reject_once", "name": "Reject", "optionId": "no"},
    {"kind": "reject_always", "name": "Never", "optionId": "never"},
]


def enc(obj: Any) -> bytes:
    return json.dumps(obj).encode("utf-8")


def wire(text: str) -> dict[str, Any]:
    assert "\n" not in text and "\r" not in text
    text.encode("utf-8")
    obj = json.loads(text)
    assert isinstance(obj, dict) and obj["jsonrpc"] == "2.0"
    return obj


def respond(
    codec: AcpCodec, request: str | dict[str, Any], result: Any = None, *, error: dict[str, Any] | None = None
) -> AcpDecoded:
    rid = (wire(request) if isinstance(request, str) else request)["id"]
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
    if error is not None:
        msg["error"] = error
    else:
        msg["result"] = result
    return codec.decode(enc(msg))


def init_result(
    *, version: Any = 1, caps: dict[str, Any] | None = None, auth: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "protocolVersion": version,
        "agentCapabilities": caps or {},
        "agentInfo": {"name": "fake", "version": "1"},
        "authMethods": auth or [],
    }


def initialized(caps: dict[str, Any] | None = None, **kw: Any) -> tuple[AcpCodec, AcpDecoded]:
    codec = AcpCodec(cwd="/w", **kw)
    [init] = codec.start()
    return codec, respond(codec, init, init_result(caps=caps))


def ready_codec(sid: str = SID) -> AcpCodec:
    codec, d = initialized()
    [new] = d.replies
    assert respond(codec, new, {"sessionId": sid}).ready
    return codec


def update(variant: str, sid: str = SID, **fields: Any) -> bytes:
    return enc(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": sid, "update": {"sessionUpdate": variant, **fields}},
        }
    )


def permission_request(rid: Any, sid: str = SID) -> bytes:
    return enc(
        {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "session/request_permission",
            "params": {
                "sessionId": sid,
                "options": PERM_OPTIONS,
                "toolCall": {
                    "toolCallId": "t1",
                    "title": "touch x",
                    "kind": "execute",
                    "rawInput": {"command": "touch x"},
                },
            },
        }
    )


def kinds(d: AcpDecoded) -> list[str]:
    return [e.kind for e in d.events]


# ---------------------------------------------------------------- handshake


def test_initialize_declares_only_what_the_bridge_implements():
    codec = AcpCodec(cwd="/w", client_version="9.9")
    [line] = codec.start()
    obj = wire(line)
    assert obj["method"] == "initialize" and isinstance(obj["id"], int)
    assert obj["params"]["protocolVersion"] == 1
    assert obj["params"]["clientCapabilities"] == {
        "fs": {"readTextFile": True, "writeTextFile": True},
        "terminal": False,
        "elicitation": {"form": {}, "url": {}},
        "session": {"configOptions": {"boolean": {}}},
    }
    assert CLIENT_CAPABILITIES == obj["params"]["clientCapabilities"]
    assert obj["params"]["clientInfo"]["name"] == "agent-bridge"
    assert obj["params"]["clientInfo"]["version"] == "9.9"
    assert codec.ready is False


def test_initialize_result_produces_session_new_and_ready_only_after_its_result():
    codec = AcpCodec(cwd="/w")
    [init] = codec.start()
    d = respond(codec, init, init_result())
    assert not d.ready and d.fatal is None and not codec.ready
    assert kinds(d) == ["agent.other"] and not d.events[0].relay and d.events[0].raw
    assert d.agent == {
        "protocol_version": 1,
        "info": {"name": "fake", "version": "1"},
        "capabilities": {},
        "auth_methods": [],
    }
    [new] = d.replies
    obj = wire(new)
    assert obj["method"] == "session/new"
    assert obj["params"] == {"cwd": "/w", "mcpServers": []}
    assert obj["id"] != wire(init)["id"]
    # a prompt-shaped update before the session exists does not make it ready
    assert not codec.decode(update("agent_message_chunk", content={"type": "text", "text": "x"})).ready
    d = respond(codec, new, {"sessionId": "abc", "modes": None})
    assert d.ready and codec.ready and codec.session_id == "abc"
    [started] = d.events
    assert started.kind == "session.started" and not started.relay
    assert started.data == {"native_session_id": "abc", "model": None, "resumed": "new"}


def test_resume_with_load_session_sends_session_load_and_counts_the_replay():
    codec, d = initialized({"loadSession": True, "sessionCapabilities": {"resume": {}}}, resume_id="old")
    [load] = d.replies
    assert wire(load)["method"] == "session/load"
    assert wire(load)["params"] == {"sessionId": "old", "cwd": "/w", "mcpServers": []}
    assert not [e for e in d.events if e.kind == "notice"]
    for kind in ("user_message_chunk", "agent_message_chunk", "tool_call"):
        r = codec.decode(update(kind, sid="old", content={"type": "text", "text": "h"}, toolCallId="t"))
        assert r.events == [] and r.replies == []
    r = codec.decode(
        enc(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"update": {"sessionUpdate": "agent_message_chunk"}},
            }
        )
    )
    assert r.events == []  # no sessionId during load: replay too
    d = respond(codec, load, None)  # the result may be null
    assert d.ready
    assert d.events[0].data == {"native_session_id": "old", "model": None, "resumed": "load", "replayed_updates": 4}
    # after the load, updates are live again
    assert kinds(codec.decode(update("agent_message_chunk", sid="old", content={"type": "text", "text": "x"}))) == [
        "message.delta"
    ]


def test_resume_with_only_the_resume_capability_sends_session_resume():
    codec, d = initialized({"sessionCapabilities": {"resume": {}}}, resume_id="old")
    [res] = d.replies
    assert wire(res)["method"] == "session/resume"
    assert wire(res)["params"] == {"sessionId": "old", "cwd": "/w", "mcpServers": []}
    d = respond(codec, res, {})
    assert d.ready and d.events[0].data == {"native_session_id": "old", "model": None, "resumed": "resume"}


@pytest.mark.parametrize(
    "caps",
    [
        {},
        {"loadSession": False},
        {"sessionCapabilities": {"resume": None}},
        {"loadSession": "yes", "sessionCapabilities": {"resume": True}},
    ],
)
def test_resume_without_load_or_resume_starts_a_new_session_with_a_notice(caps):
    codec, d = initialized(caps, resume_id="old")
    [new] = d.replies
    assert wire(new)["method"] == "session/new"
    assert kinds(d) == ["agent.other", "notice"]
    notice = d.events[1]
    assert notice.source == "bridge" and notice.data["code"] == "history_not_restored"
    assert notice.raw is None and not notice.relay
    d = respond(codec, new, {"sessionId": "fresh"})
    assert d.ready and d.events[0].data["resumed"] == "new"


@pytest.mark.parametrize("method_caps", [{"loadSession": True}, {"sessionCapabilities": {"resume": {}}}])
def test_failed_load_or_resume_falls_back_to_session_new_with_a_notice(method_caps):
    codec, d = initialized(method_caps, resume_id="gone")
    [req] = d.replies
    d = respond(codec, req, error={"code": -32002, "message": "Resource not found"})
    assert d.fatal is None and not d.ready
    assert kinds(d) == ["agent.other", "notice"]
    assert d.events[0].raw and d.events[0].data["error"] == "Resource not found"
    assert d.events[1].data["code"] == "history_not_restored"
    [new] = d.replies
    assert wire(new)["method"] == "session/new"
    # the fallback ended the load: updates are live, not counted as replay
    assert kinds(codec.decode(update("plan", sid="x", entries=[]))) == ["plan"]
    d = respond(codec, new, {"sessionId": "fresh"})
    assert d.ready and d.events[0].data == {"native_session_id": "fresh", "model": None, "resumed": "new"}


@pytest.mark.parametrize("version", [2, 0, "1", None, 1.5])
def test_protocol_version_mismatch_is_fatal(version):
    codec = AcpCodec(cwd="/w")
    [init] = codec.start()
    d = respond(codec, init, init_result(version=version))
    assert d.fatal is not None and d.fatal.reason == "protocol_version"
    assert d.replies == [] and not d.ready
    assert kinds(d) == ["agent.other", "notice"]
    assert d.events[0].raw and d.events[1].data["code"] == "protocol_version"


def test_auth_method_offered_authenticates_then_opens_the_session():
    codec = AcpCodec(cwd="/w", auth_method="key")
    [init] = codec.start()
    d = respond(codec, init, init_result(auth=[{"id": "login", "name": "L"}, {"id": "key", "name": "K"}]))
    assert d.agent is not None and d.agent["auth_methods"] == ["login", "key"]
    [auth] = d.replies
    assert wire(auth)["method"] == "authenticate" and wire(auth)["params"] == {"methodId": "key"}
    d = respond(codec, auth, {})
    assert kinds(d) == ["agent.other"] and d.fatal is None
    [new] = d.replies
    assert wire(new)["method"] == "session/new"
    assert respond(codec, new, {"sessionId": "s"}).ready


def test_auth_method_not_offered_is_fatal_auth_required():
    codec = AcpCodec(cwd="/w", auth_method="key")
    [init] = codec.start()
    d = respond(codec, init, init_result(auth=[{"id": "login", "name": "L"}]))
    assert d.fatal is not None and d.fatal.reason == "auth_required"
    assert "login" in d.fatal.message and d.replies == []


def test_authenticate_error_is_fatal():
    codec = AcpCodec(cwd="/w", auth_method="key")
    [init] = codec.start()
    [auth] = respond(codec, init, init_result(auth=[{"id": "key", "name": "K"}])).replies
    d = respond(codec, auth, error={"code": -32603, "message": "bad key"})
    assert d.fatal is not None and d.fatal.reason == "handshake_failed" and d.replies == []


def test_session_new_auth_required_error_is_fatal_auth_required():
    codec, d = initialized()
    [new] = d.replies
    d = respond(codec, new, error={"code": AUTH_REQUIRED, "message": "Please run /login"})
    assert d.fatal is not None and d.fatal.reason == "auth_required"
    assert "Please run /login" in d.fatal.message
    assert kinds(d) == ["agent.other", "notice"] and d.events[0].raw
    assert not d.ready and d.replies == []


@pytest.mark.parametrize("step", ["initialize", "session/new"])
def test_other_handshake_errors_are_fatal_handshake_failed(step):
    codec = AcpCodec(cwd="/w")
    [init] = codec.start()
    if step == "initialize":
        d = respond(codec, init, error={"code": -32603, "message": "boom"})
    else:
        [new] = respond(codec, init, init_result()).replies
        d = respond(codec, new, error={"code": -32603, "message": "boom"})
    assert d.fatal is not None and d.fatal.reason == "handshake_failed"
    assert step in d.fatal.message


def test_session_new_result_without_a_session_id_is_fatal():
    codec, d = initialized()
    [new] = d.replies
    d = respond(codec, new, {"sessionId": 42})
    assert d.fatal is not None and d.fatal.reason == "handshake_failed" and not d.ready


# ---------------------------------------------------------------- id routing


def test_responses_are_matched_by_id_in_any_order():
    codec = ready_codec()
    p1 = codec.encode_prompt([{"type": "text", "text": "one"}])
    p2 = codec.encode_prompt([{"type": "text", "text": "two"}])
    assert wire(p1)["id"] != wire(p2)["id"]
    # the agent's own request reusing our pending id is a request, not a response
    d = codec.decode(
        enc(
            {
                "jsonrpc": "2.0",
                "id": wire(p1)["id"],
                "method": "fs/read_text_file",
                "params": {"sessionId": SID, "path": "/w/a"},
            }
        )
    )
    assert d.requests == [AgentRequest(wire(p1)["id"], "fs/read_text_file", {"sessionId": SID, "path": "/w/a"})]
    second = respond(codec, p2, {"stopReason": "max_tokens"})
    first = respond(codec, p1, {"stopReason": "end_turn"})
    assert second.events[0].data == {"status": "success", "stop_reason": "max_tokens"}
    assert first.events[0].data == {"status": "success", "stop_reason": "end_turn"}
    # each id is answered once: a repeat is unknown
    again = respond(codec, p1, {"stopReason": "end_turn"})
    assert kinds(again) == ["diagnostic"]


@pytest.mark.parametrize("rid", [99, -1, "0", "x", 1.0, True, None, [0], {"a": 0}])
def test_response_to_an_unknown_id_is_a_diagnostic(rid):
    codec = ready_codec()
    codec.encode_prompt([{"type": "text", "text": "hi"}])
    line = enc({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
    d = codec.decode(line)
    [ev] = d.events
    assert ev.kind == "diagnostic" and not ev.relay and ev.raw == line.decode()
    assert ev.data["stream"] == "protocol" and "unknown request id" in ev.data["text"]
    assert d.replies == [] and not d.ready and d.fatal is None


@pytest.mark.parametrize("rid", [7, 0, -3, 2**53 + 1, "abc", "", "0", "ünï\u2028", "\ud800"])
def test_unknown_agent_request_gets_method_not_found_with_the_same_id(rid):
    codec = ready_codec()
    line = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "_zed/whatever", "params": {}}).encode()
    d = codec.decode(line)
    assert kinds(d) == ["agent.other"] and d.events[0].data == {"method": "_zed/whatever"}
    [reply] = d.replies
    obj = wire(reply)
    assert obj["id"] == json.loads(json.dumps(rid)) and type(obj["id"]) is type(rid)
    assert obj["error"]["code"] == METHOD_NOT_FOUND
    assert obj["error"]["data"] == {"method": "_zed/whatever"}
    assert "result" not in obj


@pytest.mark.parametrize("method", ["terminal/create", "elicitation/createX", "session/request_permissionX"])
def test_unimplemented_client_methods_are_method_not_found(method):
    d = ready_codec().decode(enc({"jsonrpc": "2.0", "id": 3, "method": method, "params": {}}))
    [reply] = d.replies
    assert wire(reply)["error"]["code"] == METHOD_NOT_FOUND and wire(reply)["id"] == 3


@pytest.mark.parametrize("rid", [5, "fs-1", 0])
@pytest.mark.parametrize("method", ["fs/read_text_file", "fs/write_text_file"])
def test_fs_requests_are_handed_to_the_caller_with_the_exact_id(method, rid):
    codec = ready_codec()
    params = {"sessionId": SID, "path": "/w/notes.txt", "content": "x", "line": 2, "limit": 3}
    d = codec.decode(enc({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
    assert d.replies == []
    assert d.requests == [AgentRequest(rid, method, params)]
    assert type(d.requests[0].id) is type(rid)
    assert kinds(d) == ["agent.other"] and d.events[0].data == {"method": method, "path": "/w/notes.txt"}
    assert wire(codec.encode_result(rid, {"content": "hi"})) == {
        "jsonrpc": "2.0",
        "id": rid,
        "result": {"content": "hi"},
    }
    assert wire(codec.encode_error(rid, -32002, "Resource not found")) == {
        "jsonrpc": "2.0",
        "id": rid,
        "error": {"code": -32002, "message": "Resource not found"},
    }


@pytest.mark.parametrize("rid", [1.5, 1.0, True, False, None, {"a": 1}, [1], 1e300])
def test_request_with_an_invalid_id_gets_an_error_with_id_null(rid):
    codec = ready_codec()
    line = enc({"jsonrpc": "2.0", "id": rid, "method": "session/request_permission", "params": {}})
    d = codec.decode(line)
    [ev] = d.events
    assert ev.kind == "diagnostic" and not ev.relay and ev.raw == line.decode()
    [reply] = d.replies
    assert wire(reply) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": INVALID_REQUEST, "message": "Invalid request: bad id"},
    }
    assert codec.pending_permissions() == [] and d.requests == []


def test_lines_that_are_not_json_rpc():
    codec = ready_codec()
    for line in (b"not json", b"", b"[1,2]", b"\xff\xfe"):
        [ev] = codec.decode(line).events
        assert ev.kind == "diagnostic" and not ev.relay and ev.raw is None
    for obj in (
        {"jsonrpc": "1.0", "id": 1, "result": {}},
        {"id": 1, "method": "x"},
        {"jsonrpc": "2.0"},
        {"jsonrpc": "2.0", "id": 1},
        {"jsonrpc": "2.0", "method": 5},
    ):
        d = codec.decode(enc(obj))
        [ev] = d.events
        assert ev.kind == "diagnostic" and not ev.relay and ev.raw == json.dumps(obj)
        assert d.replies == []


# ---------------------------------------------------------------- session/update mapping


def test_update_mapping():
    codec = ready_codec()

    def one(line: bytes) -> tuple[str, dict[str, Any]]:
        d = codec.decode(line)
        [ev] = d.events
        assert ev.relay and ev.source == "agent" and ev.kind in KINDS
        return ev.kind, ev.data

    assert one(update("agent_message_chunk", content={"type": "text", "text": "hi"}, messageId="m1")) == (
        "message.delta",
        {"text": "hi", "channel": "text", "message_id": "m1"},
    )
    assert one(update("agent_thought_chunk", content={"type": "text", "text": "hmm"})) == (
        "message.delta",
        {"text": "hmm", "channel": "thought", "message_id": None},
    )
    assert one(update("agent_message_chunk", content={"type": "resource_link", "uri": "file:///a", "name": "a"})) == (
        "message.delta",
        {"text": "[a](file:///a)", "channel": "text", "message_id": None},
    )
    assert one(update("agent_message_chunk", content={"type": "image", "data": "xx"}))[1]["text"] == ""
    assert one(update("user_message_chunk", content={"type": "text", "text": "me"})) == (
        "agent.other",
        {"session_update": "user_message_chunk", "text": "me"},
    )
    assert one(update("user_message_chunk", content={"type": "text", "text": "me"}, messageId="u1")) == (
        "agent.other",
        {"session_update": "user_message_chunk", "text": "me", "message_id": "u1"},
    )
    assert one(
        update("tool_call", toolCallId="t1", title="Read a", kind="read", status="pending", rawInput={"p": 1})
    ) == (
        "tool.call",
        {
            "tool_call_id": "t1",
            "name": "Read a",
            "input": {"p": 1},
            "title": "Read a",
            "kind": "read",
            "status": "pending",
        },
    )
    # a patch carries only the fields present: absent means unchanged, not cleared
    assert one(update("tool_call_update", toolCallId="t1", status="in_progress")) == (
        "tool.call",
        {"tool_call_id": "t1", "status": "in_progress", "update": True},
    )
    assert one(update("tool_call_update", toolCallId="t1", status="completed", rawOutput={"ok": 1})) == (
        "tool.result",
        {"tool_call_id": "t1", "output": {"ok": 1}, "is_error": False},
    )
    assert one(
        update(
            "tool_call_update",
            toolCallId="t1",
            status="failed",
            content=[
                {"type": "content", "content": {"type": "text", "text": "a"}},
                {"type": "diff", "path": "/x", "newText": "n"},
                {"type": "content", "content": {"type": "text", "text": "b"}},
            ],
        )
    ) == ("tool.result", {"tool_call_id": "t1", "output": "ab", "is_error": True})
    entries = [{"content": "a", "priority": "high", "status": "pending"}]
    assert one(update("plan", entries=[*entries, "junk"])) == ("plan", {"entries": entries})
    mode = ("agent.status", {"status": "mode_changed", "mode": "plan"})
    assert one(update("current_mode_update", currentModeId="plan")) == mode
    assert one(update("current_mode_update", modeId="plan")) == mode
    # a usage or config update without its required fields is not passed on half-read
    for broken in ("usage_update", "config_option_update"):
        assert one(update(broken, used=1)) == ("agent.other", {"session_update": broken, "invalid": True})
    assert one(update("usage_update", used=5, size=9, cost={"amount": 0.5, "currency": "EUR"})) == (
        "usage",
        {"used": 5, "size": 9, "cost": {"amount": 0.5, "currency": "EUR"}},
    )
    assert one(update("usage_update", used=5, size=9, cost={"amount": "1"})) == ("usage", {"used": 5, "size": 9})
    assert one(update("session_info_update", title="  Fix the bug ", updatedAt=None, used=1)) == (
        "session.info",
        {"title": "Fix the bug", "updated_at": None},
    )
    for other in (
        "available_commands_update",
        "plan_update",
        "compaction_update",
        "_x/new",
    ):
        assert one(update(other, used=1)) == ("agent.other", {"session_update": other})
    assert one(enc({"jsonrpc": "2.0", "method": "_zed/ping", "params": {}})) == ("agent.other", {"method": "_zed/ping"})
    assert codec.decode(enc({"jsonrpc": "2.0", "method": "_zed/ping"})).replies == []  # never answered


def test_update_for_another_session_is_agent_other_with_foreign_session():
    codec = ready_codec()
    d = codec.decode(update("agent_message_chunk", sid="other", content={"type": "text", "text": "x"}))
    [ev] = d.events
    assert ev.kind == "agent.other" and ev.relay
    assert ev.data == {"session_update": "agent_message_chunk", "foreign_session": "other"}
    # without a sessionId it is taken as ours
    d = codec.decode(
        enc(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "y"}}
                },
            }
        )
    )
    assert kinds(d) == ["message.delta"]


# ---------------------------------------------------------------- prompts and turn ends


def test_encode_prompt_maps_text_image_and_document_blocks():
    codec = ready_codec()
    content = [
        {"type": "text", "text": "look\nat this"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}},
        {"type": "tool_result", "content": "dropped"},
    ]
    obj = wire(codec.encode_prompt(content))
    assert obj["method"] == "session/prompt" and isinstance(obj["id"], int)
    assert obj["params"]["sessionId"] == SID
    assert obj["params"]["prompt"] == [
        {"type": "text", "text": "look\nat this"},
        {"type": "image", "mimeType": "image/png", "data": "iVBO"},
        {"type": "resource", "resource": {"uri": "attachment:document", "mimeType": "application/pdf", "blob": "JVBE"}},
    ]
    assert to_acp_blocks([]) == []


@pytest.mark.parametrize(
    ("result", "status"),
    [
        ({"stopReason": "end_turn", "usage": {"totalTokens": 3}}, "success"),
        ({"stopReason": "max_tokens"}, "success"),
        ({"stopReason": "max_turn_requests"}, "success"),
        ({"stopReason": "refusal"}, "success"),
        ({"stopReason": "cancelled"}, "cancelled"),
        ({"stopReason": "nonsense"}, "error"),
        ({}, "error"),
        (None, "error"),
    ],
)
def test_prompt_result_maps_to_turn_ended(result, status):
    codec = ready_codec()
    p = codec.encode_prompt([{"type": "text", "text": "x"}])
    d = respond(codec, p, result)
    [ev] = d.events
    assert ev.kind == "turn.ended" and not ev.relay
    assert ev.data["status"] == status
    assert ev.data["stop_reason"] == (result or {}).get("stopReason")
    if result and "usage" in result:
        assert ev.data["usage"] == {"total_tokens": 3, "acp": {"usage": result["usage"]}}


def test_prompt_error_is_turn_ended_error_and_auth_required_is_flagged():
    codec = ready_codec()
    p = codec.encode_prompt([{"type": "text", "text": "x"}])
    [ev] = respond(codec, p, error={"code": -32603, "message": "Internal error"}).events
    assert ev.data == {"status": "error", "stop_reason": None, "error": "Internal error (-32603)"}
    p = codec.encode_prompt([{"type": "text", "text": "x"}])
    [ev] = respond(codec, p, error={"code": AUTH_REQUIRED, "message": "login"}).events
    assert ev.data["status"] == "error" and ev.data["error_code"] == "auth_required"


# ---------------------------------------------------------------- cancellation and permissions


def test_permission_request_is_reported_with_its_id_and_options():
    codec = ready_codec()
    d = codec.decode(permission_request(4))
    [ev] = d.events
    assert ev.kind == "permission.requested" and not ev.relay and d.replies == []
    # no tool.call named the tool: the title stands in for its name
    assert ev.data == {
        "request_id": "4",
        "tool": "touch x",
        "input": {"command": "touch x"},
        "options": PERM_OPTIONS,
        "tool_call_id": "t1",
        "title": "touch x",
    }
    assert codec.pending_permissions() == ["4"]


def test_interrupt_cancels_the_session_and_every_pending_permission_then_the_error_is_cancelled():
    codec = ready_codec()
    p = codec.encode_prompt([{"type": "text", "text": "x"}])
    codec.decode(permission_request(0))
    codec.decode(permission_request("p-1"))
    lines = codec.interrupt()
    assert lines is not None
    objs = [wire(x) for x in lines]
    assert objs[0] == {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": SID}}
    assert objs[1:] == [
        {"jsonrpc": "2.0", "id": 0, "result": {"outcome": {"outcome": "cancelled"}}},
        {"jsonrpc": "2.0", "id": "p-1", "result": {"outcome": {"outcome": "cancelled"}}},
    ]
    assert codec.pending_permissions() == []
    assert codec.answer_permission("0", "allow", options=PERM_OPTIONS) is None  # already answered
    # the agent may still send updates before the prompt response (ACP cancellation)
    assert kinds(codec.decode(update("tool_call_update", toolCallId="t1", status="failed"))) == ["tool.result"]
    # an error response to a cancelled prompt is a cancellation (docs/api.md §7.3)
    [ev] = respond(codec, p, error={"code": -32603, "message": "aborted"}).events
    assert ev.kind == "turn.ended"
    assert ev.data == {"status": "cancelled", "stop_reason": None, "reason": "interrupted"}
    # the next prompt's error is an error again
    p = codec.encode_prompt([{"type": "text", "text": "y"}])
    [ev] = respond(codec, p, error={"code": -32603, "message": "boom"}).events
    assert ev.data["status"] == "error"


def test_interrupt_with_no_prompt_in_flight_does_not_turn_the_next_error_into_a_cancel():
    codec = ready_codec()
    p = codec.encode_prompt([{"type": "text", "text": "x"}])
    respond(codec, p, {"stopReason": "end_turn"})
    assert [wire(x)["method"] for x in codec.interrupt() or []] == ["session/cancel"]  # too late: a no-op
    p = codec.encode_prompt([{"type": "text", "text": "y"}])
    [ev] = respond(codec, p, error={"code": -32603, "message": "Internal error"}).events
    assert ev.data["status"] == "error" and ev.data["error"] == "Internal error (-32603)"


def test_interrupt_before_the_session_exists_writes_nothing():
    codec, _ = initialized()
    assert codec.interrupt() == []


@pytest.mark.parametrize(
    ("decision", "options", "option_id", "outcome"),
    [
        ("allow", PERM_OPTIONS, None, {"outcome": "selected", "optionId": "yes"}),
        ("deny", PERM_OPTIONS, None, {"outcome": "selected", "optionId": "no"}),
        ("allow", [PERM_OPTIONS[0], PERM_OPTIONS[2]], None, {"outcome": "selected", "optionId": "always"}),
        ("deny", [PERM_OPTIONS[3], PERM_OPTIONS[1]], None, {"outcome": "selected", "optionId": "never"}),
        ("allow", [PERM_OPTIONS[2], PERM_OPTIONS[3]], None, {"outcome": "cancelled"}),
        ("deny", PERM_OPTIONS[:2], None, {"outcome": "cancelled"}),
        ("deny", [{"optionId": "default", "name": "Default"}], None, {"outcome": "cancelled"}),
        ("allow", [], None, {"outcome": "cancelled"}),
        ("allow", None, None, {"outcome": "cancelled"}),
        ("cancel", PERM_OPTIONS, None, {"outcome": "cancelled"}),
        ("allow", PERM_OPTIONS, "always", {"outcome": "selected", "optionId": "always"}),
        ("deny", None, "acceptEdits", {"outcome": "selected", "optionId": "acceptEdits"}),
    ],
)
def test_answer_permission_picks_the_option_by_kind(decision, options, option_id, outcome):
    codec = ready_codec()
    codec.decode(permission_request(11))
    line = codec.answer_permission("11", decision, option_id=option_id, options=options)
    assert line is not None
    assert wire(line) == {"jsonrpc": "2.0", "id": 11, "result": {"outcome": outcome}}
    assert codec.answer_permission("11", decision, option_id=option_id, options=options) is None
    assert codec.pending_permissions() == []


def test_answer_permission_for_an_unknown_request_is_none_and_ids_round_trip():
    codec = ready_codec()
    assert codec.answer_permission("nope", "allow", options=PERM_OPTIONS) is None
    codec.decode(permission_request("abc"))
    codec.decode(permission_request(2**40))
    assert sorted(codec.pending_permissions()) == sorted(["abc", str(2**40)])
    assert wire(codec.answer_permission(str(2**40), "allow", options=PERM_OPTIONS) or "")["id"] == 2**40
    assert wire(codec.answer_permission("abc", "deny", options=PERM_OPTIONS) or "")["id"] == "abc"


def test_the_bridge_ignores_extra_keyword_arguments_of_the_stream_json_signature():
    codec = ready_codec()
    codec.decode(permission_request(1))
    line = codec.answer_permission("1", "deny", options=PERM_OPTIONS, updated_input={}, message="policy")
    assert wire(line or "")["result"] == {"outcome": {"outcome": "selected", "optionId": "no"}}


def test_encode_shutdown_is_none_and_codec_flags():
    codec = AcpCodec(cwd="/w")
    assert codec.encode_shutdown() is None
    assert (
        codec.protocol == "acp"
        and codec.resume_on_argv is False
        and codec.launch_flags({"permission_prompts": True}) == []
    )


def test_text_documents_become_embedded_text_resources_and_pdfs_blobs():
    from bridge.protocols.acp import to_acp_blocks

    blocks = to_acp_blocks(
        [
            {"type": "document", "source": {"type": "base64", "media_type": "text/plain", "data": "aGVsbG8="}},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}},
        ]
    )
    assert blocks[0]["resource"] == {"uri": "attachment:document", "mimeType": "text/plain", "text": "hello"}
    assert blocks[1]["resource"] == {"uri": "attachment:document", "mimeType": "application/pdf", "blob": "JVBERi0="}


def test_permission_request_names_the_tool_its_tool_call_named():
    # Real claude-agent-acp (issue #9): the permission's toolCall has only a title; the
    # tool.call before it carried the stable name in _meta.claudeCode.toolName.
    codec = ready_codec()
    codec.decode(
        enc(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": SID,
                    "update": {
                        "sessionUpdate": "tool_call",
                        "toolCallId": "t1",
                        "title": "Terminal",
                        "kind": "execute",
                        "_meta": {"claudeCode": {"toolName": "Bash"}},
                    },
                },
            }
        )
    )
    [ev] = codec.decode(permission_request(5)).events
    assert ev.data["tool"] == "Bash" and ev.data["title"] == "touch x"


def test_remembered_tool_names_are_bounded():
    from bridge.protocols.acp import MAX_TOOL_NAMES

    codec = ready_codec()
    for i in range(MAX_TOOL_NAMES + 5):
        codec.decode(
            enc(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {
                        "sessionId": SID,
                        "update": {
                            "sessionUpdate": "tool_call",
                            "toolCallId": f"t{i}",
                            "title": "x",
                            "_meta": {"claudeCode": {"toolName": f"Tool{i}"}},
                        },
                    },
                }
            )
        )
    assert len(codec._tool_names) == MAX_TOOL_NAMES
    # t1 was among the oldest and is forgotten: the title stands in again
    [ev] = codec.decode(permission_request(6)).events
    assert ev.data["tool"] == "touch x"


def test_permission_request_names_the_tool_from_its_own_meta_as_qwen_code_sends_it():
    # Qwen Code 0.24 (ACP): the request's toolCall carries the name in _meta.toolName and
    # no tool_call named it before; the title is a human label ("touch x (Create a file)").
    codec = ready_codec()
    line = json.loads(permission_request(7))
    line["params"]["toolCall"]["_meta"] = {"toolName": "run_shell_command"}
    [ev] = codec.decode(enc(line)).events
    assert ev.data["tool"] == "run_shell_command" and ev.data["title"] == "touch x"


# -- session modes (session/set_mode, current_mode_update)

MODES = {
    "currentModeId": "default",
    "availableModes": [
        {"id": "default", "name": "Default", "description": "asks"},
        {"id": "plan", "name": "Plan", "description": None},
        {"id": 3, "name": "not a mode"},
    ],
}


def moded_codec() -> tuple[AcpCodec, AcpDecoded]:
    codec, d = initialized()
    [new] = d.replies
    return codec, respond(codec, new, {"sessionId": SID, "modes": MODES})


def test_the_agents_modes_are_kept_in_its_agent_info_the_well_formed_part():
    codec, d = moded_codec()
    assert d.ready
    want = {"currentModeId": "default", "availableModes": [MODES["availableModes"][0], {"id": "plan", "name": "Plan"}]}
    assert codec.modes == want
    assert d.agent is not None and d.agent["modes"] == want and d.agent["info"] == {"name": "fake", "version": "1"}
    # An agent that reports none: no set_mode line at all, and agent_info is left as initialize made it.
    plain = ready_codec()
    assert plain.modes is None and plain.set_mode("plan", "r1") is None


def test_set_mode_is_the_agents_own_request_and_its_answer_is_routed_back():
    codec, _ = moded_codec()
    line = codec.set_mode("plan", "route-1")
    assert line is not None
    req = wire(line)
    assert req["method"] == "session/set_mode" and req["params"] == {"sessionId": SID, "modeId": "plan"}
    d = respond(codec, req, {})
    assert d.routed == [
        ("route-1", json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": {}}, separators=(",", ":")))
    ]
    [status] = [e for e in d.events if e.kind == "agent.status"]
    assert status.data == {"status": "mode_changed", "mode": "plan"}
    assert codec.modes is not None and codec.modes["currentModeId"] == "plan"
    assert d.agent is not None and d.agent["modes"]["currentModeId"] == "plan"


def test_a_refused_set_mode_changes_nothing_and_its_error_goes_back():
    codec, _ = moded_codec()
    req = wire(codec.set_mode("yolo", "route-2") or "")
    err = {"code": -32603, "message": "Internal error", "data": {"details": "Invalid Mode"}}
    d = respond(codec, req, error=err)
    [(route, text)] = d.routed
    assert route == "route-2" and json.loads(text)["error"] == err
    assert [e.kind for e in d.events] == ["agent.other"] and d.agent is None
    assert codec.modes is not None and codec.modes["currentModeId"] == "default"


def test_current_mode_update_keeps_the_agent_info_current():
    codec, _ = moded_codec()
    d = codec.decode(update("current_mode_update", currentModeId="plan"))
    assert [e.data for e in d.events] == [{"status": "mode_changed", "mode": "plan"}]
    assert d.agent is not None and d.agent["modes"]["currentModeId"] == "plan"
    assert codec.decode(update("current_mode_update", currentModeId="plan")).agent is None  # unchanged
    plain = ready_codec()
    assert plain.decode(update("current_mode_update", currentModeId="plan")).agent is None  # no modes reported


# ---------------------------------------------------------------- config options, usage, session info

MODEL_OPTION = {
    "id": "model",
    "name": "Model",
    "category": "model",
    "type": "select",
    "currentValue": "fast",
    "options": [{"value": "fast", "name": "Fast"}, {"value": "deep", "name": "Deep", "description": "slow"}],
}
BRAVE = {"id": "brave", "name": "Brave", "type": "boolean", "currentValue": False}
GROUPED = {
    "id": "effort",
    "name": "Effort",
    "category": "_ours",
    "type": "select",
    "currentValue": "hi",
    "options": [{"group": "g", "name": "G", "options": [{"value": "hi", "name": "High"}, {"nope": 1}]}],
}


def configured_codec(result: dict[str, Any], **kw: Any) -> tuple[AcpCodec, AcpDecoded]:
    codec, d = initialized(**kw)
    [req] = d.replies
    return codec, respond(codec, req, {"sessionId": SID, **result})


def test_config_options_are_kept_in_agent_info_the_well_formed_part_and_give_the_model():
    junk = [
        {"id": "x", "name": "X", "type": "slider", "currentValue": 1},  # an unknown type: ignored
        {"id": "y", "name": "Y", "type": "select", "currentValue": "zz", "options": [{"value": "a", "name": "A"}]},
        {"id": "b", "name": "B", "type": "boolean", "currentValue": "yes"},
        {**MODEL_OPTION, "name": "again"},  # a repeated id: the first one counts
        "junk",
    ]
    codec, d = configured_codec({"configOptions": [MODEL_OPTION, BRAVE, GROUPED, *junk]})
    grouped = {**GROUPED, "options": [{"group": "g", "name": "G", "options": [{"value": "hi", "name": "High"}]}]}
    assert codec.config_options == [MODEL_OPTION, BRAVE, grouped]
    assert d.agent is not None and d.agent["config_options"] == [MODEL_OPTION, BRAVE, grouped]
    [started] = d.events
    assert started.data["model"] == "fast"
    # none reported: no config_options key, no request line
    codec, d = configured_codec({})
    assert d.agent is None and codec.config_options is None
    assert codec.set_config_option("model", "deep", "r") is None


def test_set_config_option_is_the_bridges_request_and_the_full_list_goes_back():
    codec, _ = configured_codec({"configOptions": [MODEL_OPTION, BRAVE]})
    req = wire(codec.set_config_option("model", "deep", "route-1") or "")
    assert req["method"] == "session/set_config_option"
    assert req["params"] == {"sessionId": SID, "configId": "model", "value": "deep"}
    now = [{**MODEL_OPTION, "currentValue": "deep"}, BRAVE]
    d = respond(codec, req, {"configOptions": now})
    [(route, text)] = d.routed
    assert route == "route-1" and json.loads(text) == {
        "jsonrpc": "2.0",
        "id": req["id"],
        "result": {"configOptions": now},
    }
    assert [(e.kind, e.data) for e in d.events] == [
        ("agent.status", {"status": "config_changed", "config_options": now})
    ]
    assert d.agent is not None and d.agent["config_options"] == now
    # a boolean is sent with its type
    req = wire(codec.set_config_option("brave", True, "route-2") or "")
    assert req["params"] == {"sessionId": SID, "configId": "brave", "value": True, "type": "boolean"}
    d = respond(codec, req, {})  # an answer without the list: the known one, changed
    assert d.agent is not None and d.agent["config_options"][1]["currentValue"] is True


def test_a_refused_set_config_option_changes_nothing_and_its_error_goes_back_as_it_came():
    codec, _ = configured_codec({"configOptions": [MODEL_OPTION]})
    req = wire(codec.set_config_option("nope", "x", "route-3") or "")
    err = {"code": -32602, "message": "Invalid params", "data": {"details": "unknown configId"}}
    d = respond(codec, req, error=err)
    [(route, text)] = d.routed
    assert route == "route-3" and json.loads(text)["error"] == err
    assert kinds(d) == ["agent.other"] and d.agent is None
    assert codec.config_options == [MODEL_OPTION]


def test_an_older_agents_models_are_a_model_option_set_with_session_set_model():
    models = {
        "currentModelId": "gemini-pro",
        "availableModels": [
            {"modelId": "gemini-pro", "name": "Pro", "description": None},
            {"modelId": "gemini-flash", "name": "Flash", "description": "quick"},
            {"name": "no id"},
        ],
    }
    codec, d = configured_codec({"models": models})
    option = {
        "id": "model",
        "name": "Model",
        "category": "model",
        "type": "select",
        "currentValue": "gemini-pro",
        "options": [
            {"value": "gemini-pro", "name": "Pro"},
            {"value": "gemini-flash", "name": "Flash", "description": "quick"},
        ],
    }
    assert d.agent is not None and d.agent["config_options"] == [option]
    req = wire(codec.set_config_option("model", "gemini-flash", "route-4") or "")
    assert req["method"] == "session/set_model"
    assert req["params"] == {"sessionId": SID, "modelId": "gemini-flash"}
    d = respond(codec, req, {})
    [(_, text)] = d.routed
    assert json.loads(text)["result"]["configOptions"] == [{**option, "currentValue": "gemini-flash"}]
    # an agent that sends both: its configOptions win
    codec, d = configured_codec({"models": models, "configOptions": [BRAVE]})
    assert d.agent is not None and d.agent["config_options"] == [BRAVE]
    assert wire(codec.set_config_option("model", "x", "r") or "")["method"] == "session/set_config_option"


def test_an_older_agents_current_model_missing_from_its_list_is_offered_first():
    # Gemini CLI started with --model NAME reports NAME as current without listing it.
    models = {"currentModelId": "custom-1", "availableModels": [{"modelId": "gemini-pro", "name": "Pro"}]}
    _, d = configured_codec({"models": models})
    assert d.agent is not None
    [option] = d.agent["config_options"]
    assert option["currentValue"] == "custom-1"
    assert option["options"] == [{"value": "custom-1", "name": "custom-1"}, {"value": "gemini-pro", "name": "Pro"}]
    # no current model at all: still nothing to show
    _, d = configured_codec({"models": {"availableModels": models["availableModels"]}})
    assert d.agent is None or not d.agent.get("config_options")


def test_config_option_update_replaces_the_list():
    codec, _ = configured_codec({"configOptions": [MODEL_OPTION]})
    now = [{**MODEL_OPTION, "currentValue": "deep"}]
    d = codec.decode(update("config_option_update", configOptions=now))
    assert [(e.kind, e.data) for e in d.events] == [
        ("agent.status", {"status": "config_changed", "config_options": now})
    ]
    assert d.events[0].relay and d.agent is not None and d.agent["config_options"] == now


def test_session_info_update_is_kept_in_agent_info_and_is_an_event():
    codec = ready_codec()
    d = codec.decode(update("session_info_update", title="Refactor", updatedAt="2026-12-06T10:00:00Z"))
    assert [(e.kind, e.data) for e in d.events] == [
        ("session.info", {"title": "Refactor", "updated_at": "2026-12-06T10:00:00Z"})
    ]
    assert d.agent is not None and d.agent["session_info"] == {"title": "Refactor", "updatedAt": "2026-12-06T10:00:00Z"}
    d = codec.decode(update("session_info_update", title=None))  # null clears; the rest stays
    assert d.agent is not None and d.agent["session_info"] == {"title": None, "updatedAt": "2026-12-06T10:00:00Z"}
    long = codec.decode(update("session_info_update", title="x" * 600))
    assert long.agent is not None and long.agent["session_info"]["title"] == "x" * 512
    assert codec.decode(update("session_info_update")).agent is None  # nothing said, nothing changed


def turn(codec: AcpCodec, reports: list[dict[str, Any]], usage: Any = None) -> dict[str, Any] | None:
    p = codec.encode_prompt([{"type": "text", "text": "x"}])
    for r in reports:
        codec.decode(update("usage_update", sid=codec.session_id or SID, **r))
    [ev] = respond(codec, p, {"stopReason": "end_turn", **({"usage": usage} if usage else {})}).events
    out: dict[str, Any] | None = ev.data.get("usage")
    return out


def usd(amount: float) -> dict[str, Any]:
    return {"amount": amount, "currency": "USD"}


def test_each_turn_carries_its_share_of_the_agents_cumulative_cost():
    codec = ready_codec()
    first = turn(codec, [{"used": 10, "size": 100}, {"used": 20, "size": 100, "cost": usd(0.5)}], {"inputTokens": 7})
    assert first is not None and first["cost"] == usd(0.5) and first["context"] == {"used": 20, "size": 100}
    assert first["input_tokens"] == 7 and "output_tokens" not in first  # only what was reported
    # a report between turns (a background task) is an event, counted in the next turn
    [ev] = codec.decode(update("usage_update", used=25, size=100, cost=usd(0.7))).events
    assert ev.kind == "usage"
    second = turn(codec, [{"used": 30, "size": 100, "cost": usd(1.0)}])
    assert second is not None and second["cost"] == usd(0.5) and second["session_cost"] == usd(1.0)
    assert turn(codec, []) is None  # nothing reported: no usage
    # another currency: no share; the next turn counts from there
    third = turn(codec, [{"used": 1, "size": 100, "cost": {"amount": 2.0, "currency": "EUR"}}])
    assert third is not None and "cost" not in third and third["session_cost"]["currency"] == "EUR"
    fourth = turn(codec, [{"used": 1, "size": 100, "cost": {"amount": 2.25, "currency": "EUR"}}])
    assert fourth is not None and fourth["cost"] == {"amount": 0.25, "currency": "EUR"}


def test_a_restored_sessions_first_share_is_unknown_unless_the_agent_reported_before_it():
    codec, d = initialized({"loadSession": True}, resume_id="old")
    [load] = d.replies
    assert respond(codec, load, {}).ready
    first = turn(codec, [{"used": 1, "size": 9, "cost": usd(3.0)}])
    assert first is not None and "cost" not in first and first["session_cost"] == usd(3.0)
    assert (turn(codec, [{"used": 1, "size": 9, "cost": usd(3.5)}]) or {})["cost"] == usd(0.5)
    # a report before the first turn fixes the base
    codec, d = initialized({"loadSession": True}, resume_id="old")
    [load] = d.replies
    respond(codec, load, {})
    codec.decode(update("usage_update", sid="old", used=1, size=9, cost=usd(3.0)))
    assert (turn(codec, [{"used": 1, "size": 9, "cost": usd(3.25)}]) or {})["cost"] == usd(0.25)


def test_a_later_report_without_a_cost_does_not_hide_the_turns_cost():
    codec = ready_codec()
    got = turn(codec, [{"used": 5, "size": 100, "cost": usd(0.5)}, {"used": 9, "size": 100}])
    assert got is not None and got["context"] == {"used": 9, "size": 100}
    assert got["cost"] == usd(0.5) and got["session_cost"] == usd(0.5)
    assert got["acp"]["usage_update"] == {"used": 9, "size": 100}  # the last one, as sent
