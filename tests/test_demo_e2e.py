"""A newcomer's first run: no config, the bundled demo agent, through a real daemon."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TOKEN, new_thread


async def test_serve_with_no_config_offers_the_demo_agent_and_chats(daemon_factory: Any, tmp_path: Path) -> None:
    d = await daemon_factory("")
    async with d.http() as http:
        agents = (await http.get("/v1/agents")).json()
        demo = next(a for a in agents if a["name"] == "demo")
        assert demo["available"] and demo["default"] and demo["protocol"] == "stream-json"
        r = await http.post("/v1/threads", json={})
        assert r.status_code == 201 and r.json()["agent"] == "demo"
        thread = r.json()
    assert Path(thread["cwd"]).is_dir()
    (Path(thread["cwd"]) / "notes.txt").write_text("hi")
    c = await d.ws(thread["id"])
    end = await c.turn("hello")
    assert end["data"]["status"] == "success"
    assert c.seen("message.delta") and c.seen("session.started")
    end = await c.turn("list files")
    assert end["data"]["status"] == "success"
    call = c.seen("tool.call")[0]
    result = c.seen("tool.result", tool_call_id=call["data"]["tool_call_id"])[0]
    listed = str(result["data"]["output"])
    assert call["data"]["name"] == "ListFiles" and "notes.txt" in listed
    assert "README.md" in listed and "hello.py" in listed  # the demo workspace's samples
    acc = await c.prompt("slow")
    await c.kind("message.delta")
    await c.send(op="interrupt")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "cancelled"
    await c.close()
    # Restart the daemon: the demo agent resumes its session and remembers.
    assert await d.stop() == 0
    d2 = await daemon_factory("")
    c2 = await d2.ws(thread["id"], after=c.seqs()[-1])
    await c2.turn("what did I say?")
    reply = [f for f in c2.seen("message", role="assistant") if f["source"] == "agent"][-1]
    assert "list files" in reply["data"]["text"]
    await c2.close()


async def test_thread_created_without_agent_uses_first_configured_profile(daemon: Any) -> None:
    thread = await new_thread(daemon, "awp-jsonl")
    assert thread["agent"] == "awp-jsonl"
    async with daemon.http() as http:
        r = await http.post("/v1/threads", json={})
        assert r.json()["agent"] == "stream-json"


# ----------------------------------------------------------------- README "Talk to it"


def talk_to_it_block() -> str:
    """The shell block of README's "Talk to it" section, exactly as written."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Talk to it") :]
    return section[section.index("```sh\n") + len("```sh\n") : section.index("\n```", section.index("```sh\n"))]


