"""Sessions started outside the bridge, through a real daemon (issue #17 item 4): an ACP
agent's own ``session/list`` (the fake ACP agent, spawned for the listing and stopped),
and threads that adopt an agent session with ``native_session_id`` and resume it at
their first prompt (stream-json ``--resume=ID``; ACP ``session/load``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import agent_log, new_thread, processes_with_environ, profile_toml
from test_acp_e2e import acp_profile, sent

pytestmark = pytest.mark.timeout(60)


def config(env: dict[str, str]) -> str:
    return (
        "[server]\nstop_grace_s = 1\n\n"
        + acp_profile("acp", env)
        + acp_profile("acp-nolist", env, "--no-list")
        + profile_toml("fake", "stream-json", env)
    )


async def sessions(d: Any, agent: str, **params: Any) -> tuple[int, dict[str, Any]]:
    async with d.http() as http:
        r = await http.get(f"/v1/agents/{agent}/sessions", params=params)
        return r.status_code, r.json()


async def test_an_acp_agents_own_sessions_are_listed_and_one_is_adopted(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    d = await daemon_factory(config(agent_env))
    # A session the agent keeps (as if made by another client of it): made here, then stopped.
    first = await new_thread(d, "acp", cwd=str(work))
    c = await d.ws(first["id"])
    assert (await c.turn("remember the word KIWI"))["data"]["status"] == "success"
    native = c.seen("session.started")[0]["data"]["native_session_id"]
    async with d.http() as http:
        assert (await http.post(f"/v1/threads/{first['id']}/stop")).status_code == 202

    status, listed = await sessions(d, "acp", cwd=str(work))
    assert status == 200, listed
    assert listed["store"] == "acp" and listed["reason"] is None and listed["next_cursor"] is None
    [entry] = listed["sessions"]
    assert entry["id"] == native and entry["title"] == "remember the word KIWI" and entry["source"] == "acp"
    assert entry["last_activity"].endswith("Z")
    # The agent spawned to list was initialized, asked once for this cwd, and is gone.
    [ask] = sent(tmp_path, "session/list")
    assert ask["params"] == {"cwd": str(work)}
    assert not processes_with_environ(str(tmp_path / "agent.log").encode())

    adopted = await new_thread(d, "acp", cwd=str(work), native_session_id=native)
    assert adopted["native_session_id"] == native and adopted["state"] == "idle"
    c2 = await d.ws(adopted["id"])
    assert (await c2.turn("and again"))["data"]["status"] == "success"
    assert [f["data"]["resume"] for f in c2.seen("process.started")] == [native]
    assert c2.seen("session.started")[0]["data"]["native_session_id"] == native
    [load] = sent(tmp_path, "session/load")
    assert load["params"]["sessionId"] == native and load["params"]["cwd"] == str(work)


async def test_a_stream_json_session_is_adopted_and_resumed_with_its_history(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    c = await d.ws((await new_thread(d, "fake"))["id"])
    assert (await c.turn("hello from elsewhere"))["data"]["status"] == "success"
    native = c.seen("session.started")[0]["data"]["native_session_id"]

    adopted = await new_thread(d, "fake", native_session_id=native)
    c2 = await d.ws(adopted["id"])
    assert (await c2.turn("recall"))["data"]["status"] == "success"
    text = "".join(f["data"]["text"] for f in c2.seen("message", role="assistant"))
    assert "hello from elsewhere" in text, text
    argvs = [e["argv"] for e in agent_log(tmp_path) if e.get("event") == "start"]
    assert f"--resume={native}" in argvs[-1] and not any(a.startswith("--resume") for a in argvs[0])


async def test_listing_and_adopting_refusals(daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]) -> None:
    d = await daemon_factory(config(agent_env))
    status, body = await sessions(d, "acp-nolist", cwd=str(tmp_path))
    assert status == 200 and body["sessions"] == [] and body["reason"] == "not_advertised"
    assert not sent(tmp_path, "session/list")  # never asked
    status, body = await sessions(d, "fake", cwd=str(tmp_path))
    assert status == 200 and body["reason"] == "no_store"
    for agent, params, code, want in [
        ("nope", {"cwd": str(tmp_path)}, 404, "agent_not_found"),
        ("acp", {"cwd": "relative"}, 400, "bad_cwd"),
        ("acp", {}, 400, "invalid_request"),
        ("acp", {"cwd": str(tmp_path), "cursor": "t1/x"}, 400, "invalid_cursor"),
        ("fake", {"cwd": str(tmp_path), "limit": 0}, 400, "invalid_request"),
    ]:
        status, body = await sessions(d, agent, **params)
        assert (status, body["error"]["code"]) == (code, want), (agent, params, body)
    async with d.http() as http:
        for bad in ["-rf /", "../../etc", "x" * 300, "", "a b"]:
            r = await http.post("/v1/threads", json={"agent": "fake", "native_session_id": bad})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_session_id", r.text
        assert not (await http.get("/v1/threads")).json()["threads"]  # nothing was created
