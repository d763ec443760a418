"""What turns used, through a real daemon with the fake agents (issue #38 item 5,
docs/api.md §4.25): each ``turn.ended`` carries the turn's usage with its own cost (the fake
stream-json agent reports Claude Code's running ``total_cost_usd``, the fake ACP agent
``usage_update``s), the thread object carries the totals (also after a restart), ``GET
/v1/usage`` sums them per thread, agent, user and day and refuses bad parameters, and in
users mode each user sees only their own."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import STEP_TIMEOUT, Daemon, new_thread, profile_toml
from test_acp_e2e import acp_profile
from test_users_e2e import add_user, bearer, transcript_until

pytestmark = pytest.mark.timeout(90)


def config(tmp_path: Path, env: dict[str, str]) -> str:
    return "[server]\nstop_grace_s = 1\n\n" + acp_profile("acp", env) + profile_toml("sj", "stream-json", env)


async def usage_of(http: httpx.AsyncClient, headers: dict[str, str], **params: Any) -> dict[str, Any]:
    r = await http.get("/v1/usage", params=params, headers=headers)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_turns_threads_and_the_report_add_up_and_survive_a_restart(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d: Daemon = await daemon_factory(config(tmp_path, agent_env))
    sj, acp = (await new_thread(d, "sj"))["id"], (await new_thread(d, "acp"))["id"]
    c = await d.ws(sj)
    ends = [await c.turn("hello"), await c.turn("again")]
    # the process's running total is 0.125, then 0.25: each turn costs its own share
    assert [e["data"]["usage"]["cost"] for e in ends] == [{"amount": 0.125, "currency": "USD"}] * 2
    assert ends[1]["data"]["usage"]["session_cost"] == {"amount": 0.25, "currency": "USD"}
    assert ends[1]["data"]["usage"]["input_tokens"] == 3
    a = await d.ws(acp)
    await a.turn("usage")
    await a.turn("usage")
    expected_sj = {
        "turns": 2,
        "input_tokens": 6,
        "output_tokens": 10,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "thought_tokens": 0,
        "cost": {"USD": 0.25},
    }
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{sj}")).json()["usage"] == expected_sj
        acp_usage = (await http.get(f"/v1/threads/{acp}")).json()["usage"]
        assert acp_usage["turns"] == 2 and acp_usage["input_tokens"] == 20 and acp_usage["cost"] == {"USD": 0.5}
        listed = {t["id"]: t["usage"] for t in (await http.get("/v1/threads")).json()["threads"]}
        assert listed[sj] == expected_sj
        report = await usage_of(http, d.headers)
        assert report["group_by"] == "thread" and [g["key"] for g in report["groups"]] == [acp, sj]
        assert report["total"]["turns"] == 4 and report["total"]["cost"] == {"USD": 0.75}
        by_agent = await usage_of(http, d.headers, group_by="agent")
        assert {g["key"]: g["usage"]["turns"] for g in by_agent["groups"]} == {"sj": 2, "acp": 2}
        by_day = await usage_of(http, d.headers, group_by="day")
        assert len(by_day["groups"]) == 1 and by_day["groups"][0]["usage"]["turns"] == 4
        later = await usage_of(http, d.headers, since="2999-01-01T00:00:00Z")
        assert later["groups"] == [] and later["total"]["turns"] == 0
        for params in (
            {"group_by": "model"},
            {"since": "yesterday"},
            {"since": "0001-01-01T00:00:00+01:00"},  # out of range once in UTC
            {"since": "2026-12-02T00:00:00Z", "until": "2026-12-01T00:00:00Z"},
            {"limit": 0},
            {"limit": 1001},
        ):
            r = await http.get("/v1/usage", params=params)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", (params, r.text)
    await c.close()
    await a.close()
    await d.stop()
    await d.start()
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{sj}")).json()["usage"] == expected_sj
        assert (await usage_of(http, d.headers))["total"]["turns"] == 4
    c = await d.ws(sj)
    third = await c.turn("once more")  # a new process: its running total starts again
    assert third["data"]["usage"]["cost"] == {"amount": 0.125, "currency": "USD"}
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{sj}")).json()["usage"]["cost"] == {"USD": 0.375}
    await c.close()


async def test_each_user_sees_the_usage_of_their_own_threads(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    url = f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"
    tok = {n: await add_user(url, n, admin=n == "root") for n in ("alice", "bob", "root")}
    cfg = config(tmp_path, agent_env) + f'\n[auth]\nmode = "users"\n\n[store]\nurl = {json.dumps(url)}\n'
    d: Daemon = await daemon_factory(cfg)
    owned: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        for name, turns in (("alice", 2), ("bob", 1)):
            r = await http.post("/v1/threads", json={"agent": "sj"}, headers=bearer(tok[name]))
            assert r.status_code == 201, r.text
            owned[name] = r.json()["id"]
            last = 0  # the seq of the turn end waited for last: each prompt waits for its own
            for i in range(turns):
                r = await http.post(
                    f"/v1/threads/{owned[name]}/messages", json={"text": f"hi {i}"}, headers=bearer(tok[name])
                )
                assert r.status_code == 202, r.text
                seen = await transcript_until(
                    http, owned[name], tok[name], lambda e, after=last: e["kind"] == "turn.ended" and e["seq"] > after
                )
                last = max(e["seq"] for e in seen if e["kind"] == "turn.ended")
        for name, turns in (("alice", 2), ("bob", 1)):
            mine = await usage_of(http, bearer(tok[name]), group_by="user")
            assert [(g["key"], g["usage"]["turns"]) for g in mine["groups"]] == [(name, turns)], (name, mine)
            assert mine["total"]["turns"] == turns
        everyone = await usage_of(http, bearer(tok["root"]), group_by="user")
        assert {g["key"]: g["usage"]["turns"] for g in everyone["groups"]} == {"alice": 2, "bob": 1}
        threads = await usage_of(http, bearer(tok["bob"]))
        assert [g["key"] for g in threads["groups"]] == [owned["bob"]]
