"""The ACP test agents speak real JSON-RPC: run each as a subprocess and talk to it raw.

These pin the behaviour that the bridge's ACP dialect tests rely on, so a broken fake
shows up here rather than as a puzzling failure in an end-to-end test."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import TIMEOUT, LineProcess

HERE = Path(__file__).resolve().parent
FAKE = HERE / "fake_acp_agent.py"
SDK = HERE / "sdk_echo_agent.py"


class Peer(LineProcess):
    """The client side of one agent process: numbered requests, a queue of incoming lines."""

    def __init__(self, argv: list[str], env: dict[str, str] | None, stderr_path: Path) -> None:
        super().__init__(argv, env, stderr_path)
        self.next_id = 0

    def request(self, method: str, params: dict[str, Any] | None = None) -> int:
        rid = self.next_id
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        return rid

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def answer(self, rid: Any, result: Any = None, error: dict[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
        if error is not None:
            msg["error"] = error
        else:
            msg["result"] = result
        self.send(msg)

    def recv(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        return json.loads(self.next_line(timeout))

    def until_response(self, rid: int, timeout: float = TIMEOUT) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Everything before the response to our request ``rid`` (notifications and the
        agent's own requests), then that response."""
        before: list[dict[str, Any]] = []
        end = time.monotonic() + timeout
        while True:
            msg = self.recv(max(0.01, end - time.monotonic()))
            if "method" not in msg and msg.get("id") == rid:
                return before, msg
            before.append(msg)

    def until_request(self, method: str, timeout: float = TIMEOUT) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        before: list[dict[str, Any]] = []
        end = time.monotonic() + timeout
        while True:
            msg = self.recv(max(0.01, end - time.monotonic()))
            if msg.get("method") == method and "id" in msg:
                return before, msg
            before.append(msg)

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        _, resp = self.until_response(self.request(method, params))
        return resp


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    peers: list[Peer] = []

    def make(*flags: str, script: Path = FAKE, env: dict[str, str] | None = None) -> Peer:
        full_env = {**os.environ, "FAKE_AGENT_LOG": str(tmp_path / "agent.log"), **(env or {})}
        argv = [sys.executable, str(script), *flags] if script == SDK else [sys.executable, "-I", str(script), *flags]
        peer = Peer(argv, full_env, tmp_path / f"stderr-{len(peers)}.txt")
        peers.append(peer)
        return peer

    try:
        yield make
    finally:
        for peer in peers:
            peer.close()


def updates(msgs: list[dict[str, Any]], kind: str | None = None) -> list[dict[str, Any]]:
    ups = [m["params"]["update"] for m in msgs if m.get("method") == "session/update"]
    return [u for u in ups if kind is None or u["sessionUpdate"] == kind]


def text_of(msgs: list[dict[str, Any]], kind: str = "agent_message_chunk") -> str:
    return "".join(u["content"]["text"] for u in updates(msgs, kind))


def start(peer: Peer, cwd: str = "/tmp") -> str:
    init = peer.call(
        "initialize",
        {
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": False},
            "clientInfo": {"name": "test", "version": "0"},
        },
    )
    assert "result" in init, init
    new = peer.call("session/new", {"cwd": cwd, "mcpServers": []})
    return new["result"]["sessionId"]


