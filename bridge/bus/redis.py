"""The Redis bus (redis-py asyncio): pub/sub for wake-ups and replies, a list per replica
as its inbox, a key with an expiry per replica as its heartbeat.

Keys (``prefix`` defaults to ``agent-bridge:``, so several deployments can share a Redis):

* ``{prefix}commits`` and ``{prefix}changes`` — channels every replica subscribes to;
* ``{prefix}reply:{replica}`` — the channel a replica's command answers come back on;
* ``{prefix}inbox:{replica}`` — a list: commands for threads whose lease that replica holds (BLPOP);
* ``{prefix}replica:{replica}`` — its heartbeat, a JSON object that expires after
  ``3 × heartbeat_s`` without renewal.

Redis down is not an error for the daemon: announcements are dropped (readers poll the
store), :meth:`RedisBus.request` raises :class:`~bridge.bus.base.BusUnavailable`, and the
loops reconnect with backoff by themselves; whenever the bus comes back the listener is
told to resync, since anything announced meanwhile was lost.

A Redis that stops answering without closing its sockets (frozen, or a network path that
drops packets) is found by timeouts, not by errors: every command gives up after
:data:`SOCKET_TIMEOUT_S` and is never retried after a timeout; the subscription, which
only ever reads and whose reads have no timeout, is PINGed when idle and dropped when no
answer comes (:data:`STALL_S`). redis-py's own pub/sub health check sends a PING but
never checks that the answer came, and TCP keepalives are answered by the kernel of a
stopped process, so neither notices a frozen server. Health goes down on any failed
command and comes back as soon as the subscription is live and a heartbeat write
succeeds again.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
import structlog
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from bridge.bus.base import (
    MAX_MESSAGE_BYTES,
    BusUnavailable,
    Changes,
    Command,
    CommandRefused,
    Commit,
    Handler,
    Listener,
    NoReply,
    NotOnBus,
    Reply,
    parse_message,
    valid_id,
)
from bridge.protocols import jsonline

log = structlog.get_logger("bridge.bus")

BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 2.0
# A command is dropped by the lease holder when its sender's deadline passed this long ago: the
# sender no longer waits, and a late interrupt must not hit a later turn. Covers the wall
# clocks of two hosts disagreeing by up to this much.
CLOCK_SKEW_S = 5.0
CLOSE_TIMEOUT_S = 1.0  # each step of closing the bus
CONNECT_TIMEOUT_S = 2.0
# Any one command's answer: past it the command fails, its connection is dropped, and the
# bus is down until a heartbeat gets through again.
SOCKET_TIMEOUT_S = 3.0
READ_S = 0.5  # the subscription is read in slices this long
IDLE_PING_S = 1.0  # nothing heard on the subscription this long: PING it
STALL_S = 2.5  # nothing heard this long (a PING unanswered for 1.5 s): the connection is dropped
RECHECK_S = 0.5  # while the bus is down, a heartbeat write is tried this often
# An answer whose publish failed is published again this often, until its sender's deadline:
# the command ran, and a sender told nothing would wait for the whole timeout.
REPLY_RETRY_S = 0.25
# A command not taken from the holder's inbox within this long is withdrawn: a live holder
# pops its inbox at once, so one that does not is not reading the bus.
PICKUP_S = 2.0


def redact_url(url: str) -> str:
    """``url`` with any password replaced, for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))


class _Backoff:
    def __init__(self) -> None:
        self.delay = BACKOFF_FIRST_S

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, BACKOFF_MAX_S)
        return delay

    def reset(self) -> None:
        self.delay = BACKOFF_FIRST_S


class SubscriptionStalled(RedisError):
    """The subscription's connection is open but nothing comes back on it."""


