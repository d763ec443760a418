"""Every client action records who did it (issue #32 B11): each client event (``source:
"client"``: a prompt's ``message``, ``client.other`` for an interrupt, a permission answer,
a raw write, a mode switch) carries ``by`` — the user's name, or ``"operator"`` for the
daemon's own token — in token mode as in users mode, whichever way it came (REST, the
WebSocket, the ACP gateway). Real daemons, real fake agents."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import STEP_TIMEOUT, Client, Daemon, new_thread, profile_toml
from test_acp_e2e import acp_profile
from test_users_e2e import acp_rpc, add_user, bearer, transcript_until, ws_as

pytestmark = pytest.mark.timeout(90)


def config(agent_env: dict[str, str], extra: str = "") -> str:
    return (
        "[server]\nstop_grace_s = 2\n\n"
        + profile_toml("sj", "stream-json", agent_env, permission_prompts=True)
        + acp_profile("moded", agent_env, "--modes")
        + extra
    )


def client_events(events: list[dict[str, Any]]) -> list[tuple[str, str | None, str | None]]:
    """(kind, op, by) of every client event, in order."""
    return [(e["kind"], e["data"].get("op"), e["data"].get("by")) for e in events if e["source"] == "client"]


async def stored(d: Daemon, tid: str, upto: int, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=d.url, headers=headers or d.headers, timeout=STEP_TIMEOUT) as http:
        r = await http.get(f"/v1/threads/{tid}/events", params={"after": 0, "limit": 1000})
        assert r.status_code == 200, r.text
    return [e for e in r.json()["events"] if e["seq"] <= upto]


async def test_every_client_action_of_the_token_records_by_operator_in_token_mode(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d: Daemon = await daemon_factory(config(agent_env))
    tid = (await new_thread(d, "sj"))["id"]
    c = await d.ws(tid)
    async with d.http() as http:
        r = await http.post(f"/v1/threads/{tid}/messages", json={"text": "over rest"})
        assert r.status_code == 202, r.text
        await c.kind("turn.ended", turn_id=r.json()["turn_id"])
        await c.turn("over the socket")

        acc = await c.prompt("count 400")
        await c.kind("message.delta")
        r = await http.post(f"/v1/threads/{tid}/interrupt")
        assert r.status_code == 202 and r.json()["interrupted"] is True
        await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
        acc = await c.prompt("count 400")
        await c.kind("message.delta")
        await c.send(op="interrupt")
        await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])

        acc = await c.prompt("ask")
        req = await c.kind("permission.requested")
        r = await http.post(f"/v1/threads/{tid}/permissions/{req['data']['request_id']}", json={"decision": "allow"})
        assert r.status_code == 200, r.text
        await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
        acc = await c.prompt("ask")
        req = await c.kind("permission.requested")
        await c.send(op="permission", request_id=req["data"]["request_id"], decision="deny")
        await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])

        await c.send(op="raw", message={"type": "keep_alive"})
        raw = await c.next(lambda f: f.get("kind") == "client.accepted" and f["data"].get("op") == "raw")

        moded = (await new_thread(d, "moded", cwd=str(tmp_path)))["id"]
        r = await http.post(f"/v1/threads/{moded}/mode", json={"mode_id": "plan"})
        assert r.status_code == 200, r.text
        mode_seq = (await http.get(f"/v1/threads/{moded}")).json()["last_seq"]

    operator = "operator"
    assert client_events(await stored(d, tid, raw["data"]["seq"])) == [
        ("message", None, operator),  # REST prompt
        ("message", None, operator),  # WebSocket prompt
        ("message", None, operator),
        ("client.other", "interrupt", operator),  # REST
        ("message", None, operator),
        ("client.other", "interrupt", operator),  # WebSocket
        ("message", None, operator),
        ("client.other", "permission", operator),  # REST
        ("message", None, operator),
        ("client.other", "permission", operator),  # WebSocket
        ("client.other", "raw", operator),
    ]
    sets = [e for e in await stored(d, moded, mode_seq) if e["data"].get("op") == "set_mode"]
    assert [(e["data"]["mode_id"], e["data"].get("by")) for e in sets] == [("plan", operator)]


async def test_the_operator_is_recorded_on_a_users_thread_in_users_mode(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    url = f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"
    alice = await add_user(url, "alice")
    d: Daemon = await daemon_factory(config(agent_env, '\n[auth]\nmode = "users"\n'))
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        r = await http.post("/v1/threads", json={"agent": "sj"}, headers=bearer(alice))
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        mine = await http.post(f"/v1/threads/{tid}/messages", json={"text": "alice's"}, headers=bearer(alice))
        assert mine.status_code == 202, mine.text
        await transcript_until(http, tid, alice, lambda e: e["kind"] == "turn.ended")
        # The operator (the daemon's own token) acts on Alice's thread: REST, then the WebSocket.
        theirs = await http.post(f"/v1/threads/{tid}/messages", json={"text": "operator's"}, headers=d.headers)
        assert theirs.status_code == 202, theirs.text
        turn = theirs.json()["turn_id"]
        await transcript_until(
            http, tid, alice, lambda e: e["kind"] == "turn.ended" and e["data"].get("turn_id") == turn
        )
    c = await d.ws(tid)
    await c.turn("operator over the socket")
    acc = await c.prompt("ask")
    req = await c.kind("permission.requested")
    await c.send(op="permission", request_id=req["data"]["request_id"], decision="allow")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    # Alice over the WebSocket too: her name, not the operator's.
    own = Client(await ws_as(d, f"/v1/threads/{tid}/ws", alice))
    d.clients.append(own)
    last = await own.turn("alice over the socket")
    assert last["seq"] > end["seq"]
    assert client_events(await stored(d, tid, last["seq"], bearer(alice))) == [
        ("message", None, "alice"),
        ("message", None, "operator"),
        ("message", None, "operator"),
        ("message", None, "operator"),
        ("client.other", "permission", "operator"),
        ("message", None, "alice"),
    ]


@pytest.mark.parametrize("mode", ["token", "users"])
async def test_a_prompt_over_the_acp_gateway_records_its_caller(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str], mode: str
) -> None:
    d: Daemon = await daemon_factory(config(agent_env, f'\n[auth]\nmode = "{mode}"\n'))
    conn = await ws_as(d, "/v1/acp/sj", d.token or "")
    try:
        assert "result" in await acp_rpc(conn, 1, "initialize", {"protocolVersion": 1})
        new = await acp_rpc(conn, 2, "session/new", {"cwd": str(tmp_path), "mcpServers": []})
        sid = new["result"]["sessionId"]
        prompt = [{"type": "text", "text": "over acp"}]
        answer = await acp_rpc(conn, 3, "session/prompt", {"sessionId": sid, "prompt": prompt})
        assert answer["result"]["stopReason"] == "end_turn", answer
    finally:
        await conn.close()
    async with d.http() as http:
        last = (await http.get(f"/v1/threads/{sid}")).json()["last_seq"]
    assert client_events(await stored(d, sid, last)) == [("message", None, "operator")]
