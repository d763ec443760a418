"""The ACP gateway (docs/api.md §11): ``GET /v1/acp`` and ``/v1/acp/{agent}`` upgrade to a
WebSocket carrying the Agent Client Protocol, with the bridge as the *agent*.

One JSON-RPC 2.0 message per text frame, as in the WebSocket form of ACP's remote
transport; the upgrade response names the connection (``Acp-Connection-Id``). Credentials,
Host and Origin are checked exactly as for the thread WebSocket (ws.upgrade_user, and
guard.RequestGuard before routing). Every ACP session is a thread: ``sessionId`` is the
thread id, so threads made here are listed over REST and on the page, and the reverse.

The mapping of events to ``session/update`` is sessions/acp_session.py; this module is
the connection: requests in, answers and notifications out, one writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketState

from bridge import __version__, userdirs
from bridge.api.auth import SUBPROTOCOL
from bridge.api.content import normalize_prompt
from bridge.api.users import Streams, User, check_owner
from bridge.api.views import Shown, shown_to
from bridge.api.ws import upgrade_user
from bridge.errors import BridgeError, error_body
from bridge.protocols.codecs import may_have_modes, prompt_capabilities
from bridge.protocols.events import Record
from bridge.protocols.jsonline import dumps, loads_strict
from bridge.sessions import acp_session as mapping
from bridge.sessions.commands import AnswerPermission, Interrupt, Prompt, SetMode
from bridge.sessions.conversation import Conversation
from bridge.sessions.fanout import Subscriber, deliver
from bridge.sessions.modes import ModeRefused, modes_of
from bridge.sessions.registry import Registry
from bridge.store.base import ThreadRow

log = structlog.get_logger("bridge.acp_gateway")

router = APIRouter()

PROTOCOL_VERSION = 1
MAX_MESSAGE_CHARS = 8 * 1024 * 1024  # one JSON-RPC message (the thread WebSocket's frame cap)
MAX_PENDING = 32  # the client's requests being handled at once, prompts waiting on their turn included
MAX_SESSIONS = 64  # sessions attached on one connection
MAX_OUTSTANDING = 256  # permission requests sent to the client and not yet answered
START_WAIT_S = 10.0  # session/new with an ACP profile: how long its agent may take to report its modes
LIST_PAGE = 50  # session/list: sessions per answer
LIST_SCAN_PAGES = 20  # session/list with a cwd filter reads at most this many store pages per answer
META = "agent-bridge"

# JSON-RPC error codes (JSON-RPC 2.0 §5.1; -32002 is ACP's "resource not found").
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603
NOT_FOUND, TOO_MANY = -32002, -32000


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


def _from_bridge(exc: BridgeError) -> RpcError:
    """A bridge refusal as a JSON-RPC error; ``data.code`` is the bridge's error code."""
    rpc = INVALID_PARAMS if exc.status == 400 else NOT_FOUND if exc.status == 404 else INTERNAL_ERROR
    return RpcError(rpc, exc.message, {"code": exc.code})


def _with_modes(answer: dict[str, Any], conv: Conversation) -> dict[str, Any]:
    """A session/new, load or resume answer, with the session's ``modes`` once its agent
    has reported them (sessions/modes.py)."""
    modes = modes_of(conv.thread)
    return answer if modes is None else {**answer, "modes": modes}


async def _agent_session(conv: Conversation) -> None:
    """An ACP profile's agent is started at session/new, so that the answer carries the
    modes it reports; one that cannot start (or is slow) is left to the first prompt, which
    reports why, as for any thread."""
    if conv.profile is None or not may_have_modes(conv.profile.protocol):
        return
    try:
        async with asyncio.timeout(START_WAIT_S):
            await conv.ensure_started()
            await conv.until_ready()
    except (BridgeError, TimeoutError) as exc:
        log.info("acp.agent_not_started", thread_id=conv.id, error=getattr(exc, "code", type(exc).__name__))


def _meta(params: dict[str, Any]) -> dict[str, Any]:
    meta = params.get("_meta")
    ours = meta.get(META) if isinstance(meta, dict) else None
    return ours if isinstance(ours, dict) else {}