def prompt(peer: Peer, sid: str, text: str) -> int:
    return peer.request("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]})


# -- the scripted fake agent


def test_echo_turn_streams_chunks_before_the_response(spawn: Any, tmp_path: Path) -> None:
    peer = spawn()
    init = peer.call(
        "initialize",
        {
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": True}},
            "clientInfo": {"name": "test", "version": "0"},
        },
    )["result"]
    assert init["protocolVersion"] == 1
    assert init["agentCapabilities"]["loadSession"] is True
    assert init["agentCapabilities"]["promptCapabilities"] == {"image": True, "embeddedContext": True}
    assert init["agentCapabilities"]["sessionCapabilities"] == {"list": {}}
    assert init["agentInfo"] == {"name": "fake-acp", "title": "Fake ACP", "version": "1.0"}
    assert init["authMethods"] == []
    sid = peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})["result"]["sessionId"]
    assert sid.startswith("acp-")

    before, resp = peer.until_response(
        peer.request(
            "session/prompt",
            {
                "sessionId": sid,
                "prompt": [
                    {"type": "text", "text": "hello"},
                    {"type": "image", "mimeType": "image/png", "data": "AA=="},
                ],
            },
        )
    )
    assert resp["result"] == {"stopReason": "end_turn"}
    chunks = updates(before, "agent_message_chunk")
    assert len(chunks) == 3
    assert len({c["messageId"] for c in chunks}) == 1
    assert text_of(before) == "echo: hello [image]"
    assert updates(before)[-1]["sessionUpdate"] == "usage_update"
    assert all(m["params"]["sessionId"] == sid for m in before)

    # The log has the start record, every stdin line and the client's capabilities.
    log = [json.loads(line) for line in (tmp_path / "agent.log").read_text().splitlines()]
    assert log[0]["event"] == "start" and log[0]["pid"] == peer.proc.pid
    assert sum(1 for e in log if e["event"] == "stdin") == 3
    init_entry = next(e for e in log if e["event"] == "initialize")
    assert init_entry["clientCapabilities"] == {"fs": {"readTextFile": True}}
    assert init_entry["clientInfo"]["name"] == "test"

    peer.proc.stdin.close()
    assert peer.wait() == 0


@pytest.mark.parametrize(
    ("word", "kinds"),
    [
        ("think", ["agent_thought_chunk", "agent_message_chunk"]),
        ("tool", ["tool_call", "tool_call_update", "tool_call_update", "agent_message_chunk"]),
        ("plan", ["plan"]),
    ],
)
def test_directive_update_shapes(spawn: Any, word: str, kinds: list[str]) -> None:
    peer = spawn()
    sid = start(peer)
    before, resp = peer.until_response(prompt(peer, sid, word))
    assert resp["result"] == {"stopReason": "end_turn"}
    assert [u["sessionUpdate"] for u in updates(before)] == kinds
    if word == "tool":
        call, running, done = updates(before)[:3]
        assert call["status"] == "pending" and call["kind"] == "execute" and call["rawInput"] == {"command": "echo hi"}
        assert running["status"] == "in_progress" and running["toolCallId"] == call["toolCallId"]
        assert done["status"] == "completed" and done["rawOutput"] == "hi"
        assert done["content"] == [{"type": "content", "content": {"type": "text", "text": "hi"}}]
    if word == "plan":
        assert len(updates(before)[0]["entries"]) == 2


def test_ask_waits_for_the_permission_answer(spawn: Any) -> None:
    peer = spawn()
    sid = start(peer)
    rid = prompt(peer, sid, "ask rm -rf build")
    before, req = peer.until_request("session/request_permission")
    assert req["id"] == 0  # the agent's own id space starts at 0, like the client's
    assert updates(before, "tool_call")[0]["toolCallId"] == req["params"]["toolCall"]["toolCallId"]
    assert req["params"]["sessionId"] == sid
    assert req["params"]["toolCall"]["rawInput"] == {"command": "rm -rf build"}
    assert [o["optionId"] for o in req["params"]["options"]] == ["allow", "allow_always", "reject"]
    peer.quiet(0.2)  # nothing more until answered
    peer.answer(req["id"], {"outcome": {"outcome": "selected", "optionId": "allow"}})
    after, resp = peer.until_response(rid)
    assert resp["result"] == {"stopReason": "end_turn"}
    assert updates(after, "tool_call_update")[0]["status"] == "completed"
    assert text_of(after) == "permission: allow"

    # Cancelled while the permission is pending: the client answers "cancelled".
    rid = prompt(peer, sid, "ask")
    _, req = peer.until_request("session/request_permission")
    assert req["id"] == 1
    peer.notify("session/cancel", {"sessionId": sid})
    peer.answer(req["id"], {"outcome": {"outcome": "cancelled"}})
    after, resp = peer.until_response(rid)
    assert resp["result"] == {"stopReason": "cancelled"}
    assert updates(after, "tool_call_update")[0]["status"] == "failed"
    assert text_of(after) == "permission: cancelled"


