"""ACP agents end to end through a real daemon (issue #4): the fake ACP agent with its
misbehaviours, and an agent written with the official Python SDK."""

from __future__ import annotations

import json
import os
import site
import sys
from pathlib import Path
from typing import Any

from conftest import PYTHON, ROOT, agent_log, fake_grants, new_thread

FAKE_ACP = ROOT / "tests" / "agents" / "fake_acp_agent.py"
SDK_AGENT = ROOT / "tests" / "agents" / "sdk_echo_agent.py"


def acp_profile(name: str, env: dict[str, str], *flags: str, **fields: Any) -> str:
    args = ["-I", str(FAKE_ACP), *flags]
    lines = [
        f"[agents.{name}]",
        'protocol = "acp"',
        f"executable = {json.dumps(PYTHON)}",
        f"args = {json.dumps(args)}",
        "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }",
        fake_grants(env),
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in fields.items()]
    return "\n".join(lines) + "\n"


def config(env: dict[str, str], **profiles: tuple[str, ...]) -> str:
    cfg = "[server]\nstop_grace_s = 1\ninterrupt_timeout_s = 5\n\n"
    cfg += acp_profile("acp", env)
    for name, flags in profiles.items():
        cfg += acp_profile(name, env, *flags)
    return cfg


def sent(tmp_path: Path, method: str) -> list[dict[str, Any]]:
    out = []
    for e in agent_log(tmp_path):
        if e["event"] == "stdin":
            msg = json.loads(e["line"])
            if msg.get("method") == method:
                out.append(msg)
    return out


def reply_text(c: Any) -> str:
    return "".join(f["data"]["text"] for f in c.seen("message.delta"))


