"""Draining in-process (issue #35 item 4): from SIGTERM (``Registry.drain``) a daemon takes
no new work — a prompt is refused 503 ``draining`` with ``Retry-After``, nothing starts an
agent — while what acts on the running turn (an interrupt) is still served; its agent is
stopped by the drain itself, not later, and the turn ends once. Its leases: the ones it
holds are confirmed (the agent's exit is recorded under them), no other is acquired.
tests/cluster/test_drain_e2e.py does the same across real replicas."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import wait_until
from support.memory import MemoryStore, Spawner

from bridge.errors import Draining
from bridge.sessions.commands import Interrupt, Prompt
from bridge.sessions.local_port import LocalPort
from bridge.sessions.ownership import Ownership
from bridge.sessions.registry import Registry
from tests.cluster.test_fencing_inprocess import settings
from tests.cluster.test_ownership import TTL, Clock, FakeLeases
from tests.sessions.test_conversation_memory import echo, prompt

pytestmark = pytest.mark.timeout(30)


async def test_a_draining_daemon_refuses_new_work_and_stops_its_agent_at_once(tmp_path: Path) -> None:
    store = MemoryStore()
    spawner = Spawner(echo)
    reg = Registry(settings(tmp_path), store, spawn=spawner)  # type: ignore[arg-type]
    try:
        conv = await reg.create(agent="fake", cwd=None, model=None, title=None, options=None)
        port = reg.port(conv)
        acc = await port.run(Prompt(content=prompt("slow")))  # a turn under way (it waits for an interrupt)
        reg.drain()
        with pytest.raises(Draining) as refused:
            await port.run(Prompt(content=prompt("hello"), client_id="after-sigterm"))
        err = refused.value
        assert (err.code, err.status, err.retry_after_s) == ("draining", 503, 1)
        await port.run(Interrupt())  # still served: it acts on what runs here
        await wait_until(lambda: not conv.running, what="the drain to stop the agent (no shutdown() yet)")
        ended = [r for r in store.events[conv.id] if r.kind == "turn.ended"]
        assert [r.data["turn_id"] for r in ended] == [acc.turn_id]
        assert not any(r.data.get("client_id") == "after-sigterm" for r in store.events[conv.id])
        with pytest.raises(Draining):  # no agent starts after SIGTERM (POST …/resume)
            await conv.ensure_started()
        assert len(spawner.agents) == 1
    finally:
        await reg.shutdown()


async def test_a_draining_replica_confirms_its_leases_and_takes_no_other() -> None:
    clock = Clock()
    leases = FakeLeases(clock)
    leases.add("held")
    leases.add("free")
    own = Ownership(leases, "a", TTL, clock=clock)
    epoch = await own.ensure("held")
    own.drain()
    assert await own.ensure("held") == epoch  # the exit is still recorded under it
    with pytest.raises(Draining):
        await own.ensure("free")
    assert leases.rows["free"][0] is None  # not even tried


async def test_a_prompt_past_the_gate_when_the_signal_lands_is_refused_not_recorded(tmp_path: Path) -> None:
    """The port's draining check passed just before SIGTERM (here: the local port is called
    directly, as it is right after that check); the prompt reaches the journal's lock after
    the signal: refused 503 draining, never recorded and then ended "not started"."""
    store = MemoryStore()
    reg = Registry(settings(tmp_path), store, spawn=Spawner(echo))  # type: ignore[arg-type]
    try:
        conv = await reg.create(agent="fake", cwd=None, model=None, title=None, options=None)
        await reg.port(conv).run(Prompt(content=prompt("slow")))  # the agent runs a turn
        reg.drain()
        with pytest.raises(Draining):
            await LocalPort(conv).run(Prompt(content=prompt("late"), client_id="in-flight"))
        assert not any(r.data.get("client_id") == "in-flight" for r in store.events[conv.id])
    finally:
        await reg.shutdown()