def test_requests_are_served_while_a_prompt_runs_and_cancel_stops_it(spawn: Any) -> None:
    peer = spawn()
    sid = start(peer)
    rid = prompt(peer, sid, "slow")
    peer.recv()  # the first tick
    new_id = peer.request("session/new", {"cwd": "/tmp", "mcpServers": []})
    before, resp = peer.until_response(new_id)
    assert resp["result"]["sessionId"] != sid
    assert all(u["sessionUpdate"] == "agent_message_chunk" for u in updates(before))
    peer.notify("session/cancel", {"sessionId": sid})
    _, resp = peer.until_response(rid)
    assert resp["result"] == {"stopReason": "cancelled"}


def test_fs_requests_report_results_and_errors(spawn: Any, tmp_path: Path) -> None:
    peer = spawn()
    sid = start(peer)
    path = str(tmp_path / "notes.txt")
    rid = prompt(peer, sid, f"read {path}")
    _, req = peer.until_request("fs/read_text_file")
    assert req["params"] == {"sessionId": sid, "path": path}
    peer.answer(req["id"], {"content": "line one\n"})
    before, resp = peer.until_response(rid)
    assert text_of(before) == "read: line one\n" and resp["result"]["stopReason"] == "end_turn"

    rid = prompt(peer, sid, f"read {path}.missing")
    _, req = peer.until_request("fs/read_text_file")
    peer.answer(req["id"], error={"code": -32002, "message": "Resource not found"})
    before, _ = peer.until_response(rid)
    assert text_of(before) == "read error -32002: Resource not found"

    rid = prompt(peer, sid, f"write {path} new text here")
    _, req = peer.until_request("fs/write_text_file")
    assert req["params"] == {"sessionId": sid, "path": path, "content": "new text here"}
    peer.answer(req["id"], None)
    before, _ = peer.until_response(rid)
    assert text_of(before) == "write: ok"


def test_unknown_agent_request_and_stray_output(spawn: Any) -> None:
    peer = spawn()
    sid = start(peer)
    rid = prompt(peer, sid, "unknown")
    _, req = peer.until_request("_fake/whatever")
    peer.answer(req["id"], error={"code": -32601, "message": "Method not found"})
    before, _ = peer.until_response(rid)
    assert text_of(before) == "unknown: error -32601"

    rid = prompt(peer, sid, "garbage")
    assert peer.next_line() == "this is not json"
    assert peer.recv() == {"jsonrpc": "2.0"}
    before, _ = peer.until_response(rid)
    assert text_of(before) == "echo: garbage"

    rid = prompt(peer, sid, "twoupdates")
    before, _ = peer.until_response(rid)
    assert before[0]["params"]["sessionId"] != sid
    assert (
        "".join(
            u["content"]["text"]
            for m in before[1:]
            for u in [m["params"]["update"]]
            if u["sessionUpdate"] == "agent_message_chunk"
        )
        == "echo: twoupdates"
    )


def test_unknown_methods_and_bad_params(spawn: Any) -> None:
    peer = spawn()
    sid = start(peer)
    err = peer.call("session/bogus", {"sessionId": sid})["error"]
    assert err == {"code": -32601, "message": "Method not found", "data": {"method": "session/bogus"}}
    peer.notify("_fake/ignored", {})  # unknown notifications get no answer
    assert peer.call("session/new", {"cwd": "relative", "mcpServers": []})["error"]["code"] == -32602
    assert peer.call("session/new", {"cwd": "/tmp"})["error"]["code"] == -32602
    err = peer.call("session/prompt", {"sessionId": "nope", "prompt": [{"type": "text", "text": "x"}]})["error"]
    assert err["code"] == -32603 and err["data"] == {"details": "Session not found"}
    assert peer.call("session/resume", {"sessionId": sid, "cwd": "/tmp"})["error"]["code"] == -32601


