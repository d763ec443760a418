"""In-memory test doubles for the conversation: an agent that implements the AgentIO seam
(bridge/process/agent_io.py) without a process, and a store that implements the store
protocols (bridge/store/base.py) without a database. With them a Conversation runs its
whole logic in milliseconds; what crosses a real process or socket stays in the e2e tests.

The agent is driven from the test: what the conversation writes arrives in
``agent.written`` (await ``agent.line()``), what the agent says is pushed with
``agent.say(obj)``; ``script`` may answer each written line at once (a scripted agent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from bridge.errors import StoreError
from bridge.process.agent_io import ExitInfo
from bridge.process.launch import LaunchSpec
from bridge.protocols.envelope import Frames, Page
from bridge.protocols.events import Record
from bridge.protocols.framing import LineTooLong
from bridge.store.base import SecretRow, StoreListeners

Script = Callable[["MemoryAgent", dict[str, Any]], None]


class MemoryAgent:
    """An agent process in memory. ``exit_on_eof``: closing stdin ends it (code 0), as a
    polite CLI does; otherwise only a signal does."""

    _next_pid = 40000

    def __init__(self, spec: LaunchSpec, script: Script | None = None, *, exit_on_eof: bool = True) -> None:
        MemoryAgent._next_pid += 1
        self.pid = MemoryAgent._next_pid
        self.start_time: int | None = 1
        self.spec = spec
        self.script = script
        self.exit_on_eof = exit_on_eof
        self.written: list[str] = []
        self.signals: list[int] = []
        self._out: asyncio.Queue[list[bytes] | BaseException | None] = asyncio.Queue()
        self._err: asyncio.Queue[str | None] = asyncio.Queue()
        self._wrote = asyncio.Condition()
        self._exited = asyncio.Event()
        self._exit = ExitInfo(None, None)
        self.stdin_closed = False
        self.released = False

    # -- the test's side

    def say(self, *objs: dict[str, Any] | str | bytes) -> None:
        """Lines on stdout, all in one read (one batch)."""
        lines = []
        for o in objs:
            if isinstance(o, dict):
                lines.append(json.dumps(o).encode())
            elif isinstance(o, str):
                lines.append(o.encode())
            else:
                lines.append(o)
        self._out.put_nowait(lines)

    def say_stderr(self, text: str) -> None:
        self._err.put_nowait(text)

    def too_long(self, text: str = "line longer than the cap") -> None:
        self._out.put_nowait(LineTooLong(text))

    def close_stdout(self) -> None:
        self._out.put_nowait(None)
        self._err.put_nowait(None)

    def exit(self, code: int | None = 0, sig: int | None = None) -> None:
        if not self._exited.is_set():
            self._exit = ExitInfo(code, sig)
            self.close_stdout()
            self._exited.set()

    @property
    def alive(self) -> bool:
        return not self._exited.is_set()

    async def line(self, index: int, timeout: float = 5.0) -> dict[str, Any]:
        """The ``index``-th line the conversation wrote (waiting for it), parsed."""
        async with asyncio.timeout(timeout):
            async with self._wrote:
                await self._wrote.wait_for(lambda: len(self.written) > index)
        return json.loads(self.written[index])

    # -- AgentIO

    async def write_line(self, line: str) -> None:
        if self.stdin_closed or not self.alive:
            raise BrokenPipeError("agent stdin is closed")
        assert "\n" not in line
        self.written.append(line)
        async with self._wrote:
            self._wrote.notify_all()
        if self.script is not None:
            self.script(self, json.loads(line))

    async def stdout_batches(self) -> AsyncIterator[list[bytes]]:
        while True:
            item = await self._out.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def pump_stderr(self, emit: Callable[[str], Awaitable[None]]) -> None:
        while (text := await self._err.get()) is not None:
            await emit(text)

    async def wait(self) -> ExitInfo:
        await self._exited.wait()
        return self._exit

    def signal_group(self, sig: int) -> bool:
        self.signals.append(sig)
        if not self.alive:
            return False
        if sig in (signal.SIGTERM, signal.SIGKILL):
            self.exit(None, sig)
        return True

    def release(self) -> None:
        self.released = True

    async def stop(self, grace_s: float, *, shutdown_line: str | None = None) -> ExitInfo:
        if shutdown_line is not None and self.alive and not self.stdin_closed:
            await self.write_line(shutdown_line)
        self.stdin_closed = True
        if self.exit_on_eof:
            self.exit(0)
        try:
            async with asyncio.timeout(grace_s):
                return await self.wait()
        except TimeoutError:
            self.signal_group(signal.SIGTERM)
            return await self.wait()


class Spawner:
    """``spawn=`` for a Conversation: makes MemoryAgents and keeps them for the test."""

    def __init__(self, script: Script | None = None, **kw: Any) -> None:
        self.script = script
        self.kw = kw
        self.agents: list[MemoryAgent] = []

    async def __call__(self, spec: LaunchSpec) -> MemoryAgent:
        await asyncio.sleep(0)  # a real spawn yields to the loop
        agent = MemoryAgent(spec, self.script, **self.kw)
        self.agents.append(agent)
        return agent

    @property
    def agent(self) -> MemoryAgent:
        return self.agents[-1]


class MemoryStore:
    """The thread, transcript and browser-session stores in dicts. ``fail_appends`` makes
    appends raise (a store that cannot write)."""

    def __init__(self) -> None:
        self.healthy = True
        self.shared = False
        self.listeners = StoreListeners()
        self.threads: dict[str, dict[str, Any]] = {}
        self.events: dict[str, list[Record]] = {}
        self.client_ids: dict[tuple[str, str], int] = {}
        self.sessions: dict[str, float] = {}
        self.session_users: dict[str, str | None] = {}
        self.secrets: dict[tuple[str, str, str], SecretRow] = {}
        self.fail_appends: BaseException | None = None
        self.block_appends: asyncio.Event | None = None  # set: appends wait (a disk that is full)
        self.blocked = asyncio.Event()  # an append is waiting on block_appends

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def ping(self) -> None:
        return None

    # threads
    async def create_thread(self, thread: dict[str, Any]) -> None:
        self.threads[thread["id"]] = dict(thread)
        self.events[thread["id"]] = []

    async def get_thread(self, thread_id: str) -> dict[str, Any] | None:
        row = self.threads.get(thread_id)
        return dict(row) if row else None

    async def list_threads(
        self,
        *,
        limit: int,
        cursor: str | None,
        agent: str | None,
        owner: str | None = None,
        archived: bool | None = False,
    ) -> tuple[list[dict[str, Any]], str | None]:
        rows = sorted(self.threads.values(), key=lambda r: (r["updated_at"], r["id"]), reverse=True)
        rows = [
            r
            for r in rows
            if (agent is None or r["agent"] == agent)
            and (owner is None or r.get("owner") == owner)
            and (archived is None or bool(r.get("archived")) == archived)
        ]
        return [dict(r) for r in rows[:limit]], None

    async def update_thread(self, thread_id: str, fields: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        if self.block_appends is not None:
            await self.block_appends.wait()
        self.threads[thread_id].update(fields)

    @contextlib.asynccontextmanager
    async def creation_lock(self) -> AsyncIterator[None]:
        yield

    async def count_threads(self, owner: str | None = None) -> int:
        return sum(1 for r in self.threads.values() if owner is None or r.get("owner") == owner)

    async def delete_thread(self, thread_id: str) -> bool:
        self.events.pop(thread_id, None)
        return self.threads.pop(thread_id, None) is not None

    async def live_threads(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.threads.values() if r["state"] != "exited" or r["turn_active"]]

    # transcript
    async def append(
        self,
        thread_id: str,
        records: Sequence[Record],
        client_ids: Sequence[str | None],
        thread_fields: dict[str, Any],
    ) -> None:
        await asyncio.sleep(0)  # a real store yields while it commits
        if self.block_appends is not None:
            self.blocked.set()
            await self.block_appends.wait()
        if self.fail_appends is not None:
            raise self.fail_appends
        held = {r.seq for r in self.events[thread_id]}
        if any(rec.seq in held for rec in records):  # the primary key (thread_id, seq), as SQLite says it
            raise StoreError("append refused: UNIQUE constraint failed: events.thread_id, events.seq")
        for rec, cid in zip(records, client_ids, strict=True):
            self.events[thread_id].append(rec)
            if cid is not None:
                self.client_ids[(thread_id, cid)] = rec.seq
        self.threads[thread_id].update(thread_fields)
        if records:
            self.threads[thread_id]["last_seq"] = records[-1].seq

    async def read_events(self, thread_id: str, after: int, limit: int, *, with_raw: bool = True) -> Page:
        page = [r for r in self.events.get(thread_id, []) if r.seq > after][:limit]
        if with_raw:
            return Page(page, more=len(page) == limit)
        bare = (Record(r.seq, r.ts, r.source, r.kind, r.data, None, r.relay) for r in page)
        return Page(bare, more=len(page) == limit)

    async def read_frames(self, thread_id: str, after: int, limit: int, *, raw: bool) -> Frames:
        page = await self.read_events(thread_id, after, limit)
        last = page[-1].seq if page else after
        if raw:
            texts = [r.raw.encode() for r in page if r.source == "agent" and r.relay and r.raw is not None]
        else:
            texts = [r.envelope().encode() for r in page]
        return Frames(texts, len(page), last, more=page.more)

    async def find_client_event(self, thread_id: str, client_id: str) -> int | None:
        return self.client_ids.get((thread_id, client_id))

    async def turn_starts_before(self, thread_id: str, before: int, limit: int) -> list[int]:
        starts = [r.seq for r in self.events.get(thread_id, []) if r.seq < before and r.kind == "turn.started"]
        return starts[::-1][:limit]

    # browser sessions
    async def load_sessions(self, now: float) -> list[tuple[str, float, str | None]]:
        return [(k, v, self.session_users.get(k)) for k, v in self.sessions.items() if v > now]

    async def save_session(
        self, key: str, expires_at: float, evicted: Sequence[str] = (), *, user: str | None = None
    ) -> None:
        for k in evicted:
            self.sessions.pop(k, None)
        self.sessions[key] = expires_at
        self.session_users[key] = user

    async def delete_session(self, key: str) -> None:
        self.sessions.pop(key, None)

    # per-user secrets (ciphertext only, as the real stores keep them)
    async def put_secret(
        self, user: str, profile: str, key: str, nonce: bytes, ciphertext: bytes, *, max_per_user: int
    ) -> bool:
        held = [k for k in self.secrets if k[0] == user]
        if (user, profile, key) not in self.secrets and len(held) >= max_per_user:
            return False
        self.secrets[(user, profile, key)] = SecretRow(
            user, profile, key, nonce, ciphertext, "2026-01-01T00:00:00.000Z"
        )
        return True

    async def list_secrets(self, user: str, profile: str | None = None) -> list[SecretRow]:
        return [
            row for (u, p, _), row in sorted(self.secrets.items()) if u == user and (profile is None or p == profile)
        ]

    async def delete_secret(self, user: str, profile: str, key: str) -> bool:
        return self.secrets.pop((user, profile, key), None) is not None

    # for tests
    def kinds(self, thread_id: str) -> list[str]:
        return [r.kind for r in self.events[thread_id]]
