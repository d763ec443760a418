"""The bridge as an ACP *agent* (docs/api.md §11): one connection's JSON-RPC methods,
apart from the WebSocket that carries them (api/acp_gateway.py).

Every ACP session is a thread: ``sessionId`` is the thread id, so threads made here are
listed over REST and on the page, and the reverse. The agent is given JSON values and an
:class:`Outbox` to answer into; it reaches threads only through api/acp_threads.py's
:class:`~bridge.api.acp_threads.AcpThreads` (commands run through the thread's port), and
the mapping of transcript records to ``session/update`` is sessions/acp_session.py.

**Where a new ACP method goes:** a coroutine on :class:`AcpAgent` taking ``(rpc_id,
params)`` and one row in ``_METHODS``; one that changes a thread builds a command
(sessions/commands.py) and runs it with ``thread.run``. It answers by returning the result
(or raising :class:`~bridge.protocols.jsonrpc.RpcError` / a BridgeError), or returns
``_LATER`` when it answers itself (a prompt answers at its turn's end).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from bridge import __version__, userdirs
from bridge.api import acp_elicit, acp_mcp, acp_request_cancel
from bridge.api import acp_session_ops as ops
from bridge.api.acp_attached import META, Attached, meta
from bridge.api.acp_threads import AcpThread, AcpThreads
from bridge.api.content import normalize_prompt
from bridge.api.users import User, check_owner
from bridge.api.views import Shown, shown_to
from bridge.config import Settings
from bridge.errors import BridgeError
from bridge.logs import bound_trace
from bridge.protocols import acp_cancel, jsonrpc, trace
from bridge.protocols.codecs import prompt_capabilities
from bridge.protocols.jsonrpc import Invalid, Notification, Request, Response, RpcError
from bridge.sessions import acp_session as mapping
from bridge.sessions.commands import BOUNDS, Interrupt, Prompt
from bridge.store.base import ThreadRow

log = structlog.get_logger("bridge.acp_gateway")

PROTOCOL_VERSION = 1
MAX_PENDING = 32  # the client's requests being handled at once, prompts waiting on their turn included
MAX_SESSIONS = 64  # sessions attached on one connection
MAX_OUTSTANDING = 256  # permission requests sent to the client and not yet answered
START_WAIT_S = 10.0  # session/new with an ACP profile: how long its agent may take to report its modes
LIST_PAGE = 50  # session/list: sessions per answer
LIST_SCAN_PAGES = 20  # session/list with a cwd filter reads at most this many store pages per answer
REPLAY_PAGE = 1000  # records read at a time when a session is loaded
MAX_CLIENT_ID = BOUNDS.client_id  # a prompt's _meta client_id, as a REST prompt's (docs/api.md §4.6)


class Outbox(Protocol):
    """Where the agent's messages go: the connection's one writer."""

    async def send(self, message: dict[str, Any]) -> None:
        """Send one JSON-RPC message; raises when it cannot go out."""
        ...

    def fail(self) -> None:
        """Something could not be sent: the connection ends."""
        ...

    def close(self, code: int, reason: str) -> None:
        """End the connection with this close code."""
        ...


def _from_bridge(exc: BridgeError) -> RpcError:
    """A bridge refusal as a JSON-RPC error; ``data.code`` is the bridge's error code."""
    data = {"code": exc.code}
    if exc.status == 400:
        return RpcError.invalid_params(exc.message, data)
    if exc.status == 404:
        return RpcError.not_found(exc.message, data)
    return RpcError.internal(exc.message, data)


def _session_id(params: dict[str, Any]) -> str:
    sid = params.get("sessionId")
    if not isinstance(sid, str) or not sid:
        raise RpcError.invalid_params("sessionId must be a non-empty string")
    return sid


def _optional_str(params: dict[str, Any], key: str) -> str | None:
    value = params.get(key)
    if value is not None and not isinstance(value, str):
        raise RpcError.invalid_params(f"{key} must be a string")
    return value