def test_load_replays_history_before_its_response(spawn: Any, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    first = spawn(env={"FAKE_AGENT_STATE": str(state)})
    sid = start(first)
    first.until_response(prompt(first, sid, "hello"))
    first.until_response(prompt(first, sid, "again"))
    assert json.loads((state / f"{sid}.json").read_text()) == [
        {"role": "user", "text": "hello"},
        {"role": "agent", "text": "echo: hello"},
        {"role": "user", "text": "again"},
        {"role": "agent", "text": "echo: again"},
    ]
    first.proc.stdin.close()
    assert first.wait() == 0

    second = spawn("--resume-cap", env={"FAKE_AGENT_STATE": str(state)})
    start(second)
    # A stored session is not open until loaded.
    assert second.call("session/prompt", {"sessionId": sid, "prompt": []})["error"]["code"] == -32603
    before, resp = second.until_response(
        second.request("session/load", {"sessionId": sid, "cwd": "/tmp", "mcpServers": []})
    )
    assert resp["result"] == {}
    assert [(u["sessionUpdate"], u["content"]["text"]) for u in updates(before)] == [
        ("user_message_chunk", "hello"),
        ("agent_message_chunk", "echo: hello"),
        ("user_message_chunk", "again"),
        ("agent_message_chunk", "echo: again"),
    ]
    assert all(u["messageId"] for u in updates(before))
    _, resp = second.until_response(prompt(second, sid, "third"))
    assert resp["result"] == {"stopReason": "end_turn"}
    err = second.call("session/load", {"sessionId": "acp-nope", "cwd": "/tmp", "mcpServers": []})["error"]
    assert err["code"] == -32002
    # resume: known → {}, no replay; unknown → -32002
    before, resp = second.until_response(
        second.request("session/resume", {"sessionId": sid, "cwd": "/tmp", "mcpServers": []})
    )
    assert before == [] and resp["result"] == {}
    assert second.call("session/resume", {"sessionId": "acp-nope", "cwd": "/tmp"})["error"]["code"] == -32002
    listed = second.call("session/list", {})["result"]["sessions"]
    assert any(s["sessionId"] == sid and s["title"] == "hello" for s in listed)


def test_version_and_no_load_flags(spawn: Any) -> None:
    peer = spawn("--version", "2", "--no-load")
    init = peer.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})["result"]
    assert init["protocolVersion"] == 2
    assert init["agentCapabilities"]["loadSession"] is False
    err = peer.call("session/load", {"sessionId": "x", "cwd": "/tmp", "mcpServers": []})["error"]
    assert err["code"] == -32601


def test_auth_required_flow(spawn: Any) -> None:
    peer = spawn("--auth-required")
    init = peer.call("initialize", {"protocolVersion": 1})["result"]
    assert init["authMethods"] == [{"id": "fake-key", "name": "Fake key"}]
    err = peer.call("session/new", {"cwd": "/tmp", "mcpServers": []})["error"]
    assert err == {"code": -32000, "message": "Authentication required"}
    assert peer.call("session/load", {"sessionId": "x", "cwd": "/tmp", "mcpServers": []})["error"]["code"] == -32000
    assert peer.call("authenticate", {"methodId": "other"})["error"]["code"] == -32602
    assert peer.call("authenticate", {"methodId": "fake-key"})["result"] == {}
    assert peer.call("session/new", {"cwd": "/tmp", "mcpServers": []})["result"]["sessionId"]