async def test_the_readme_talk_to_it_lines_print_the_agents_reply(daemon_factory: Any, tmp_path: Path) -> None:
    """README's lines, in order, against a real daemon, adapted only where they must be: the
    port, the token file, and a time limit on the last line (a live stream that never ends)."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (Debian package curl)")
    d = await daemon_factory("")
    port = d.url.rsplit(":", 1)[1]
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    block = talk_to_it_block()
    assert "localhost:8765" in block and "~/.local/share/agent-bridge/token" in block
    script = (
        block.replace("localhost:8765", f"localhost:{port}")
        .replace("~/.local/share/agent-bridge/token", str(token_file))
        .replace("curl -sN ", "curl -sN --max-time 2 ")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE")}
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=tmp_path
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    shown = out.decode()
    assert "I'm the agent-bridge demo agent" in shown, (shown, err.decode())
    assert "You said: “hello”" in shown  # the reply to the README's own prompt, in full


# ----------------------------------------------------------------- the long-poll until a turn ends


async def test_a_long_poll_until_turn_end_answers_with_every_queued_turn_ended(daemon_factory: Any) -> None:
    d = await daemon_factory("")
    async with d.http() as http:
        tid = (await http.post("/v1/threads", json={"agent": "demo"})).json()["id"]
        first = (await http.post(f"/v1/threads/{tid}/messages", json={"text": "hello"})).json()
        second = (await http.post(f"/v1/threads/{tid}/messages", json={"text": "code"})).json()
        assert second["queued"] is True  # waits behind the first
        r = await http.get(
            f"/v1/threads/{tid}/events", params={"after": 0, "wait": 30, "until": "turn_end", "limit": 1000}
        )
        events = r.json()["events"]
        ended = [e["data"]["turn_id"] for e in events if e["kind"] == "turn.ended"]
        assert ended == [first["turn_id"], second["turn_id"]]
        replies = [e["data"]["text"] for e in events if e["kind"] == "message" and e["source"] == "agent"]
        assert any("```python" in t for t in replies)
        # Nothing runs now: the answer comes at once, whatever the wait.
        loop = asyncio.get_running_loop()
        started = loop.time()
        r = await http.get(
            f"/v1/threads/{tid}/events", params={"after": r.json()["last_seq"], "wait": 30, "until": "turn_end"}
        )
        assert r.status_code == 200 and r.json()["events"] == []
        assert loop.time() - started < 10
        bad = await http.get(f"/v1/threads/{tid}/events", params={"wait": 1, "until": "forever"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"


# ----------------------------------------------------------------- what the page can show


async def test_demo_edit_asks_permission_then_edits_or_leaves_the_file(daemon_factory: Any) -> None:
    d = await daemon_factory("")
    async with d.http() as http:
        thread = (await http.post("/v1/threads", json={"agent": "demo"})).json()
    hello = Path(thread["cwd"]) / "hello.py"
    before = hello.read_text()
    c = await d.ws(thread["id"])

    acc = await c.prompt("edit hello.py")
    asked = await c.kind("permission.requested")
    assert asked["data"]["tool"] == "Edit" and asked["data"]["input"]["file_path"] == str(hello)
    async with d.http() as http:
        r = await http.post(
            f"/v1/threads/{thread['id']}/permissions/{asked['data']['request_id']}", json={"decision": "allow"}
        )
        assert r.status_code == 200, r.text
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "success"
    call = c.seen("tool.call", name="Edit")[0]["data"]
    assert "Hello" in call["input"]["old_string"] and "Hi there" in call["input"]["new_string"]
    result = c.seen("tool.result", tool_call_id=call["tool_call_id"])[0]
    assert result["data"]["is_error"] is False
    patch = result["raw"]["tool_use_result"]["structuredPatch"]
    assert any(ln.startswith("+") and "Hi there" in ln for h in patch for ln in h["lines"])
    assert hello.read_text() == before.replace("Hello", "Hi there", 1)
    assert c.seen("message", channel="thought")  # it thought first

    edited = hello.read_text()
    acc = await c.prompt("edit hello.py")
    asked = await c.kind("permission.requested")
    async with d.http() as http:
        r = await http.post(
            f"/v1/threads/{thread['id']}/permissions/{asked['data']['request_id']}",
            json={"decision": "deny", "message": "not now"},
        )
        assert r.status_code == 200, r.text
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "success"
    denied = c.seen("tool.call", name="Edit")[-1]["data"]
    result = c.seen("tool.result", tool_call_id=denied["tool_call_id"])[0]["data"]
    assert result["is_error"] is True and result["output"] == "not now"
    assert hello.read_text() == edited  # refused: nothing changed
    reply = [f for f in c.seen("message", role="assistant") if f["source"] == "agent"][-1]
    assert "unchanged" in reply["data"]["text"]
    await c.close()


async def test_the_demo_tour_shows_every_kind_of_event_the_page_draws(daemon_factory: Any) -> None:
    d = await daemon_factory("")
    async with d.http() as http:
        thread = (await http.post("/v1/threads", json={"agent": "demo"})).json()
    tid = thread["id"]
    c = await d.ws(tid)
    acc = await c.prompt("tour")
    asked = await c.kind("permission.requested")
    async with d.http() as http:
        r = await http.post(f"/v1/threads/{tid}/permissions/{asked['data']['request_id']}", json={"decision": "allow"})
        assert r.status_code == 200
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=60)
    assert end["data"]["status"] == "success"

    # A thinking block, streamed and complete.
    assert c.seen("message.delta", channel="thought") and c.seen("message", channel="thought")
    # An edit with the strings a diff is drawn from.
    edit = c.seen("tool.call", name="Edit")[0]["data"]
    assert {"file_path", "old_string", "new_string"} <= set(edit["input"])
    # A shell command, its output and its exit status (success: not an error).
    bash = c.seen("tool.call", name="Bash")[0]["data"]
    assert bash["input"]["command"].startswith("wc -l ")
    ran = c.seen("tool.result", tool_call_id=bash["tool_call_id"])[0]
    assert ran["data"]["is_error"] is False and "total" in ran["data"]["output"]
    assert ran["raw"]["tool_use_result"]["interrupted"] is False
    # A sub-agent: its prompt, its calls and messages under the Task call, its progress.
    task = c.seen("tool.call", name="Task")[0]["data"]
    parent = task["tool_call_id"]
    assert c.seen("message", role="user", origin="agent", parent_tool_use_id=parent)
    inner = [f for f in c.seen("tool.call") if f["data"].get("parent_tool_use_id") == parent]
    assert [f["data"]["name"] for f in inner][:2] == ["ListFiles", "ReadFile"]
    updates = [f["data"] for f in c.seen("task.updated")]
    assert updates[0]["event"] == "task_started"
    assert sum(u["event"] == "task_progress" for u in updates) == len(inner)
    assert updates[-1]["event"] == "task_notification" and updates[-1]["status"] == "completed"
    assert c.seen("tool.result", tool_call_id=parent)[0]["data"]["is_error"] is False
    async with d.http() as http:
        tasks = (await http.get(f"/v1/threads/{tid}/tasks")).json()["tasks"]
    assert [(t["description"], t["status"], t["tool_use_id"]) for t in tasks] == [
        ("Survey the workspace", "completed", parent)
    ]
    # A fenced code block in the last reply.
    reply = [f for f in c.seen("message", role="assistant") if f["source"] == "agent" and not f["data"].get("channel")]
    assert "```python" in reply[-1]["data"]["text"]
    await c.close()


async def test_demo_run_shows_a_failed_commands_exit_status_and_refuses_other_commands(daemon_factory: Any) -> None:
    d = await daemon_factory("")
    async with d.http() as http:
        tid = (await http.post("/v1/threads", json={"agent": "demo"})).json()["id"]
    c = await d.ws(tid)
    await c.turn("run git status")  # the workspace is no git repository
    ran = c.seen("tool.result")[-1]["data"]
    assert ran["is_error"] is True and re.match(r"Exit code (128|127)\n", ran["output"]), ran
    await c.turn("run rm -rf .")
    assert len(c.seen("tool.call")) == 1  # not run: no tool call at all
    reply = [f for f in c.seen("message", role="assistant") if f["source"] == "agent"][-1]["data"]["text"]
    assert "only run a few fixed, read-only commands" in reply
    await c.close()
