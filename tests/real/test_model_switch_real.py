"""A thread's model switched mid-thread with the real CLIs (issue #38 item 2), fully offline
against the loopback fake Messages API: after ``PATCH /v1/threads/{id} {"model"}`` the
fake model's next request asks for the new model AND carries the earlier turns (the
conversation kept). Claude Code (stream-json) is restarted on the model and resumed, idle
and in the middle of a turn; claude-agent-acp switches through its ``model`` option."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import new_thread
from fake_anthropic import MODEL, asked_with, block_texts
from realagents import AGENT_TIMEOUT, Real, fake_api, real
from test_claude_agent_acp import acp_profile
from test_claude_code import claude_profile

__all__ = ["fake_api", "real"]  # fixtures used by the tests below

pytestmark = pytest.mark.timeout(180)
OTHER = "claude-fake-2"


def said(request: Any) -> list[str]:
    """Every text of every message the model was sent."""
    return [t for m in request.messages for t in block_texts(m["content"])]


async def patch_model(d: Any, tid: str, model: str) -> dict[str, Any]:
    async with d.http() as http:
        r = await http.patch(f"/v1/threads/{tid}", json={"model": model})
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out


async def test_claude_code_switches_model_idle_and_after_a_running_turn_keeping_the_conversation(real: Real) -> None:
    d = await real.daemon(real.config(claude_profile(real)))
    tid = (await new_thread(d, "claude", cwd=str(real.work)))["id"]
    c = await d.ws(tid)
    assert (await c.turn("CHAT remember the word PINEAPPLE"))["data"]["status"] == "success"
    native = c.seen("session.started")[0]["data"]["native_session_id"]
    # Idle: stopped now, started again on the new model by the next prompt, resumed.
    assert (await patch_model(d, tid, OTHER))["model"] == OTHER
    await c.kind("process.exited", reason="model_changed", timeout=AGENT_TIMEOUT)
    assert (await c.turn("CHAT which word?"))["data"]["status"] == "success"
    second = asked_with(real.fake, "which word?")
    assert second.body["model"] == OTHER
    assert any("remember the word PINEAPPLE" in t for t in said(second))
    assert second.headers["x-claude-code-session-id"] == native
    # Busy: the switch waits for the running turn; a prompt sent meanwhile runs on the new model.
    slow = await c.prompt("SLOW count for me")
    await c.kind("message.delta", timeout=AGENT_TIMEOUT)
    await patch_model(d, tid, MODEL)
    queued = await c.prompt("CHAT third question")
    assert queued["kind"] == "client.accepted" and queued["data"]["queued"] is True, queued
    assert len(c.seen("process.started")) == 2  # the turn goes on in the same process
    await c.send(op="interrupt")
    ended = await c.kind("turn.ended", turn_id=slow["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert ended["data"]["status"] == "cancelled", ended
    third = await c.kind("turn.ended", turn_id=queued["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert third["data"]["status"] == "success", third
    asked = asked_with(real.fake, "third question")
    assert asked.body["model"] == MODEL
    assert any("remember the word PINEAPPLE" in t for t in said(asked))
    assert any("which word?" in t for t in said(asked))
    started = [f["data"]["resume"] for f in c.seen("process.started")]
    assert started == [None, native, native], started
    await c.close()


async def test_claude_agent_acp_switches_through_its_model_option_keeping_the_conversation(real: Real) -> None:
    d = await real.daemon(real.config(acp_profile(real)))
    tid = (await new_thread(d, "claude-acp", cwd=str(real.work)))["id"]
    c = await d.ws(tid)
    assert (await c.turn("CHAT remember the word PINEAPPLE"))["data"]["status"] == "success"
    thread = await patch_model(d, tid, "sonnet")
    assert thread["model"] == "sonnet"
    [option] = [o for o in thread["agent_info"]["config_options"] if o.get("category") == "model"]
    assert option["currentValue"] == "sonnet"
    assert (await c.turn("CHAT which word?"))["data"]["status"] == "success"
    second = asked_with(real.fake, "which word?")
    assert second.body["model"] != MODEL and "sonnet" in second.body["model"], second.body["model"]
    assert any("remember the word PINEAPPLE" in t for t in said(second))
    assert len(c.seen("process.started")) == 1  # the agent switched by itself: no restart
    # A new process loads the session on the agent's default model: the bridge sets the
    # thread's again before the next prompt.
    async with d.http() as http:
        assert (await http.post(f"/v1/threads/{tid}/stop")).status_code == 202
    assert (await c.turn("CHAT after a restart"))["data"]["status"] == "success"
    third = asked_with(real.fake, "after a restart")
    assert "sonnet" in third.body["model"], third.body["model"]
    assert any("which word?" in t for t in said(third))
    async with d.http() as http:
        r = await http.patch(f"/v1/threads/{tid}", json={"model": "no-such-model"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_model", r.text
    await c.close()
