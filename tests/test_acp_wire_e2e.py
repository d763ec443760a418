"""Issue #37's cross-cutting pieces end to end, through a real daemon: a client's MCP servers
reaching the agent (ACP: in session/new; stream-json: a generated --mcp-config file), W3C
trace context from a gateway prompt or a REST header into the ACP agent's session/prompt
and the log, and ``$/cancel_request`` of a prompt. The gateway's client is a plain
WebSocket JSON-RPC client, so every message is exactly what is written here."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import websockets
from conftest import STEP_TIMEOUT, agent_log, profile_toml, wait_until
from test_acp_e2e import config as acp_config
from test_acp_e2e import sent
from test_acp_gateway_e2e import answer_to, rpc

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ENV_SECRET = "env-s3cret-0xA11CE"
HEADER_SECRET = "hdr-s3cret-0xB0B"
STDIO = {
    "name": "files",
    "command": "/usr/bin/env",
    "args": ["--", "mcp-files"],
    "env": [{"name": "API_TOKEN", "value": ENV_SECRET}],
}
HTTP = {
    "type": "http",
    "name": "web",
    "url": "http://127.0.0.1:9/mcp",
    "headers": [{"name": "Authorization", "value": f"Bearer {HEADER_SECRET}"}],
}


def req(rid: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


async def gateway(d: Any, profile: str) -> Any:
    conn = await websockets.connect(f"{d.ws_url}/v1/acp/{profile}", additional_headers=d.headers)
    init = await rpc(conn, req(0, "initialize", {"protocolVersion": 1}))
    assert init["result"]["agentCapabilities"]["mcpCapabilities"] == {"http": True, "sse": True}
    return conn


def daemon_lines(d: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in d.stderr_path.read_text().splitlines() if line.startswith("{")]


async def test_mcp_servers_and_trace_context_reach_an_acp_agent(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(acp_config(agent_env))
    conn = await gateway(d, "acp")
    new = await answer_to(conn, req(1, "session/new", {"cwd": str(tmp_path), "mcpServers": [STDIO, HTTP]}))
    sid = new["result"]["sessionId"]
    # The fake says no mcpCapabilities: it takes stdio servers only, so the http one is left out.
    (opened,) = sent(tmp_path, "session/new")
    assert opened["params"]["mcpServers"] == [STDIO]

    meta = {"traceparent": TP, "tracestate": "congo=t61rcWkgMzE", "agent-bridge": {"client_id": "c1"}}
    done = await answer_to(conn, req(2, "session/prompt", {"sessionId": sid, "prompt": [_text("hi")], "_meta": meta}))
    assert done["result"]["stopReason"] == "end_turn"
    bad = {"traceparent": TP.upper(), "tracestate": "x=1"}  # not lower-case hex: dropped, with its tracestate
    done = await answer_to(conn, req(3, "session/prompt", {"sessionId": sid, "prompt": [_text("hi")], "_meta": bad}))
    assert done["result"]["stopReason"] == "end_turn"
    first, second = sent(tmp_path, "session/prompt")
    assert first["params"]["_meta"] == {"traceparent": TP, "tracestate": "congo=t61rcWkgMzE"}
    assert "_meta" not in second["params"]

    async with d.http() as http:
        rest = {"traceparent": TP.replace("-01", "-00"), "tracestate": "rojo=00f067aa0ba902b7"}
        r = await http.post(f"/v1/threads/{sid}/messages", json={"text": "over rest"}, headers=rest)
        assert r.status_code == 202, r.text
        await wait_until(lambda: len(sent(tmp_path, "session/prompt")) == 3, what="the REST prompt at the agent")
        assert sent(tmp_path, "session/prompt")[2]["params"]["_meta"] == rest
    ws = await d.ws(sid)
    acc = await ws.prompt("over the websocket", traceparent=TP, tracestate="ws=1")
    assert acc["kind"] == "client.accepted", acc
    await wait_until(lambda: len(sent(tmp_path, "session/prompt")) == 4, what="the WebSocket prompt at the agent")
    assert sent(tmp_path, "session/prompt")[3]["params"]["_meta"] == {"traceparent": TP, "tracestate": "ws=1"}
    async with d.http() as http:
        shown = (await http.get(f"/v1/threads/{sid}")).text
        events = (await http.get(f"/v1/threads/{sid}/events?after=0")).text
    thread = json.loads(shown)
    assert thread["options"]["mcp_servers"][0]["env"] == [{"name": "API_TOKEN", "value": "[redacted]"}]
    assert thread["options"]["mcp_servers"][1]["headers"] == [{"name": "Authorization", "value": "[redacted]"}]
    assert ENV_SECRET not in shown and HEADER_SECRET not in shown
    assert ENV_SECRET not in events and HEADER_SECRET not in events  # nor in what was written to the agent

    traced = [e for e in daemon_lines(d) if e.get("event") == "turn.traced"]
    assert [(e["thread_id"], e["trace_id"], e["parent_span_id"]) for e in traced] == [(sid, TP[3:35], TP[36:52])] * 3
    log_text = d.stderr_path.read_text()
    assert ENV_SECRET not in log_text and HEADER_SECRET not in log_text and TP.upper() not in log_text
    await conn.close()


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


async def test_hostile_mcp_servers_are_refused_and_remote_urls_need_the_opt_in(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(acp_config(agent_env))
    conn = await gateway(d, "acp")
    hostile: list[Any] = [
        {"servers": "nope"},
        [{**STDIO, "command": "relative/bin"}],
        [{**STDIO, "env": [{"name": "A=B", "value": "x"}]}],
        [{**HTTP, "headers": [{"name": "X", "value": "a\r\nInjected: 1"}]}],
        [{**HTTP, "url": "file:///etc/passwd"}],
        [{"type": "acp", "name": "a", "serverId": "s"}],
        [{**STDIO, "extra": 1}],
        [STDIO, STDIO],  # the same name twice
        [{**STDIO, "name": f"s{i}"} for i in range(17)],
        [{**STDIO, "args": ["x" * 5000]}],
        [{**STDIO, "command": "/bin/x\x00y"}],
    ]
    for i, servers in enumerate(hostile):
        got = await answer_to(conn, req(10 + i, "session/new", {"cwd": str(tmp_path), "mcpServers": servers}))
        assert got["error"]["code"] == -32602, (servers, got)
    remote = {**HTTP, "url": "https://mcp.example.com/mcp"}
    got = await answer_to(conn, req(50, "session/new", {"cwd": str(tmp_path), "mcpServers": [remote]}))
    assert got["error"]["data"]["code"] == "remote_url_refused", got
    via_args = {**STDIO, "args": ["https://mcp.example.com/sse"]}
    got = await answer_to(conn, req(51, "session/new", {"cwd": str(tmp_path), "mcpServers": [via_args]}))
    assert got["error"]["data"]["code"] == "remote_url_refused", got
    assert not sent(tmp_path, "session/new")  # no agent was ever started
    bad_load = {"sessionId": "thr_x", "cwd": str(tmp_path), "mcpServers": [{**STDIO, "command": "x"}]}
    assert (await answer_to(conn, req(60, "session/load", bad_load)))["error"]["code"] == -32602
    async with d.http() as http:
        assert (await http.get("/v1/threads")).json()["threads"] == []
    await conn.close()


async def test_cancel_request_of_a_prompt_cancels_its_turn(daemon_factory: Any, tmp_path: Path, agent_env: Any) -> None:
    d = await daemon_factory(acp_config(agent_env))
    conn = await gateway(d, "acp")
    sid = (await answer_to(conn, req(1, "session/new", {"cwd": str(tmp_path), "mcpServers": []})))["result"][
        "sessionId"
    ]
    await conn.send(json.dumps(req("p-1", "session/prompt", {"sessionId": sid, "prompt": [_text("slow")]})))
    while True:  # the turn is running once the agent's first tick arrives
        msg = json.loads(await asyncio.wait_for(conn.recv(), STEP_TIMEOUT))
        if msg.get("method") == "session/update" and "tick" in json.dumps(msg):
            break
    # Ids that name nothing of ours, or nothing at all, are ignored (a notification has no answer).
    for params in ({"requestId": "no-such"}, {"requestId": None}, {}, []):
        await conn.send(json.dumps({"jsonrpc": "2.0", "method": "$/cancel_request", "params": params}))
    await conn.send(json.dumps({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "p-1"}}))
    while True:
        msg = json.loads(await asyncio.wait_for(conn.recv(), STEP_TIMEOUT))
        if "method" not in msg:
            break
    assert msg == {"jsonrpc": "2.0", "id": "p-1", "result": {"stopReason": "cancelled"}}
    assert [e for e in agent_log(tmp_path) if e["event"] == "cancel"]  # the agent got session/cancel
    listed = await answer_to(conn, req(9, "session/list", {}))
    assert listed["result"]["sessions"][0]["sessionId"] == sid  # the connection is fine
    await conn.close()


async def test_stream_json_agent_gets_a_private_mcp_config_file_and_rest_takes_a_traceparent(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    cfg = "[server]\nstop_grace_s = 2\n\n" + profile_toml("sj", "stream-json", agent_env)
    d = await daemon_factory(cfg, extra_env={"HOME": str(home)})
    async with d.http() as http:
        bad = {"agent": "sj", "options": {"mcp_servers": [{**HTTP, "headers": [{"name": "X", "value": "a\nb"}]}]}}
        r = await http.post("/v1/threads", json=bad)
        assert r.status_code == 422 and r.json()["error"]["code"] == "bad_mcp_config", r.text
        r = await http.post("/v1/threads", json={"agent": "sj", "options": {"mcp_servers": [STDIO, HTTP]}})
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        assert ENV_SECRET not in r.text and HEADER_SECRET not in r.text
        headers = {"traceparent": TP, "tracestate": "a=1"}
        r = await http.post(f"/v1/threads/{tid}/messages", json={"text": "hello"}, headers=headers)
        assert r.status_code == 202, r.text

        async def ended() -> bool:
            events = (await http.get(f"/v1/threads/{tid}/events?after=0")).json()["events"]
            return any(e["kind"] == "turn.ended" for e in events)

        await _until(ended, "the turn's end")
        (loaded,) = [e for e in agent_log(tmp_path) if e["event"] == "mcp_config"]
        path = home / ".agent-bridge-mcp" / f"{tid}.json"
        assert loaded["files"] == [str(path)] and loaded["modes"] == ["0o600"]
        assert loaded["servers"] == {
            "files": {
                "type": "stdio",
                "command": "/usr/bin/env",
                "args": ["--", "mcp-files"],
                "env": {"API_TOKEN": ENV_SECRET},
            },
            "web": {
                "type": "http",
                "url": "http://127.0.0.1:9/mcp",
                "headers": {"Authorization": f"Bearer {HEADER_SECRET}"},
            },
        }
        assert os.stat(path.parent).st_mode & 0o777 == 0o700
        (start,) = [e for e in agent_log(tmp_path) if e["event"] == "start"]
        assert start["argv"][-2:] == ["--mcp-config", str(path)]
        assert (await http.post(f"/v1/threads/{tid}/stop")).status_code == 202
        await wait_until(lambda: not path.exists(), what="the file removed once its agent exited")
    traced = [e for e in daemon_lines(d) if e.get("event") == "turn.traced"]
    assert [(e["thread_id"], e["trace_id"]) for e in traced] == [(tid, TP[3:35])]
    log_text = d.stderr_path.read_text()
    assert ENV_SECRET not in log_text and HEADER_SECRET not in log_text


async def _until(check: Any, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + STEP_TIMEOUT
    while not await check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
