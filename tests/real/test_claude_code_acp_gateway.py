"""The real Claude Code CLI driven over the ACP gateway (issue #19), fully offline: the
official ACP SDK is the client of a real daemon whose profile runs ``@anthropic-ai/
claude-code`` against the loopback fake Messages API (fake_anthropic.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from acp import text_block
from conftest import new_thread
from fake_anthropic import MODEL, asked_with
from realagents import AGENT_TIMEOUT, Real, fake_api, real
from support.acp_client import connect
from test_claude_code import claude_profile

__all__ = ["fake_api", "real"]  # fixtures used by the tests below

pytestmark = pytest.mark.timeout(120)


async def test_claude_code_over_acp_streams_asks_and_loses_a_race_to_rest(real: Real) -> None:
    d = await real.daemon(real.config(claude_profile(real)))
    s = await connect(d.ws_url, d.token, "/v1/acp/claude")
    await s.initialize()
    sid = (await s.conn.new_session(cwd=str(real.work))).session_id
    resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block("CHAT hello")]), AGENT_TIMEOUT)
    assert resp.stop_reason == "end_turn"
    assert s.rec.text(sid) == "Hello from the fake model."  # streamed once, not again whole
    (commands,) = s.rec.of(sid, "available_commands_update")
    assert commands["availableCommands"]  # the CLI's slash commands

    allowed = real.work / "allowed.txt"
    s.rec.answer = lambda ask: {"outcome": "selected", "optionId": "allow"}
    resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block(f"WRITE {allowed}")]), AGENT_TIMEOUT)
    assert resp.stop_reason == "end_turn" and allowed.exists()
    (ask,) = s.rec.asks
    assert ask["toolCall"]["rawInput"]["command"] == f"touch {allowed}" and ask["toolCall"]["kind"] == "execute"
    bash = [u for u in s.rec.of(sid, "tool_call") if u["title"] == "Bash"]
    assert bash and any(
        u["toolCallId"] == bash[-1]["toolCallId"] and u.get("status") == "completed"
        for u in s.rec.of(sid, "tool_call_update")
    )

    # The next request is answered on the web side first: the ACP prompt is cancelled.
    denied = real.work / "denied.txt"
    never: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    s.rec.answer = lambda ask: never
    prompt = asyncio.ensure_future(s.conn.prompt(session_id=sid, prompt=[text_block(f"WRITE {denied}")]))
    await s.rec.wait_for(lambda: len(s.rec.asks) == 2, "the second request", AGENT_TIMEOUT)
    async with d.http() as http:
        (pending,) = (await http.get(f"/v1/threads/{sid}/permissions")).json()["permissions"]
        r = await http.post(f"/v1/threads/{sid}/permissions/{pending['request_id']}", json={"decision": "deny"})
        assert r.status_code == 200, r.text
    resp = await asyncio.wait_for(prompt, AGENT_TIMEOUT)
    assert resp.stop_reason == "end_turn" and not denied.exists()
    assert any(m.get("method") == "$/cancel_request" for m in s.validator.received)
    never.set_result({"outcome": "cancelled"})
    # The thread is an ordinary one: REST lists it with the CLI's session.
    thread = next(t for t in (await _threads(d)) if t["id"] == sid)
    assert thread["agent"] == "claude" and thread["native_session_id"]
    await s.close()
    await new_thread(d, "claude", cwd=str(real.work))  # and the reverse: REST-made, ACP-listed
    s2 = await connect(d.ws_url, d.token)
    await s2.initialize()
    assert len((await s2.conn.list_sessions(cwd=str(real.work))).sessions) == 2
    await s2.close()


async def _threads(d: Any) -> list[dict[str, Any]]:
    async with d.http() as http:
        return list((await http.get("/v1/threads")).json()["threads"])


async def test_claude_code_over_acp_reports_usage_message_ids_and_switches_model(real: Real) -> None:
    """ACP's 2026 additions from a stream-json agent behind the gateway: a ``usage_update``
    at the turn's end (Claude Code's context and cost), one ``messageId`` on the chunks of
    its message, and the ``model`` config option made from the profile's ``models``, whose
    switch makes the next turn ask the API for the new model."""
    other = "claude-fake-2"
    d = await real.daemon(real.config(claude_profile(real) + f"models = {json.dumps([MODEL, other])}\n"))
    s = await connect(d.ws_url, d.token, "/v1/acp/claude")
    await s.initialize()
    new = await s.conn.new_session(cwd=str(real.work))
    sid = new.session_id
    options = [o.model_dump(by_alias=True, exclude_none=True) for o in new.config_options or []]
    [model] = [o for o in options if o.get("category") == "model"]
    assert model["currentValue"] == MODEL and {o["value"] for o in model["options"]} == {MODEL, other}
    resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block("CHAT hello")]), AGENT_TIMEOUT)
    assert resp.stop_reason == "end_turn"
    (usage,) = s.rec.of(sid, "usage_update")
    assert 0 < usage["used"] <= usage["size"] and usage["cost"]["currency"] == "USD", usage
    ids = {u.get("messageId") for u in s.rec.of(sid, "agent_message_chunk")}
    assert len(ids) == 1 and None not in ids, ids

    switched = await asyncio.wait_for(
        s.conn.set_config_option(config_id=model["id"], session_id=sid, value=other), AGENT_TIMEOUT
    )
    now = [o.model_dump(by_alias=True) for o in switched.config_options]
    assert [o["currentValue"] for o in now if o["id"] == model["id"]] == [other]
    resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block("CHAT again")]), AGENT_TIMEOUT)
    assert resp.stop_reason == "end_turn"
    assert asked_with(real.fake, "CHAT again").body["model"] == other
    await s.close()
