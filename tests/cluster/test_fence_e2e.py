"""A frozen owner's agent is dead before another replica's agent starts on the same native
session (issue #35 item 5, D7), across real daemons: two replicas on one PostgreSQL and one
Redis, a 3 s lease, the fake agent keeping its history in a state dir both replicas'
agents share (a shared HOME) and logging a heartbeat with the wall time every 20 ms (its
stand-in for writing its session files).

The owner is SIGSTOPped in the middle of a turn: it cannot fence itself, but its fence
watchdog (bridge/process/fence.py), a process of its own, kills the agent half a margin
after the lease's self-fence deadline, before the lease can expire in the store. The other
replica takes the thread over (prompted until it accepts) and resumes the session. From
the agents' heartbeats and the watchdog's log line: the old agent's last write and its kill
both come before the new agent's first write (overlap zero; without the watchdog the old
agent kept writing until SIGCONT: about 4 s of overlap). Then SIGCONT: the stale owner
behaves as before — its client is told ``owner_lost`` and closed 1012, its lease count is
zero, and the transcript is one consistent sequence whichever replica is asked."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import agent_log, alive, new_thread

from tests.cluster.test_takeover_e2e import (
    RESUME_S,
    TTL,
    Cluster,
    agent_pids,
    recall_on,
    stale_holder_woke,
    start_long_turn,
    take_over,
)
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(120)

BEAT_S = 0.02
MARGIN = TTL / 5  # ownership's margin: the daemon fences at ttl - margin, the watchdog half a margin later


@pytest.fixture
async def cluster(
    pg_url: str, redis_server: RedisServer, tmp_path: Path, agent_env: dict[str, str]
) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, pg_url, redis_server.url, {**agent_env, "FAKE_HEARTBEAT_S": str(BEAT_S)})
    try:
        yield c
    finally:
        await c.close()


def beats(tmp: Path, pid: int) -> list[float]:
    return [e["t"] for e in agent_log(tmp) if e["event"] == "beat" and e["pid"] == pid]


def kills(stderr: str) -> list[dict[str, Any]]:
    """The fence watchdog's log lines (JSON, whatever the daemon's log format)."""
    out = []
    for line in stderr.splitlines():
        if '"fence.agent_killed"' in line:
            out.append(json.loads(line))
    return out


async def test_a_frozen_owners_agent_dies_before_the_takeover_starts_another(cluster: Cluster, tmp_path: Path) -> None:
    a = await cluster.start("a")
    b = await cluster.start("b")
    tid = (await new_thread(a, "stream-json"))["id"]
    c, turn_id, native = await start_long_turn(a, tid)
    old_agent = agent_pids(tmp_path)[-1]
    assert alive(old_agent) and beats(tmp_path, old_agent)
    seen_before = [f for f in c.frames if f.get("seq")]
    a.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
    stopped = time.time()
    try:
        acc, took = await take_over(b, tid, "recall", "after-stop", within=TTL + RESUME_S + 1)
        assert "remember kiwi" in await recall_on(b, tid, 0, acc["turn_id"])
        # a is still frozen: its watchdog killed the agent, nothing of a's own did
        assert not alive(old_agent)
        new_agent = agent_pids(tmp_path)[-1]
        (started,) = [e for e in agent_log(tmp_path) if e["event"] == "start" and e["pid"] == new_agent]
        assert new_agent != old_agent and f"--resume={native}" in started["argv"]  # the same native session
        (kill,) = [k for k in kills(a.stderr()) if k["thread"] == tid]
        assert old_agent in kill["pids"] and kill["why"] == "deadline"
    finally:
        a.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    killed_at = datetime.fromisoformat(kill["timestamp"]).timestamp()
    last_old, first_new = beats(tmp_path, old_agent)[-1], beats(tmp_path, new_agent)[0]
    overlap = max(0.0, last_old - first_new)
    print(
        f"\nfence: SIGSTOP→kill {killed_at - stopped:.3f}s, kill late {kill['late_s']:.4f}s "
        f"(self-fence deadline→kill {MARGIN / 2 + kill['late_s']:.3f}s), kill→new agent's first write "
        f"{first_new - killed_at:.3f}s, old agent's last write→new agent's first {first_new - last_old:.3f}s, "
        f"overlap {overlap:.3f}s, takeover took {took:.2f}s"
    )
    assert overlap == 0.0 and killed_at < first_new
    # the kill came within the lease: no later than ttl - margin/2 after the freeze
    assert killed_at - stopped <= TTL - MARGIN / 2 + 0.5

    # a wakes up: as without the watchdog, it knows its lease is gone and tells its client
    await stale_holder_woke(a, b, c, tid, seen_before, turn_id)
    # the new owner's agent was never touched
    assert alive(new_agent)