class RedisBus:
    def __init__(
        self,
        url: str,
        replica_id: str,
        *,
        prefix: str = "agent-bridge:",
        heartbeat_s: float = 2.0,
        info: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
        on_health: Callable[[bool, str | None], None] | None = None,
    ):
        if not valid_id(replica_id):
            raise ValueError(f"replica id {replica_id!r} is not valid: letters, digits and _.:- only")
        self.replica_id = replica_id
        self.healthy = False
        self.on_health = on_health
        self._url = url
        self._safe_url = redact_url(url)
        self._prefix = prefix
        self._heartbeat_s = heartbeat_s
        self._info = dict(info or {})
        self._clock = clock
        self._client: aioredis.Redis | None = None
        self._sub_client: aioredis.Redis | None = None
        self._subscribed = False  # the subscription is live (its confirmations came back)
        self._listener: Listener | None = None
        self._handler: Handler | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._running: set[asyncio.Task[None]] = set()
        self._pending: dict[str, asyncio.Future[Reply]] = {}
        self._commits: dict[str, int] = {}
        self._changes = False
        self._wake = asyncio.Event()
        self._first_connection = True
        self._stats = {
            "bus_received": 0.0,
            "bus_malformed": 0.0,
            "bus_dropped": 0.0,
            "bus_lag_ms": 0.0,
            "bus_reconnects": 0.0,
            "bus_stalls": 0.0,
        }

    # keys
    def _key(self, *parts: str) -> str:
        return self._prefix + ":".join(parts)

    @property
    def _commits_channel(self) -> str:
        return self._key("commits")

    @property
    def _changes_channel(self) -> str:
        return self._key("changes")

    async def start(self, listener: Listener, handler: Handler) -> None:
        """Starts the loops and returns at once: a Redis that is down now is retried."""
        self._listener, self._handler = listener, handler
        # Commands: one immediate retry on a fresh connection when a pooled one turns out
        # closed (Redis restarted), and a PING before reusing a connection idle for 2 s;
        # never a retry after a timeout, which would only lengthen the wait on a frozen
        # server.
        self._client = self._connect(Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)), 2)
        # The subscription: no retry at all. redis-py would reconnect and resubscribe
        # silently, and the listener would never be told to resync.
        self._sub_client = self._connect(Retry(NoBackoff(), 0), 0)
        for loop in (self._subscribe_loop, self._inbox_loop, self._publish_loop, self._heartbeat_loop):
            self._tasks.append(asyncio.create_task(loop(), name=f"bus.{loop.__name__}"))

    def _connect(self, retry: Retry, health_check_interval: int) -> aioredis.Redis:
        return aioredis.Redis.from_url(
            self._url,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=SOCKET_TIMEOUT_S,
            health_check_interval=health_check_interval,
            retry=retry,
        )

    async def close(self) -> None:
        tasks = [*self._tasks, *self._running]
        for task in tasks:
            task.cancel()
        # A loop stuck in the client library past its cancellation is left behind, not waited
        # for forever: the daemon's shutdown must finish.
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S * 2)
        self._tasks.clear()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(BusUnavailable("the bus is closing"))
        self._pending.clear()
        if self._client is not None:
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await asyncio.wait_for(self._client.delete(self._key("replica", self.replica_id)), CLOSE_TIMEOUT_S)
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await asyncio.wait_for(self._client.aclose(), CLOSE_TIMEOUT_S)
            self._client = None
        if self._sub_client is not None:
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await asyncio.wait_for(self._sub_client.aclose(), CLOSE_TIMEOUT_S)
            self._sub_client = None
        self._set_health(False, "closed")

    # wake-ups
    def announce_commit(self, thread_id: str, last_seq: int) -> None:
        if self._commits.get(thread_id, -1) < last_seq:
            self._commits[thread_id] = last_seq
        self._wake.set()

    def announce_changes(self) -> None:
        self._changes = True
        self._wake.set()

    async def _publish_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            commits, self._commits = self._commits, {}
            changes, self._changes = self._changes, False
            if not self.healthy:
                self._stats["bus_dropped"] += len(commits) + changes
                continue
            now = self._clock()
            try:
                async with self._redis().pipeline(transaction=False) as pipe:
                    for thread_id, seq in commits.items():
                        msg = {"type": "commit", "sender": self.replica_id, "thread": thread_id, "seq": seq, "at": now}
                        pipe.publish(self._commits_channel, jsonline.dumps(msg))
                    if changes:
                        msg = {"type": "changes", "sender": self.replica_id, "at": now}
                        pipe.publish(self._changes_channel, jsonline.dumps(msg))
                    await pipe.execute()
            except (RedisError, OSError) as exc:
                self._stats["bus_dropped"] += len(commits) + changes
                self._failed("publish", exc)

    # the subscription: wake-ups and replies
    async def _subscribe_loop(self) -> None:
        backoff = _Backoff()
        channels = (self._commits_channel, self._changes_channel, self._key("reply", self.replica_id))
        while True:
            assert self._sub_client is not None
            pubsub = self._sub_client.pubsub()
            try:
                await pubsub.subscribe(*channels)
                await self._confirmed(pubsub, len(channels))
                await self._connected()
                backoff.reset()
                await self._listen(pubsub)
            except (RedisError, OSError) as exc:
                self._set_health(False, f"{type(exc).__name__}: {exc}")
            finally:
                self._subscribed = False
                self._answers_lost()
                # Bounded: closing a subscription whose read was cancelled must never hang
                # the loop (or close()) on the connection's lock.
                # (Typed through a variable: redis-py types aclose from 8.2 on, not before.)
                aclose: Callable[[], Awaitable[None]] = pubsub.aclose
                with contextlib.suppress(RedisError, OSError, TimeoutError):
                    await asyncio.wait_for(aclose(), CLOSE_TIMEOUT_S)
            await asyncio.sleep(backoff.next())

    async def _confirmed(self, pubsub: Any, channels: int) -> None:
        """Until Redis has confirmed every channel: only then is a message published to
        them sure to reach us (SUBSCRIBE is sent without waiting for its answer)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + STALL_S
        while channels > 0:
            if loop.time() > end:
                raise SubscriptionStalled(f"the subscription was not confirmed within {STALL_S:g} s")
            msg = await pubsub.get_message(timeout=READ_S)
            if msg is not None and msg.get("type") == "subscribe":
                channels -= 1
            elif msg is not None:
                self._on_message(msg)

    async def _listen(self, pubsub: Any) -> None:
        """Reads the subscription until it fails or stalls. Anything read (a message, or
        the answer to our PING) shows the connection is alive."""
        loop = asyncio.get_running_loop()
        heard, pinged = loop.time(), False
        while True:
            msg = await pubsub.get_message(timeout=READ_S)
            now = loop.time()
            if msg is not None:
                heard, pinged = now, False
                self._on_message(msg)
            elif now - heard > STALL_S:
                self._stats["bus_stalls"] += 1
                raise SubscriptionStalled(
                    f"nothing came back on the subscription for {STALL_S:g} s, not even a PING's answer"
                )
            elif now - heard > IDLE_PING_S and not pinged:
                await pubsub.ping()
                pinged = True

    def _on_message(self, msg: Mapping[str, Any]) -> None:
        if msg.get("type") == "message" and isinstance(msg.get("data"), bytes):
            self._dispatch(msg["data"])

    async def _connected(self) -> None:
        if self._first_connection:
            # Commands left for a previous process with this replica id are not for us.
            await self._redis().delete(self._key("inbox", self.replica_id))
            self._first_connection = False
        else:
            self._stats["bus_reconnects"] += 1
        await self._beat()
        self._subscribed = True
        self._set_health(True, None)
        assert self._listener is not None
        self._listener.resync()

    def _answers_lost(self) -> None:
        """The subscription dropped: answers published until it is back are lost, so
        nobody waits for them."""
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(BusUnavailable("the bus dropped while the answer was awaited"))

    def _dispatch(self, data: bytes) -> None:
        msg = parse_message(data)
        assert self._listener is not None
        if isinstance(msg, Commit):
            if msg.sender != self.replica_id:
                self._lag(msg.at)
                self._listener.committed(msg.thread_id, msg.last_seq)
        elif isinstance(msg, Changes):
            if msg.sender != self.replica_id:
                self._lag(msg.at)
                self._listener.changed()
        elif isinstance(msg, Reply):
            fut = self._pending.get(msg.id)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        else:
            self._malformed("a message on a channel")

    def _lag(self, sent_at: float) -> None:
        self._stats["bus_received"] += 1
        self._stats["bus_lag_ms"] = max(0.0, (self._clock() - sent_at) * 1000)

    def _malformed(self, what: str) -> None:
        self._stats["bus_malformed"] += 1
        log.warning("bus.malformed", what=what, count=int(self._stats["bus_malformed"]))

    # commands
    async def request(
        self, replica_id: str, kind: str, thread_id: str, body: Mapping[str, Any], timeout: float
    ) -> Reply:
        """Sends a command to ``replica_id``'s inbox and waits for its answer."""
        if not self.healthy:
            raise BusUnavailable("the bus is down")
        if not valid_id(replica_id):
            raise NoReply(f"not a replica id: {replica_id!r}")
        cmd = Command(secrets.token_hex(12), self.replica_id, kind, thread_id, body, self._clock() + timeout)
        data = jsonline.dumps(cmd.to_json())
        if len(data.encode()) > MAX_MESSAGE_BYTES:
            raise ValueError("command too large for the bus")
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        fut: asyncio.Future[Reply] = loop.create_future()
        self._pending[cmd.id] = fut
        try:
            await self._send(replica_id, data, timeout)
            if timeout > PICKUP_S:
                await asyncio.wait({fut}, timeout=PICKUP_S)
                if not fut.done() and await self._withdraw(replica_id, data):
                    raise NotOnBus(f"replica {replica_id} did not take the command within {PICKUP_S:g} s")
            return await asyncio.wait_for(fut, max(0.0, end - loop.time()))
        except TimeoutError as exc:
            raise NoReply(f"replica {replica_id} did not answer within {timeout:g} s") from exc
        finally:
            self._pending.pop(cmd.id, None)

    async def _send(self, replica_id: str, data: str, timeout: float) -> None:
        client = self._redis()
        inbox = self._key("inbox", replica_id)
        try:
            if not await client.exists(self._key("replica", replica_id)):
                raise NotOnBus(f"replica {replica_id} is not alive on the bus (no heartbeat)")
            async with client.pipeline(transaction=True) as pipe:
                pipe.rpush(inbox, data)
                pipe.expire(inbox, max(1, math.ceil(timeout + CLOCK_SKEW_S)))
                await pipe.execute()
        except (RedisError, OSError) as exc:  # a socket timeout here is the bus failing, not the holder
            self._failed("send", exc)
            raise BusUnavailable(f"the bus failed: {type(exc).__name__}") from exc

    async def _withdraw(self, replica_id: str, data: str) -> bool:
        """Takes a command back from ``replica_id``'s inbox; True when it was still there
        (so the holder never saw it), False when the holder had already popped it."""
        try:
            return bool(await self._redis().lrem(self._key("inbox", replica_id), 1, data))
        except (RedisError, OSError) as exc:
            self._failed("withdraw", exc)
            raise BusUnavailable(f"the bus failed: {type(exc).__name__}") from exc

    async def _inbox_loop(self) -> None:
        backoff = _Backoff()
        inbox = self._key("inbox", self.replica_id)
        while True:
            try:
                item = await self._redis().blpop([inbox], timeout=1)
                backoff.reset()
            except (RedisError, OSError):
                await asyncio.sleep(backoff.next())  # the subscription loop reports health
                continue
            if item is None:
                continue
            payload = item[1]
            cmd = parse_message(payload) if isinstance(payload, bytes) else None
            if not isinstance(cmd, Command):
                self._malformed("a command in the inbox")
            elif cmd.deadline + CLOCK_SKEW_S < self._clock():
                self._stats["bus_dropped"] += 1
                log.info("bus.command_expired", kind=cmd.kind, thread_id=cmd.thread_id, sender=cmd.sender)
            else:
                task = asyncio.create_task(self._run(cmd), name="bus.command")
                self._running.add(task)
                task.add_done_callback(self._running.discard)

    async def _run(self, cmd: Command) -> None:
        assert self._handler is not None
        try:
            reply = Reply(cmd.id, True, await self._handler(cmd))
        except CommandRefused as exc:
            reply = Reply(cmd.id, False, exc.body)
        except Exception:
            log.exception("bus.command_failed", kind=cmd.kind, thread_id=cmd.thread_id)
            reply = Reply(cmd.id, False, {"code": "internal_error", "message": "the lease holder failed to run it"})
        data = jsonline.dumps(reply.to_json())
        while True:
            try:
                await self._redis().publish(self._key("reply", cmd.sender), data)
                return
            except (RedisError, OSError) as exc:
                self._failed("reply", exc)
                if self._clock() + REPLY_RETRY_S > cmd.deadline:
                    log.warning("bus.reply_lost", kind=cmd.kind, sender=cmd.sender, error=type(exc).__name__)
                    return
            await asyncio.sleep(REPLY_RETRY_S)

    # heartbeats
    async def _heartbeat_loop(self) -> None:
        """Renews the heartbeat, and is the probe that brings the bus back up after a failed
        command while the subscription stayed live (the subscription loop says so itself
        after a reconnection). Without a live subscription no heartbeat is written: a
        replica that cannot hear its inbox's answers is not on the bus."""
        while True:
            await asyncio.sleep(self._heartbeat_s if self.healthy else min(self._heartbeat_s, RECHECK_S))
            if not self._subscribed:
                continue
            try:
                await self._beat()
            except (RedisError, OSError) as exc:
                self._failed("heartbeat", exc)
                continue
            if not self.healthy and self._subscribed:
                self._set_health(True, None)
                assert self._listener is not None
                self._listener.resync()  # announcements published while down may be lost

    async def _beat(self) -> None:
        info = {**self._info, "replica_id": self.replica_id, "at": self._clock()}
        ttl_ms = max(1, int(self._heartbeat_s * 3 * 1000))
        await self._redis().set(self._key("replica", self.replica_id), jsonline.dumps(info), px=ttl_ms)

    async def live_replicas(self) -> dict[str, dict[str, Any]]:
        """Replicas with a live heartbeat, each with what it last said about itself."""
        client = self._redis()
        try:
            keys = [k async for k in client.scan_iter(match=self._key("replica", "*"), count=100)]
            values = await client.mget(keys) if keys else []
        except (RedisError, OSError) as exc:
            self._failed("heartbeat listing", exc)
            raise BusUnavailable(f"the bus failed: {type(exc).__name__}") from exc
        out: dict[str, dict[str, Any]] = {}
        for key, value in zip(keys, values, strict=True):
            replica = key.decode(errors="replace").removeprefix(self._key("replica", ""))
            obj, _, _ = jsonline.parse_object(value) if isinstance(value, bytes) else (None, "", None)
            if valid_id(replica) and obj is not None and len(out) < 1000:
                out[replica] = obj
        return out

    def stats(self) -> dict[str, float]:
        return {**self._stats, "bus_healthy": 1.0 if self.healthy else 0.0}

    def _redis(self) -> aioredis.Redis:
        if self._client is None:
            raise BusUnavailable("the bus is not started")
        return self._client

    def _failed(self, what: str, exc: BaseException) -> None:
        self._set_health(False, f"{what} failed: {type(exc).__name__}")

    def _set_health(self, healthy: bool, reason: str | None) -> None:
        if healthy == self.healthy:
            return
        self.healthy = healthy
        if healthy:
            log.info("bus.up", url=self._safe_url)
        else:
            log.warning("bus.down", url=self._safe_url, reason=reason)
        if self.on_health is not None:
            self.on_health(healthy, reason)
