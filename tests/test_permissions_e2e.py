"""Permission prompts reach clients, and exactly one answer reaches the agent (issue #5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import agent_log, new_thread, profile_toml
from test_acp_e2e import acp_profile


def cfg(env: dict[str, str], server: str = "") -> str:
    out = "[server]\nstop_grace_s = 1\n" + server + "\n"
    out += profile_toml("sj", "stream-json", env, permission_prompts=True)
    out += profile_toml("quiet", "stream-json", env)
    out += acp_profile("acp", env)
    return out


def written_answers(tmp_path: Path) -> list[dict[str, Any]]:
    out = []
    for e in agent_log(tmp_path):
        if e["event"] != "stdin":
            continue
        msg = json.loads(e["line"])
        if msg.get("type") == "control_response" or (
            "result" in msg and isinstance(msg["result"], dict) and "outcome" in msg["result"]
        ):
            out.append(msg)
    return out


async def test_prompt_reaches_clients_and_one_answer_reaches_the_agent(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(cfg(agent_env))
    thread = await new_thread(d, "sj")
    a = await d.ws(thread["id"])
    acc = await a.prompt("ask")
    req = await a.kind("permission.requested")
    rid = req["data"]["request_id"]
    assert req["data"]["tool"] == "Bash" and req["data"]["input"] == {"command": "touch x"}
    start = next(e for e in agent_log(tmp_path) if e["event"] == "start")
    assert start["argv"][start["argv"].index("--permission-prompt-tool") + 1] == "stdio"
    # A client that attaches now sees the pending request (replay and REST).
    late = await d.ws(thread["id"])
    await late.kind("permission.requested", request_id=rid)
    async with d.http() as http:
        pending = (await http.get(f"/v1/threads/{thread['id']}/permissions")).json()["permissions"]
    assert [p["request_id"] for p in pending] == [rid] and pending[0]["seq"] == req["seq"]
    await a.send(op="permission", request_id=rid, decision="allow", client_id="alice")
    ok = await a.next(
        lambda f: f.get("kind") in ("client.accepted", "client.rejected") and f["data"]["op"] == "permission"
    )
    assert ok["kind"] == "client.accepted"
    resolved = await late.kind("permission.resolved", request_id=rid)
    assert resolved["data"] == {"request_id": rid, "decision": "allow", "by": "alice"}
    end = await a.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "success"
    assert [f for f in a.seen("message") if f["source"] == "agent"][-1]["data"]["text"] == "permission: allow"
    answers = written_answers(tmp_path)
    assert len(answers) == 1
    assert answers[0]["response"]["response"] == {"behavior": "allow", "updatedInput": {"command": "touch x"}}
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{thread['id']}/permissions")).json() == {"permissions": []}
        late_answer = await http.post(f"/v1/threads/{thread['id']}/permissions/{rid}", json={"decision": "deny"})
        assert late_answer.status_code == 409 and late_answer.json()["error"]["code"] == "already_resolved"
        unknown = await http.post(f"/v1/threads/{thread['id']}/permissions/nope", json={"decision": "deny"})
        assert unknown.status_code == 404
        bad = await http.post(f"/v1/threads/{thread['id']}/permissions/{rid}", json={"decision": "maybe"})
        assert bad.status_code == 400


async def test_rest_deny_carries_the_message(daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]) -> None:
    d = await daemon_factory(cfg(agent_env))
    thread = await new_thread(d, "sj")
    c = await d.ws(thread["id"])
    await c.prompt("ask")
    rid = (await c.kind("permission.requested"))["data"]["request_id"]
    async with d.http() as http:
        r = await http.post(
            f"/v1/threads/{thread['id']}/permissions/{rid}", json={"decision": "deny", "message": "not today"}
        )
    assert r.status_code == 200 and r.json()["by"] == "rest"
    await c.kind("turn.ended")
    assert written_answers(tmp_path)[0]["response"]["response"] == {"behavior": "deny", "message": "not today"}


async def test_acp_prompt_answered_with_an_option_and_cancelled_by_interrupt(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(cfg(agent_env))
    c = await d.ws((await new_thread(d, "acp"))["id"])
    await c.prompt("ask")
    req = await c.kind("permission.requested")
    rid = req["data"]["request_id"]
    await c.send(op="permission", request_id=rid, decision="allow", option_id="nonsense")
    bad = await c.next(lambda f: f.get("kind") == "client.rejected")
    assert bad["data"]["code"] == "invalid_option_id"
    await c.send(op="permission", request_id=rid, decision="allow", option_id="allow_always")
    await c.kind("turn.ended")
    assert written_answers(tmp_path)[-1]["result"] == {"outcome": {"outcome": "selected", "optionId": "allow_always"}}
    # Interrupt while the next one is pending: answered `cancelled`, resolved by "interrupt".
    acc = await c.prompt("ask")
    rid2 = (await c.next(lambda f: f.get("kind") == "permission.requested" and f["data"]["request_id"] != rid))["data"][
        "request_id"
    ]
    await c.send(op="interrupt")
    resolved = await c.kind("permission.resolved", request_id=rid2)
    assert resolved["data"]["decision"] == "cancelled" and resolved["data"]["by"] == "interrupt"
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "cancelled"
    assert written_answers(tmp_path)[-1]["result"] == {"outcome": {"outcome": "cancelled"}}


async def test_profile_secrets_never_reach_the_transcript_clients_or_logs(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    secret = "sk-test-0123456789abcdef"
    d = await daemon_factory(cfg({**agent_env, "FAKE_API_KEY": secret}))
    thread = await new_thread(d, "sj")
    c = await d.ws(thread["id"])
    await c.turn("leak FAKE_API_KEY")
    text = [f for f in c.seen("message") if f["source"] == "agent"][-1]["data"]["text"]
    assert text == "the value of FAKE_API_KEY is [redacted]"

    # stderr is its own pipe: its line may arrive after the turn ended
    def is_leak(f: dict[str, Any]) -> bool:
        return f.get("kind") == "diagnostic" and "my secret is" in f["data"]["text"]

    leaked = [f for f in c.frames if is_leak(f)] or [await c.next(is_leak)]
    assert any("my secret is [redacted]" in f["data"]["text"] for f in leaked)
    assert secret not in "".join(c.texts)
    async with d.http() as http:
        page = await http.get(f"/v1/threads/{thread['id']}/events", params={"limit": 1000})
    assert secret not in page.text
    assert secret not in d.stderr()
    for db_file in d.data_dir.glob("bridge.db*"):  # the database and its WAL
        assert secret.encode() not in db_file.read_bytes()