async def test_acp_chat_turn_handshake_and_agent_info(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    thread = await new_thread(d, "acp")
    assert thread["protocol"] == "acp"
    c = await d.ws(thread["id"])
    end = await c.turn("hello acp")
    assert end["data"]["status"] == "success" and end["data"]["stop_reason"] == "end_turn"
    assert reply_text(c) == "echo: hello acp"
    started = c.seen("session.started")[0]
    assert started["data"]["resumed"] == "new" and started["data"]["native_session_id"].startswith("acp-")
    init = sent(tmp_path, "initialize")[0]["params"]
    assert init["protocolVersion"] == 1
    assert init["clientCapabilities"] == {
        "fs": {"readTextFile": True, "writeTextFile": True},
        "terminal": False,
        "elicitation": {"form": {}, "url": {}},
        "session": {"configOptions": {"boolean": {}}},
    }
    assert init["clientInfo"]["name"] == "agent-bridge"
    new = sent(tmp_path, "session/new")[0]["params"]
    assert new == {"cwd": thread["cwd"], "mcpServers": []}
    async with d.http() as http:
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
    assert t["agent_info"]["info"]["name"] == "fake-acp"
    assert t["agent_info"]["capabilities"]["loadSession"] is True
    assert t["native_session_id"] == started["data"]["native_session_id"]
    # No resume flag on argv for ACP: resume goes through session/load.
    assert not any(a.startswith("--resume") for a in agent_log(tmp_path)[0]["argv"])
    await c.close()


async def test_acp_restart_loads_the_session_without_duplicating_history(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    cfg = config(agent_env)
    d1 = await daemon_factory(cfg)
    thread = await new_thread(d1, "acp")
    c = await d1.ws(thread["id"])
    await c.turn("first words")
    await c.turn("second words")
    native = c.seen("session.started")[0]["data"]["native_session_id"]
    deltas_before = len(c.seen("message.delta"))
    last = c.seqs()[-1]
    assert await d1.stop() == 0
    d2 = await daemon_factory(cfg)
    c2 = await d2.ws(thread["id"], after=0)
    end = await c2.turn("third words")
    assert end["data"]["status"] == "success"
    load = sent(tmp_path, "session/load")
    assert [m["params"]["sessionId"] for m in load] == [native]
    resumed = next(f for f in c2.seen("session.started") if f["seq"] > last)
    assert resumed["data"]["resumed"] == "load" and resumed["data"]["replayed_updates"] >= 4
    # The agent replayed the first two turns; none of it entered the transcript again.
    assert len(c2.seen("message.delta")) == deltas_before + 3
    assert c2.seqs() == list(range(1, len(c2.seqs()) + 1))
    await c2.close()


async def test_acp_resume_falls_back_to_session_resume_then_new_with_a_notice(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    cfg = config(agent_env, resumable=("--no-load", "--resume-cap"), forgetful=("--no-load",))
    d1 = await daemon_factory(cfg)
    threads = {name: await new_thread(d1, name) for name in ("resumable", "forgetful")}
    for t in threads.values():
        c = await d1.ws(t["id"])
        await c.turn("remember me")
        await c.close()
    assert await d1.stop() == 0
    d2 = await daemon_factory(cfg)
    c = await d2.ws(threads["resumable"]["id"], after=0)
    await c.turn("again")
    assert [f["data"]["resumed"] for f in c.seen("session.started")] == ["new", "resume"]
    assert not c.seen("notice")
    c = await d2.ws(threads["forgetful"]["id"], after=0)
    await c.turn("again")
    assert [f["data"]["resumed"] for f in c.seen("session.started")] == ["new", "new"]
    notice = c.seen("notice", code="history_not_restored")
    assert len(notice) == 1 and notice[0]["source"] == "bridge"
    assert len(sent(tmp_path, "session/resume")) == 1


async def test_acp_incompatible_protocol_version_ends_the_start_clearly(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env, future=("--version", "2")))
    thread = await new_thread(d, "future")
    c = await d.ws(thread["id"])
    end = await c.turn("hello")
    assert end["data"]["status"] == "error" and "protocol_version" in end["data"]["error"]
    assert c.seen("notice", code="protocol_version")
    assert c.seen("process.exited", reason="protocol_version")
    assert not sent(tmp_path, "session/new") and not sent(tmp_path, "session/prompt")
    await c.close()


async def test_acp_authentication_with_and_without_a_configured_method(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    cfg = (
        "[server]\nstop_grace_s = 1\n"
        + acp_profile("locked", agent_env, "--auth-required")
        + acp_profile("keyed", agent_env, "--auth-required", auth_method="fake-key")
    )
    d = await daemon_factory(cfg)
    c = await d.ws((await new_thread(d, "keyed"))["id"])
    end = await c.turn("let me in")
    assert end["data"]["status"] == "success"
    assert [m["params"] for m in sent(tmp_path, "authenticate")] == [{"methodId": "fake-key"}]
    c2 = await d.ws((await new_thread(d, "locked"))["id"])
    end = await c2.turn("let me in")
    assert end["data"]["status"] == "error" and "auth_required" in end["data"]["error"]
    notice = c2.seen("notice", code="auth_required")[0]
    assert "fake-key" in notice["data"]["text"]
    await c.close()
    await c2.close()


async def test_acp_interrupt_sends_session_cancel_and_the_turn_ends_cancelled(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    c = await d.ws((await new_thread(d, "acp"))["id"])
    acc = await c.prompt("slow")
    await c.kind("message.delta")
    await c.send(op="interrupt")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "cancelled" and end["data"]["stop_reason"] == "cancelled"
    assert len(sent(tmp_path, "session/cancel")) == 1
    end = await c.turn("after cancel")
    assert end["data"]["status"] == "success"
    await c.close()


async def test_acp_permission_request_goes_to_clients_and_deny_picks_a_reject_option(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    thread = await new_thread(d, "acp")
    c = await d.ws(thread["id"])
    acc = await c.prompt("ask")
    req = await c.kind("permission.requested")
    assert [o["optionId"] for o in req["data"]["options"]] == ["allow", "allow_always", "reject"]
    async with d.http() as http:
        r = await http.post(
            f"/v1/threads/{thread['id']}/permissions/{req['data']['request_id']}", json={"decision": "deny"}
        )
        assert r.status_code == 200
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "success"
    resolved = c.seen("permission.resolved", request_id=req["data"]["request_id"])[0]
    assert resolved["data"]["decision"] == "deny" and resolved["data"]["by"] == "rest"
    assert "permission: reject" in reply_text(c)
    await c.close()


async def test_acp_fs_requests_are_served_only_inside_the_cwd(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("line1\nline2\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    (work / "escape").symlink_to(secret)
    c = await d.ws((await new_thread(d, "acp", cwd=str(work)))["id"])
    await c.turn(f"read {work / 'notes.txt'}")
    assert "read: line1\nline2\n" in reply_text(c)
    await c.turn(f"write {work / 'new.txt'} hello-file")
    assert (work / "new.txt").read_text() == "hello-file"
    for path in (secret, work / ".." / "secret.txt", work / "escape"):
        before = len(c.seen("message.delta"))
        await c.turn(f"read {path}")
        text = "".join(f["data"]["text"] for f in c.seen("message.delta")[before:])
        assert "read error -32001" in text and "top secret" not in text
    await c.turn(f"write {tmp_path / 'outside.txt'} nope")
    assert not (tmp_path / "outside.txt").exists()
    await c.turn(f"read {work / 'missing.txt'}")
    assert "read error -32002" in reply_text(c)
    await c.close()


async def test_acp_unknown_agent_requests_get_method_not_found(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    c = await d.ws((await new_thread(d, "acp"))["id"])
    end = await c.turn("unknown")
    assert end["data"]["status"] == "success"
    assert "unknown: error -32601" in reply_text(c)
    end = await c.turn("garbage")
    assert end["data"]["status"] == "success"
    assert len(c.seen("diagnostic")) >= 2
    end = await c.turn("twoupdates")
    assert [f for f in c.seen("agent.other") if f["data"].get("foreign_session")]
    await c.close()


async def test_acp_tool_plan_and_thought_updates_map_to_normalized_kinds(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    c = await d.ws((await new_thread(d, "acp"))["id"])
    await c.turn("tool")
    call = c.seen("tool.call")[0]
    result = c.seen("tool.result", tool_call_id=call["data"]["tool_call_id"])[0]
    assert result["data"]["output"] == "hi" and result["data"]["is_error"] is False
    await c.turn("plan")
    assert len(c.seen("plan")[0]["data"]["entries"]) == 2
    await c.turn("think")
    assert c.seen("message.delta", channel="thought")
    await c.close()


async def test_acp_agent_crash_during_a_prompt_ends_the_turn_with_error(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    c = await d.ws((await new_thread(d, "acp"))["id"])
    end = await c.turn("crash")
    assert end["data"]["status"] == "error"
    assert c.seen("process.exited", reason="crashed")
    end = await c.turn("back again")  # restarts with session/load
    assert end["data"]["status"] == "success"
    await c.close()


async def test_agent_built_with_the_official_python_sdk(daemon_factory: Any, tmp_path: Path) -> None:
    # The SDK agent needs the test environment's site-packages (pydantic, acp).
    paths = os.pathsep.join([*site.getsitepackages(), str(ROOT)])
    cfg = (
        "\n".join(
            [
                "[agents.sdk]",
                'protocol = "acp"',
                f"executable = {json.dumps(PYTHON)}",
                f"args = {json.dumps([str(SDK_AGENT)])}",
                f"env = {{ PYTHONPATH = {json.dumps(paths)} }}",
            ]
        )
        + "\n"
    )
    d = await daemon_factory(cfg)
    c = await d.ws((await new_thread(d, "sdk"))["id"])
    end = await c.turn("hello sdk")
    assert end["data"]["status"] == "success" and end["data"]["stop_reason"] == "end_turn"
    assert "hello sdk" in reply_text(c)
    assert sys.executable
    await c.close()


async def test_acp_raw_mode_is_an_acp_connection_with_ids_rewritten_and_routed(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    thread = await new_thread(d, "acp")
    ev = await d.ws(thread["id"])
    await ev.turn("hello")  # the bridge's own handshake used ids 0.. already
    sid = ev.seen("session.started")[0]["data"]["native_session_id"]
    a = await d.ws(thread["id"], mode="raw", after=ev.seqs()[-1])
    b = await d.ws(thread["id"], mode="raw", after=ev.seqs()[-1])
    # Both clients use id 1, which the bridge itself has used too.
    await a.send(
        jsonrpc="2.0",
        id=1,
        method="session/prompt",
        params={"sessionId": sid, "prompt": [{"type": "text", "text": "from a"}]},
    )
    got_a = await a.next(lambda f: "result" in f or "error" in f)
    assert got_a["id"] == 1 and got_a["result"]["stopReason"] == "end_turn"
    await b.send(jsonrpc="2.0", id=1, method="session/list", params={})
    got_b = await b.next(lambda f: "result" in f or "error" in f)
    assert got_b["id"] == 1 and "sessions" in got_b["result"]
    # a saw the session/update notifications of its prompt; b got only its own response.
    assert any(f.get("method") == "session/update" for f in a.frames)
    assert not any("stopReason" in json.dumps(f) for f in b.frames)
    # On the wire the agent saw ids of the bridge's, never a repeated one.
    ids = [json.loads(e["line"]).get("id") for e in agent_log(tmp_path) if e["event"] == "stdin"]
    requests = [i for i in ids if i is not None]
    assert len(requests) == len(set(requests))
    # A response from a client is not forwarded (the bridge answers the agent itself).
    before = len([e for e in agent_log(tmp_path) if e["event"] == "stdin"])
    await a.send(jsonrpc="2.0", id=0, result={})
    await ev.turn("still fine")
    lines = [e["line"] for e in agent_log(tmp_path) if e["event"] == "stdin"][before:]
    assert not any('"result"' in x for x in lines)
    for c in (a, b, ev):
        await c.close()


PNG_B64 = "iVBORw0KGgoAAAAAAAAAAAAAAAAAAAAA"  # "\x89PNG\r\n\x1a\n" + zero bytes
PDF_B64 = "JVBERi0xLjQK"  # "%PDF-1.4\n"


async def test_acp_content_the_agent_cannot_take_is_refused_not_sent(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    """promptCapabilities decide: an image or document for a text-only agent is refused
    (before the agent starts: the turn ends unsent; afterwards: client.rejected / 400),
    and the agent never sees it."""
    d = await daemon_factory(config(agent_env, textonly=("--text-only",)))
    thread = await new_thread(d, "textonly")
    c = await d.ws(thread["id"])
    image = [
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
    ]
    # Fresh thread: capabilities are unknown until the handshake, so the prompt is accepted
    # and its turn ends unsent with the reason.
    await c.send(op="prompt", content=image, client_id="img-1")
    end = await c.kind("turn.ended")
    assert end["data"]["status"] == "error" and end["data"]["error_code"] == "unsupported_content", end
    assert "image" in end["data"]["error"]
    assert sent(tmp_path, "session/prompt") == []
    # Now the agent has said what it takes: refused up front, on both transports.
    doc = [{"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_B64}}]
    await c.send(op="prompt", content=doc, client_id="doc-1")
    rejected = await c.kind("client.rejected")
    assert rejected["data"]["code"] == "unsupported_content" and "documents" in rejected["data"]["message"]
    async with d.http() as http:
        r = await http.post(f"/v1/threads/{thread['id']}/messages", json={"content": image})
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_content", r.text
        # Still refused after a stop, from the capabilities stored with the thread.
        assert (await http.post(f"/v1/threads/{thread['id']}/stop")).status_code in (200, 202, 204)
        r = await http.post(f"/v1/threads/{thread['id']}/messages", json={"content": doc})
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_content", r.text
    # Text still works, and only text ever reached the agent.
    end = await c.turn("just text")
    assert end["data"]["status"] == "success"
    prompts = sent(tmp_path, "session/prompt")
    assert [b["type"] for p in prompts for b in p["params"]["prompt"]] == ["text"]
