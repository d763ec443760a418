"""Closing the books of a lost owner (issue #35 item 2), in-process.

Pure parts: the requests a lost life left pending, found in a transcript's tail and
further back a page at a time (a request older than the tail is still found, reading
stops at the life's start); the closing events (process end, each pending request
cancelled with the reason, the turn's end, queued prompts "not started").

Then two registries on one real PostgreSQL database stand for two replicas: a runs a turn
whose agent asked for a permission and stops renewing (it "died"); nobody sends input. b's
sweep takes the lease, closes the books once (``owner_lost``), releases it at once; the
request is cancelled in the transcript, b lists nothing pending, and an answer is refused
``already_resolved`` (by owner_lost), not ``permission_not_found``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.memory import MemoryStore, Spawner
from support.stores import opened_at

from bridge.config import AgentProfile, ServerSettings, Settings
from bridge.errors import Conflict
from bridge.protocols.events import Record
from bridge.sessions.lease import closing_events, settled_in_transcript
from bridge.sessions.local_port import LocalPort
from bridge.sessions.ownership import TAIL_EVENTS, Ownership, open_requests, takeover_events
from bridge.sessions.registry import Registry
from bridge.sessions.sweep import OrphanSweep, sweep_interval
from bridge.store.base import Store
from tests.cluster.test_fencing_inprocess import TTL, expired
from tests.sessions.test_conversation_memory import echo, prompt

pytestmark = pytest.mark.timeout(30)


def rec(seq: int, kind: str, **data: Any) -> Record:
    return Record(seq, "2026-12-01T00:00:00.000Z", "bridge", kind, data, None, False)


PERM = "permission.requested"


def test_open_requests_in_a_tail() -> None:
    tail = [
        rec(1, "process.started", pid=1),
        rec(2, PERM, request_id="p1"),
        rec(3, "permission.resolved", request_id="p1", decision="allow", by="rest"),
        rec(4, PERM, request_id="p2"),
        rec(5, "message.delta", text="x"),
        rec(6, PERM, request_id="p3"),
    ]
    assert open_requests(tail) == [(PERM, "p2"), (PERM, "p3")]
    # an earlier life's request is not this life's: its exit (or the start after it) bounds it
    earlier = [rec(1, PERM, request_id="p0"), rec(2, "process.exited", reason="crashed")]
    assert open_requests([*earlier, rec(3, PERM, request_id="p9")]) == [(PERM, "p9")]
    assert open_requests([*earlier]) == []
    assert open_requests([]) == []


def test_closing_events_cancel_each_request_before_the_turn_ends() -> None:
    row: Any = {"id": "t", "state": "running", "turn_active": True, "pid": 7, "pending_permissions": 2}
    events, fields = takeover_events(row, "owner_lost", "turn_1", ["turn_2"], [(PERM, "p2"), (PERM, "p3")])
    assert [e.kind for e in events] == [
        "process.exited",
        "permission.resolved",
        "permission.resolved",
        "turn.ended",
        "turn.ended",
    ]
    assert events[1].data == {"request_id": "p2", "decision": "cancelled", "by": "owner_lost"}
    assert [e.data["turn_id"] for e in events[3:]] == ["turn_1", "turn_2"]
    assert events[4].data["error"].startswith("not started")
    assert fields["pending_permissions"] == 0 and fields["turn_active"] is False


async def _transcript(store: MemoryStore, tid: str, records: list[Record], **row: Any) -> dict[str, Any]:
    thread = {"id": tid, "agent": "fake", "protocol": "stream-json", "cwd": "/", "state": "running"}
    await store.create_thread({**thread, "turn_active": True, "last_seq": 0, **row})
    await store.append(tid, records, [None] * len(records), {})
    got = await store.get_thread(tid)
    assert got is not None
    return got


async def test_a_request_older_than_the_tail_is_found_by_reading_back() -> None:
    store = MemoryStore()
    long = [rec(1, "process.started", pid=1), rec(2, "turn.started", turn_id="turn_1"), rec(3, PERM, request_id="p1")]
    long += [rec(s, "message.delta", text="x") for s in range(4, 4 + 3 * TAIL_EVENTS)]
    row = await _transcript(store, "t", long, pending_permissions=1)
    events, _ = await closing_events(store, row, "owner_lost")  # type: ignore[arg-type]
    assert [(e.kind, e.data.get("request_id")) for e in events if e.kind == "permission.resolved"] == [
        ("permission.resolved", "p1")
    ]
    assert await settled_in_transcript(store, "t", "p1") is None  # type: ignore[arg-type]


async def test_a_long_turn_ends_with_its_id_and_the_prompt_queued_behind_it_ends_too() -> None:
    """The open turn's start (and the prompt queued behind it) lie far before the tail: the
    books are still closed with the turn's id, and the queued prompt ends "not started"."""
    store = MemoryStore()
    prompt_1 = Record(2, "2026-12-01T00:00:00.000Z", "client", "message", {"turn_id": "turn_1"}, None, False)
    prompt_2 = Record(4, "2026-12-01T00:00:00.000Z", "client", "message", {"turn_id": "turn_2"}, None, False)
    long = [rec(1, "process.started", pid=1), prompt_1, rec(3, "turn.started", turn_id="turn_1", prompt_seq=2)]
    long += [prompt_2, *(rec(s, "message.delta", text="x") for s in range(5, 5 + 3 * TAIL_EVENTS))]
    row = await _transcript(store, "t", long, pending_permissions=0)
    events, _ = await closing_events(store, row, "owner_lost")  # type: ignore[arg-type]
    ends = [e.data for e in events if e.kind == "turn.ended"]
    assert [d["turn_id"] for d in ends] == ["turn_1", "turn_2"]
    assert "not started" not in ends[0]["error"] and ends[1]["error"].startswith("not started")