def test_delayed_initialize_answers_out_of_order(spawn: Any) -> None:
    peer = spawn("--delay-initialize", "0.3")
    init_id = peer.request("initialize", {"protocolVersion": 1})
    new_id = peer.request("session/new", {"cwd": "/tmp", "mcpServers": []})
    first, second = peer.recv(), peer.recv()
    assert (first["id"], second["id"]) == (new_id, init_id)
    assert first["result"]["sessionId"].startswith("acp-") and second["result"]["protocolVersion"] == 1


def test_exits_crash_and_hang(spawn: Any) -> None:
    peer = spawn()
    sid = start(peer)
    prompt(peer, sid, "crash")
    assert updates([peer.recv()])[0]["content"]["text"] == "about to crash"
    assert peer.wait() == 3
    assert "crashing on purpose" in peer.stderr_text()

    assert spawn("--exit-at-start").wait() == 5

    peer = spawn("--exit-after-initialize")
    assert peer.call("initialize", {"protocolVersion": 1})["result"]["protocolVersion"] == 1
    assert peer.wait() == 4

    peer = spawn()
    sid = start(peer)
    prompt(peer, sid, "hang")
    assert text_of([peer.recv()]) == "hanging"
    peer.notify("session/cancel", {"sessionId": sid})
    peer.quiet(0.3)  # cancel ignored: no response
    assert peer.call("session/new", {"cwd": "/tmp", "mcpServers": []})["result"]  # still serving
    peer.proc.stdin.close()
    assert peer.wait() == 0


# -- the official-SDK echo agent


