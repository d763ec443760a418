"""The agents' memory through a real daemon (issue #36): admission by the budget, idle
agents evicted for a new one, 503 ``memory_budget`` when none can be, and a profile's
``memory_limit_mb`` stopping a greedy agent while the daemon and other threads go on.

The fake agent keeps memory resident on command (``alloc N``); budgets are a few tens of
MiB so that these stay quick and harmless on a small shared machine. Each agent's tree is
sampled once a second, so each test first waits for the sample it relies on.

The limit is the kernel's where the daemon may make memory cgroups (process/cgroup.py),
else the sample's: the tests that use it read which from /metrics, check it against the
machine (where a memory cgroup can be made here, the daemon must have chosen the kernel),
and assert what that way must show. Neither is skipped: each machine runs one of them."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import STEP_TIMEOUT, alive, new_thread, profile_toml, wait_until

from bridge.process import bwrap
from tests.support.cgroups import agent_cgroup, left_by, v1_writable

MIB = 1024 * 1024


def config(agent_env: dict[str, str], budget: int, *, capacity: str = "", **fields: Any) -> str:
    return (
        f"[server]\nstop_grace_s = 2\n[capacity]\nmemory_budget_mb = {budget}\n{capacity}"
        + profile_toml("mem", "stream-json", agent_env, **fields)
        + profile_toml("calm", "stream-json", agent_env)
    )


async def metrics(d: Any) -> dict[str, float]:
    async with d.http() as http:
        text = (await http.get("/metrics")).text
    return {m[0]: float(m[1]) for m in re.findall(r"^agent_bridge_(\w+) (\S+)$", text, re.M)}


async def limit_mode(d: Any) -> str:
    """How the daemon enforces memory_limit_mb: cgroup_v2, cgroup_v1 or sampling."""
    async with d.http() as http:
        text = (await http.get("/metrics")).text
    [mode] = re.findall(r'^agent_bridge_memory_limit_mode\{mode="(\w+)"\} 1$', text, re.M)
    return str(mode)


async def kernel_limits(d: Any) -> bool:
    """The daemon put agents with a limit into cgroups of their own; where a memory cgroup
    can be made here (the daemon is this process's child, in the same cgroup), it must."""
    mode = await limit_mode(d)
    if v1_writable():
        assert mode != "sampling", f"a memory cgroup can be made here, yet the daemon samples: {d.stderr()}"
    return mode != "sampling"


def started_pid(client: Any) -> int:
    return int(client.seen("process.started")[-1]["data"]["pid"])


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
    """With memory cgroups, the agent runs in one of its own whose limit is memory_limit_mb,
    and the kernel kills it there the moment it passes it (an OOM kill, counted); without,
    the next sample stops it. Either way the exit is memory_limit, not a crash by signal 9,
    its cgroup goes with it, and the daemon and the other thread carry on."""
    d = await daemon_factory(config(agent_env, 0, memory_limit_mb=50))
    kernel = await kernel_limits(d)
    greedy, calm = await new_thread(d, "mem"), await new_thread(d, "calm")
    cg, cc = await d.ws(greedy["id"]), await d.ws(calm["id"])
    assert (await cc.turn("hello"))["data"]["status"] == "success"
    assert agent_cgroup(started_pid(cc)) is None  # no memory_limit_mb: no cgroup of its own
    assert (await cg.turn("hello"))["data"]["status"] == "success"
    own = agent_cgroup(started_pid(cg))
    assert (own is not None) == kernel
    if own is not None:
        assert own[1] == 50 * MIB
    end = await cg.turn("alloc 80 wait")  # over 50 MiB: the kernel's kill, or the next sample's
    assert end["data"]["status"] == "error"
    assert "memory_limit" in end["data"]["error"]
    [exited] = cg.seen("process.exited")  # recorded before the turn's end
    assert exited["data"]["reason"] == "memory_limit"
    assert exited["data"]["signal"] == 9
    assert len(cg.seen("turn.ended", turn_id=end["data"]["turn_id"])) == 1
    figures = await metrics(d)
    assert figures["memory_limit_stops_total"] == 1
    # One process alone: its RSS never exceeds its cgroup's charge, so the sample cannot
    # have been first where the kernel enforces the limit.
    assert figures["memory_oom_kills_total"] == int(kernel)
    if own is not None:
        await wait_until(lambda: not own[0].exists(), what="the agent's cgroup to be removed")
    # The daemon and the other thread carry on; the greedy thread is usable again.
    assert (await cc.turn("still here"))["data"]["status"] == "success"
    assert (await cg.turn("hello"))["data"]["status"] == "success"
    async with d.http() as http:
        assert (await http.get("/readyz")).status_code == 200


async def test_an_agent_stopped_or_left_at_shutdown_leaves_no_cgroup(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env, 0, memory_limit_mb=200))
    kernel = await kernel_limits(d)
    thread = await new_thread(d, "mem")
    c = await d.ws(thread["id"])
    assert (await c.turn("hello"))["data"]["status"] == "success"
    first = agent_cgroup(started_pid(c))
    assert (first is not None) == kernel
    async with d.http() as http:
        assert (await http.post(f"/v1/threads/{thread['id']}/stop")).status_code == 202
    assert (await c.kind("process.exited"))["data"]["reason"] == "stopped"
    if first is not None:
        await wait_until(lambda: not first[0].exists(), what="the stopped agent's cgroup to be removed")
    assert (await c.turn("hello again"))["data"]["status"] == "success"  # a new life, a new cgroup
    second = agent_cgroup(started_pid(c))
    assert (second is not None) == kernel
    assert second is None or first is None or second[0] != first[0]
    assert d.proc is not None
    assert await d.stop() == 0  # the daemon stops the agent on its way out
    assert left_by(d.proc.pid) == []