async def test_nothing_is_read_beyond_the_tail_when_nothing_older_is_needed() -> None:
    store = MemoryStore()
    long = [rec(1, "process.started", pid=1), rec(2, PERM, request_id="p0")]
    long += [rec(s, "message.delta", text="x") for s in range(3, 3 + 3 * TAIL_EVENTS)]
    row = await _transcript(store, "u", long, pending_permissions=0, turn_active=False)
    reads = 0
    real = store.read_events

    async def counted(*a: Any, **kw: Any) -> Any:
        nonlocal reads
        reads += 1
        return await real(*a, **kw)

    store.read_events = counted  # type: ignore[method-assign]
    events, _ = await closing_events(store, row, "owner_lost")  # type: ignore[arg-type]
    assert [e.kind for e in events] == ["process.exited"] and reads == 1


def test_the_sweep_interval_scales_on_the_lease() -> None:
    assert sweep_interval(2.0) == 1.0 and sweep_interval(15.0) == 5.0 and sweep_interval(0.2) == 0.5


def replica(tmp: Path, store: Store, rid: str) -> tuple[Registry, Spawner]:
    """A replica whose agent asks clients for permissions (test_fencing_inprocess's, with prompts on)."""
    profile = AgentProfile(name="fake", protocol="stream-json", executable="/usr/bin/true", permission_prompts=True)
    cfg = Settings(data_dir=tmp, server=ServerSettings(), agents={"fake": profile}, default_agent="fake")
    spawner = Spawner(echo)
    reg = Registry(cfg, store, spawn=spawner)
    reg.ownership = Ownership(store, rid, TTL, on_lost=reg._leases_lost)
    return reg, spawner


@pytest.fixture
async def stores(pg_url: str) -> Any:
    async with opened_at(pg_url, "a") as a, opened_at(pg_url, "b") as b:
        yield a, b


async def test_the_sweep_closes_a_dead_owners_turn_and_cancels_its_permission(
    tmp_path: Path, stores: tuple[Store, Store]
) -> None:
    sa, sb = stores
    reg_a, agents_a = replica(tmp_path, sa, "a")  # never started: a renews nothing, as if dead
    reg_b, _ = replica(tmp_path, sb, "b")
    try:
        conv = await reg_a.create(agent="fake", cwd=None, model=None, title=None, options=None)
        tid = conv.id
        acc = await LocalPort(conv).submit(prompt("ask"), None)
        async with asyncio.timeout(5):
            while not conv.pending_permissions():
                await conv.wait_beyond(conv.journal.last_seq, 0.5)
        (asked,) = conv.pending_permissions()
        rid = asked["request_id"]
        assert reg_b.ownership is not None
        sweep_b = OrphanSweep(sb, reg_b.ownership, reg_b, every_s=sweep_interval(TTL))
        assert await sweep_b.sweep_once() == 0  # a's lease lives: nothing to close
        await expired(sb, tid)

        assert await sweep_b.sweep_once() == 1
        stored = await sb.read_events(tid, 0, 1000)
        assert [r.seq for r in stored] == list(range(1, len(stored) + 1))
        tail = [r for r in stored if r.seq > asked["seq"]]
        assert [r.kind for r in tail] == ["process.exited", "permission.resolved", "turn.ended"]
        assert tail[1].data == {"request_id": rid, "decision": "cancelled", "by": "owner_lost"}
        assert tail[2].data["turn_id"] == acc.turn_id and tail[2].data["reason"] == "owner_lost"
        row = await sb.get_thread(tid)
        assert row is not None and row["state"] == "exited" and not row["turn_active"]
        assert row["pending_permissions"] == 0
        lease = await sb.lease_of(tid)
        assert lease is not None and not lease.live and lease.epoch == 2  # taken once, given back at once
        assert not reg_b.ownership.holds(tid)
        assert await sweep_b.sweep_once() == 0  # closed once: nothing left

        # b agrees with the transcript: nothing pending, and an answer is too late, not unknown
        conv_b = await reg_b.get(tid)
        assert conv_b.pending_permissions() == []
        with pytest.raises(Conflict) as late:
            await LocalPort(conv_b).answer_permission(rid, "allow", channel="rest")
        assert late.value.code == "already_resolved" and "owner_lost" in late.value.message
        assert agents_a.agent.alive  # the sweep never touches a process (a's would die with a)
    finally:
        await reg_a.shutdown()
        await reg_b.shutdown()
