"""Session modes over the ACP gateway (issue #19, ``session/set_mode``): the official SDK
as the client of a real daemon, an ACP fake agent that advertises modes and honours
``session/set_mode`` as strictly as claude-agent-acp. Every message the gateway sends is
validated against the SDK's schema models (support/acp_client)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import acp
import pytest
from acp import text_block
from conftest import STEP_TIMEOUT, base_config, new_thread, profile_toml
from support.acp_client import connect
from test_acp_e2e import acp_profile


def config(tmp_path: Path, env: dict[str, str]) -> str:
    return (
        base_config(tmp_path, env)
        + acp_profile("moded", env, "--modes")
        + acp_profile("plain", env)
        + profile_toml("sj", "stream-json", env)
    )


async def ask(s: Any, sid: str, text: str) -> str:
    before = len(s.rec.text(sid))
    resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block(text)]), STEP_TIMEOUT)
    assert resp.stop_reason == "end_turn"
    return str(s.rec.text(sid)[before:])


async def test_modes_are_reported_set_through_the_agent_and_kept_with_the_thread(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    s = await connect(d.ws_url, d.token, "/v1/acp/moded")
    await s.initialize()
    new = await asyncio.wait_for(s.conn.new_session(cwd=str(tmp_path)), STEP_TIMEOUT)
    sid = new.session_id
    # session/new started the agent, so its answer has the modes the agent reported.
    assert new.modes is not None and new.modes.current_mode_id == "default"
    assert [m.id for m in new.modes.available_modes] == ["default", "acceptEdits", "plan"]
    await asyncio.wait_for(s.conn.set_session_mode(session_id=sid, mode_id="plan"), STEP_TIMEOUT)
    assert await ask(s, sid, "whatmode") == "mode: plan"  # the agent itself switched
    # An unknown mode: the agent's own refusal, as it gave it; the mode stays.
    with pytest.raises(acp.RequestError) as info:
        await asyncio.wait_for(s.conn.set_session_mode(session_id=sid, mode_id="yolo"), STEP_TIMEOUT)
    assert info.value.code == -32603 and info.value.data == {"details": "Invalid Mode"}
    # The agent switching by itself: current_mode_update reaches the client.
    assert await ask(s, sid, "mode acceptEdits") == "mode: acceptEdits"
    assert [u["currentModeId"] for u in s.rec.of(sid, "current_mode_update")] == ["plan", "acceptEdits"]
    async with d.http() as http:
        thread = (await http.get(f"/v1/threads/{sid}")).json()
        events = (await http.get(f"/v1/threads/{sid}/events")).json()["events"]
    assert thread["agent_info"]["modes"]["currentModeId"] == "acceptEdits"
    changes = [e for e in events if e["kind"] == "agent.status" and e["data"].get("status") == "mode_changed"]
    assert [e["data"]["mode"] for e in changes] == ["plan", "acceptEdits"]
    sets = [e for e in events if e["kind"] == "client.other" and e["data"].get("op") == "set_mode"]
    assert [e["data"]["mode_id"] for e in sets] == ["plan", "yolo"]
    await s.close()
    # Another client: resume and load answer the modes as the agent last reported them.
    other = await connect(d.ws_url, d.token, "/v1/acp/moded")
    await other.initialize()
    resumed = await asyncio.wait_for(other.conn.resume_session(cwd=str(tmp_path), session_id=sid), STEP_TIMEOUT)
    assert resumed.modes is not None and resumed.modes.current_mode_id == "acceptEdits"
    await other.close()
    again = await connect(d.ws_url, d.token)
    await again.initialize()
    loaded = await asyncio.wait_for(again.conn.load_session(cwd=str(tmp_path), session_id=sid), STEP_TIMEOUT)
    assert loaded.modes is not None and loaded.modes.current_mode_id == "acceptEdits"
    # The replay carries the mode changes as they happened.
    assert [u["currentModeId"] for u in again.rec.of(sid, "current_mode_update")] == ["plan", "acceptEdits"]
    await again.close()


@pytest.mark.parametrize("agent", ["sj", "plain"])
async def test_set_mode_where_the_agent_has_no_modes_is_method_not_found(
    daemon_factory: Any, tmp_path: Path, agent_env: Any, agent: str
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    s = await connect(d.ws_url, d.token, f"/v1/acp/{agent}")
    await s.initialize()
    new = await asyncio.wait_for(s.conn.new_session(cwd=str(tmp_path)), STEP_TIMEOUT)
    assert new.modes is None
    with pytest.raises(acp.RequestError) as info:
        await asyncio.wait_for(s.conn.set_session_mode(session_id=new.session_id, mode_id="plan"), STEP_TIMEOUT)
    assert info.value.code == -32601 and info.value.data == {"code": "modes_not_supported"}
    await s.close()


async def test_the_rest_route_starts_the_agent_and_answers_once_it_switched(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    tid = (await new_thread(d, "moded", cwd=str(tmp_path)))["id"]
    sj = (await new_thread(d, "sj", cwd=str(tmp_path)))["id"]
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{tid}")).json()["agent_info"] is None  # not started yet
        r = await http.post(f"/v1/threads/{tid}/mode", json={"mode_id": "plan"})
        assert r.status_code == 200 and r.json() == {"mode_id": "plan"}, r.text
        assert (await http.get(f"/v1/threads/{tid}")).json()["agent_info"]["modes"]["currentModeId"] == "plan"
        r = await http.post(f"/v1/threads/{tid}/mode", json={"mode_id": "yolo"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "mode_refused"
        assert "Internal error" in r.json()["error"]["message"]
        r = await http.post(f"/v1/threads/{sj}/mode", json={"mode_id": "plan"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "modes_not_supported"
        assert (await http.get(f"/v1/threads/{sj}")).json()["state"] == "idle"  # not started for nothing
        r = await http.post(f"/v1/threads/{tid}/mode", json={"mode": "plan"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
        r = await http.post("/v1/threads/nope/mode", json={"mode_id": "plan"})
        assert r.status_code == 404


async def test_the_websocket_set_mode_op_answers_like_the_rest_route(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    tid = (await new_thread(d, "moded", cwd=str(tmp_path)))["id"]
    c = await d.ws(tid)

    def answer(f: dict[str, Any]) -> bool:
        return f.get("kind") in ("client.accepted", "client.rejected") and f["data"].get("op") == "set_mode"

    await c.send(op="set_mode", mode_id="plan", client_id="m1")  # the agent is started for it
    ok = await c.next(answer)
    assert ok["kind"] == "client.accepted" and ok["data"] == {"op": "set_mode", "mode_id": "plan", "client_id": "m1"}
    # Recorded before the agent is asked and changed before the answer, yet sent after it:
    # the answer first (api.md §5.4).
    changed = await c.kind("agent.status", status="mode_changed")
    assert changed["data"]["mode"] == "plan"
    [asked] = c.seen("client.other", op="set_mode")
    assert c.frames.index(ok) < c.frames.index(asked) < c.frames.index(changed)
    await c.send(op="set_mode", mode_id="yolo")
    refused = await c.next(answer)
    assert refused["kind"] == "client.rejected" and refused["data"]["code"] == "mode_refused"
    await c.send(op="set_mode", mode_id="")
    bad = await c.next(answer)
    assert bad["kind"] == "client.rejected" and bad["data"]["code"] == "invalid_frame"
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{tid}")).json()["agent_info"]["modes"]["currentModeId"] == "plan"
    sj = (await new_thread(d, "sj", cwd=str(tmp_path)))["id"]
    c2 = await d.ws(sj)
    await c2.send(op="set_mode", mode_id="plan")
    no = await c2.next(answer)
    assert no["kind"] == "client.rejected" and no["data"]["code"] == "modes_not_supported"
