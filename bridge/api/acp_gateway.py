"""The ACP gateway (docs/api.md §11): ``GET /v1/acp`` and ``/v1/acp/{agent}`` upgrade to a
WebSocket carrying the Agent Client Protocol, with the bridge as the *agent*.

This module is the transport: one JSON-RPC 2.0 message per text frame, as in the
WebSocket form of ACP's remote transport; the upgrade response names the connection
(``Acp-Connection-Id``). Credentials, Host and Origin are checked exactly as for the thread
WebSocket (ws.upgrade_user, and guard.RequestGuard before routing). It owns the frames
(text only, at most MAX_MESSAGE_CHARS, strict JSON), the one writer and its send deadline,
and the connection's end (the client leaving, a revoked user, the daemon stopping, a send
that failed). What the messages mean is api/acp_agent.py's.

**Where another transport goes** (ACP over stdio in-process, over HTTP): beside this one,
giving :class:`~bridge.api.acp_agent.AcpAgent` the parsed JSON values and an
:class:`~bridge.api.acp_agent.Outbox`; the agent needs nothing else of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import structlog
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketState

from bridge.api.acp_agent import AcpAgent
from bridge.api.acp_threads import RegistryThreads
from bridge.api.context import context
from bridge.api.tokens import SUBPROTOCOL
from bridge.api.users import Streams, User
from bridge.api.ws import upgrade_user
from bridge.config import Settings
from bridge.errors import error_body
from bridge.protocols import jsonrpc
from bridge.protocols.jsonline import dumps, loads_strict
from bridge.protocols.jsonrpc import RpcError
from bridge.sessions.commands import BOUNDS
from bridge.sessions.registry import Registry

log = structlog.get_logger("bridge.acp_gateway")

router = APIRouter()

MAX_MESSAGE_CHARS = BOUNDS.message_chars  # one JSON-RPC message (the thread WebSocket's frame cap)


@router.websocket("/v1/acp")
@router.websocket("/v1/acp/{agent}")
async def acp_ws(ws: WebSocket, agent: str | None = None) -> None:
    user = await upgrade_user(ws)
    if not isinstance(user, User):
        await ws.send_denial_response(user)
        return
    ctx = context(ws)
    settings = ctx.settings
    if agent is not None and agent not in settings.agents:
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
    await AcpConnection(ws, settings, ctx.registry, ctx.streams, agent, conn_id, user).run()


class AcpConnection:
    """One gateway WebSocket: frames in to its agent, the agent's messages out (the
    :class:`~bridge.api.acp_agent.Outbox`), and its end."""

    def __init__(
        self,
        ws: WebSocket,
        settings: Settings,
        registry: Registry,
        streams: Streams,
        agent: str | None,
        conn_id: str,
        user: User,
    ) -> None:
        self.ws = ws
        self.id = conn_id
        self.user = user
        self._changes = registry.changes
        self._streams = streams
        self.agent = AcpAgent(self, RegistryThreads(registry), settings, user, agent, conn_id)
        self._send_lock = asyncio.Lock()
        self._send_deadline = settings.server.ws_ping_interval_s + settings.server.ws_ping_timeout_s
        self._closing: tuple[int, str] | None = None
        self._closed = asyncio.Event()

    # ------------------------------------------------------------------ Outbox

    async def send(self, message: dict[str, Any]) -> None:
        text = dumps(message)
        try:
            async with self._send_lock:
                async with asyncio.timeout(self._send_deadline):
                    await self.ws.send_text(text)
        except WebSocketDisconnect as exc:
            raise ConnectionError("the client left") from exc

    def fail(self) -> None:
        """Something could not be sent: the connection is closed (1011), never left half alive."""
        self.close(*(self._closing or (1011, "send failed")))

    def close(self, code: int, reason: str) -> None:
        self._closing = (code, reason)
        self._closed.set()

    # ------------------------------------------------------------------ the connection

    async def _watch_shutdown(self) -> None:
        """The daemon is stopping (Registry.close_clients closes the change notifier every
        stream waits on): close with 1001, sessions attached or not."""
        changes = self._changes
        while changes.close_reason is None:
            await changes.wait(changes.generation, 60.0)
        self.close(1001, "daemon_shutdown")

    def revoked(self) -> None:
        """The user was revoked (users mode): the connection closes at once, 4401."""
        self.close(4401, "user_revoked")

    async def run(self) -> None:
        self._changes.attach()  # close_clients waits until this connection has let go
        watcher = asyncio.create_task(self._watch_shutdown())
        try:
            with self._streams.held(self.user, self.revoked):
                await self._receive()
        finally:
            watcher.cancel()
            await self._let_go()
            self._changes.detach()

    async def _let_go(self) -> None:
        """Every task and subscriber ended, then the close frame."""
        await self.agent.close()
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
            await self.send(jsonrpc.error(None, RpcError.invalid_request("ACP messages are text frames")))
            return
        if len(text) > MAX_MESSAGE_CHARS:
            err = RpcError.invalid_request(f"message over {MAX_MESSAGE_CHARS} characters")
            await self.send(jsonrpc.error(None, err))
            return
        try:
            value = loads_strict(text)
        except (ValueError, RecursionError):
            await self.send(jsonrpc.error(None, RpcError.parse_error()))
            return
        await self.agent.message(value)
