"""The agents' memory through a real daemon (issue #36): admission by the budget, idle
agents evicted for a new one, 503 ``memory_budget`` when none can be, and a profile's
``memory_limit_mb`` stopping a greedy agent while the daemon and other threads go on.

The fake agent keeps memory resident on command (``alloc N``); budgets are a few tens of
MiB so that these stay quick and harmless on a small shared machine. Each agent's tree is
sampled once a second, so each test first waits for the sample it relies on."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from conftest import STEP_TIMEOUT, alive, new_thread, profile_toml, wait_until

MIB = 1024 * 1024


def config(agent_env: dict[str, str], budget: int, **fields: Any) -> str:
    return (
        f"[server]\nstop_grace_s = 2\n[capacity]\nmemory_budget_mb = {budget}\n"
        + profile_toml("mem", "stream-json", agent_env, **fields)
        + profile_toml("calm", "stream-json", agent_env)
    )


async def metrics(d: Any) -> dict[str, float]:
    async with d.http() as http:
        text = (await http.get("/metrics")).text
    return {m[0]: float(m[1]) for m in re.findall(r"^agent_bridge_(\w+) (\S+)$", text, re.M)}


async def rss_at_least(d: Any, mib: int) -> None:
    """Until the agents' last sample shows at least ``mib`` MiB resident."""
    async with asyncio.timeout(STEP_TIMEOUT):
        while True:
            if (await metrics(d))["agents_rss_bytes"] >= mib * MIB:
                return
            await asyncio.sleep(0.05)  # the next scrape: the sample is made once a second


async def post_prompt(d: Any, thread_id: str, text: str, client_id: str) -> Any:
    async with d.http() as http:
        return await http.post(f"/v1/threads/{thread_id}/messages", json={"text": text, "client_id": client_id})


async def test_an_idle_agent_is_evicted_to_admit_another(daemon_factory: Any, agent_env: dict[str, str]) -> None:
    d = await daemon_factory(config(agent_env, 100, memory_estimate_mb=40))
    a, b = await new_thread(d, "mem"), await new_thread(d, "calm")
    ca, cb = await d.ws(a["id"]), await d.ws(b["id"])
    assert (await ca.turn("alloc 60"))["data"]["status"] == "success"
    await rss_at_least(d, 60)  # A holds ~70 MiB: with B's 40 it would not fit in 100
    assert (await cb.turn("hello"))["data"]["status"] == "success"
    notice = await ca.kind("notice", code="memory_evicted")
    assert "memory budget" in notice["data"]["text"]
    assert (await ca.kind("process.exited"))["data"]["reason"] == "memory_budget"
    assert (await metrics(d))["memory_evictions_total"] >= 1
    # The evicted thread is kept: its next prompt resumes it (B, idle now, may go for it).
    assert (await ca.turn("hello again"))["data"]["status"] == "success"
    assert not ca.seen("turn.ended", status="error")


async def test_no_room_and_nothing_idle_is_503_and_nothing_is_lost(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env, 100, memory_estimate_mb=40))
    a, b = await new_thread(d, "mem"), await new_thread(d, "calm")
    ca = await d.ws(a["id"])
    await ca.turn("alloc 60")
    slow = await ca.prompt("slow")  # a turn: A is not idle, so nothing can be evicted
    await rss_at_least(d, 60)
    refused = await post_prompt(d, b["id"], "hello", "c-1")
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "memory_budget"
    assert int(refused.headers["Retry-After"]) >= 1
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{b['id']}/events")).json()["events"] == []  # not recorded
        await http.post(f"/v1/threads/{a['id']}/interrupt")
    await ca.kind("turn.ended", turn_id=slow["data"]["turn_id"])
    assert (await metrics(d))["memory_refused_total"] >= 1
    # Retried with the same client_id once A is idle: it runs (A is evicted for it).
    again = await post_prompt(d, b["id"], "hello", "c-1")
    assert again.status_code == 202, again.text
    assert again.json()["duplicate"] is False
    cb = await d.ws(b["id"], after=0)
    assert (await cb.kind("turn.ended"))["data"]["status"] == "success"


async def test_memory_limit_stops_a_greedy_agent_and_the_rest_goes_on(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env, 0, memory_limit_mb=50))
    greedy, calm = await new_thread(d, "mem"), await new_thread(d, "calm")
    cg, cc = await d.ws(greedy["id"]), await d.ws(calm["id"])
    assert (await cc.turn("hello"))["data"]["status"] == "success"
    end = await cg.turn("alloc 80 wait")  # over 50 MiB: stopped at the next sample
    assert end["data"]["status"] == "error"
    assert "memory_limit" in end["data"]["error"]
    [exited] = cg.seen("process.exited")  # recorded before the turn's end
    assert exited["data"]["reason"] == "memory_limit"
    assert len(cg.seen("turn.ended")) == 1
    assert (await metrics(d))["memory_limit_stops_total"] == 1
    # The daemon and the other thread carry on; the greedy thread is usable again.
    assert (await cc.turn("still here"))["data"]["status"] == "success"
    assert (await cg.turn("hello"))["data"]["status"] == "success"
    async with d.http() as http:
        assert (await http.get("/readyz")).status_code == 200


async def test_memory_hidden_in_an_escaped_child_counts_and_the_child_goes_with_the_agent(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    """A hostile agent hides its memory in a child that left its session and process group
    (setsid): the sample still counts it, the limit stops the agent, and the child dies too."""
    d = await daemon_factory(config(agent_env, 0, memory_limit_mb=50))
    hider = await new_thread(d, "mem")
    c = await d.ws(hider["id"])
    end = await c.turn("alloc 80 hide")
    assert end["data"]["status"] == "success"
    text = [f for f in c.seen("message") if f["source"] == "agent"][-1]["data"]["text"]
    child = int(re.fullmatch(r"hidden 80 MiB in (\d+)", text)[1])  # type: ignore[index]
    exited = await c.kind("process.exited")
    assert exited["data"]["reason"] == "memory_limit"
    await wait_until(lambda: not alive(child), what="the hidden child to be killed with the agent")
    assert (await metrics(d))["memory_limit_stops_total"] == 1
