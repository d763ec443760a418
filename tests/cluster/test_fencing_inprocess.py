"""Conversations under leases, in-process: one real PostgreSQL database opened by two
stores stands for two replicas, the agents are tests/support/memory.py's. Replica a's
clock is frozen, so a believes its lease is fresh while the database has let it expire
and b has taken the thread: a's next append is refused by the database (not by Python),
a kills its agent at once, tells its clients (owner_lost) and drops the thread; b's
takeover closed the books of a's turn once (owner_lost) and resumed the native session.
Also: draining refuses new threads."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.memory import MemoryStore, Spawner
from support.stores import opened_at, thread

from bridge.config import AgentProfile, ServerSettings, Settings
from bridge.errors import Draining, HeldElsewhere, LeaseLost
from bridge.sessions.local_port import LocalPort
from bridge.sessions.ownership import Ownership
from bridge.sessions.registry import Registry
from bridge.store.base import Store
from tests.sessions.test_conversation_memory import echo, prompt, result

pytestmark = pytest.mark.timeout(30)

TTL = 2.0


class Frozen:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def settings(tmp: Path) -> Settings:
    profile = AgentProfile(name="fake", protocol="stream-json", executable="/usr/bin/true")
    return Settings(data_dir=tmp, server=ServerSettings(), agents={"fake": profile}, default_agent="fake")


def replica(tmp: Path, store: Store, rid: str, clock: Any = None) -> tuple[Registry, Spawner]:
    spawner = Spawner(echo)
    reg = Registry(settings(tmp), store, spawn=spawner)
    kw = {} if clock is None else {"clock": clock}
    reg.ownership = Ownership(store, rid, TTL, on_lost=reg._leases_lost, **kw)
    return reg, spawner


async def expired(store: Store, tid: str) -> None:
    async with asyncio.timeout(TTL + 5):
        while True:
            lease = await store.lease_of(tid)
            if lease is None or not lease.live:
                return
            await asyncio.sleep(0.02)


@pytest.fixture
async def stores(pg_url: str) -> AsyncIterator[tuple[Store, Store]]:
    url = pg_url
    async with opened_at(url, "a") as a, opened_at(url, "b") as b:
        yield a, b


async def test_a_stale_holder_is_refused_by_the_database_and_stops_its_agent(
    tmp_path: Path, stores: tuple[Store, Store]
) -> None:
    sa, sb = stores
    reg_a, agents_a = replica(tmp_path, sa, "a", Frozen())
    reg_b, agents_b = replica(tmp_path, sb, "b")
    try:
        conv = await reg_a.create(agent="fake", cwd=None, model=None, title=None, options=None)
        tid = conv.id
        await LocalPort(conv).submit(prompt("hello"), None)  # a turn that ends: native session sess-1
        async with asyncio.timeout(5):
            while conv.turn_active or conv.thread.get("native_session_id") is None:
                await conv.wait_beyond(conv.core.last_seq, 0.5)
        acc = await LocalPort(conv).submit(prompt("slow"), None)  # a turn under way on a
        assert reg_a.ownership is not None and reg_a.ownership.epoch(tid) == 1
        sub = conv.subscribe()

        # b cannot take it while a's lease lives
        with pytest.raises(HeldElsewhere):
            await LocalPort(await reg_b.get(tid)).submit(prompt("too early"), None)
        await expired(sa, tid)  # a stopped renewing (its clock says it need not)
        conv_b = await reg_b.get(tid)
        acc_b = await LocalPort(conv_b).submit(prompt("after takeover"), "cb-1")
        stored = await sb.read_events(tid, 0, 1000)
        assert [r.seq for r in stored] == list(range(1, len(stored) + 1))
        ends = [r for r in stored if r.kind == "turn.ended" and r.data.get("turn_id") == acc.turn_id]
        assert len(ends) == 1 and ends[0].data["reason"] == "owner_lost" and ends[0].data["status"] == "error"
        assert agents_b.agent.spec.argv[-1].endswith("sess-1")  # resumed (--resume=sess-1)
        last_before = stored[-1].seq

        # a's agent speaks: the append is refused by the database, a kills its agent
        agents_a.agent.say(
            {
                "type": "stream_event",
                "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}},
            }
        )
        await asyncio.wait_for(agents_a.agent.wait(), 5)
        assert 9 in agents_a.agent.signals  # SIGKILL, at once
        assert conv.lease.lost and tid not in reg_a._convs
        with pytest.raises(LeaseLost):
            await conv.emit([])
        assert sub.closed and sub.close_reason == "owner_lost"
        assert any(json.loads(t)["data"]["code"] == "owner_lost" for t in sub.side)
        # nothing a wrote after the takeover is in the transcript; b's turn goes on
        agents_b.agent.say(result())
        await (await reg_b.get(tid)).wait_beyond(last_before, 2)
        after = [r for r in await sb.read_events(tid, last_before, 1000)]
        assert all(r.kind != "message.delta" for r in after)
        assert acc_b.turn_id is not None
    finally:
        await reg_a.shutdown()
        await reg_b.shutdown()


async def test_draining_refuses_new_threads(tmp_path: Path) -> None:
    reg = Registry(settings(tmp_path), MemoryStore(), spawn=Spawner(echo))  # type: ignore[arg-type]
    reg.drain()
    with pytest.raises(Draining) as refused:
        await reg.create(agent="fake", cwd=None, model=None, title=None, options=None)
    assert (refused.value.code, refused.value.status) == ("draining", 503)
    await reg.shutdown()


async def test_start_up_recovers_only_what_this_replica_still_owns(tmp_path: Path, stores: tuple[Store, Store]) -> None:
    """Two rows replica a recorded with a live process (real ones, own process groups):
    one whose lease b took since, one nobody holds. a's start-up leaves b's alone (its
    process too) and closes the other's books (daemon_stopped), reaping its process."""
    from bridge.process.reaper import start_time

    sa, sb = stores
    procs = [await asyncio.create_subprocess_exec("sleep", "30", start_new_session=True) for _ in ("mine", "theirs")]
    try:
        ids = []
        for name, proc in zip(("mine", "theirs"), procs, strict=True):
            tid = f"thr_{name}"
            await sa.create_thread(thread(tid))  # type: ignore[arg-type]
            fields = {"state": "running", "turn_active": True, "pid": proc.pid, "pid_start": start_time(proc.pid)}
            await sa.update_thread(tid, fields)  # stamped: replica a recorded this process
            ids.append(tid)
        assert await sb.acquire_lease("thr_theirs", "b", 30) == 1
        reg_a, _ = replica(tmp_path, sa, "a")
        await reg_a.start()
        try:
            mine = await sa.get_thread("thr_mine")
            theirs = await sa.get_thread("thr_theirs")
            assert mine is not None and mine["state"] == "exited" and not mine["turn_active"]
            assert theirs is not None and theirs["state"] == "running" and theirs["turn_active"]
            assert [r.kind for r in await sa.read_events("thr_mine", 0, 10)] == ["process.exited", "turn.ended"]
            assert await sa.read_events("thr_theirs", 0, 10) == []
            await asyncio.wait_for(procs[0].wait(), 5)  # reaped
            assert procs[1].returncode is None  # b's: untouched
            lease = await sa.lease_of("thr_mine")
            assert lease is not None and not lease.live  # released once its books were closed
        finally:
            await reg_a.shutdown()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