def _session_id(params: dict[str, Any]) -> str:
    sid = params.get("sessionId")
    if not isinstance(sid, str) or not sid:
        raise RpcError(INVALID_PARAMS, "sessionId must be a non-empty string")
    return sid


@router.websocket("/v1/acp")
@router.websocket("/v1/acp/{agent}")
async def acp_ws(ws: WebSocket, agent: str | None = None) -> None:
    user = await upgrade_user(ws)
    if not isinstance(user, User):
        await ws.send_denial_response(user)
        return
    if agent is not None and agent not in ws.app.state.settings.agents:
        body = error_body("agent_not_found", f"no agent profile named {agent!r}")
        await ws.send_denial_response(JSONResponse(body, status_code=404))
        return
    conn_id = uuid.uuid4().hex
    offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",")]
    await ws.accept(
        subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None,
        headers=[(b"acp-connection-id", conn_id.encode())],
    )
    log.info("acp.connected", connection_id=conn_id, agent=agent)
    await AcpConnection(ws, ws.app.state.registry, agent, conn_id, user).run()


class _Attached:
    """One session (thread) attached to the connection: its subscriber, its mapper, the
    prompts waiting for their turn's end and the permission requests sent for it."""

    def __init__(self, conn: AcpConnection, conv: Conversation) -> None:
        self.conn = conn
        self.conv = conv
        self.sub: Subscriber = conv.subscribe()
        self.mapper = mapping.UpdateMapper()
        self.by_client: dict[str, Any] = {}  # client_id → the prompt's rpc id
        self.by_turn: dict[str, Any] = {}  # turn_id → the prompt's rpc id
        self.asked: dict[str, Any] = {}  # permission request id → our rpc id, still unanswered
        self.sent_asks: set[str] = set()  # permission requests ever sent on this attachment
        self.task: asyncio.Task[str | None] | None = None
        self.replay_frames = False  # fanout.Sink: records, never stored frames

    # -- fanout.Sink

    async def send(self, texts: list[str], records: list[Record]) -> None:
        # ``texts`` are the thread WebSocket's notices and answers: nothing of ACP's.
        for rec in records:
            await self.record(rec)

    async def send_frames(self, frames: list[bytes]) -> None:  # pragma: no cover - replay_frames is False
        raise AssertionError("the ACP gateway reads records")

    async def record(self, rec: Record) -> None:
        data = rec.data
        own = False
        if rec.kind == "message" and rec.source == "client":
            cid = data.get("client_id")
            if isinstance(cid, str) and cid in self.by_client and isinstance(data.get("turn_id"), str):
                self.by_turn[data["turn_id"]] = self.by_client.pop(cid)
                own = True
        for update in self.mapper.updates(rec, own_prompt=own):
            params = {"sessionId": self.conv.id, "update": update, "_meta": {META: {"seq": rec.seq}}}
            await self.conn.notify("session/update", params)
        if rec.kind == "turn.ended":
            await self._turn_ended(data)
        elif rec.kind == "permission.requested":
            await self.ask(data)
        elif rec.kind == "permission.resolved":
            await self._resolved(data)

    async def _turn_ended(self, data: dict[str, Any]) -> None:
        turn_id = data.get("turn_id")
        rpc_id = self.by_turn.pop(turn_id, None) if isinstance(turn_id, str) else None
        if rpc_id is None:
            return
        await self.conn.answer_turn(rpc_id, data)

    async def ask(self, data: dict[str, Any]) -> None:
        """``session/request_permission`` for a request that is still pending, once."""
        rid = data.get("request_id")
        if not isinstance(rid, str) or rid in self.sent_asks or rid not in self.conv.core.permissions:
            return
        self.sent_asks.add(rid)
        rpc_id = await self.conn.request(
            "session/request_permission", mapping.permission_request(self.conv.id, data), (self, rid, data)
        )
        if rpc_id is not None:
            self.asked[rid] = rpc_id

    async def _resolved(self, data: dict[str, Any]) -> None:
        """Answered elsewhere (another client, a timeout, the agent): the request this
        client still shows is cancelled (``$/cancel_request``, ACP's request cancellation)."""
        rid = data.get("request_id")
        if not isinstance(rid, str):
            return
        self.sent_asks.discard(rid)  # resolved: never pending again, so never asked again
        rpc_id = self.asked.pop(rid, None)
        if rpc_id is not None:
            self.conn.forget(rpc_id)
            await self.conn.notify("$/cancel_request", {"requestId": rpc_id})

    async def answered(self, rid: str, data: dict[str, Any], result: Any, error: Any) -> None:
        self.asked.pop(rid, None)
        answer = mapping.permission_answer(data, result) if error is None else ("deny", None)
        if answer is None:
            log.info("acp.permission_answer_ignored", thread_id=self.conv.id, request_id=rid)
            return
        decision, option_id = answer
        try:
            command = AnswerPermission(
                request_id=rid, decision=decision, channel="acp", option_id=option_id, actor=self.conn.user.name
            )
            await self.conn.registry.port(self.conv).run(command)
        except BridgeError as exc:
            log.info("acp.permission_answer_refused", thread_id=self.conv.id, request_id=rid, code=exc.code)

    async def ask_pending(self) -> None:
        for view in self.conv.pending_permissions():
            await self.ask(view)

    async def run(self, after: int) -> None:
        try:
            why = await deliver(self.sub, after, self.conv, self)
        except Exception as exc:  # a client that does not read (send deadline), or a dead socket
            log.info("acp.session_send_failed", thread_id=self.conv.id, error=type(exc).__name__)
            self.conn.fail()
            return
        await self.conn.session_closed(self, why or "closed")

    def detach(self) -> None:
        self.conv.unsubscribe(self.sub)
        if self.task is not None:
            self.task.cancel()


