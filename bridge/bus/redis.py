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
loops reconnect with backoff by themselves; on every (re)connection the listener is told
to resync, since anything announced meanwhile was lost.
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
        self._client = aioredis.Redis.from_url(
            self._url, socket_connect_timeout=2.0, socket_timeout=5.0, health_check_interval=2
        )
        for loop in (self._subscribe_loop, self._inbox_loop, self._publish_loop, self._heartbeat_loop):
            self._tasks.append(asyncio.create_task(loop(), name=f"bus.{loop.__name__}"))

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
                self._set_health(False, f"publish failed: {type(exc).__name__}")

    # the subscription: wake-ups and replies
    async def _subscribe_loop(self) -> None:
        backoff = _Backoff()
        while True:
            pubsub = self._redis().pubsub()
            try:
                await pubsub.subscribe(
                    self._commits_channel, self._changes_channel, self._key("reply", self.replica_id)
                )
                await self._connected()
                backoff.reset()
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None and isinstance(msg.get("data"), bytes):
                        self._dispatch(msg["data"])
            except (RedisError, OSError) as exc:
                self._set_health(False, f"{type(exc).__name__}: {exc}")
            finally:
                # Bounded: closing a subscription whose read was cancelled must never hang
                # the loop (or close()) on the connection's lock.
                # (Typed through a variable: redis-py types aclose from 8.2 on, not before.)
                aclose: Callable[[], Awaitable[None]] = pubsub.aclose
                with contextlib.suppress(RedisError, OSError, TimeoutError):
                    await asyncio.wait_for(aclose(), CLOSE_TIMEOUT_S)
            await asyncio.sleep(backoff.next())

    async def _connected(self) -> None:
        if self._first_connection:
            # Commands left for a previous process with this replica id are not for us.
            await self._redis().delete(self._key("inbox", self.replica_id))
            self._first_connection = False
        else:
            self._stats["bus_reconnects"] += 1
        await self._beat()
        self._set_health(True, None)
        assert self._listener is not None
        self._listener.resync()

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
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[cmd.id] = fut
        try:
            await self._send(replica_id, data, timeout)
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError as exc:
            raise NoReply(f"replica {replica_id} did not answer within {timeout:g} s") from exc
        finally:
            self._pending.pop(cmd.id, None)

    async def _send(self, replica_id: str, data: str, timeout: float) -> None:
        client = self._redis()
        inbox = self._key("inbox", replica_id)
        try:
            if not await client.exists(self._key("replica", replica_id)):
                raise NoReply(f"replica {replica_id} is not alive (no heartbeat)")
            async with client.pipeline(transaction=True) as pipe:
                pipe.rpush(inbox, data)
                pipe.expire(inbox, max(1, math.ceil(timeout + CLOCK_SKEW_S)))
                await pipe.execute()
        except (RedisError, OSError) as exc:  # a socket timeout here is the bus failing, not the holder
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
        try:
            await self._redis().publish(self._key("reply", cmd.sender), jsonline.dumps(reply.to_json()))
        except (RedisError, OSError) as exc:
            log.warning("bus.reply_lost", kind=cmd.kind, sender=cmd.sender, error=type(exc).__name__)

    # heartbeats
    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            if self.healthy:
                with contextlib.suppress(RedisError, OSError):
                    await self._beat()

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
