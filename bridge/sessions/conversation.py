"""One thread's live state: its agent process, turns, and transcript.

Invariants (issue #2, API.md §4):

* every event gets the next ``seq`` and is in the store before any subscriber sees it;
* a turn starts when its prompt is written to the agent, and every accepted prompt ends in
  exactly one ``turn.ended`` — from the agent's terminal line, or from the bridge when the
  process exits first (status ``error``, or ``cancelled`` when the user stopped it);
* a terminal line with no turn pending is recorded as ``agent.other`` and never ends the
  next turn;
* prompts sent during a turn wait in order (up to ``max_pending_prompts``) and are written
  one at a time; nothing accepted is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from bridge import __version__
from bridge.config import AgentProfile, Settings
from bridge.errors import BridgeError, Busy, Conflict, InvalidRequest, LaunchRefused, NotFound, StoreError
from bridge.process.agent_process import AgentProcess, ExitInfo
from bridge.process.launch import build_launch, valid_session_id
from bridge.protocols.acp import AcpCodec, AcpDecoded, AgentRequest, Fatal, content_refusal
from bridge.protocols.codecs import Codec, make_codec
from bridge.protocols.events import REDACTED, SECRET_KEY_RE, Event, Frames, Record, dumps
from bridge.protocols.framing import LineTooLong
from bridge.protocols.stream_json import Decoded
from bridge.sessions import acp_fs
from bridge.sessions.fanout import Fanout, Subscriber
from bridge.sessions.tasks import TaskTable
from bridge.store.base import Store, ThreadRow

log = structlog.get_logger("bridge.conversation")

# After the process exits, its pipes get this long to drain before they are abandoned
# (a grandchild may hold them open).
DRAIN_TIMEOUT_S = 2.0


_SECOND: list[Any] = [None, ""]  # the last whole second formatted, and its text


def now_iso() -> str:
    """UTC now as ``2026-11-30T01:02:03.456Z`` (milliseconds, truncated). The date and time
    are formatted once per second; one is needed per transcript append (issue #8)."""
    t = time.time()
    sec = int(t)
    if sec != _SECOND[0]:
        _SECOND[0], _SECOND[1] = sec, datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{_SECOND[1]}.{min(int((t - sec) * 1000), 999):03d}Z"


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


@dataclass(slots=True)
class Turn:
    turn_id: str
    content: list[dict[str, Any]]
    prompt_seq: int
    # The exact line, when the codec could encode it at acceptance; ACP prompts need the
    # session id, so before the handshake completes they are encoded when written.
    line: str | None


@dataclass(slots=True)
class PendingPermission:
    request_id: str
    tool: str | None
    input: dict[str, Any]
    options: list[dict[str, Any]]
    seq: int
    created_at: str
    expires_at: float  # loop time
    timer: asyncio.TimerHandle | None = None

    def view(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "tool": self.tool,
            "input": self.input,
            "options": self.options,
            "seq": self.seq,
            "created_at": self.created_at,
        }


RESOLVED_MEMORY = 256  # recently resolved request ids, to tell "too late" from "unknown"


@dataclass(slots=True)
class Accepted:
    seq: int
    turn_id: str | None
    duplicate: bool = False
    queued: bool = False


def _raw_obj(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _prompt_text(content: Sequence[dict[str, Any]]) -> str:
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


class Conversation:
    def __init__(
        self,
        thread: ThreadRow,
        profile: AgentProfile | None,
        settings: Settings,
        store: Store,
        *,
        can_start: Callable[[Conversation], None],
    ) -> None:
        self.thread = thread
        self.id: str = thread["id"]
        self.profile = profile
        self.settings = settings
        self.store = store
        self.fanout = Fanout()
        self._can_start = can_start
        self._seq: int = thread["last_seq"]
        self._emit_lock = asyncio.Lock()
        self._life_lock = asyncio.Lock()  # start / stop / delete
        self._turn_lock = asyncio.Lock()
        self._submit_lock = asyncio.Lock()
        self._proc: AgentProcess | None = None
        self._codec: Codec | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._watcher: asyncio.Task[None] | None = None
        self._exit_reason: str | None = None
        self._active: Turn | None = None
        self._queue: deque[Turn] = deque()
        self._interrupting = False
        self._interrupt_timer: asyncio.TimerHandle | None = None
        self.last_activity = time.monotonic()
        self.deleted = False
        self._appended = asyncio.Event()  # replaced on every append; wakes long-polls
        self._raw_routes: dict[str, Subscriber] = {}  # ACP raw-mode clients awaiting responses
        self._permissions: dict[str, PendingPermission] = {}
        self.tasks = TaskTable.from_json(thread["tasks"]) if thread.get("tasks") else TaskTable()
        # Values of the profile's secret-looking env vars: never stored, never shown.
        self._secrets: list[bytes] = (
            []
            if profile is None
            else [v.encode() for k, v in profile.env.items() if SECRET_KEY_RE.search(k) and len(v) >= 6]
        )
        self._resolved: dict[str, str] = {}  # request_id → who decided (bounded)

    # ------------------------------------------------------------------ state

    @property
    def running(self) -> bool:
        return self._proc is not None

    @property
    def turn_active(self) -> bool:
        return self._active is not None

    @property
    def busy(self) -> bool:
        return self._active is not None or bool(self._queue)

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    # ------------------------------------------------------------------ transcript

    async def emit(
        self,
        events: Sequence[Event] | Callable[[int], Sequence[Event]],
        *,
        client_ids: Sequence[str | None] | None = None,
        fields: dict[str, Any] | None = None,
    ) -> list[Record]:
        """Number, persist, then publish: durable before visible. ``events`` may be a
        function of the seq its first event gets (an event that names another's seq)."""
        async with self._emit_lock:
            if callable(events):
                events = events(self._seq + 1)
            ts = now_iso()
            records = []
            seq = self._seq
            for ev in events:
                seq += 1
                records.append(Record(seq, ts, ev.source, ev.kind, ev.data, ev.raw, ev.relay))
            thread_fields = {"updated_at": ts, **(fields or {})}
            await self.store.append(self.id, records, client_ids or [None] * len(records), thread_fields)
            self._seq = seq
            self.thread.update(thread_fields)
            self.thread["last_seq"] = seq
            self.fanout.publish(records)
            self._appended.set()
            self._appended = asyncio.Event()
            self.touch()
            return records

    async def wait_beyond(self, seq: int, timeout: float) -> None:
        """Return once the transcript has an event after ``seq``, or after ``timeout``.
        A long-poll is not a subscriber: it does not keep an idle agent alive."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while self._seq <= seq and (left := end - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._appended.wait(), left)

    async def set_fields(self, fields: dict[str, Any]) -> None:
        async with self._emit_lock:
            fields = {"updated_at": now_iso(), **fields}
            await self.store.update_thread(self.id, fields)
            self.thread.update(fields)

    async def read_page(self, after: int, limit: int) -> list[Record]:
        return await self.store.read_events(self.id, after, limit)

    async def read_frames(self, after: int, limit: int, *, raw: bool) -> Frames:
        return await self.store.read_frames(self.id, after, limit, raw=raw)

    def subscribe(self, *, raw: bool = False) -> Subscriber:
        self.touch()
        return self.fanout.subscribe(self.settings.server.subscriber_buffer, raw=raw)

    def unsubscribe(self, sub: Subscriber) -> None:
        self.fanout.unsubscribe(sub)
        self._raw_routes = {k: v for k, v in self._raw_routes.items() if v is not sub}
        self.touch()

    # ------------------------------------------------------------------ process life

    async def ensure_started(self) -> None:
        async with self._life_lock:
            if self._proc is not None:
                return
            if self.deleted:
                raise Conflict("thread was deleted", code="thread_deleted")
            await self._start()

    async def _start(self) -> None:
        profile = self.profile
        if profile is None:
            raise LaunchRefused(
                f"agent profile {self.thread['agent']!r} is no longer configured", code="agent_not_found"
            )
        self._can_start(self)
        resume = self.thread.get("native_session_id")
        codec = make_codec(
            profile.protocol,
            cwd=self.thread["cwd"],
            resume_id=resume,
            auth_method=profile.auth_method,
            client_version=__version__,
            cli=profile.stream_json_cli(),
        )
        opts = self._options()
        extra: list[str] = []
        if profile.protocol == "stream-json":
            if opts.get("permission_prompts"):
                # can_use_tool control requests come to us, and from us to clients (§1.4.4)
                extra += profile.permission_prompt_flags()
            if opts.get("permission_mode"):
                extra += ["--permission-mode", opts["permission_mode"]]
            if opts.get("allowed_tools"):
                extra += ["--allowedTools", ",".join(opts["allowed_tools"])]
            if opts.get("disallowed_tools"):
                extra += ["--disallowedTools", ",".join(opts["disallowed_tools"])]
            if opts.get("system_prompt") is not None:
                extra += ["--system-prompt", opts["system_prompt"]]
        if resume is not None and not valid_session_id(resume):
            raise LaunchRefused("native session id is not valid; refusing to pass it on", code="invalid_session_id")
        spec = build_launch(
            executable=profile.executable,
            args=profile.args,
            protocol_flags=profile.launch_flags(codec.launch_flags),
            profile_env=profile.env,
            cwd=self.thread["cwd"],
            model=self.thread.get("model"),
            resume_id=resume if codec.resume_on_argv else None,
            extra_args=extra,
            mcp_config=opts.get("mcp_config"),
            remote_api_opt_in=profile.remote_api_opt_in,
        )
        await self.set_fields({"state": "starting"})
        try:
            proc = await AgentProcess.spawn(spec)
        except BridgeError:
            await self.set_fields({"state": "exited" if self.thread.get("last_exit") else "idle"})
            raise
        self._proc, self._codec, self._exit_reason = proc, codec, None
        self._interrupting = False
        log.info(
            "agent.spawned",
            thread_id=self.id,
            pid=proc.pid,
            agent=profile.name,
            argv0=spec.argv[0],
            resume=resume is not None,
        )
        await self.emit(
            [Event("bridge", "process.started", {"pid": proc.pid, "resume": resume})],
            fields={"state": "running", "pid": proc.pid, "pid_start": proc.start_time},
        )
        reader = asyncio.create_task(self._read_stdout(proc, codec), name=f"stdout-{self.id}")
        errs = asyncio.create_task(proc.pump_stderr(self._on_stderr), name=f"stderr-{self.id}")
        self._tasks = [reader, errs]
        self._watcher = asyncio.create_task(self._watch(proc, reader, errs), name=f"watch-{self.id}")
        for line in codec.start():  # ACP: initialize; the rest of the handshake follows replies
            await self._write(proc, line, kind="client.other", data={"op": "handshake"})

    def _scrub(self, line: bytes) -> bytes:
        for secret in self._secrets:
            if secret in line:
                line = line.replace(secret, REDACTED.encode())
        return line

    async def _on_stderr(self, text: str) -> None:
        for secret in self._secrets:
            text = text.replace(secret.decode(), REDACTED)
        await self.emit([Event("agent", "diagnostic", {"stream": "stderr", "text": text})])

    async def _read_stdout(self, proc: AgentProcess, codec: Codec) -> None:
        try:
            async for lines in proc.stdout_batches():
                # Everything one read brought is decoded, stored and published together:
                # one transaction for a burst of deltas instead of one per line.
                if self._secrets:
                    lines = [self._scrub(line) for line in lines]
                await self._on_agent_output(proc, codec, [codec.decode(line) for line in lines])
        except LineTooLong as exc:
            self._exit_reason = "line_too_long"
            await self.emit([Event("bridge", "diagnostic", {"stream": "protocol", "text": str(exc)})])
            log.warning("agent.line_too_long", thread_id=self.id, pid=proc.pid)
            await proc.stop(0.0)  # the watcher reaps it and ends the turn

    async def _on_agent_output(self, proc: AgentProcess, codec: Codec, decoded: list[Decoded]) -> None:
        ended = ready = False
        fatal: Fatal | None = None
        async with self._turn_lock:
            fields: dict[str, Any] = {}
            out: list[Event] = []
            writes: list[str] = []
            requests: list[AgentRequest] = []
            routed: list[tuple[str, str]] = []
            asks: list[Event] = []
            for d in decoded:
                if isinstance(d, AcpDecoded):
                    ready = ready or d.ready
                    fatal = fatal or d.fatal
                    requests += d.requests
                    routed += d.routed
                    if d.agent is not None:
                        fields["agent_info"] = d.agent
                for ev in d.events:
                    out.append(ev)
                    if ev.kind == "session.started":
                        sid = ev.data.get("native_session_id")
                        if sid is not None and not valid_session_id(sid):
                            out.append(
                                Event(
                                    "bridge",
                                    "diagnostic",
                                    {
                                        "stream": "protocol",
                                        "text": "agent reported a native session id that is not valid; ignored",
                                    },
                                )
                            )
                        elif sid and sid != self.thread.get("native_session_id"):
                            fields["native_session_id"] = sid
                    elif ev.kind == "turn.ended" and ev.source == "agent":
                        if self._active is None:
                            # No turn pending (e.g. after a background task): record it,
                            # never assign it to the next turn.
                            ev.kind = "agent.other"
                            ev.data = {"unsolicited": "turn.ended", **ev.data}
                            continue
                        ev.data["turn_id"] = self._active.turn_id
                        if (
                            self._interrupting
                            and ev.data.get("status") == "error"
                            and ev.data.get("subtype") == "error_during_execution"
                        ):
                            ev.data["status"] = "cancelled"
                        self._end_turn_state()
                        ended = True
                        fields["turn_active"] = False
                    elif ev.kind == "permission.requested" and ev.source == "agent":
                        rid = str(ev.data.get("request_id"))
                        if self._prompts_to_clients(codec):
                            asks.append(ev)  # pending until a client, the timeout or the agent decides
                            continue
                        # Prompts are off for this profile: deny by policy so the agent never hangs.
                        answer = codec.answer_permission(
                            rid,
                            "deny",
                            options=ev.data.get("options"),
                            updated_input=ev.data.get("input") or {},
                            message="Permission prompts are not enabled for this agent profile",
                        )
                        out.append(
                            Event(
                                "bridge", "permission.resolved", {"request_id": rid, "decision": "deny", "by": "policy"}
                            )
                        )
                        if answer is not None:
                            out.append(Event("client", "client.other", {"op": "permission"}, answer))
                            writes.append(answer)
                    elif ev.kind == "task.updated" and ev.source == "agent":
                        # The task table decides: snapshots replace, patches patch, only the
                        # notification is terminal, and late or duplicate events are recorded
                        # but do not change the task (issue #5 item 4).
                        verdict = self.tasks.apply(ev.data, _raw_obj(ev.raw), time.time())
                        if not verdict.accepted or verdict.task is None:
                            ev.kind = "agent.other"
                            ev.data = {"task_event_ignored": verdict.reason, **ev.data}
                        else:
                            ev.data["status"] = verdict.task["status"]
                            fields["tasks"] = self.tasks.to_json()
                    elif ev.kind == "permission.resolved" and ev.source == "agent":
                        # The agent withdrew its request (control_cancel_request): nothing is
                        # written back.
                        pending = self._permissions.pop(str(ev.data.get("request_id")), None)
                        if pending is None:
                            ev.kind = "agent.other"
                        else:
                            self._forget(pending, "agent")
                for reply in d.replies:
                    out.append(Event("client", "client.other", {"op": "auto_reply"}, reply))
                    writes.append(reply)
            if out or fields:
                records = await self.emit(out, fields=fields)
                for ev, rec in zip(out, records, strict=True):
                    if any(ev is a for a in asks):
                        self._hold_permission(ev, rec)
            for route, text in routed:  # after the commit, like every other delivery
                sub = self._raw_routes.get(route)
                if sub is not None:
                    sub.push_side(text)
            for line in writes:
                try:
                    await proc.write_line(line)
                except (BrokenPipeError, ConnectionResetError) as exc:
                    log.info("agent.stdin_closed", thread_id=self.id, error=str(exc))
            if requests and isinstance(codec, AcpCodec):
                await self._serve_agent_requests(proc, codec, requests)
        if fatal is not None:
            self._exit_reason = fatal.reason
            log.warning("agent.handshake_failed", thread_id=self.id, reason=fatal.reason)
            await proc.stop(min(self.settings.server.stop_grace_s, 1.0))
        elif ended or ready:
            await self._pump()

    def _options(self) -> dict[str, Any]:
        """The profile's spawn options, overridden by the thread's own (API.md §1)."""
        base = self.profile.model_dump(include=set(_OPTION_FIELDS)) if self.profile else {}
        return {**base, **(self.thread.get("options") or {})}

    def _prompts_to_clients(self, codec: Codec) -> bool:
        return isinstance(codec, AcpCodec) or bool(self._options().get("permission_prompts"))

    def _hold_permission(self, ev: Event, rec: Record) -> None:
        rid = str(ev.data.get("request_id"))
        loop = asyncio.get_running_loop()
        timeout = self.settings.server.permission_timeout_s
        pending = PendingPermission(
            rid,
            ev.data.get("tool"),
            ev.data.get("input") or {},
            list(ev.data.get("options") or []),
            rec.seq,
            rec.ts,
            loop.time() + timeout,
        )
        pending.timer = loop.call_later(timeout, lambda: asyncio.ensure_future(self._permission_expired(rid)))
        self._permissions[rid] = pending

    def _forget(self, pending: PendingPermission, by: str) -> None:
        if pending.timer is not None:
            pending.timer.cancel()
        self._resolved[pending.request_id] = by
        while len(self._resolved) > RESOLVED_MEMORY:
            self._resolved.pop(next(iter(self._resolved)))

    def pending_permissions(self) -> list[dict[str, Any]]:
        return [p.view() for p in self._permissions.values()]

    async def _permission_expired(self, request_id: str) -> None:
        with contextlib.suppress(BridgeError):
            await self.answer_permission(
                request_id, "deny", by="timeout", message="No answer to the permission request in time"
            )

    async def answer_permission(
        self, request_id: str, decision: str, *, by: str, option_id: str | None = None, message: str | None = None
    ) -> dict[str, Any]:
        """One answer per request: the first wins; later ones are refused (409)."""
        if decision not in ("allow", "deny"):
            raise InvalidRequest("decision must be 'allow' or 'deny'", code="invalid_decision")
        async with self._turn_lock:
            pending = self._permissions.get(request_id)
            if pending is None:
                if request_id in self._resolved:
                    raise Conflict(
                        f"permission request {request_id} was already resolved (by {self._resolved[request_id]})",
                        code="already_resolved",
                    )
                raise NotFound(f"no pending permission request {request_id}", code="permission_not_found")
            if (
                option_id is not None
                and pending.options
                and not any(o.get("optionId") == option_id for o in pending.options)
            ):
                raise InvalidRequest(
                    f"option_id {option_id!r} is not one of the request's options", code="invalid_option_id"
                )
            proc, codec = self._proc, self._codec
            del self._permissions[request_id]
            self._forget(pending, by)
            data: dict[str, Any] = {"request_id": request_id, "decision": decision, "by": by}
            if option_id is not None:
                data["option_id"] = option_id
            events = [Event("bridge", "permission.resolved", data)]
            line = None
            if codec is not None:
                line = codec.answer_permission(
                    request_id,
                    decision,
                    option_id=option_id,
                    options=pending.options,
                    updated_input=pending.input,
                    message=message or ("Denied by the user" if decision == "deny" else ""),
                )
                if line is not None:
                    events.append(Event("client", "client.other", {"op": "permission"}, line))
            await self.emit(events)
            if line is not None and proc is not None:
                try:
                    await proc.write_line(line)
                except (BrokenPipeError, ConnectionResetError) as exc:
                    log.info("agent.stdin_closed", thread_id=self.id, error=str(exc))
            return data

    def _drop_permissions(self, by: str) -> list[Event]:
        """Every pending request ends (interrupt, process exit): resolved as cancelled."""
        events = []
        for pending in self._permissions.values():
            self._forget(pending, by)
            events.append(
                Event(
                    "bridge",
                    "permission.resolved",
                    {"request_id": pending.request_id, "decision": "cancelled", "by": by},
                )
            )
        self._permissions.clear()
        return events

    async def _serve_agent_requests(self, proc: AgentProcess, codec: AcpCodec, requests: list[AgentRequest]) -> None:
        """ACP fs/* requests, served inside the thread's cwd (sessions/acp_fs.py)."""
        for req in requests:
            try:
                line = codec.encode_result(req.id, await acp_fs.serve(self.thread["cwd"], req.method, req.params))
            except acp_fs.FsError as exc:
                line = codec.encode_error(req.id, exc.code, exc.message)
            await self._write(proc, line, kind="client.other", data={"op": "fs", "method": req.method})

    def _end_turn_state(self) -> None:
        self._active = None
        self._interrupting = False
        if self._interrupt_timer is not None:
            self._interrupt_timer.cancel()
            self._interrupt_timer = None

    async def _write(self, proc: AgentProcess, line: str, *, kind: str, data: dict[str, Any]) -> None:
        """Record what we write, then write it (one locked write per message)."""
        await self.emit([Event("client", kind, data, line)])
        try:
            await proc.write_line(line)
        except (BrokenPipeError, ConnectionResetError) as exc:
            log.info("agent.stdin_closed", thread_id=self.id, error=str(exc))

    async def _watch(self, proc: AgentProcess, reader: asyncio.Task[None], errs: asyncio.Task[None]) -> None:
        info = await proc.wait()
        _done, pending = await asyncio.wait({reader, errs}, timeout=DRAIN_TIMEOUT_S)
        for t in pending:
            t.cancel()
        for t in (reader, errs):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        proc.signal_group(signal.SIGKILL)  # anything the agent left in its group
        proc.release()
        await self._on_exit(proc, info)

    async def _on_exit(self, proc: AgentProcess, info: ExitInfo) -> None:
        async with self._turn_lock:
            reason = self._exit_reason or ("exited" if info.code == 0 else "crashed")
            last_exit = {"code": info.code, "signal": info.signal, "reason": reason}
            events = [Event("bridge", "process.exited", {"pid": proc.pid, **last_exit})]
            user_ended = reason in ("stopped", "interrupted", "interrupt_timeout", "deleted")
            if self._active is not None:
                events.append(
                    Event(
                        "bridge",
                        "turn.ended",
                        {
                            "turn_id": self._active.turn_id,
                            "status": "cancelled" if user_ended else "error",
                            "error": f"agent process ended: {reason}",
                            "exit": last_exit,
                        },
                    )
                )
            for turn in self._queue:
                events.append(
                    Event(
                        "bridge",
                        "turn.ended",
                        {
                            "turn_id": turn.turn_id,
                            "status": "cancelled" if user_ended else "error",
                            "error": f"not started: agent process ended ({reason})",
                        },
                    )
                )
            events[1:1] = self._drop_permissions("agent_exited")
            self._queue.clear()
            self._end_turn_state()
            self._proc = None
            self._codec = None
            log.info("agent.exited", thread_id=self.id, pid=proc.pid, **last_exit)
            await self.emit(
                events,
                fields={
                    "state": "exited",
                    "turn_active": False,
                    "last_exit": last_exit,
                    "pid": None,
                    "pid_start": None,
                },
            )

    async def stop(self, reason: str = "stopped") -> None:
        async with self._life_lock:
            await self._stop_locked(reason)

    async def _stop_locked(self, reason: str) -> None:
        proc, watcher, codec = self._proc, self._watcher, self._codec
        if proc is None or watcher is None:
            return
        self._exit_reason = reason
        await self.set_fields({"state": "stopping"})
        await proc.stop(self.settings.server.stop_grace_s, shutdown_line=codec.encode_shutdown() if codec else None)
        await watcher

    async def close(self, reason: str) -> None:
        """Stop the process and disconnect every subscriber (delete, daemon shutdown)."""
        async with self._life_lock:
            if reason == "deleted":
                self.deleted = True
            await self._stop_locked(reason)
            self.fanout.close_all(reason)

    # ------------------------------------------------------------------ client operations

    async def submit(self, content: list[dict[str, Any]], client_id: str | None) -> Accepted:
        # One submission at a time per thread: a resent client_id can never race its twin.
        if not self.store.healthy:
            raise StoreError("the transcript store cannot be written right now; retry later", code="store_unavailable")
        async with self._submit_lock:
            if client_id is not None:
                seq = await self.store.find_client_event(self.id, client_id)
                if seq is not None:
                    return Accepted(seq=seq, turn_id=None, duplicate=True)
            if self.busy and len(self._queue) >= self.settings.server.max_pending_prompts:
                raise Busy(f"a turn is in progress and {len(self._queue)} prompts are queued", code="busy")
            self._refuse_content(content, None)  # what the agent said it takes last time
            await self.ensure_started()
            async with self._turn_lock:
                proc, codec = self._proc, self._codec
                if proc is None or codec is None:
                    raise Conflict("the agent process ended before the prompt could be sent", code="agent_exited")
                self._refuse_content(content, codec)
                line = codec.encode_prompt(content) if codec.ready else None
                turn_id = new_id("turn")
                data: dict[str, Any] = {"role": "user", "text": _prompt_text(content), "turn_id": turn_id}
                if any(b.get("type") != "text" for b in content):
                    data["content"] = [
                        b
                        if b.get("type") == "text"
                        else {"type": b.get("type"), "media_type": (b.get("source") or {}).get("media_type")}
                        for b in content
                    ]
                if client_id is not None:
                    data["client_id"] = client_id
                queued = self.busy
                if not queued and line is not None:
                    # Nothing ahead of it: the prompt and its turn.started share one
                    # transaction (issue #8: one commit less per turn), then the prompt is
                    # written, exactly as _pump would write it.
                    turn = Turn(turn_id, content, 0, line)
                    self._active = turn

                    def started(first_seq: int) -> list[Event]:
                        turn.prompt_seq = first_seq
                        return [
                            Event("client", "message", data, line),
                            Event("bridge", "turn.started", {"turn_id": turn_id, "prompt_seq": first_seq}),
                        ]

                    try:
                        recs = await self.emit(started, client_ids=[client_id, None], fields={"turn_active": True})
                    except BaseException:
                        self._active = None
                        raise
                    try:
                        await proc.write_line(line)
                    except (BrokenPipeError, ConnectionResetError):
                        log.info("agent.stdin_closed", thread_id=self.id)  # the watcher ends the turn
                    return Accepted(seq=recs[0].seq, turn_id=turn_id, queued=False)
                recs = await self.emit([Event("client", "message", data, line)], client_ids=[client_id])
                self._queue.append(Turn(turn_id, content, recs[0].seq, line))
        await self._pump()
        return Accepted(seq=recs[0].seq, turn_id=turn_id, queued=queued)

    async def _pump(self) -> None:
        """Write the next queued prompt when no turn is active."""
        async with self._turn_lock:
            proc, codec = self._proc, self._codec
            if self._active is not None or not self._queue or proc is None or codec is None or not codec.ready:
                return
            turn = self._queue.popleft()
            events = [Event("bridge", "turn.started", {"turn_id": turn.turn_id, "prompt_seq": turn.prompt_seq})]
            refusal = codec.refuse_content(turn.content) if turn.line is None else None
            if refusal is not None:
                # Accepted before the agent said what it takes: the turn ends unsent.
                events.append(
                    Event(
                        "bridge",
                        "turn.ended",
                        {
                            "turn_id": turn.turn_id,
                            "status": "error",
                            "error": refusal,
                            "error_code": "unsupported_content",
                        },
                    )
                )
                await self.emit(events)
                pump_again = True
            else:
                pump_again = False
                self._active = turn
            if not pump_again:
                line = turn.line
                if line is None:
                    line = codec.encode_prompt(turn.content)
                    events.append(Event("client", "client.other", {"op": "prompt", "turn_id": turn.turn_id}, line))
                await self.emit(events, fields={"turn_active": True})
                try:
                    await proc.write_line(line)
                except (BrokenPipeError, ConnectionResetError):
                    log.info("agent.stdin_closed", thread_id=self.id)  # the watcher ends the turn
        if pump_again:
            await self._pump()

    def _refuse_content(self, content: list[dict[str, Any]], codec: Codec | None) -> None:
        """InvalidRequest ``unsupported_content`` when the agent cannot take ``content``: from
        the live codec once its handshake is done, else from the capabilities the agent
        declared when it last started (stored on the thread)."""
        if codec is not None:
            reason = codec.refuse_content(content)
        elif self.thread.get("protocol") == "acp" and isinstance(self.thread.get("agent_info"), dict):
            reason = content_refusal(content, self.thread["agent_info"].get("capabilities"))
        else:
            reason = None
        if reason is not None:
            raise InvalidRequest(reason, code="unsupported_content")

    async def interrupt(self) -> bool:
        """Cancel the active turn. Idempotent; False when no turn is active."""
        async with self._turn_lock:
            proc, codec = self._proc, self._codec
            if self._active is None or proc is None or codec is None:
                return False
            if self._interrupting:
                return True
            self._interrupting = True
            lines = codec.interrupt()
            # ACP: the cancel answers every pending permission request (§3.9); stream-json
            # agents withdraw theirs with control_cancel_request.
            dropped = self._drop_permissions("interrupt") if isinstance(codec, AcpCodec) else []
        if dropped:
            await self.emit(dropped)
        if lines is None:
            # awp-jsonl has no interrupt message: stopping the process ends the turn.
            asyncio.create_task(self.stop("interrupted"))  # noqa: RUF006
            return True
        for line in lines:
            await self._write(proc, line, kind="client.other", data={"op": "interrupt"})
        # If the agent does not end the turn in time, the bridge stops the process and the
        # turn ends ``cancelled`` (server.interrupt_timeout_s).
        loop = asyncio.get_running_loop()
        self._interrupt_timer = loop.call_later(
            self.settings.server.interrupt_timeout_s, lambda: asyncio.ensure_future(self._interrupt_expired())
        )
        return True

    async def _interrupt_expired(self) -> None:
        if self._interrupting and self._active is not None:
            await self.emit(
                [
                    Event(
                        "bridge",
                        "notice",
                        {
                            "code": "interrupt_timeout",
                            "text": f"the agent did not end the turn within "
                            f"{self.settings.server.interrupt_timeout_s:g}s of the interrupt; stopping it",
                        },
                    )
                ]
            )
            await self.stop("interrupt_timeout")

    async def write_raw(self, message: dict[str, Any], sub: Subscriber | None = None) -> int:
        """The ``raw`` op / raw mode: write a client's JSON object to stdin. On an ACP thread
        a raw-mode client's request gets an id of ours and its response goes back to that
        client only; a response of its own is refused (the bridge answers the agent)."""
        await self.ensure_started()
        proc, codec = self._proc, self._codec
        if proc is None or codec is None:
            raise Conflict("the agent process is not running", code="agent_exited")
        line = dumps(message)
        if message.get("type") == "control_response" and not isinstance(codec, AcpCodec):
            # A stream-json client answering a permission prompt itself: the same flow as
            # the permission op, so the first answer still wins and is recorded once.
            resp = _as_dict(message.get("response"))
            rid = resp.get("request_id")
            if isinstance(rid, str) and rid in self._permissions:
                inner = _as_dict(resp.get("response"))
                note = inner.get("message")
                await self.answer_permission(
                    rid,
                    "allow" if inner.get("behavior") == "allow" else "deny",
                    by="raw",
                    message=note if isinstance(note, str) else None,
                )
                return self._seq
            if isinstance(rid, str) and rid in self._resolved:
                raise Conflict(f"permission request {rid} was already resolved", code="already_resolved")
        if isinstance(codec, AcpCodec):
            if "method" not in message:
                raise InvalidRequest(
                    "the bridge answers the agent's requests; a response from a client is not forwarded",
                    code="not_forwarded",
                )
            if "id" in message:
                # Always our id on the wire, so it cannot be taken for a response to one of
                # the bridge's requests; the answer goes back to a raw-mode client, and is in
                # the transcript for everyone.
                route = f"r{id(sub)}" if sub is not None else ""
                if sub is not None:
                    self._raw_routes[route] = sub
                line = codec.forward_request(message, route)
        recs = await self.emit([Event("client", "client.other", {"op": "raw"}, line)])
        try:
            await proc.write_line(line)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise Conflict("the agent process closed its stdin", code="agent_exited") from exc
        return recs[0].seq

    def thread_view(self) -> dict[str, Any]:
        return thread_view(self.thread)


_OPTION_FIELDS = (
    "permission_mode",
    "allowed_tools",
    "disallowed_tools",
    "system_prompt",
    "mcp_config",
    "permission_prompts",
)

PUBLIC_THREAD_FIELDS = (
    "id",
    "agent",
    "protocol",
    "model",
    "cwd",
    "title",
    "native_session_id",
    "state",
    "turn_active",
    "last_seq",
    "created_at",
    "updated_at",
    "last_exit",
    "agent_info",
)


def thread_view(row: ThreadRow) -> dict[str, Any]:
    out = {k: row.get(k) for k in PUBLIC_THREAD_FIELDS}
    out["options"] = row.get("options") or {}
    return out
