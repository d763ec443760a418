"""The Redis bus between two replicas, against a real redis-server on a free port: wake-ups
cross, commands reach the holder and their answers come back to the sender, heartbeats
show who is alive, and Redis going down and coming back — or freezing and thawing — is
survived with a resync."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
import redis.asyncio as aioredis
from conftest import wait_until
from redis.exceptions import ConnectionError as RedisConnectionError

from bridge.bus.base import BusUnavailable, Command, CommandRefused, NoReply, NotOnBus
from bridge.bus.redis import PICKUP_S, SOCKET_TIMEOUT_S, STALL_S, RedisBus, redact_url
from tests.support.redis_server import MISSING, REDIS_SERVER, RedisServer

pytestmark = pytest.mark.timeout(60)
STEP = 10.0


class Recorder:
    """A listener that remembers what woke it; tests wait on conditions over it."""

    def __init__(self) -> None:
        self.commits: list[tuple[str, int]] = []
        self.changes = 0
        self.resyncs = 0
        self._changed = asyncio.Event()

    def committed(self, thread_id: str, last_seq: int) -> None:
        self.commits.append((thread_id, last_seq))
        self._changed.set()

    def changed(self) -> None:
        self.changes += 1
        self._changed.set()

    def resync(self) -> None:
        self.resyncs += 1
        self._changed.set()

    async def until(self, cond: Callable[[], bool], what: str) -> None:
        async def wait() -> None:
            while not cond():
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(wait(), STEP)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}") from None


async def echo(cmd: Command) -> Mapping[str, Any]:
    if cmd.kind == "interrupt":
        raise CommandRefused({"code": "no_turn", "message": "no turn is running"})
    return {"thread": cmd.thread_id, "kind": cmd.kind, "body": dict(cmd.body), "by": "b"}


async def until_healthy(bus: RedisBus, healthy: bool = True) -> None:
    await wait_until(lambda: bus.healthy == healthy, STEP, f"bus {bus.replica_id} healthy={healthy}")


@pytest.fixture
async def pair(redis_server: RedisServer) -> AsyncIterator[tuple[RedisBus, Recorder, RedisBus, Recorder]]:
    a, b = RedisBus(redis_server.url, "a", heartbeat_s=0.2), RedisBus(redis_server.url, "b", heartbeat_s=0.2)
    ra, rb = Recorder(), Recorder()
    await a.start(ra, echo)
    await b.start(rb, echo)
    await until_healthy(a)
    await until_healthy(b)
    try:
        yield a, ra, b, rb
    finally:
        await a.close()
        await b.close()


async def test_a_commit_announced_on_one_replica_wakes_the_other_and_not_itself(pair: Any) -> None:
    a, ra, b, rb = pair
    await rb.until(lambda: rb.resyncs >= 1, "b's first resync")
    a.announce_commit("thr_1", 3)
    a.announce_commit("thr_1", 5)  # coalesced or not, b learns seq 5
    a.announce_changes()
    await rb.until(lambda: ("thr_1", 5) in rb.commits and rb.changes >= 1, "b woken")
    assert ra.commits == [] and ra.changes == 0
    assert all(seq <= 5 for _, seq in rb.commits)
    assert b.stats()["bus_lag_ms"] >= 0 and b.stats()["bus_received"] >= 2


async def test_a_command_reaches_the_holder_and_its_answer_comes_back_to_the_sender(pair: Any) -> None:
    a, _, b, _ = pair
    reply = await a.request("b", "prompt", "thr_9", {"text": "hello", "client_id": "c1"}, timeout=STEP)
    assert reply.ok and reply.body == {
        "thread": "thr_9",
        "kind": "prompt",
        "body": {"text": "hello", "client_id": "c1"},
        "by": "b",
    }
    refused = await b.request("a", "interrupt", "thr_9", {}, timeout=STEP)
    assert not refused.ok and refused.body["code"] == "no_turn"
    # Many at once: each answer goes to its own request.
    replies = await asyncio.gather(*(a.request("b", "raw", f"thr_{i}", {"n": i}, timeout=STEP) for i in range(20)))
    assert [r.body["body"]["n"] for r in replies] == list(range(20))


async def test_a_command_to_a_replica_without_a_heartbeat_fails_at_once(pair: Any) -> None:
    a, _, _, _ = pair
    with pytest.raises(NoReply, match="not alive"):
        await a.request("gone", "prompt", "thr_1", {}, timeout=STEP)


async def test_a_holder_that_does_not_answer_in_time_is_a_no_reply(redis_server: RedisServer) -> None:
    release = asyncio.Event()

    async def slow(cmd: Command) -> Mapping[str, Any]:
        await release.wait()
        return {}

    a, b = RedisBus(redis_server.url, "a"), RedisBus(redis_server.url, "b")
    await a.start(Recorder(), echo)
    await b.start(Recorder(), slow)
    try:
        await until_healthy(a)
        await until_healthy(b)
        with pytest.raises(NoReply, match="did not answer"):
            await a.request("b", "prompt", "thr_1", {}, timeout=0.3)
    finally:
        release.set()
        await a.close()
        await b.close()


async def test_heartbeats_list_live_replicas_and_a_closed_one_goes_away(pair: Any) -> None:
    a, _, b, _ = pair
    live = await a.live_replicas()
    assert set(live) == {"a", "b"} and live["b"]["replica_id"] == "b"
    await b.close()
    assert set(await a.live_replicas()) == {"a"}


async def test_malformed_messages_from_redis_are_counted_and_ignored(pair: Any, redis_server: RedisServer) -> None:
    a, _, b, rb = pair
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        for junk in (b"not json", b'{"type":"commit","sender":"x","thread":"../etc","seq":1,"at":0}', b"[]"):
            await raw.publish("agent-bridge:commits", junk)
        await raw.rpush("agent-bridge:inbox:b", b'{"type":"command","id":"1"}')
        a.announce_commit("thr_ok", 1)
        await rb.until(lambda: ("thr_ok", 1) in rb.commits, "the good message after the junk")
        assert b.stats()["bus_malformed"] >= 3
        assert all(t == "thr_ok" for t, _ in rb.commits)
        reply = await a.request("b", "prompt", "thr_ok", {}, timeout=STEP)  # the inbox still works
        assert reply.ok
    finally:
        await raw.aclose()


async def test_redis_down_then_back_is_survived_with_a_resync(pair: Any, redis_server: RedisServer) -> None:
    a, _, b, rb = pair
    await rb.until(lambda: rb.resyncs >= 1, "b's first resync")
    redis_server.stop()
    await until_healthy(a, False)
    await until_healthy(b, False)
    a.announce_commit("thr_1", 1)  # dropped, never raises, never blocks
    with pytest.raises(BusUnavailable):
        await a.request("b", "prompt", "thr_1", {}, timeout=STEP)
    resyncs = rb.resyncs
    redis_server.start()
    await until_healthy(a)
    await until_healthy(b)
    await rb.until(lambda: rb.resyncs > resyncs, "a resync after Redis came back")
    a.announce_commit("thr_1", 2)
    await rb.until(lambda: ("thr_1", 2) in rb.commits, "wake-ups after Redis came back")
    assert (await a.request("b", "prompt", "thr_1", {}, timeout=STEP)).ok
    assert b.stats()["bus_reconnects"] >= 1


async def test_a_bus_started_while_redis_is_down_connects_when_it_comes_up(tmp_path: Any) -> None:
    if REDIS_SERVER is None:
        pytest.skip(MISSING)  # as the redis_server fixture does for its siblings
    server = RedisServer(tmp_path / "redis")  # not started
    bus = RedisBus(server.url, "a")
    rec = Recorder()
    await bus.start(rec, echo)
    try:
        assert not bus.healthy
        server.start()
        await until_healthy(bus)
        await rec.until(lambda: rec.resyncs >= 1, "the first resync")
    finally:
        await bus.close()
        server.stop()


def test_passwords_in_bus_urls_are_redacted() -> None:
    assert redact_url("redis://:s3cret@redis:6379/0") == "redis://:***@redis:6379/0"
    assert redact_url("redis://bridge:s3cret@redis/0") == "redis://bridge:***@redis/0"
    assert redact_url("redis://redis:6379/0") == "redis://redis:6379/0"
    with pytest.raises(ValueError, match="replica id"):
        RedisBus("redis://x", "bad id with spaces")


# A frozen Redis (SIGSTOP): its sockets stay open and nothing comes back. Noticed within a
# PING's stall bound plus one command's timeout, and over within a few seconds of the thaw.
NOTICE_S = STALL_S + SOCKET_TIMEOUT_S + 2.0
RECOVER_S = 5.0


async def test_a_frozen_redis_is_noticed_and_the_bus_comes_back_by_itself_after_the_thaw(
    pair: Any, redis_server: RedisServer
) -> None:
    a, _, b, rb = pair
    await rb.until(lambda: rb.resyncs >= 1, "b's first resync")
    assert redis_server.proc is not None
    loop = asyncio.get_running_loop()
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        frozen = loop.time()
        a.announce_commit("thr_1", 1)  # a publish that times out: the first thing to fail
        await wait_until(lambda: not a.healthy and not b.healthy, NOTICE_S, "both buses to notice the freeze")
        noticed = loop.time() - frozen
        with pytest.raises(BusUnavailable):  # at once, not after a command's timeout
            await asyncio.wait_for(a.request("b", "prompt", "thr_1", {}, timeout=STEP), 0.5)
        await asyncio.sleep(max(0.0, SOCKET_TIMEOUT_S + 1.0 - (loop.time() - frozen)))  # frozen past any timeout
        resyncs = rb.resyncs
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    thawed = loop.time()
    await wait_until(lambda: a.healthy and b.healthy, RECOVER_S, "both buses back after the thaw")
    back = loop.time() - thawed
    await rb.until(lambda: rb.resyncs > resyncs, "a resync after the thaw")
    a.announce_commit("thr_1", 2)
    await rb.until(lambda: ("thr_1", 2) in rb.commits, "wake-ups after the thaw")
    assert (await a.request("b", "prompt", "thr_1", {}, timeout=STEP)).ok
    assert (await b.request("a", "prompt", "thr_1", {}, timeout=STEP)).ok
    assert b.stats()["bus_stalls"] >= 1 and a.stats()["bus_reconnects"] >= 1
    assert set(await a.live_replicas()) == {"a", "b"}
    print(f"freeze noticed after {noticed:.2f} s, buses back {back:.2f} s after the thaw")


async def test_a_command_its_holder_does_not_take_is_withdrawn_and_never_runs(
    pair: Any, redis_server: RedisServer
) -> None:
    a, _, _, _ = pair
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        # "ghost" has a heartbeat on the bus but reads no inbox (its link to Redis stalled)
        await raw.set("agent-bridge:replica:ghost", b'{"replica_id":"ghost"}', px=60_000)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(NotOnBus, match="did not take"):
            await a.request("ghost", "prompt", "thr_1", {"client_id": "c1"}, timeout=STEP)
        assert loop.time() - start < PICKUP_S + 1.5  # not the whole timeout
        assert await raw.llen("agent-bridge:inbox:ghost") == 0  # taken back: it can never run late
        with pytest.raises(NotOnBus, match="no heartbeat"):
            await a.request("nobody", "prompt", "thr_1", {}, timeout=STEP)
    finally:
        await raw.aclose()


async def test_an_answer_whose_publish_failed_is_published_again_before_the_deadline(pair: Any) -> None:
    a, _, b, _ = pair
    client = b._client
    assert client is not None
    publish = client.publish
    failed: list[str] = []

    async def flaky(channel: str, data: str) -> int:
        if ":reply:" in channel and not failed:  # the holder's first answer does not get out
            failed.append(channel)
            raise RedisConnectionError("injected: the holder's link dropped")
        return await publish(channel, data)

    client.publish = flaky  # type: ignore[method-assign]
    reply = await a.request("b", "prompt", "thr_r", {"text": "hello"}, timeout=STEP)
    assert failed and reply.ok and reply.body["by"] == "b"  # the command ran once and its answer came
