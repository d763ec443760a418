"""The official ACP SDKs as clients of the bridge (issue #37 item 3): the TypeScript SDK
(tests/support/acp_sdk_client.mjs, the version pinned in tests/support/acp_sdk_pins.txt)
and the Python SDK (tests/support/acp_sdk_client.py), each over the gateway's WebSocket and
over stdio through ``agent-bridge acp``, run the same plans against a real daemon whose
sessions are served by the strict fake ACP agent. Both SDKs check every message the bridge
sends against the ACP schema (the scripts add what an SDK leaves unchecked: the results of
its own requests), so a shape the bridge gets wrong fails here."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import websockets
from conftest import ROOT, Daemon, agent_log, base_config, new_thread
from support import acp_sdk_client
from test_acp_e2e import acp_profile

SUPPORT = ROOT / "tests" / "support"
SDK_PACKAGE = "@agentclientprotocol/sdk"
CLIENT_DEADLINE_S = 120.0  # one whole plan, node's start included, on two busy cores
CLIENTS = ["ts-ws", "ts-stdio", "py-ws", "py-stdio"]


def _npm_cache() -> Path:
    env = os.environ.get("AGENT_BRIDGE_NPM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "agent-bridge" / "npm"


def _pinned_sdk() -> str:
    (line,) = [
        ln.strip()
        for ln in (SUPPORT / "acp_sdk_pins.txt").read_text().splitlines()
        if ln.strip().startswith(SDK_PACKAGE + "@")
    ]
    return line.rsplit("@", 1)[1]


def _unavailable(reason: str) -> None:
    # As tests/real: CI (scripts/test installs the SDK) fails; a bare checkout is told why.
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (scripts/test installs it)", pytrace=False)
    pytest.skip(f"{reason}; run scripts/test, or npm install --prefix {_npm_cache()} {SDK_PACKAGE}@{_pinned_sdk()}")


def _node_and_sdk() -> tuple[str, Path]:
    sdk = _npm_cache() / "node_modules" / SDK_PACKAGE
    try:
        version = json.loads((sdk / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        version = None
    if version != _pinned_sdk():
        _unavailable(f"{SDK_PACKAGE}@{_pinned_sdk()} is not installed in {_npm_cache()} (found {version})")
    node = shutil.which("node")
    major = 0
    if node:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
        major = int(out.strip().lstrip("v").split(".")[0] or 0)
    if node is None or major < 22:  # its WebSocket transport needs Node's own WebSocket
        _unavailable(f"node 22 or newer is not on PATH (found {node}, major {major})")
    assert node is not None
    return node, sdk


def transport(d: Daemon, kind: str, agent: str) -> dict[str, Any]:
    if kind == "ws":
        return {"kind": "ws", "url": f"{d.ws_url}/v1/acp/{agent}", "token": d.token}
    argv = [sys.executable, "-m", "bridge", "acp", "--url", d.url, "--agent", agent]
    return {"kind": "stdio", "command": argv, "env": {"AGENT_BRIDGE_TOKEN": str(d.token)}}


async def run_plan(client: str, d: Daemon, agent: str, steps: list[dict[str, Any]], tmp: Path) -> dict[str, Any]:
    """The report of ``client`` (``ts-ws``, ``py-stdio``, …) running ``steps``; every
    message the bridge sent fitted the schema."""
    report = await run_client(client, transport(d, client.split("-")[1], agent), steps, tmp)
    assert not report["problems"], report["problems"]
    return report


async def run_client(client: str, where: dict[str, Any], steps: list[dict[str, Any]], tmp: Path) -> dict[str, Any]:
    lang = client.split("-")[0]
    plan: dict[str, Any] = {"transport": where, "steps": steps}
    if lang == "py":
        report = await asyncio.wait_for(acp_sdk_client.run(plan), CLIENT_DEADLINE_S)
    else:
        node, sdk = _node_and_sdk()
        plan["sdk"] = str(sdk)
        path = tmp / f"plan-{client}.json"
        path.write_text(json.dumps(plan))
        proc = await asyncio.create_subprocess_exec(
            node, str(SUPPORT / "acp_sdk_client.mjs"), str(path), stdout=asyncio.subprocess.PIPE
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), CLIENT_DEADLINE_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        report = json.loads(out)
        assert proc.returncode == 0, report.get("failed")
    return dict(report)


def texts(updates: list[dict[str, Any]], kind: str = "agent_message_chunk") -> str:
    return "".join(u["update"]["content"].get("text", "") for u in updates if u["update"]["sessionUpdate"] == kind)


def is_title(update: dict[str, Any]) -> bool:
    return bool(update["update"]["sessionUpdate"] == "session_info_update")


def kinds(updates: list[dict[str, Any]]) -> list[str]:
    return [u["update"]["sessionUpdate"] for u in updates]


def req(method: str, params: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"op": "request", "method": method, "params": params, **extra}


INIT = req("initialize", {"protocolVersion": 1, "clientCapabilities": {}})


def config(tmp_path: Path, env: dict[str, str]) -> str:
    return base_config(tmp_path, env) + acp_profile("acp", env, "--modes", "--resume-cap")


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_session_from_new_to_load_and_resume(
    client: str, daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    """initialize, session/new, a streamed prompt, a permission answered, set_mode,
    session/list; then a new connection loads the session (whole, and after a cursor), and
    a third resumes it and goes on in the mode the first one chose."""
    d = await daemon_factory(config(tmp_path, agent_env))
    cwd = str(tmp_path)
    sid = "$sid"
    steps = [
        INIT,
        req("session/new", {"cwd": cwd, "mcpServers": []}, save={"sid": "result.sessionId"}),
        req("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]}),
        req("session/list", {"cwd": cwd}, save={"mid": "result.sessions.0._meta.agent-bridge.last_seq"}),
        req(
            "session/prompt",
            {"sessionId": sid, "prompt": [{"type": "text", "text": "ask"}]},
            answer={"permission": "allow"},
        ),
        req("session/set_mode", {"sessionId": sid, "modeId": "plan"}),
        req("session/set_mode", {"sessionId": sid, "modeId": "nonsense"}),
        {"op": "reconnect"},
        INIT,
        req("session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []}),
        {"op": "reconnect"},
        INIT,
        req(
            "session/load",
            {"sessionId": sid, "cwd": cwd, "mcpServers": [], "_meta": {"agent-bridge": {"after": "$mid"}}},
        ),
        {"op": "reconnect"},
        INIT,
        req("session/resume", {"sessionId": sid, "cwd": cwd}),
        req("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "whatmode"}]}),
        req("session/list", {}),
    ]
    report = await run_plan(client, d, "acp", steps, tmp_path)
    r = report["results"]
    init = r[0]["result"]
    assert init["protocolVersion"] == 1 and init["agentInfo"]["name"] == "agent-bridge"
    assert init["agentCapabilities"]["loadSession"] is True
    new = r[1]["result"]
    assert new["modes"]["currentModeId"] == "default"
    assert {m["id"] for m in new["modes"]["availableModes"]} >= {"default", "plan"}
    sid_value = new["sessionId"]

    hello = r[2]
    assert hello["result"] == {"stopReason": "end_turn"}
    assert texts(hello["updates"]) == "echo: hello"
    assert {u["sessionId"] for u in hello["updates"]} == {sid_value}
    # Every update from the transcript carries its seq; the title the prompt gave the thread
    # (issue #38 item 6) is a change of the thread, told without one.
    seqs = [u["_meta"]["agent-bridge"]["seq"] for u in hello["updates"] if not is_title(u)]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)

    (listed,) = r[3]["result"]["sessions"]
    assert listed["sessionId"] == sid_value and listed["cwd"] == cwd
    assert listed["_meta"]["agent-bridge"]["agent"] == "acp"

    ask = r[4]
    assert ask["result"] == {"stopReason": "end_turn"}
    (asked,) = report["asks"]
    assert asked["sessionId"] == sid_value and asked["toolCall"]["status"] == "pending"
    assert {o["kind"] for o in asked["options"]} >= {"allow_once", "reject_once"}
    assert texts(ask["updates"]).endswith("permission: allow")
    assert "tool_call" in kinds(ask["updates"]) and "tool_call_update" in kinds(ask["updates"])

    assert r[5] == {"result": {}, "updates": []} or r[5]["result"] == {}
    refused = r[6]["error"]
    assert refused["code"] == -32603 and refused["data"] == {"details": "Invalid Mode"}

    # A new connection loads the whole transcript: both prompts as the user's chunks, the
    # agent's text as it streamed it.
    whole = r[9]
    assert whole["result"]["modes"]["currentModeId"] == "plan"
    assert [
        u["update"]["content"]["text"] for u in whole["updates"] if u["update"]["sessionUpdate"] == "user_message_chunk"
    ] == ["hello", "ask"]
    assert texts(whole["updates"]) == texts(hello["updates"]) + texts(ask["updates"])
    # From the cursor the first listing gave: only what came after the first turn.
    later = r[12]
    assert texts(later["updates"], "user_message_chunk") == "ask"
    assert texts(later["updates"]) == texts(ask["updates"])
    assert all(
        u["_meta"]["agent-bridge"]["seq"]
        > report["results"][3]["result"]["sessions"][0]["_meta"]["agent-bridge"]["last_seq"]
        for u in later["updates"]
        if not is_title(u)  # the thread's title (its first prompt's) follows the replay, §11.8
    )

    # Resume: no replay, and the session goes on in the mode chosen on the first connection.
    resumed = r[15]
    assert [u for u in resumed["updates"] if not is_title(u)] == []
    assert resumed["result"]["modes"]["currentModeId"] == "plan"
    assert texts(r[16]["updates"]) == "mode: plan"
    assert sid_value in {s["sessionId"] for s in r[17]["result"]["sessions"]}


@pytest.mark.parametrize("client", CLIENTS)
async def test_cancel_ends_a_running_prompt_cancelled(
    client: str, daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    steps = [
        INIT,
        req("session/new", {"cwd": str(tmp_path), "mcpServers": []}, save={"sid": "result.sessionId"}),
        {
            "op": "start",
            "id": "slow",
            "method": "session/prompt",
            "params": {"sessionId": "$sid", "prompt": [{"type": "text", "text": "slow"}]},
        },
        {"op": "until", "kind": "agent_message_chunk", "count": 1},
        {"op": "notify", "method": "session/cancel", "params": {"sessionId": "$sid"}},
        {"op": "finish", "id": "slow"},
    ]
    report = await run_plan(client, d, "acp", steps, tmp_path)
    assert report["results"][5]["result"] == {"stopReason": "cancelled"}


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_permission_answered_elsewhere_is_withdrawn_with_cancel_request(
    client: str, daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    """A thread made over REST, resumed by the SDK client, whose permission request is
    answered on the thread's WebSocket first: the client is sent ``$/cancel_request`` for
    the request it was asked, which its SDK takes as a valid protocol-level notification."""
    d = await daemon_factory(config(tmp_path, agent_env))
    tid = (await new_thread(d, "acp", cwd=str(tmp_path)))["id"]
    steps = [
        INIT,
        req("session/resume", {"sessionId": tid, "cwd": str(tmp_path)}),
        {
            "op": "start",
            "id": "ask",
            "method": "session/prompt",
            "params": {"sessionId": tid, "prompt": [{"type": "text", "text": "ask"}]},
            "answer": {"permission": "never"},
        },
        {"op": "finish", "id": "ask"},
    ]

    async def deny_on_the_websocket() -> None:
        c = await d.ws(tid)
        asked = await c.kind("permission.requested")
        await c.send(op="permission", request_id=asked["data"]["request_id"], decision="deny")
        resolved = await c.kind("permission.resolved")
        assert resolved["data"]["by"] == "websocket"

    report, _ = await asyncio.gather(run_plan(client, d, "acp", steps, tmp_path), deny_on_the_websocket())
    done = report["results"][3]
    assert done["result"] == {"stopReason": "end_turn"}
    assert texts(done["updates"]).endswith("permission: reject")
    asked = [m for m in report["received"] if m.get("method") == "session/request_permission"]
    cancels = [m for m in report["received"] if m.get("method") == "$/cancel_request"]
    assert len(asked) == 1 and [m["params"]["requestId"] for m in cancels] == [asked[0]["id"]]


@pytest.mark.parametrize("client", CLIENTS)
async def test_the_agents_elicitation_reaches_a_client_that_advertised_it(
    client: str, daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    """The fake ACP agent's ``elicitation/create`` (a form, then a URL) reaches the SDK
    client that said it shows both; the form's answer and the URL's refusal reach the agent."""
    d = await daemon_factory(config(tmp_path, agent_env))
    caps = {"elicitation": {"form": {}, "url": {}}}

    def prompt(text: str) -> dict[str, Any]:
        return req("session/prompt", {"sessionId": "$sid", "prompt": [{"type": "text", "text": text}]})

    steps = [
        req("initialize", {"protocolVersion": 1, "clientCapabilities": caps}),
        req("session/new", {"cwd": str(tmp_path), "mcpServers": []}, save={"sid": "result.sessionId"}),
        {**prompt("elicit form"), "answer": {"elicitation": {"name": "Ada", "count": 4}}},
        {**prompt("elicit url"), "answer": {"elicitation": "decline"}},
    ]
    report = await run_plan(client, d, "acp", steps, tmp_path)
    form, url = report["results"][2], report["results"][3]
    assert form["result"] == {"stopReason": "end_turn"}
    assert texts(form["updates"]) == 'elicit: accept {"count": 4, "name": "Ada"}'
    assert url["result"] == {"stopReason": "end_turn"} and texts(url["updates"]).startswith("elicit: decline")
    asked = [m["params"] for m in report["received"] if m.get("method") == "elicitation/create"]
    assert [a["mode"] for a in asked] == ["form", "url"]
    assert asked[0]["requestedSchema"]["required"] == ["name"] and asked[1]["url"].startswith("https://")
    sid = report["results"][1]["result"]["sessionId"]
    assert all(a.get("sessionId") == sid for a in asked)


def config_2026(tmp_path: Path, env: dict[str, str]) -> str:
    return base_config(tmp_path, env) + acp_profile("acp", env, "--modes", "--resume-cap", "--config-options")


def by_id(options: list[dict[str, Any]]) -> dict[str, Any]:
    return {o["id"]: o for o in options}


@pytest.mark.parametrize("client", CLIENTS)
async def test_the_2026_additions_config_options_usage_message_ids_titles_close_and_delete(
    client: str, daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    """ACP's stable 2026 additions as both SDKs see them: configOptions in new/load and set
    with session/set_config_option, usage_update after a turn, one messageId on a message's
    chunks (the same on replay), the agent's title as session_info_update, session/close
    (the thread stays, load attaches it again) and session/delete (gone from session/list;
    deleting again is still {})."""
    d = await daemon_factory(config_2026(tmp_path, agent_env))
    cwd = str(tmp_path)
    sid = "$sid"

    def prompt(text: str) -> dict[str, Any]:
        return req("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]})

    steps = [
        INIT,  # 0
        req("session/new", {"cwd": cwd, "mcpServers": []}, save={"sid": "result.sessionId"}),
        prompt("hello"),
        req("session/set_config_option", {"sessionId": sid, "configId": "model", "value": "deep"}),
        req("session/set_config_option", {"sessionId": sid, "configId": "model", "value": "nonsense"}),
        prompt("title Counting files"),  # 5
        {"op": "until", "kind": "session_info_update", "count": 2},  # the first prompt's title, then the agent's
        {"op": "reconnect"},
        INIT,
        req("session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []}),
        req("session/close", {"sessionId": sid}),  # 10
        prompt("after close"),
        req("session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []}),
        prompt("whatconfig"),
        req("session/delete", {"sessionId": sid}),
        req("session/list", {"cwd": cwd}),
        req("session/delete", {"sessionId": sid}),  # 16
    ]
    report = await run_plan(client, d, "acp", steps, tmp_path)
    r = report["results"]
    caps = r[0]["result"]["agentCapabilities"]["sessionCapabilities"]
    assert "close" in caps and "delete" in caps
    options = by_id(r[1]["result"]["configOptions"])
    assert options["model"]["category"] == "model" and options["mode"]["category"] == "mode"
    sid_value = r[1]["result"]["sessionId"]

    hello = r[2]["updates"]
    chunks = [u["update"] for u in hello if u["update"]["sessionUpdate"] == "agent_message_chunk"]
    assert "".join(c["content"]["text"] for c in chunks) == "echo: hello"
    assert len({c["messageId"] for c in chunks}) == 1 and chunks[0]["messageId"]
    (usage,) = [u["update"] for u in hello if u["update"]["sessionUpdate"] == "usage_update"]
    assert usage["used"] > 0 and usage["size"] >= usage["used"]

    assert by_id(r[3]["result"]["configOptions"])["model"]["currentValue"] == "deep"
    assert r[4]["error"]["code"] == -32602

    titles = [m["params"]["update"] for m in report["received"] if m.get("method") == "session/update"]
    named = [u.get("title") for u in titles if u["sessionUpdate"] == "session_info_update"]
    assert named[0] == "hello" and "Counting files" in named, named  # the prompt's title, replaced by the agent's

    # Replayed on a new connection: the same message id as live, the option as set.
    loaded = r[9]
    assert by_id(loaded["result"]["configOptions"])["model"]["currentValue"] == "deep"
    replayed = [u["update"] for u in loaded["updates"] if u["update"]["sessionUpdate"] == "agent_message_chunk"]
    assert [c["messageId"] for c in replayed[: len(chunks)]] == [c["messageId"] for c in chunks]
    assert r[10]["result"] == {}
    assert r[11]["error"]["code"] == -32002  # closed: no longer attached here
    # Closing stopped the agent; the prompt after the load started it again on its own
    # default model, and the bridge set it back to the thread's model before the prompt
    # (docs/api.md §4.21: a model the agent took is the thread's, kept across restarts).
    # (The config_option_update for that comes from the change log, unordered with the
    # prompt's own updates: it may land in this step or the next, so only the agent's
    # answer is checked here; tests/test_model_switch_e2e.py checks the thread's row.)
    assert texts(r[13]["updates"]) == "config: model=deep mode=default"
    assert r[14]["result"] == {}
    assert sid_value not in {s["sessionId"] for s in r[15]["result"]["sessions"]}
    assert r[16]["result"] == {}
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{sid_value}")).status_code == 404


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
MCP_STDIO = {"name": "files", "command": "/usr/bin/env", "args": ["--", "mcp-files"], "env": []}


def agent_got(tmp_path: Path, method: str) -> list[dict[str, Any]]:
    """What the fake ACP agent read on its stdin for ``method``."""
    lines = [json.loads(e["line"]) for e in agent_log(tmp_path) if e.get("event") == "stdin"]
    return [m for m in lines if m.get("method") == method]


@pytest.mark.parametrize("client", CLIENTS)
async def test_mcp_servers_trace_context_and_a_prompt_given_up_with_cancel_request(
    client: str, daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    """The editor's ``mcpServers`` reach the ACP agent's ``session/new``, a prompt's
    ``_meta`` trace context reaches the agent's ``session/prompt``, and a prompt the client
    gives up with ``$/cancel_request`` is answered ``cancelled``."""
    d = await daemon_factory(config(tmp_path, agent_env))
    meta = {"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"}
    hello = {"sessionId": "$sid", "prompt": [{"type": "text", "text": "hello"}], "_meta": meta}
    slow = {"sessionId": "$sid", "prompt": [{"type": "text", "text": "slow"}]}
    steps = [
        INIT,
        req("session/new", {"cwd": str(tmp_path), "mcpServers": [MCP_STDIO]}, save={"sid": "result.sessionId"}),
        req("session/prompt", hello),
        {"op": "start", "id": "slow", "method": "session/prompt", "params": slow},
        {"op": "until", "kind": "agent_message_chunk", "count": 5},  # hello's 3, then slow's ticks
        {"op": "cancel_request", "id": "slow"},
        {"op": "finish", "id": "slow"},
    ]
    report = await run_plan(client, d, "acp", steps, tmp_path)
    r = report["results"]
    assert r[2]["result"] == {"stopReason": "end_turn"}
    assert r[6]["result"] == {"stopReason": "cancelled"}
    (opened,) = agent_got(tmp_path, "session/new")
    assert opened["params"]["mcpServers"] == [MCP_STDIO]
    first = agent_got(tmp_path, "session/prompt")[0]
    assert first["params"]["_meta"] == meta


@pytest.mark.parametrize("client", ["ts-ws", "py-ws"])
async def test_the_clients_report_what_does_not_fit_the_schema(client: str, tmp_path: Path) -> None:
    """What makes the tests above strict: a gateway stand-in that answers ``session/new``
    without a ``sessionId`` and streams a chunk whose content has no text; each SDK client
    reports both."""

    async def wrong(ws: Any) -> None:
        async for raw in ws:
            m = json.loads(raw)
            if m.get("method") == "initialize":
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"protocolVersion": 1}}))
            elif m.get("method") == "session/new":
                chunk = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text"}}
                note = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": chunk}}
                await ws.send(json.dumps(note))
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"session": "s"}}))

    def subprotocol(conn: Any, offered: Any) -> str | None:
        return "agent-bridge.v1" if "agent-bridge.v1" in offered else None

    async with websockets.serve(wrong, "127.0.0.1", 0, select_subprotocol=subprotocol) as server:
        port = server.sockets[0].getsockname()[1]
        where = {"kind": "ws", "url": f"ws://127.0.0.1:{port}", "token": "t"}
        report = await run_client(
            client, where, [INIT, req("session/new", {"cwd": str(tmp_path), "mcpServers": []})], tmp_path
        )
    problems = report["problems"]
    assert len(problems) == 2, problems
    assert any("SessionNotification" in p or "session/update does not fit" in p for p in problems), problems
    assert any("NewSessionResponse" in p or "the answer to session/new does not fit" in p for p in problems), problems