def _session_info(row: ThreadRow, view: Shown) -> dict[str, Any]:
    info: dict[str, Any] = {"sessionId": row["id"], "cwd": view.path(row["cwd"]), "updatedAt": row["updated_at"]}
    if row.get("title"):
        info["title"] = row["title"]
    info["_meta"] = {META: {"agent": row["agent"], "state": row["state"], "last_seq": row["last_seq"]}}
    return info


class AcpAgent:
    """One connection's ACP agent: its sessions, the client's requests being handled, and
    the permission requests it was asked and has not answered."""

    def __init__(
        self, out: Outbox, threads: AcpThreads, settings: Settings, user: User, agent: str | None, conn_id: str
    ) -> None:
        self.out = out
        self.threads = threads
        self.settings = settings
        self.user = user  # users mode: only this user's threads (an admin's: all)
        self.agent = agent
        self.id = conn_id
        self.initialized = False
        self.sessions: dict[str, Attached] = {}
        # our requests to the client: rpc id → (session, permission request id, its data)
        self._outstanding: jsonrpc.Pending[tuple[Attached, str, dict[str, Any]]] = jsonrpc.Pending(first=1)
        self._handling: dict[asyncio.Task[None], jsonrpc.Id] = {}  # task → the request id it answers
        self.booleans = False  # the client takes boolean config options
        self.elicitation: frozenset[str] = frozenset()  # the elicitation modes it shows (api/acp_elicit.py)
        self.watcher: asyncio.Task[None] | None = None  # the threads' changes (acp_session_ops)
        self.watch_ready: asyncio.Future[None] | None = None  # …once it has taken its cursor

    # ------------------------------------------------------------------ writing

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self.out.send(jsonrpc.notification(method, params))

    async def request(
        self, method: str, params: dict[str, Any], waiting: tuple[Attached, str, dict[str, Any]]
    ) -> jsonrpc.Id | None:
        """Ask the client; None when too many of our requests are unanswered already."""
        if len(self._outstanding) >= MAX_OUTSTANDING:
            log.warning("acp.too_many_outstanding", connection_id=self.id)
            return None
        rpc_id = self._outstanding.add(waiting)
        await self.out.send(jsonrpc.request(rpc_id, method, params))
        return rpc_id

    def forget(self, rpc_id: jsonrpc.Id) -> None:
        self._outstanding.drop(rpc_id)

    async def _result(self, rpc_id: jsonrpc.Id, result: Any) -> None:
        await self.out.send(jsonrpc.result(rpc_id, result))

    async def _error(self, rpc_id: jsonrpc.Id | None, err: RpcError) -> None:
        await self.out.send(jsonrpc.error(rpc_id, err))

    async def answer_turn(self, rpc_id: jsonrpc.Id, data: dict[str, Any]) -> None:
        """A prompt's answer, at its turn's end."""
        reason = mapping.stop_reason(data)
        if reason is not None:
            await self._result(rpc_id, {"stopReason": reason})
            return
        error = str(data["error"]) if isinstance(data.get("error"), str) else "the turn failed"
        extra = {k: data[k] for k in ("status", "error_code") if isinstance(data.get(k), str)}
        await self._error(rpc_id, RpcError.internal(error, extra or None))

    async def answer_cancelled(self, rpc_id: jsonrpc.Id) -> None:
        await self._result(rpc_id, {"stopReason": "cancelled"})

    async def fail_prompts(self, att: Attached, why: str) -> None:
        """The session ended under its prompts (its thread was deleted)."""
        for rpc_id in att.prompts():
            await self._error(rpc_id, RpcError.internal(f"the session ended: {why}", {"code": "thread_deleted"}))

    # ------------------------------------------------------------------ reading

    async def message(self, value: Any) -> None:
        """One JSON value the client sent."""
        msg = jsonrpc.classify(value)
        if isinstance(msg, Request):
            await self._request(msg)
        elif isinstance(msg, Notification):
            await self._notification(msg.method, msg.params)
        elif isinstance(msg, Response):
            await self._response(msg.id, msg.result, msg.error)
        else:
            await self._invalid(msg)

    async def _invalid(self, msg: Invalid) -> None:
        if not msg.response:
            await self._error(msg.answer_id, msg.error())
        elif msg.reply_to is not None:
            # A broken answer to one of our requests: taken as a failed one (a denial), never
            # answered back (two peers would then argue forever).
            await self._response(msg.reply_to, None, msg.error())

    async def _request(self, msg: Request) -> None:
        if self._pending() >= MAX_PENDING:
            await self._error(msg.id, RpcError.too_many(f"more than {MAX_PENDING} requests pending"))
            return
        params = {} if msg.params is None else msg.params  # absent: no parameters
        task = asyncio.create_task(self._handle(msg.id, msg.method, params))
        self._handling[task] = msg.id
        task.add_done_callback(self._handling.pop)

    def _pending(self) -> int:
        """Requests being handled, and prompts waiting for their turn to end (a prompt
        being handled is both: counted once)."""
        ids = {jsonrpc.id_key(i) for i in self._handling.values()}
        for att in self.sessions.values():
            ids.update(jsonrpc.id_key(i) for i in att.prompts())
        return len(ids)

    async def _handle(self, rpc_id: jsonrpc.Id, method: str, params: Any) -> None:
        try:
            with bound_trace(trace.from_meta(params.get("_meta") if isinstance(params, dict) else None)):
                await self._answer(rpc_id, method, params)  # its log lines carry the client's trace ids
        except (TimeoutError, RuntimeError, OSError) as exc:  # the answer cannot go out
            log.info("acp.request_send_failed", connection_id=self.id, method=method, error=type(exc).__name__)
            self.out.fail()

    async def _answer(self, rpc_id: jsonrpc.Id, method: str, params: Any) -> None:
        handler = _METHODS.get(method)
        try:
            if handler is None:
                raise RpcError.method_not_found(f"Method not found: {method}")
            if not self.initialized and method != "initialize":
                raise RpcError.invalid_request("initialize first")
            if not isinstance(params, dict):
                raise RpcError.invalid_params("params must be an object")
            result = await handler(self, rpc_id, params)
        except RpcError as exc:
            await self._error(rpc_id, exc)
            return
        except BridgeError as exc:
            rpc = _from_bridge(exc)
            rpc.message = shown_to(self.settings, self.user).text(rpc.message)  # no data dir path
            await self._error(rpc_id, rpc)
            return
        if result is not _LATER:
            await self._result(rpc_id, result)

    async def _notification(self, method: str, params: Any) -> None:
        """Never answered (JSON-RPC 2.0 §4.1). ``session/cancel`` interrupts the turn."""
        if method == acp_cancel.METHOD:  # the client gives up one of its requests
            await acp_request_cancel.client_cancelled(self, params)
            return
        if method != "session/cancel" or not isinstance(params, dict):
            return
        sid = params.get("sessionId")
        att = self.sessions.get(sid) if isinstance(sid, str) else None
        if att is not None:
            with contextlib.suppress(BridgeError):
                await att.thread.run(Interrupt(actor=self.user.name))

    async def _response(self, rpc_id: jsonrpc.Id | None, result: Any, error: RpcError | None) -> None:
        waiting = self._outstanding.take(rpc_id)
        if waiting is None:
            return  # an answer to a request we forgot (cancelled) or never made
        att, rid, data = waiting
        await att.answered(rid, data, result, error)

    # ------------------------------------------------------------------ sessions

    async def session_closed(self, att: Attached, why: str) -> None:
        """The thread went away (deleted) or the daemon is stopping."""
        if why == "daemon_shutdown":
            self.out.close(1001, why)
            return
        if self.sessions.get(att.thread.id) is att:
            del self.sessions[att.thread.id]
        att.detach(cancel=False)
        if why == "deleted":
            await ops.deleted(self, att)
        await self.fail_prompts(att, why)

    async def close(self) -> None:
        """The connection is ending: every task and subscriber ended."""
        await ops.stop_watching(self)
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

    def _room_for_session(self) -> None:
        if len(self.sessions) >= MAX_SESSIONS:
            raise RpcError.too_many(f"more than {MAX_SESSIONS} sessions on one connection")

    async def _existing(self, params: dict[str, Any]) -> AcpThread:
        sid = _session_id(params)
        if sid in self.sessions:
            raise RpcError.invalid_params(f"session {sid} is already attached on this connection")
        self._room_for_session()
        try:
            thread = await self.threads.get(sid)
            check_owner(self.user, sid, thread.owner)  # another user's: as if none
            return thread
        except BridgeError as exc:
            raise RpcError.not_found(f"no session {sid}", {"code": exc.code}) from None

    def _attached(self, params: dict[str, Any]) -> Attached:
        att = self.sessions.get(_session_id(params))
        if att is None:
            raise RpcError.not_found("session not attached on this connection: session/new, load or resume first")
        return att

    async def _attach(self, att: Attached, after: int) -> None:
        self.sessions[att.thread.id] = att
        await ops.tell_title(self, att)
        await att.ask_pending()
        att.start(after)

    async def _answer_then_attach(
        self, rpc_id: jsonrpc.Id, thread: AcpThread, after: int, answer: dict[str, Any]
    ) -> None:
        """Subscribed first (nothing committed meanwhile is lost), answered, then the
        session's pending permission requests and its updates: a client learns of the
        session before anything is asked in it."""
        await ops.watching(self)
        att = Attached(self, thread)
        self.sessions[thread.id] = att
        try:
            await att.prime(after)  # live from the middle of a message: the id its start had
            await self._result(rpc_id, ops.session_state(self, att, answer))
        except BaseException:
            self.sessions.pop(thread.id, None)
            att.detach()
            raise
        await self._attach(att, after)

    # ------------------------------------------------------------------ methods

    async def _initialize(self, rpc_id: jsonrpc.Id, params: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(params.get("protocolVersion"), int) or isinstance(params.get("protocolVersion"), bool):
            raise RpcError.invalid_params("protocolVersion must be an integer")
        self.initialized = True
        self.elicitation = acp_elicit.modes(params.get("clientCapabilities"))
        caps = params.get("clientCapabilities")
        session = caps.get("session") if isinstance(caps, dict) else None
        config = session.get("configOptions") if isinstance(session, dict) else None
        self.booleans = isinstance(config, dict) and isinstance(config.get("boolean"), dict)
        profile = self.settings.agents.get(self.agent or self.settings.default_profile())
        prompts = prompt_capabilities(profile.protocol if profile is not None else "")
        return {
            # The one version spoken here; a client asking for another decides (ACP initialization).
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": prompts,
                "mcpCapabilities": {"http": True, "sse": True},  # remote ones by opt-in (bridge/launching.py)
                "sessionCapabilities": {"list": {}, "resume": {}, "close": {}, "delete": {}},
            },
            "agentInfo": {"name": "agent-bridge", "title": "agent-bridge", "version": __version__},
            "authMethods": [],
        }

    async def _new(self, rpc_id: jsonrpc.Id, params: dict[str, Any]) -> Any:
        cwd = params.get("cwd")
        if not isinstance(cwd, str):
            raise RpcError.invalid_params("cwd must be an absolute path")
        mcp = acp_mcp.create_options(params)  # the client's MCP servers, checked: the thread's option
        agent = meta(params).get("agent")
        if agent is not None and not isinstance(agent, str):
            raise RpcError.invalid_params(f"_meta.{META}.agent must be a profile name")
        self._room_for_session()
        thread = await self.threads.create(
            agent=agent or self.agent, cwd=cwd, owner=self.user.owner, admin=self.user.admin, **mcp
        )
        await thread.start_agent(START_WAIT_S)
        last = thread.last_seq
        answer = {"sessionId": thread.id, "_meta": {META: {"last_seq": last}}}
        await self._answer_then_attach(rpc_id, thread, last, answer)
        return _LATER

    async def _load(self, rpc_id: jsonrpc.Id, params: dict[str, Any]) -> Any:
        """Replays the transcript (from ``_meta.agent-bridge.after``, else the start) as
        updates, then answers; live updates follow the answer."""
        acp_mcp.servers(params)  # checked as session/new's; the thread keeps the servers it was made with
        thread = await self._existing(params)
        after = meta(params).get("after", 0)
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise RpcError.invalid_params(f"_meta.{META}.after must be a non-negative integer")
        await ops.watching(self)
        att = Attached(self, thread)  # subscribed first: nothing committed during the replay is lost
        self.sessions[thread.id] = att
        try:
            await att.prime(after)
            cursor = await att.replay(after, REPLAY_PAGE)
        except BaseException:
            self.sessions.pop(thread.id, None)
            att.detach()
            raise
        await self._result(rpc_id, ops.session_state(self, att, {"_meta": {META: {"last_seq": cursor}}}))
        await self._attach(att, cursor)
        return _LATER

    async def _resume(self, rpc_id: jsonrpc.Id, params: dict[str, Any]) -> Any:
        acp_mcp.servers(params)  # checked as session/new's; the thread keeps the servers it was made with
        thread = await self._existing(params)
        last = thread.last_seq
        await self._answer_then_attach(rpc_id, thread, last, {"_meta": {META: {"last_seq": last}}})
        return _LATER

    async def _prompt(self, rpc_id: jsonrpc.Id, params: dict[str, Any]) -> Any:
        att = self._attached(params)
        blocks = normalize_prompt(None, mapping.prompt_blocks(params.get("prompt")))
        client_id = meta(params).get("client_id")
        if not isinstance(client_id, str) or not 0 < len(client_id) <= MAX_CLIENT_ID:
            client_id = f"acp-{uuid.uuid4().hex}"
        att.by_client[client_id] = rpc_id
        try:
            traced = trace.from_meta(params.get("_meta"))  # W3C trace context: to the agent, into the logs
            accepted = await att.thread.run(
                Prompt(content=blocks, client_id=client_id, actor=self.user.name, trace=traced)
            )
        except BaseException:
            att.by_client.pop(client_id, None)
            raise
        if accepted.duplicate:
            att.by_client.pop(client_id, None)
            await att.answer_again(rpc_id, accepted.seq, REPLAY_PAGE)
        return _LATER

    async def _set_mode(self, rpc_id: jsonrpc.Id, params: dict[str, Any]) -> dict[str, Any]:
        """``session/set_mode``: the agent's own, through the thread (and the replica holding its lease);
        the agent's refusal is passed on as it gave it."""
        att = self._attached(params)
        mode_id = params.get("modeId")
        if not isinstance(mode_id, str) or not mode_id:
            raise RpcError.invalid_params("modeId must be a non-empty string")
        await ops.set_mode(att, mode_id, self.user.name)
        return {}

    async def _list(self, rpc_id: jsonrpc.Id, params: dict[str, Any]) -> dict[str, Any]:
        """Threads, newest activity first; with ``cwd``, those in it (the store pages are
        read until one has a match, at most LIST_SCAN_PAGES per answer)."""
        cwd, cursor = _optional_str(params, "cwd"), _optional_str(params, "cursor")
        view = shown_to(self.settings, self.user)
        if cwd is not None:
            cwd = userdirs.given(self.settings, cwd)  # "<data-dir>/…", as this caller was shown it
        owner = None if self.user.admin else self.user.name
        found: list[dict[str, Any]] = []
        for _ in range(LIST_SCAN_PAGES):
            rows, cursor = await self.threads.list(limit=LIST_PAGE, cursor=cursor, owner=owner)
            found += [_session_info(row, view) for row in rows if cwd is None or row["cwd"] == cwd]
            if cursor is None or found:
                break
        return {"sessions": found} if cursor is None else {"sessions": found, "nextCursor": cursor}


_LATER: Any = object()  # the handler has answered (or will answer) itself

_Method = Callable[[AcpAgent, jsonrpc.Id, dict[str, Any]], Awaitable[Any]]
_METHODS: dict[str, _Method] = {
    "initialize": AcpAgent._initialize,
    "session/new": AcpAgent._new,
    "session/load": AcpAgent._load,
    "session/resume": AcpAgent._resume,
    "session/prompt": AcpAgent._prompt,
    "session/list": AcpAgent._list,
    "session/set_mode": AcpAgent._set_mode,
    "session/set_config_option": ops.set_config_option,
    "session/close": ops.close,
    "session/delete": ops.delete,
}
