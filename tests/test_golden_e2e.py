"""Real Claude Code transcripts, replayed by tests/agents/replay_agent.py through a real
daemon and real WebSocket clients (issue #5 item 6): the bridge must drive each exchange
the way the real host did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import PYTHON, ROOT, agent_log, new_thread

REPLAY = ROOT / "tests" / "agents" / "replay_agent.py"
TRANSCRIPTS = ROOT / "tests" / "fixtures" / "transcripts" / "claude-code-2.1.197"


def replay_cfg(env: dict[str, str], *scenarios: str) -> str:
    out = "[server]\nstop_grace_s = 1\n\n"
    for name in scenarios:
        args = ["-I", str(REPLAY), "--transcript", str(TRANSCRIPTS / f"{name}.transcript.jsonl")]
        out += "\n".join(
            [
                f"[agents.{name}]",
                'protocol = "stream-json"',
                f"executable = {json.dumps(PYTHON)}",
                f"args = {json.dumps(args)}",
                "permission_prompts = true",
                "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }",
            ]
        )
        out += "\n\n"
    return out


def answers(tmp_path: Path) -> list[dict[str, Any]]:
    return [
        json.loads(e["line"])
        for e in agent_log(tmp_path)
        if e["event"] == "stdin" and '"control_response"' in e["line"]
    ]


async def test_allow_transcript(daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]) -> None:
    d = await daemon_factory(replay_cfg(agent_env, "allow"))
    c = await d.ws((await new_thread(d, "allow"))["id"])
    acc = await c.prompt("RUN_WRITE please")
    req = await c.kind("permission.requested")
    assert req["data"]["request_id"] == "35d70460-9882-45a9-a4e2-62b1aba38ced"
    assert req["data"]["tool"] == "Bash"
    await c.send(op="permission", request_id=req["data"]["request_id"], decision="allow")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "success"
    assert c.seen("tool.call")[0]["data"]["name"] == "Bash"
    assert c.seen("tool.result")
    sent = answers(tmp_path)
    assert len(sent) == 1 and sent[0]["response"]["response"] == {
        "behavior": "allow",
        "updatedInput": req["data"]["input"],
    }
    assert not [e for e in agent_log(tmp_path) if e["event"] == "skipped"]


async def test_deny_transcript(daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]) -> None:
    d = await daemon_factory(replay_cfg(agent_env, "deny"))
    thread = await new_thread(d, "deny")
    c = await d.ws(thread["id"])
    acc = await c.prompt("RUN_WRITE please")
    rid = (await c.kind("permission.requested"))["data"]["request_id"]
    async with d.http() as http:
        r = await http.post(
            f"/v1/threads/{thread['id']}/permissions/{rid}", json={"decision": "deny", "message": "User said no"}
        )
        assert r.status_code == 200
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "success"
    assert answers(tmp_path)[0]["response"]["response"] == {"behavior": "deny", "message": "User said no"}
    assert len([f for f in c.seen("diagnostic") if f["data"]["stream"] == "stderr"]) >= 10


async def test_cancelperm_transcript(daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]) -> None:
    d = await daemon_factory(replay_cfg(agent_env, "cancelperm"))
    c = await d.ws((await new_thread(d, "cancelperm"))["id"])
    acc = await c.prompt("RUN_WRITE please")
    rid = (await c.kind("permission.requested"))["data"]["request_id"]
    await c.send(op="interrupt")
    resolved = await c.kind("permission.resolved", request_id=rid)
    assert resolved["data"]["by"] == "agent" and resolved["data"]["decision"] == "cancelled"
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "cancelled"
    assert answers(tmp_path) == []  # nothing written back for a withdrawn prompt
    end = await c.turn("hello")
    assert end["data"]["status"] == "success"
    # The agent reports itself idle again after the turn (session_state_changed).
    await c.next(lambda f: f.get("kind") == "agent.status" and f["data"].get("state") == "idle")


async def test_hooks_transcript(daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]) -> None:
    d = await daemon_factory(replay_cfg(agent_env, "hooks"))
    c = await d.ws((await new_thread(d, "hooks"))["id"])
    end = await c.turn("hi")
    assert end["data"]["status"] == "success"
    phases = [(f["data"]["hook_event"], f["data"]["phase"]) for f in c.seen("hook")]
    assert phases == [("UserPromptSubmit", "started"), ("UserPromptSubmit", "response")]
    assert c.seen("hook", phase="response")[0]["data"]["outcome"] == "success"