class AcpConnection:
    def __init__(self, ws: WebSocket, registry: Registry, agent: str | None, conn_id: str, user: User) -> None:
        self.ws = ws
        self.user = user  # users mode: only this user's threads (an admin's: all)
        self.registry = registry
        self.agent = agent
        self.id = conn_id
        self.initialized = False
        self.sessions: dict[str, _Attached] = {}
        self._send_lock = asyncio.Lock()
        self._next_id = 0
        # our requests to the client: rpc id → (session, permission request id, its data)
        self._outstanding: dict[int, tuple[_Attached, str, dict[str, Any]]] = {}
        self._handling: dict[asyncio.Task[None], Any] = {}  # task → the request id it answers
        server = ws.app.state.settings.server
        self._send_deadline = server.ws_ping_interval_s + server.ws_ping_timeout_s
        self._closing: tuple[int, str] | None = None
        self._closed = asyncio.Event()

    # ------------------------------------------------------------------ writing

    async def _send(self, message: dict[str, Any]) -> None:
        text = dumps(message)
        async with self._send_lock:
            async with asyncio.timeout(self._send_deadline):
                await self.ws.send_text(text)

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._send({"jsonrpc": "2.0", "method": method, "params": params})

    async def request(
        self, method: str, params: dict[str, Any], waiting: tuple[_Attached, str, dict[str, Any]]
    ) -> int | None:
        if len(self._outstanding) >= MAX_OUTSTANDING:
            log.warning("acp.too_many_outstanding", connection_id=self.id)
            return None
        self._next_id += 1
        rpc_id = self._next_id
        self._outstanding[rpc_id] = waiting
        await self._send({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
        return rpc_id

    def forget(self, rpc_id: int) -> None:
        self._outstanding.pop(rpc_id, None)

    async def _result(self, rpc_id: Any, result: Any) -> None:
        await self._send({"jsonrpc": "2.0", "id": rpc_id, "result": result})

    async def _error(self, rpc_id: Any, err: RpcError) -> None:
        await self._send({"jsonrpc": "2.0", "id": rpc_id, "error": err.body()})

    async def answer_turn(self, rpc_id: Any, data: dict[str, Any]) -> None:
        """A prompt's answer, at its turn's end."""
        reason = mapping.stop_reason(data)
        if reason is not None:
            await self._result(rpc_id, {"stopReason": reason})
            return
        error = str(data["error"]) if isinstance(data.get("error"), str) else "the turn failed"
        extra = {k: data[k] for k in ("status", "error_code") if isinstance(data.get(k), str)}
        await self._error(rpc_id, RpcError(INTERNAL_ERROR, error, extra or None))

    # ------------------------------------------------------------------ the connection

    async def _watch_shutdown(self) -> None:
        """The daemon is stopping (Registry.close_clients closes the change notifier every
        stream waits on): close with 1001, sessions attached or not."""
        changes = self.registry.changes
        while changes.close_reason is None:
            await changes.wait(changes.generation, 60.0)
        self._closing = (1001, "daemon_shutdown")
        self._closed.set()

    def revoked(self) -> None:
        """The user was revoked (users mode): the connection closes at once, 4401."""
        self._closing = (4401, "user_revoked")
        self._closed.set()

    async def run(self) -> None:
        changes = self.registry.changes
        changes.attach()  # close_clients waits until this connection has let go
        watcher = asyncio.create_task(self._watch_shutdown())
        streams: Streams = self.ws.app.state.streams
        try:
            with streams.held(self.user, self.revoked):
                await self._receive()
        finally:
            watcher.cancel()
            await self._let_go()
            changes.detach()

    async def _let_go(self) -> None:
        """Every task and subscriber ended, then the close frame."""
        for task in list(self._handling):
            task.cancel()
        for att in list(self.sessions.values()):
            att.detach()
        tasks: list[asyncio.Task[Any]] = [*self._handling]
        tasks += [a.task for a in self.sessions.values() if a.task is not None]
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.sessions.clear()
        code, reason = self._closing or (1000, "")
        if self.ws.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._send_deadline):
                    await self.ws.close(code=code, reason=reason)
        log.info("acp.disconnected", connection_id=self.id)

    async def _receive(self) -> None:
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            while True:
                recv = asyncio.ensure_future(self.ws.receive())
                done, _ = await asyncio.wait({recv, closed}, return_when=asyncio.FIRST_COMPLETED)
                if recv not in done:
                    recv.cancel()
                    return
                msg = recv.result()
                if msg["type"] == "websocket.disconnect":
                    return
                await self._frame(msg.get("text"))
        except (WebSocketDisconnect, TimeoutError, RuntimeError, OSError):
            return  # the client left, or an answer could not be sent to it
        finally:
            closed.cancel()

    async def _frame(self, text: str | None) -> None:
        if text is None:
            await self._error(None, RpcError(INVALID_REQUEST, "ACP messages are text frames"))
            return
        if len(text) > MAX_MESSAGE_CHARS:
            await self._error(None, RpcError(INVALID_REQUEST, f"message over {MAX_MESSAGE_CHARS} characters"))
            return
        try:
            msg = loads_strict(text)
        except (ValueError, RecursionError):
            await self._error(None, RpcError(PARSE_ERROR, "Parse error"))
            return
        await self._message(msg)

    async def _message(self, msg: Any) -> None:
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            await self._error(_valid_id(msg), RpcError(INVALID_REQUEST, "not a JSON-RPC 2.0 message"))
            return
        method = msg.get("method")
        if method is None and "id" in msg:
            await self._response(msg)
            return
        if not isinstance(method, str):
            await self._error(_valid_id(msg), RpcError(INVALID_REQUEST, "method must be a string"))
            return
        params = msg.get("params", {})
        if "id" not in msg:
            await self._notification(method, params)
            return
        rpc_id = msg["id"]
        if _valid_id(msg) is None:
            await self._error(None, RpcError(INVALID_REQUEST, "id must be a string or an integer"))
            return
        if self._pending() >= MAX_PENDING:
            await self._error(rpc_id, RpcError(TOO_MANY, f"more than {MAX_PENDING} requests pending"))
            return
        task = asyncio.create_task(self._handle(rpc_id, method, params))
        self._handling[task] = rpc_id
        task.add_done_callback(self._handling.pop)

    def _pending(self) -> int:
        """Requests being handled, and prompts waiting for their turn to end (a prompt
        being handled is both: counted once)."""
        ids = {_key(i) for i in self._handling.values()}
        for att in self.sessions.values():
            ids.update(_key(i) for i in (*att.by_client.values(), *att.by_turn.values()))
        return len(ids)

    async def _handle(self, rpc_id: Any, method: str, params: Any) -> None:
        try:
            await self._answer(rpc_id, method, params)
        except (TimeoutError, WebSocketDisconnect, RuntimeError, OSError) as exc:  # the answer cannot go out
            log.info("acp.request_send_failed", connection_id=self.id, method=method, error=type(exc).__name__)
            self.fail()

    async def _answer(self, rpc_id: Any, method: str, params: Any) -> None:
        handler = _METHODS.get(method)
        try:
            if handler is None:
                raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
            if not self.initialized and method != "initialize":
                raise RpcError(INVALID_REQUEST, "initialize first")
            if not isinstance(params, dict):
                raise RpcError(INVALID_PARAMS, "params must be an object")
            result = await handler(self, rpc_id, params)
        except RpcError as exc:
            await self._error(rpc_id, exc)
            return
        except BridgeError as exc:
            rpc = _from_bridge(exc)
            rpc.message = shown_to(self.ws.app.state.settings, self.user).text(rpc.message)  # no data dir path
            await self._error(rpc_id, rpc)
            return
        if result is not _LATER:
            await self._result(rpc_id, result)

    async def _notification(self, method: str, params: Any) -> None:
        """Never answered (JSON-RPC 2.0 §4.1). ``session/cancel`` interrupts the turn."""
        if method != "session/cancel" or not isinstance(params, dict):
            return
        sid = params.get("sessionId")
        att = self.sessions.get(sid) if isinstance(sid, str) else None
        if att is not None:
            with contextlib.suppress(BridgeError):
                await self.registry.port(att.conv).run(Interrupt(actor=self.user.name))

    async def _response(self, msg: dict[str, Any]) -> None:
        rpc_id = msg["id"]
        ours = isinstance(rpc_id, int) and not isinstance(rpc_id, bool)  # true is not 1
        waiting = self._outstanding.pop(rpc_id, None) if ours else None
        if waiting is None:
            return  # an answer to a request we forgot (cancelled) or never made
        att, rid, data = waiting
        await att.answered(rid, data, msg.get("result"), msg.get("error"))

    def fail(self) -> None:
        """Something could not be sent: the connection is closed (1011), never left half alive."""
        self._closing = self._closing or (1011, "send failed")
        self._closed.set()

    async def session_closed(self, att: _Attached, why: str) -> None:
        """The thread went away (deleted) or the daemon is stopping."""
        if why == "daemon_shutdown":
            self._closing = (1001, why)
            self._closed.set()
            return
        self.sessions.pop(att.conv.id, None)
        att.conv.unsubscribe(att.sub)
        for rpc_id in [*att.by_client.values(), *att.by_turn.values()]:
            await self._error(rpc_id, RpcError(INTERNAL_ERROR, f"the session ended: {why}", {"code": "thread_deleted"}))

    # ------------------------------------------------------------------ methods

    async def _initialize(self, rpc_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(params.get("protocolVersion"), int) or isinstance(params.get("protocolVersion"), bool):
            raise RpcError(INVALID_PARAMS, "protocolVersion must be an integer")
        self.initialized = True
        settings = self.ws.app.state.settings
        profile = settings.agents.get(self.agent or settings.default_agent)
        prompts = prompt_capabilities(profile.protocol if profile is not None else "")
        return {
            # The one version spoken here; a client asking for another decides (ACP initialization).
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": prompts,
                "mcpCapabilities": {"http": False, "sse": False},
                "sessionCapabilities": {"list": {}, "resume": {}},
            },
            "agentInfo": {"name": "agent-bridge", "title": "agent-bridge", "version": __version__},
            "authMethods": [],
        }

    async def _new(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        cwd = params.get("cwd")
        if not isinstance(cwd, str):
            raise RpcError(INVALID_PARAMS, "cwd must be an absolute path")
        if not isinstance(params.get("mcpServers", []), list):
            raise RpcError(INVALID_PARAMS, "mcpServers must be a list")
        agent = _meta(params).get("agent")
        if agent is not None and not isinstance(agent, str):
            raise RpcError(INVALID_PARAMS, f"_meta.{META}.agent must be a profile name")
        self._room_for_session()
        conv = await self.registry.create(
            agent=agent or self.agent,
            cwd=cwd,
            model=None,
            title=None,
            options=None,
            owner=self.user.owner,
            admin=self.user.admin,
        )
        await _agent_session(conv)
        last = conv.core.last_seq
        await self._answer_then_attach(rpc_id, conv, last, {"sessionId": conv.id, "_meta": {META: {"last_seq": last}}})
        return _LATER

    def _room_for_session(self) -> None:
        if len(self.sessions) >= MAX_SESSIONS:
            raise RpcError(TOO_MANY, f"more than {MAX_SESSIONS} sessions on one connection")

    async def _existing(self, params: dict[str, Any]) -> Conversation:
        sid = _session_id(params)
        if sid in self.sessions:
            raise RpcError(INVALID_PARAMS, f"session {sid} is already attached on this connection")
        self._room_for_session()
        try:
            conv = await self.registry.get(sid)
            check_owner(self.user, sid, conv.thread.get("owner"))  # another user's: as if none
            return conv
        except BridgeError as exc:
            raise RpcError(NOT_FOUND, f"no session {sid}", {"code": exc.code}) from None

    async def _attach(self, conv: Conversation, after: int, att: _Attached | None = None) -> _Attached:
        att = att or _Attached(self, conv)
        self.sessions[conv.id] = att
        await att.ask_pending()
        att.task = asyncio.create_task(att.run(after))
        return att

    async def _answer_then_attach(self, rpc_id: Any, conv: Conversation, after: int, answer: dict[str, Any]) -> None:
        """Subscribed first (nothing committed meanwhile is lost), answered, then the
        session's pending permission requests and its updates: a client learns of the
        session before anything is asked in it."""
        att = _Attached(self, conv)
        self.sessions[conv.id] = att
        try:
            await self._result(rpc_id, _with_modes(answer, conv))
        except BaseException:
            self.sessions.pop(conv.id, None)
            att.detach()
            raise
        await self._attach(conv, after, att)

    async def _load(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        """Replays the transcript (from ``_meta.agent-bridge.after``, else the start) as
        updates, then answers; live updates follow the answer."""
        conv = await self._existing(params)
        after = _meta(params).get("after", 0)
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise RpcError(INVALID_PARAMS, f"_meta.{META}.after must be a non-negative integer")
        att = _Attached(self, conv)  # subscribed first: nothing committed during the replay is lost
        self.sessions[conv.id] = att
        try:
            cursor = after
            while True:
                page = await conv.read_page(cursor, 1000)
                for rec in page:
                    await att.record(rec)
                if page:
                    cursor = page[-1].seq
                if len(page) < 1000:
                    break
        except BaseException:
            self.sessions.pop(conv.id, None)
            att.detach()
            raise
        await self._result(rpc_id, _with_modes({"_meta": {META: {"last_seq": cursor}}}, conv))
        await self._attach(conv, cursor, att)
        return _LATER

    async def _resume(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        conv = await self._existing(params)
        last = conv.core.last_seq
        await self._answer_then_attach(rpc_id, conv, last, {"_meta": {META: {"last_seq": last}}})
        return _LATER

    async def _prompt(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        att = self.sessions.get(_session_id(params))
        if att is None:
            raise RpcError(NOT_FOUND, "session not attached on this connection: session/new, load or resume first")
        blocks = normalize_prompt(None, mapping.prompt_blocks(params.get("prompt")))
        client_id = _meta(params).get("client_id")
        if not isinstance(client_id, str) or not 0 < len(client_id) <= 128:
            client_id = f"acp-{uuid.uuid4().hex}"
        att.by_client[client_id] = rpc_id
        try:
            prompt = Prompt(content=blocks, client_id=client_id, actor=self.user.name)
            acc = await self.registry.port(att.conv).run(prompt)
        except BaseException:
            att.by_client.pop(client_id, None)
            raise
        if acc.duplicate:
            att.by_client.pop(client_id, None)
            await self._duplicate_prompt(att, rpc_id, acc.seq)
        return _LATER

    async def _duplicate_prompt(self, att: _Attached, rpc_id: Any, seq: int) -> None:
        """A prompt sent again (the relay reconnected): answered from the transcript if its
        turn already ended, else when it ends."""
        first = await att.conv.read_page(seq - 1, 1)
        turn_id = first[0].data.get("turn_id") if first else None
        if not isinstance(turn_id, str):
            raise RpcError(INTERNAL_ERROR, "the prompt's turn is not in the transcript")
        att.by_turn[turn_id] = rpc_id
        cursor = seq
        while att.by_turn.get(turn_id) == rpc_id:
            page = await att.conv.read_page(cursor, 1000)
            for rec in page:
                if rec.kind == "turn.ended" and rec.data.get("turn_id") == turn_id and att.by_turn.pop(turn_id, None):
                    await self.answer_turn(rpc_id, rec.data)
                    return
            if len(page) < 1000:
                return
            cursor = page[-1].seq

    async def _set_mode(self, rpc_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        """``session/set_mode``: the agent's own, through the thread (and its owner replica);
        the agent's refusal is passed on as it gave it."""
        att = self.sessions.get(_session_id(params))
        if att is None:
            raise RpcError(NOT_FOUND, "session not attached on this connection: session/new, load or resume first")
        mode_id = params.get("modeId")
        if not isinstance(mode_id, str) or not mode_id:
            raise RpcError(INVALID_PARAMS, "modeId must be a non-empty string")
        try:
            await self.registry.port(att.conv).run(SetMode(mode_id=mode_id, actor=self.user.name))
        except ModeRefused as exc:
            raise RpcError(exc.rpc["code"], exc.rpc["message"], exc.rpc.get("data")) from None
        except BridgeError as exc:
            if exc.code == "modes_not_supported":
                raise RpcError(METHOD_NOT_FOUND, exc.message, {"code": exc.code}) from None
            raise
        return {}

    async def _list(self, rpc_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        """Threads, newest activity first; with ``cwd``, those in it (the store pages are
        read until one has a match, at most LIST_SCAN_PAGES per answer)."""
        cwd, cursor = _optional_str(params, "cwd"), _optional_str(params, "cursor")
        settings = self.ws.app.state.settings
        view = shown_to(settings, self.user)
        if cwd is not None:
            cwd = userdirs.given(settings, cwd)  # "<data-dir>/…", as this caller was shown it
        found: list[dict[str, Any]] = []
        for _ in range(LIST_SCAN_PAGES):
            owner = None if self.user.admin else self.user.name
            rows, cursor = await self.registry.store.list_threads(
                limit=LIST_PAGE, cursor=cursor, agent=None, owner=owner
            )
            current = [self.registry.current(row) for row in rows]
            found += [_session_info(row, view) for row in current if cwd is None or row["cwd"] == cwd]
            if cursor is None or found:
                break
        return {"sessions": found} if cursor is None else {"sessions": found, "nextCursor": cursor}


def _optional_str(params: dict[str, Any], key: str) -> str | None:
    value = params.get(key)
    if value is not None and not isinstance(value, str):
        raise RpcError(INVALID_PARAMS, f"{key} must be a string")
    return value


def _session_info(row: ThreadRow, view: Shown) -> dict[str, Any]:
    info: dict[str, Any] = {"sessionId": row["id"], "cwd": view.path(row["cwd"]), "updatedAt": row["updated_at"]}
    if row.get("title"):
        info["title"] = row["title"]
    info["_meta"] = {META: {"agent": row["agent"], "state": row["state"], "last_seq": row["last_seq"]}}
    return info


def _key(rpc_id: Any) -> tuple[str, Any]:
    return (type(rpc_id).__name__, rpc_id)  # 1 and "1" are two ids


def _valid_id(msg: Any) -> Any:
    """The message's id when it is one JSON-RPC allows (string or integer), else None."""
    rpc_id = msg.get("id") if isinstance(msg, dict) else None
    if isinstance(rpc_id, bool) or not isinstance(rpc_id, (str, int)):
        return None
    return rpc_id


_LATER: Any = object()  # the handler has answered (or will answer) itself

_Method = Callable[[AcpConnection, Any, dict[str, Any]], Awaitable[Any]]
_METHODS: dict[str, _Method] = {
    "initialize": AcpConnection._initialize,
    "session/new": AcpConnection._new,
    "session/load": AcpConnection._load,
    "session/resume": AcpConnection._resume,
    "session/prompt": AcpConnection._prompt,
    "session/list": AcpConnection._list,
    "session/set_mode": AcpConnection._set_mode,
}
