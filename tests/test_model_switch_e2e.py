"""A thread's model switched mid-thread, the conversation kept (issue #38 item 2), through a
real daemon and the fake agents: ``PATCH /v1/threads/{id} {"model"}`` restarts a
stream-json or awp-jsonl agent on the new model at a turn boundary, resuming its session
(the fake's ``recall`` answers with what its session saw); an ACP agent switches through
its ``model`` config option; the ACP gateway's ``model`` option is the same operation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from acp import text_block
from conftest import FAKE_AGENT, STEP_TIMEOUT, Daemon, agent_log, new_thread, profile_toml
from support.acp_client import connect
from test_acp_e2e import acp_profile, sent
from test_cluster_e2e import metric, replica_pair

from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)


def config(env: dict[str, str]) -> str:
    return (
        "[server]\nstop_grace_s = 1\n\n"
        + profile_toml("sj", "stream-json", env, model="m1")
        + profile_toml("awp", "awp-jsonl", env, model="m1")
        + acp_profile("cfg", env, "--config-options")
        + acp_profile("acp", env)
    )


def starts(tmp_path: Path) -> list[list[str]]:
    return [e["argv"] for e in agent_log(tmp_path) if e["event"] == "start"]


async def patch(d: Any, tid: str, body: dict[str, Any]) -> Any:
    async with d.http() as http:
        return await http.patch(f"/v1/threads/{tid}", json=body)


async def transcript(d: Any, tid: str) -> list[dict[str, Any]]:
    async with d.http() as http:
        r = await http.get(f"/v1/threads/{tid}/events", params={"after": 0, "limit": 1000})
        assert r.status_code == 200, r.text
        return list(r.json()["events"])


@pytest.mark.parametrize(
    ("agent", "model_argv", "resume_argv"),
    [
        ("sj", lambda m: [f"--model={m}"], lambda s: [f"--resume={s}"]),
        ("awp", lambda m: ["--model", m], lambda s: ["--resume", s]),  # the AWP contract's two arguments
    ],
)
async def test_an_idle_agent_restarts_on_the_new_model_and_resumes_its_session(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str], agent: str, model_argv: Any, resume_argv: Any
) -> None:
    d = await daemon_factory(config(agent_env))
    tid = (await new_thread(d, agent))["id"]
    c = await d.ws(tid)
    assert (await c.turn("first words"))["data"]["status"] == "success"
    r = await patch(d, tid, {"model": "m2"})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "m2"
    # The idle agent is stopped now, so that nothing runs on the old model any more.
    notice = await c.kind("notice", code="model_changed")
    assert notice["data"]["model"] == "m2" and notice["data"]["previous"] == "m1"
    assert notice["data"]["by"] == "operator"
    await c.kind("process.exited", reason="model_changed")
    end = await c.turn("recall")
    assert end["data"]["status"] == "success"
    assert "first words" in c.seen("message", role="assistant")[-1]["data"]["text"]  # the conversation kept
    first, last = starts(tmp_path)
    native = c.seen("session.started")[0]["data"]["native_session_id"]
    assert model_argv("m1")[-1] in first and not any(a.startswith("--resume") for a in first)
    assert _holds(last, model_argv("m2")) and _holds(last, resume_argv(native)), last
    # The same model again: nothing changes, nothing is restarted.
    r = await patch(d, tid, {"model": "m2"})
    assert r.status_code == 200 and len(starts(tmp_path)) == 2
    assert len([e for e in await transcript(d, tid) if e["data"].get("code") == "model_changed"]) == 1
    await c.close()


def _holds(argv: list[str], part: list[str]) -> bool:
    return any(argv[i : i + len(part)] == part for i in range(len(argv)))


async def test_a_busy_agent_switches_after_its_turn_and_prompts_sent_meanwhile_run_on_the_new_model(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    tid = (await new_thread(d, "sj"))["id"]
    c = await d.ws(tid)
    held = await c.prompt("workflow")  # waits for FAKE_AGENT_STATE/go
    assert held["kind"] == "client.accepted", held
    await c.kind("task.updated")
    r = await patch(d, tid, {"model": "m2"})
    assert r.status_code == 200 and r.json()["model"] == "m2", r.text
    await c.kind("notice", code="model_changed")
    queued = await c.prompt("recall")  # waits for the new process
    assert queued["kind"] == "client.accepted" and queued["data"]["queued"] is True, queued
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{tid}")).json()["state"] == "running"
    assert len(starts(tmp_path)) == 1 and not c.seen("process.exited")  # the running turn goes on
    (Path(agent_env["FAKE_AGENT_STATE"]) / "go").touch()
    first = await c.kind("turn.ended", turn_id=held["data"]["turn_id"])
    assert first["data"]["status"] == "success"  # the turn was not cut short
    await c.kind("process.exited", reason="model_changed")
    second = await c.kind("turn.ended", turn_id=queued["data"]["turn_id"])
    assert second["data"]["status"] == "success", second
    assert "workflow" in c.seen("message", role="assistant")[-1]["data"]["text"]
    last = starts(tmp_path)[-1]
    assert "--model=m2" in last and any(a.startswith("--resume=") for a in last), last
    # The queued prompt went to the new process only (recorded with its line when written).
    kinds = [(e["kind"], e["data"].get("reason") or e["data"].get("op")) for e in await transcript(d, tid)]
    assert kinds.index(("process.exited", "model_changed")) < kinds.index(("client.other", "prompt"))
    await c.close()


async def test_a_model_that_cannot_be_is_refused_and_changes_nothing(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    tid = (await new_thread(d, "sj"))["id"]
    for body, code in (
        ({"model": "-rf"}, "invalid_model"),  # would read as a flag (docs/api.md §2.2)
        ({"model": "a b"}, "invalid_model"),
        ({"model": ""}, "invalid_request"),
        ({"model": 3}, "invalid_request"),
        ({"model": "m2", "colour": "red"}, "invalid_request"),
    ):
        r = await patch(d, tid, {**body, "title": "never"})
        assert r.status_code == 400 and r.json()["error"]["code"] == code, (body, r.text)
    async with d.http() as http:
        t = (await http.get(f"/v1/threads/{tid}")).json()
        assert (t["model"], t["title"], t["last_seq"]) == ("m1", "", 0)
        r = await http.patch("/v1/threads/thr_0000000000000000", json={"model": "m2"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "thread_not_found"
    # Title and model together: both.
    r = await patch(d, tid, {"model": "m3", "title": "named"})
    assert r.status_code == 200 and (r.json()["model"], r.json()["title"]) == ("m3", "named")


async def test_an_acp_agent_switches_through_its_model_option_and_one_without_is_refused(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    tid = (await new_thread(d, "cfg"))["id"]
    c = await d.ws(tid)
    await c.turn("hello")
    pid = c.seen("process.started")[0]["data"]["pid"]
    r = await patch(d, tid, {"model": "deep"})
    assert r.status_code == 200 and r.json()["model"] == "deep", r.text
    [asked] = sent(tmp_path, "session/set_config_option")
    assert (asked["params"]["configId"], asked["params"]["value"]) == ("model", "deep")
    notice = await c.kind("notice", code="model_changed")
    assert notice["data"]["model"] == "deep"
    await c.turn("whatconfig")
    assert "config: model=deep" in "".join(f["data"]["text"] for f in c.seen("message.delta"))
    assert [f["data"]["pid"] for f in c.seen("process.started")] == [pid]  # no restart: the agent switched
    async with d.http() as http:
        t = (await http.get(f"/v1/threads/{tid}")).json()
    assert [o["currentValue"] for o in t["agent_info"]["config_options"] if o["id"] == "model"] == ["deep"]
    # A new process of the agent starts on its own default: the bridge sets the thread's
    # model again once its session is loaded, before the next prompt.
    async with d.http() as http:
        assert (await http.post(f"/v1/threads/{tid}/stop")).status_code == 202
    mark = len(c.seen("message.delta"))
    await c.turn("whatconfig")
    assert "".join(f["data"]["text"] for f in c.seen("message.delta")[mark:]).startswith("config: model=deep")
    again = sent(tmp_path, "session/set_config_option")[-1]["params"]
    assert len(sent(tmp_path, "session/set_config_option")) == 2 and again["value"] == "deep"
    r = await patch(d, tid, {"model": "huge"})  # not among the values the agent offers
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_model", r.text
    assert "fast, deep" in r.json()["error"]["message"]
    # An ACP agent with no model option: it takes no model on its command line either.
    other = (await new_thread(d, "acp"))["id"]
    r = await patch(d, other, {"model": "deep"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_supported", r.text
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{other}")).json()["model"] is None
    await c.close()


async def test_the_gateways_model_option_is_the_same_switch_and_waits_for_a_busy_turn(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    """A stream-json thread's ``model`` option set over ACP while its turn runs: the turn
    ends, then the agent restarts on it — the switch REST makes, recorded as it is."""
    cfg = config(agent_env).replace('model = "m1"', 'model = "m1"\nmodels = ["m1", "m2"]', 1)
    d = await daemon_factory(cfg)
    s = await connect(d.ws_url, d.token, "/v1/acp/sj")
    await s.initialize()
    new = await s.conn.new_session(cwd=str(tmp_path))
    sid = new.session_id
    c = await d.ws(sid)
    running = asyncio.ensure_future(s.conn.prompt(session_id=sid, prompt=[text_block("workflow")]))
    await c.kind("task.updated")
    got = await asyncio.wait_for(s.conn.set_config_option(session_id=sid, config_id="model", value="m2"), STEP_TIMEOUT)
    assert [o.current_value for o in got.config_options if o.id == "model"] == ["m2"]
    notice = await c.kind("notice", code="model_changed")
    assert notice["data"]["model"] == "m2" and "after the running turn" in notice["data"]["text"]
    assert not running.done()
    (Path(agent_env["FAKE_AGENT_STATE"]) / "go").touch()
    assert (await asyncio.wait_for(running, STEP_TIMEOUT)).stop_reason == "end_turn"
    await c.kind("process.exited", reason="model_changed")
    resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block("recall")]), STEP_TIMEOUT)
    assert resp.stop_reason == "end_turn"
    assert "workflow" in c.seen("message", role="assistant")[-1]["data"]["text"]
    last = starts(tmp_path)[-1]
    assert "--model=m2" in last and any(a.startswith("--resume=") for a in last), last
    assert notice["data"]["by"] == "operator"  # the gateway's caller, as over REST
    await c.close()
    await s.close()


@pytest.fixture
async def pair(pg_url: str, redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[tuple[Daemon, Daemon]]:
    env = {"FAKE_AGENT_LOG": str(tmp_path / "agent.log"), "FAKE_AGENT_STATE": str(tmp_path / "agent-state")}
    (tmp_path / "agent-state").mkdir()
    shared = {"AGENT_BRIDGE_STORE_URL": pg_url, "AGENT_BRIDGE_BUS_URL": redis_server.url}
    agent = profile_toml("sj", "stream-json", env, model="m1")
    async with replica_pair(
        tmp_path, shared, agent, "stop_grace_s = 2\n", env["FAKE_AGENT_LOG"], str(FAKE_AGENT)
    ) as both:
        yield both


async def test_a_switch_asked_of_the_other_replica_is_made_by_the_one_running_the_agent(
    pair: tuple[Daemon, Daemon], tmp_path: Path
) -> None:
    a, b = pair
    tid = (await new_thread(a, "sj"))["id"]
    on_a = await a.ws(tid)
    await on_a.turn("first words")  # A runs the agent and holds the lease
    r = await patch(b, tid, {"model": "m2"})
    assert r.status_code == 200 and r.json()["model"] == "m2", r.text
    await on_a.kind("process.exited", reason="model_changed")  # A's agent, stopped by A
    end = await on_a.turn("recall")
    assert end["data"]["status"] == "success"
    assert "first words" in on_a.seen("message", role="assistant")[-1]["data"]["text"]
    last = starts(tmp_path)[-1]
    assert "--model=m2" in last and any(x.startswith("--resume=") for x in last), last
    assert await metric(b, "agent_bridge_forwarded_total") >= 1