async def test_without_a_cgroup_to_make_the_sample_enforces_the_limit(
    daemon_factory: Any, agent_env: dict[str, str], tmp_path: Path
) -> None:
    """The daemon pointed at a place with no cgroup file system (as a container with a
    read-only /sys/fs/cgroup has none it may write): it says it samples, and why, and the
    sample stops the agent over its limit as before."""
    capacity = f'agent_cgroups = "{tmp_path / "no-cgroup-fs"}"\n'
    d = await daemon_factory(config(agent_env, 0, capacity=capacity, memory_limit_mb=50))
    assert await limit_mode(d) == "sampling"
    assert "no unified hierarchy" in d.stderr() and "no memory hierarchy" in d.stderr()
    greedy = await new_thread(d, "mem")
    c = await d.ws(greedy["id"])
    end = await c.turn("alloc 80 wait")
    assert end["data"]["status"] == "error"
    assert agent_cgroup(started_pid(c)) is None
    [exited] = c.seen("process.exited")
    assert exited["data"]["reason"] == "memory_limit"
    figures = await metrics(d)
    assert figures["memory_limit_stops_total"] == 1
    assert figures["memory_oom_kills_total"] == 0


async def test_memory_hidden_in_an_escaped_child_counts_and_the_child_goes_with_the_agent(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    """A hostile agent hides its memory in a child that left its session and process group
    (setsid): the sample still counts it, the limit stops the agent, and the child dies too.
    In a cgroup the child cannot even take its 80 MiB: on cgroup v1 the kernel kills it
    alone (the agent survives that, and is then stopped for it), on cgroup v2 the whole
    agent with it (memory.oom.group) before the agent can answer."""
    d = await daemon_factory(config(agent_env, 0, memory_limit_mb=50))
    kernel, mode = await kernel_limits(d), await limit_mode(d)
    hider = await new_thread(d, "mem")
    c = await d.ws(hider["id"])
    end = await c.turn("alloc 80 hide")
    if mode == "cgroup_v2":
        assert end["data"]["status"] == "error" and "memory_limit" in end["data"]["error"]
        [exited] = c.seen("process.exited")
    else:
        assert end["data"]["status"] == "success"
        text = [f for f in c.seen("message") if f["source"] == "agent"][-1]["data"]["text"]
        child = int(re.fullmatch(r"hidden 80 MiB in (\d+)", text)[1])  # type: ignore[index]
        exited = await c.kind("process.exited")
        await wait_until(lambda: not alive(child), what="the hidden child to be killed with the agent")
    assert exited["data"]["reason"] == "memory_limit"
    figures = await metrics(d)
    assert figures["memory_limit_stops_total"] == 1
    assert figures["memory_oom_kills_total"] == int(kernel)


async def test_an_agent_in_bubblewrap_is_in_its_cgroup_from_before_bubblewrap_runs(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    """Confined by bubblewrap (its own cgroup namespace), the agent is still inside its
    cgroup: the child joined it before bubblewrap was executed."""
    if bwrap.find() is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    d = await daemon_factory(config(agent_env, 0, memory_limit_mb=50), extra_env={"AGENT_BRIDGE_SANDBOX": "bubblewrap"})
    kernel = await kernel_limits(d)
    async with d.http() as http:
        assert (await http.get("/v1/daemon")).json()["sandbox"] == "bubblewrap"
    thread = await new_thread(d, "mem")
    c = await d.ws(thread["id"])
    assert (await c.turn("hello"))["data"]["status"] == "success"
    own = agent_cgroup(started_pid(c))  # bubblewrap's own pid: the agent runs beneath it
    assert (own is not None) == kernel
    end = await c.turn("alloc 80 wait")
    assert end["data"]["status"] == "error"
    [exited] = c.seen("process.exited")
    assert exited["data"]["reason"] == "memory_limit"
    assert (await metrics(d))["memory_oom_kills_total"] == int(kernel)
    if own is not None:
        await wait_until(lambda: not own[0].exists(), what="the agent's cgroup to be removed")
