"""Elicitation end to end through a real daemon: the fake ACP agent asks
(``elicitation/create``), the bridge records ``elicitation.requested``, and whichever client
answers first — REST or a WebSocket frame — settles it; the agent gets the answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import base_config, new_thread, profile_toml
from test_acp_e2e import config, reply_text, sent


async def _asked(d: Any, mode: str = "form") -> tuple[dict[str, Any], Any, dict[str, Any], dict[str, Any]]:
    thread = await new_thread(d, "acp")
    c = await d.ws(thread["id"])
    acc = await c.prompt(f"elicit {mode}")
    req = await c.kind("elicitation.requested")
    return thread, c, acc, req


async def test_rest_answer_reaches_the_agent_and_a_second_answer_is_refused(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    thread, c, acc, req = await _asked(d)
    data = req["data"]
    assert data["mode"] == "form" and data["message"] == "Tell me about it" and data["scope"] == "session"
    schema = data["requested_schema"]
    assert schema["required"] == ["name"] and schema["properties"]["count"]["default"] == 2
    rid = data["request_id"]
    base = f"/v1/threads/{thread['id']}/elicitations"
    async with d.http() as http:
        listed = (await http.get(base)).json()["elicitations"]
        assert [e["request_id"] for e in listed] == [rid] and listed[0]["seq"] == req["seq"]
        # Content the form refuses: 400, and the request still waits.
        bad = await http.post(f"{base}/{rid}", json={"action": "accept", "content": {"name": "x", "count": 9}})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_elicitation_content"
        missing = await http.post(f"{base}/{rid}", json={"action": "accept", "content": {"count": 1}})
        assert missing.status_code == 400
        wrong = await http.post(f"{base}/{rid}", json={"action": "maybe"})
        assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "invalid_action"
        content = {"name": "Ada", "count": 3, "color": "green", "agree": True, "tags": ["b"]}
        ok = await http.post(f"{base}/{rid}", json={"action": "accept", "content": content})
        assert ok.status_code == 200, ok.text
        assert ok.json() == {"request_id": rid, "action": "accept", "by": "rest", "content": content}
        again = await http.post(f"{base}/{rid}", json={"action": "decline"})
        assert again.status_code == 409 and again.json()["error"]["code"] == "already_resolved"
        unknown = await http.post(f"{base}/nope", json={"action": "decline"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "elicitation_not_found"
        assert (await http.get(base)).json()["elicitations"] == []
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "success"
    assert f"elicit: accept {json.dumps(content, sort_keys=True)}" in reply_text(c)
    resolved = c.seen("elicitation.resolved", request_id=rid)
    assert len(resolved) == 1 and resolved[0]["data"]["by"] == "rest"
    await c.close()


async def test_first_answer_wins_across_two_websocket_clients(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    thread, c, acc, req = await _asked(d)
    other = await d.ws(thread["id"], after=0)
    rid = req["data"]["request_id"]
    await other.kind("elicitation.requested")
    await c.send(op="elicitation", request_id=rid, action="decline", client_id="first")
    ok = await c.next(
        lambda f: f.get("kind") in ("client.accepted", "client.rejected") and f["data"].get("op") == "elicitation"
    )
    assert ok["kind"] == "client.accepted" and ok["data"]["by"] == "first"
    await other.send(op="elicitation", request_id=rid, action="accept", content={"name": "late"})
    late = await other.next(lambda f: f.get("kind") == "client.rejected")
    assert late["data"]["code"] == "already_resolved"
    await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert "elicit: decline null" in reply_text(c)
    answers = [json.loads(m["line"]) for m in _agent_stdin(tmp_path) if "action" in m["line"]]
    assert [a["result"] for a in answers if "result" in a] == [{"action": "decline"}]
    await other.close()
    await c.close()


async def test_interrupt_cancels_a_pending_elicitation(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    thread, c, acc, req = await _asked(d, "url")
    data = req["data"]
    assert data["url"] == "https://example.com/connect?e=fake-1" and data["url_host"] == "example.com"
    assert data["elicitation_id"] == "fake-1" and "requested_schema" not in data
    await c.send(op="interrupt")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "cancelled"
    resolved = c.seen("elicitation.resolved", request_id=data["request_id"])
    assert [(r["data"]["action"], r["data"]["by"]) for r in resolved] == [("cancel", "interrupt")]
    assert "elicit: cancel null" in reply_text(c)
    async with d.http() as http:
        r = await http.post(f"/v1/threads/{thread['id']}/elicitations/{data['request_id']}", json={"action": "accept"})
        assert r.status_code == 409
    await c.close()


async def test_a_schema_outside_the_spec_is_refused_to_the_agent(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    c = await d.ws((await new_thread(d, "acp"))["id"])
    end = await c.turn("elicit bad")
    assert end["data"]["status"] == "success"
    assert "elicit: error -32602" in reply_text(c)
    assert not c.seen("elicitation.requested")
    assert any("elicitation refused" in f["data"]["text"] for f in c.seen("diagnostic"))
    assert sent(tmp_path, "initialize")[0]["params"]["clientCapabilities"]["elicitation"] == {"form": {}, "url": {}}
    await c.close()


def _agent_stdin(tmp_path: Path) -> list[dict[str, Any]]:
    from conftest import agent_log

    return [e for e in agent_log(tmp_path) if e["event"] == "stdin"]


def stream_json_config(tmp_path: Path, env: dict[str, str]) -> str:
    cfg = base_config(tmp_path, env)
    return cfg + profile_toml("asker", "stream-json", env, permission_prompts=True)


async def test_claude_codes_elicitation_is_asked_of_clients_with_prompts_on(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(stream_json_config(tmp_path, agent_env))
    thread = await new_thread(d, "asker")
    c = await d.ws(thread["id"])
    acc = await c.prompt("elicit")
    req = await c.kind("elicitation.requested")
    assert req["data"]["server"] == "gh" and req["data"]["requested_schema"]["required"] == ["repo"]
    rid = req["data"]["request_id"]
    await c.send(op="elicitation", request_id=rid, action="accept", content={})
    refused = await c.next(lambda f: f.get("kind") == "client.rejected")
    assert refused["data"]["code"] == "invalid_elicitation_content"  # "repo" is required
    await c.send(op="elicitation", request_id=rid, action="accept", content={"repo": "a/b"})
    await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert 'elicit: accept {"repo": "a/b"}' in reply_text(c)
    # Withdrawn by the agent on an interrupt (control_cancel_request): cancelled by "agent".
    acc = await c.prompt("elicit")
    req = await c.kind("elicitation.requested")  # the next one
    assert req["data"]["request_id"] != rid
    await c.send(op="interrupt")
    await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    resolved = c.seen("elicitation.resolved", request_id=req["data"]["request_id"])
    assert [(r["data"]["action"], r["data"]["by"]) for r in resolved] == [("cancel", "agent")]
    await c.close()


async def test_claude_codes_elicitation_is_declined_by_policy_without_prompts(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env))
    c = await d.ws((await new_thread(d, "stream-json"))["id"])
    end = await c.turn("elicit")
    assert end["data"]["status"] == "success"
    assert "elicit: decline null" in reply_text(c)
    [resolved] = c.seen("elicitation.resolved")
    assert (resolved["data"]["action"], resolved["data"]["by"]) == ("decline", "policy")
    await c.close()
