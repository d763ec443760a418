"""A newcomer's first run: no config, the bundled demo agent, through a real daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import new_thread


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