def test_sdk_echo_agent(spawn: Any) -> None:
    pytest.importorskip("acp")
    peer = spawn(script=SDK)
    init = peer.call(
        "initialize",
        {
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True},
            "clientInfo": {"name": "test", "version": "0"},
        },
    )["result"]
    assert init["protocolVersion"] == 1
    assert init["agentCapabilities"]["loadSession"] is True
    assert init["agentInfo"]["name"] == "sdk-echo"
    sid = peer.call("session/new", {"cwd": "/tmp", "mcpServers": []})["result"]["sessionId"]

    before, resp = peer.until_response(
        peer.request(
            "session/prompt",
            {"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]},
        )
    )
    assert resp["result"] == {"stopReason": "end_turn"}
    assert [u["content"]["text"] for u in updates(before, "agent_message_chunk")] == ["hello", "world"]

    before, resp = peer.until_response(
        peer.request("session/load", {"sessionId": "any-id", "cwd": "/tmp", "mcpServers": []})
    )
    assert before == [] and resp["result"] == {}
    peer.notify("session/cancel", {"sessionId": sid})
    err = peer.call("session/bogus", {})["error"]
    assert err["code"] == -32601 and err["data"] == {"method": "session/bogus"}
    # A newer version is negotiated down to the SDK's.
    assert peer.call("initialize", {"protocolVersion": 99})["result"]["protocolVersion"] == 1
    peer.proc.stdin.close()
    assert peer.wait() == 0


def test_modes_are_advertised_and_set_mode_is_strict(spawn: Any, tmp_path: Path) -> None:
    plain = spawn()
    sid = start(plain)
    assert plain.call("session/set_mode", {"sessionId": sid, "modeId": "plan"})["error"]["code"] == -32601
    peer = spawn("--modes", env={"FAKE_AGENT_STATE": str(tmp_path)})
    peer.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    new = peer.call("session/new", {"cwd": "/tmp", "mcpServers": []})["result"]
    sid = new["sessionId"]
    assert new["modes"]["currentModeId"] == "default"
    assert [m["id"] for m in new["modes"]["availableModes"]] == ["default", "acceptEdits", "plan"]
    err = peer.call("session/set_mode", {"sessionId": sid, "modeId": "yolo"})["error"]
    assert err == {"code": -32603, "message": "Internal error", "data": {"details": "Invalid Mode"}}
    err = peer.call("session/set_mode", {"sessionId": "nope", "modeId": "plan"})["error"]
    assert err["data"] == {"details": "Session not found"}
    before, resp = peer.until_response(peer.request("session/set_mode", {"sessionId": sid, "modeId": "plan"}))
    assert resp["result"] == {} and updates(before) == []  # no current_mode_update for the client's own change
    before, _ = peer.until_response(prompt(peer, sid, "whatmode"))
    assert text_of(before) == "mode: plan"
    before, _ = peer.until_response(prompt(peer, sid, "mode acceptEdits"))
    assert updates(before, "current_mode_update") == [
        {"sessionUpdate": "current_mode_update", "currentModeId": "acceptEdits"}
    ]
    load = peer.call("session/load", {"sessionId": sid, "cwd": "/tmp", "mcpServers": []})["result"]
    assert load["modes"]["currentModeId"] == "acceptEdits"


def test_config_options_are_strict_as_the_sdk_and_boolean_ones_need_the_capability(spawn: Any) -> None:
    from acp.schema import NewSessionResponse, SetSessionConfigOptionResponse, UsageUpdate

    plain = spawn()
    sid = start(plain)
    assert (
        plain.call("session/set_config_option", {"sessionId": sid, "configId": "m", "value": "x"})["error"]["code"]
        == -32601
    )
    # a client without boolean support is never sent a boolean option
    peer = spawn("--config-options")
    sid = start(peer)
    listed = peer.call("session/load", {"sessionId": sid, "cwd": "/tmp", "mcpServers": []})["result"]["configOptions"]
    assert [o["id"] for o in listed] == ["mode", "model"]
    peer = spawn("--config-options")
    caps = {"session": {"configOptions": {"boolean": {}}}}
    peer.call("initialize", {"protocolVersion": 1, "clientCapabilities": caps})
    new = peer.call("session/new", {"cwd": "/tmp", "mcpServers": []})["result"]
    NewSessionResponse.model_validate(new)  # the SDK's own model takes it
    sid = new["sessionId"]
    assert [(o["id"], o["type"]) for o in new["configOptions"]] == [
        ("mode", "select"),
        ("model", "select"),
        ("brave", "boolean"),
    ]

    def set_option(**params: Any) -> dict[str, Any]:
        return peer.call("session/set_config_option", {"sessionId": sid, **params})

    ok = set_option(configId="model", value="deep")["result"]
    assert SetSessionConfigOptionResponse.model_validate(ok).config_options[1].current_value == "deep"
    assert (
        set_option(configId="brave", value=True, type="boolean")["result"]["configOptions"][2]["currentValue"] is True
    )
    for bad, details in (
        ({"configId": "nope", "value": "x"}, "Unknown config option: nope"),
        ({"configId": "model", "value": "huge"}, "Invalid value for config option model: huge"),
        ({"configId": "model", "value": True, "type": "boolean"}, "Invalid value for config option model: True"),
        ({"configId": "brave", "value": True}, "brave is a boolean option: send type boolean and a boolean value"),
    ):
        assert set_option(**bad)["error"] == {"code": -32602, "message": "Invalid params", "data": {"details": details}}
    assert set_option(configId="model")["error"]["code"] == -32602
    # the usage directive: a usage_update the SDK's model takes, and usage in the answer
    before, resp = peer.until_response(prompt(peer, sid, "usage"))
    [usage] = updates(before, "usage_update")
    UsageUpdate.model_validate(usage)
    assert resp["result"]["usage"]["totalTokens"] == 17
    # the older models API: session/set_model
    old = spawn("--models")
    sid = start(old)
    models = old.call("session/load", {"sessionId": sid, "cwd": "/tmp", "mcpServers": []})["result"]["models"]
    assert models["currentModelId"] == "fast"
    assert old.call("session/set_model", {"sessionId": sid, "modelId": "deep"})["result"] == {}
    assert old.call("session/set_model", {"sessionId": sid, "modelId": "huge"})["error"]["code"] == -32602
