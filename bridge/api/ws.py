"""WebSocket ``/v1/threads/{id}/ws`` (docs/api.md §5), events and raw modes.

Close codes (docs/api.md §5.7):
  1000 normal · 1001 daemon shutting down · 1003 raw mode frame was not one JSON object
  HTTP 401 before the upgrade when unauthorized · 4404 thread not found (or not the caller's)
  4400 bad query parameter · 4410 thread deleted · 4401 the user was revoked
  1012 this replica lost the thread's lease (reconnect, to any replica, with after=)
  1013 the transcript store cannot be read now (reason ``store_unavailable``; reconnect later)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.websockets import WebSocketState

from bridge.api.auth import WWW_AUTHENTICATE, how_to_authenticate, resolve_user
from bridge.api.browser_sessions import COOKIE_NAME
from bridge.api.context import context
from bridge.api.elicitations import frame_command as elicitation_frame
from bridge.api.schema import ConfigIn, ModeIn, PermissionFrame, PromptIn, RawIn, frame_error_code, plain_error
from bridge.api.tokens import SUBPROTOCOL
from bridge.api.users import User, check_owner
from bridge.api.views import shown_to
from bridge.api.ws_coalesce import coalesce
from bridge.api.ws_transport import RECEIVE, SEND_TEXTS, Inbox
from bridge.clock import now_iso
from bridge.errors import STORE_UNAVAILABLE_CLOSE, BridgeError, InvalidRequest, StoreError, Throttled, error_body
from bridge.protocols import trace
from bridge.protocols.envelope import ephemeral
from bridge.protocols.events import Record
from bridge.protocols.jsonline import loads_strict
from bridge.sessions.commands import BOUNDS, Command, Interrupt, Raw, ThreadPort
from bridge.sessions.config_options import CONFIG_TIMEOUT_S
from bridge.sessions.conversation import Conversation
from bridge.sessions.fanout import Subscriber, deliver
from bridge.sessions.modes import MODE_TIMEOUT_S

log = structlog.get_logger("bridge.ws")

router = APIRouter()

CLOSE_CODES = {"daemon_shutdown": 1001, "deleted": 4410, "owner_lost": 1012, "user_revoked": 4401}
MAX_FRAME_BYTES = BOUNDS.message_chars  # characters of one text frame


async def upgrade_user(ws: WebSocket) -> User | JSONResponse:
    """The caller of an upgrade, or the HTTP answer to one without good credentials (401,
    or 429 for a peer that sent too many wrong ones). Host and Origin were checked before
    routing (guard.RequestGuard)."""
    try:
        user = await resolve_user(ws)
    except Throttled as exc:
        headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse(error_body(exc.code, exc.message), status_code=429, headers=headers)
    if user is None:
        body = error_body("unauthorized", how_to_authenticate(ws))
        return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": WWW_AUTHENTICATE})
    return user


@router.websocket("/v1/threads/{thread_id}/ws")
async def thread_ws(ws: WebSocket, thread_id: str) -> None:
    user = await upgrade_user(ws)
    if not isinstance(user, User):
        # Refused before the upgrade: an HTTP answer, nothing of the thread is looked up.
        await ws.send_denial_response(user)
        return
    offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",")]
    await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    mode = ws.query_params.get("mode", "events")
    after_raw = ws.query_params.get("after", "0") or "0"
    omit_raw = ws.query_params.get("omit_raw", "0")
    coalesced = ws.query_params.get("coalesce", "0")
    if not _valid_query(mode, after_raw, omit_raw, coalesced):
        await _close_quietly(
            ws, 4400, "mode must be events|raw, after a non-negative integer, omit_raw and coalesce 0|1"
        )
        return
    reg = context(ws).registry
    try:
        conv = await reg.get(thread_id)
        check_owner(user, thread_id, conv.thread.get("owner"))
    except StoreError as exc:
        # Not "no such thread": the store could not say (a database outage).
        await store_unavailable(ws, exc, notice=mode == "events")
        return
    except BridgeError as exc:
        await _close_quietly(ws, 4404, exc.code)
        return
    session = _Session(
        ws, conv, reg.port(conv), user, raw=(mode == "raw"), omit_raw=omit_raw == "1" and mode == "events"
    )
    session.coalesce = coalesced == "1"
    await session.run(int(after_raw))


def _valid_query(mode: str, after: str, omit_raw: str, coalesced: str) -> bool:
    return (
        mode in ("events", "raw")
        and after.isascii()
        and after.isdigit()
        and len(after) <= 15
        and omit_raw in ("0", "1")
        and coalesced in ("0", "1")
    )


async def _close_quietly(ws: WebSocket, code: int, reason: str) -> None:
    """Close; a client that already left is not an error."""
    with contextlib.suppress(Exception):
        await ws.close(code=code, reason=reason)


def store_notice(exc: StoreError) -> str:
    """The ``notice`` an events-mode client is sent before a close for a store it cannot
    be served from (raw mode carries the agent's lines only)."""
    text = f"the transcript store cannot be read ({exc.message}); reconnect later with after="
    return ephemeral("notice", now_iso(), code="store_unavailable", text=text)


async def store_unavailable(ws: WebSocket, exc: StoreError, *, notice: bool) -> None:
    """A connection the store cannot serve now: a ``notice`` saying why, then close 1013
    with reason ``store_unavailable``; the client reconnects later with ``after=``."""
    log.info("ws.store_unavailable", path=ws.url.path, error=exc.message)
    if notice:
        with contextlib.suppress(Exception):
            await ws.send_text(store_notice(exc))
    await _close_quietly(ws, STORE_UNAVAILABLE_CLOSE, "store_unavailable")


class _Session:
    def __init__(
        self, ws: WebSocket, conv: Conversation, port: ThreadPort, user: User, *, raw: bool, omit_raw: bool = False
    ) -> None:
        self.ws = ws
        self.conv = conv
        self.port = port  # where this client's commands run (Registry.port)
        self.user = user
        self.actor = user.name  # who sends this client's commands: ``by`` in their events (the operator's too)
        self.raw = raw
        # Envelopes without "raw" (null): a frame about half the size of a huge prompt's.
        # Replayed pages then come as records, each envelope built for this client.
        self.omit_raw = omit_raw
        self.replay_frames = not omit_raw
        self._send_lock = asyncio.Lock()
        # ?coalesce=1: what is ready at once leaves as NDJSON lines in few frames (ws_coalesce).
        self.coalesce = False
        self._sub: Subscriber | None = None
        # A peer that has not taken a frame for a whole ping round (interval + timeout)
        # has failed keepalive. uvicorn then closes the transport gracefully, which waits
        # forever to flush to a peer that never reads, so no disconnect ever reaches us:
        # bound every send (and the final close) ourselves, or the subscriber leaks.
        server = context(ws).settings.server
        self._send_deadline = server.ws_ping_interval_s + server.ws_ping_timeout_s

    # -- fanout.Sink: what deliver() sends this client

    async def send(self, texts: list[str], recs: list[Record]) -> None:
        """Replies and notices, then records, in one write."""
        if self.raw:
            texts += [r.raw for r in recs if r.source == "agent" and r.relay and r.raw is not None]
        elif self.omit_raw:
            texts += [r.envelope(with_raw=False) for r in recs]
        else:
            texts += [r.envelope() for r in recs]
        if texts:
            await self._send_texts(texts)

    async def send_frames(self, frames: list[bytes]) -> None:
        await self._send_texts(frames)

    async def _send_texts(self, texts: list[str] | list[bytes]) -> None:
        """Frames under one lock and one deadline, with one socket write when the server
        offers it (ws_transport.SEND_TEXTS, issue #8)."""
        if self.coalesce:
            texts = coalesce(texts)
        send_texts = self.ws.scope.get("extensions", {}).get(SEND_TEXTS)
        async with self._send_lock:
            async with asyncio.timeout(self._send_deadline):
                if send_texts is not None:
                    await send_texts(texts)
                else:
                    for text in texts:
                        await self.ws.send_text(text if isinstance(text, str) else text.decode())

    async def run(self, after: int) -> None:
        sub = self.conv.subscribe(raw=self.raw)
        self._sub = sub
        streams = context(self.ws).streams
        pusher = context(self.ws).running.push
        # A page (the browser session's cookie) with the thread open: its user is told there,
        # so no push (bridge/push/sender.py).
        page = pusher is not None and not self.raw and COOKIE_NAME in self.ws.cookies
        with streams.held(self.user, lambda: sub.close("user_revoked")), contextlib.ExitStack() as watch:
            if page and pusher is not None:
                watch.enter_context(pusher.watching(self.user.owner, self.conv.id))
            await self._serve(sub, after)

    async def _serve(self, sub: Subscriber, after: int) -> None:
        sender = asyncio.create_task(deliver(sub, after, self.conv.journal, self))
        receiver = asyncio.create_task(self._receive())
        close_code, reason = 1000, ""
        try:
            done, _ = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
            if sender in done and not sender.cancelled() and isinstance(exc := sender.exception(), StoreError):
                # The replay or a catch-up could not read the store: say so, never a plain 1000.
                if not self.raw:
                    with contextlib.suppress(Exception):
                        await self._send_texts([store_notice(exc)])
                close_code, reason = STORE_UNAVAILABLE_CLOSE, "store_unavailable"
            elif sender in done and not sender.cancelled() and sender.exception() is None:
                why = sender.result() or ""
                close_code, reason = CLOSE_CODES.get(why, 1000), why
            elif receiver in done and not receiver.cancelled() and receiver.exception() is None:
                close_code, reason = receiver.result()
        finally:
            self.conv.unsubscribe(sub)
            for t in (sender, receiver):
                t.cancel()
            for t in (sender, receiver):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            if self.ws.application_state == WebSocketState.CONNECTED:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(self._send_deadline):
                        await self.ws.close(code=close_code, reason=reason)

    async def _next_message(self, inbox: Inbox | None) -> str | bytes | None:
        """The client's next message: text, binary, or None once it is gone. Read from the
        transport's inbox when it offers one (ws_transport.RECEIVE, issue #22), else
        through ASGI."""
        if inbox is not None:
            item = await inbox.get()
            return None if isinstance(item, dict) else item
        msg = await self.ws.receive()
        if msg["type"] == "websocket.disconnect":
            return None
        text = msg.get("text")
        return text if text is not None else msg.get("bytes") or b""

    def _take_inbox(self) -> Inbox | None:
        """The transport's inbox of client messages, when it offers one (taken once)."""
        direct = self.ws.scope.get("extensions", {}).get(RECEIVE)
        return direct() if direct is not None else None

    async def _receive(self) -> tuple[int, str]:
        inbox = self._take_inbox()
        try:
            while True:
                text = await self._next_message(inbox)
                if text is None:
                    return 1000, ""
                if isinstance(text, bytes):
                    if self.raw:
                        return 1003, "raw mode takes text frames with one JSON object"
                    await self._reject(None, "invalid_frame", "frames must be JSON text")
                    continue
                if len(text) > MAX_FRAME_BYTES:
                    if self.raw:
                        return 1009, "frame too large"
                    await self._reject(None, "frame_too_large", "frame too large")
                    continue
                if self.raw:
                    if not await self._raw_frame(text):
                        return 1003, "raw mode frames must be one JSON object"
                else:
                    await self._op_frame(text)
        except WebSocketDisconnect:
            return 1000, ""

    async def _raw_frame(self, text: str) -> bool:
        try:
            obj = loads_strict(text)
        except (ValueError, RecursionError):
            return False
        if not isinstance(obj, dict):
            return False
        try:
            await self.port.run(Raw(message=obj, routed=True, actor=self.actor), answer_to=self._sub)
        except BridgeError as exc:
            log.info("ws.raw_refused", thread_id=self.conv.id, code=exc.code)
        return True

    async def _reply(self, text: str) -> None:
        """An answer to one of this client's frames: the sender takes it, with the events
        it caused when they are ready too (one write, issue #8)."""
        sub = self._sub
        assert sub is not None
        sub.push_reply(text)
        sub.release()  # a forwarded frame's answer: it goes out before what waited for it
        if not sub.room.is_set():
            await sub.room.wait()  # a client that sends faster than it reads waits here

    async def _reject(self, op: str | None, code: str, message: str, **extra: Any) -> None:
        await self._reply(ephemeral("client.rejected", now_iso(), op=op, code=code, message=message, **extra))

    async def _accept(self, op: str, **extra: Any) -> None:
        await self._reply(ephemeral("client.accepted", now_iso(), op=op, **extra))

    async def _op_frame(self, text: str) -> None:
        frame = await self._frame(text)
        if frame is None:
            return
        op = frame.get("op")
        name = op if isinstance(op, str) else None
        client_id = frame.get("client_id")
        ids = {"client_id": client_id} if isinstance(client_id, str) else {}
        try:
            spec = _OPS.get(name or "")
            if name is None or spec is None:
                raise InvalidRequest(f"unknown op {op!r}", code="unknown_op")
            command = spec.command(frame, self.actor, ids.get("client_id") or "websocket")
            if spec.hold_s and self._sub is not None:
                # Run here too, the command's events may be recorded before its answer: they
                # wait for it, as a forwarded frame's do (released by _reply, or at the bound).
                self._sub.hold(spec.hold_s)
            answer = await self.port.run(command, answer_to=self._sub)
        except BridgeError as exc:
            message = shown_to(context(self.ws).settings, self.user).text(exc.message)  # no data dir path
            await self._reject(name, exc.code, message, **ids)
            return
        await self._accept(name, **command.answer_to_wire(answer), **(ids if spec.echo_client_id else {}))

    async def _frame(self, text: str) -> dict[str, Any] | None:
        """The frame's object, or None once the client was told why it is not one."""
        try:
            frame = loads_strict(text)
        except (ValueError, RecursionError):
            await self._reject(None, "invalid_json", "frame is not JSON")
            return None
        if not isinstance(frame, dict):
            await self._reject(None, "invalid_frame", "frame must be a JSON object")
            return None
        return frame


def _first_error(exc: ValidationError) -> str:
    return plain_error(exc.errors()[0])


@dataclass(frozen=True)
class _Op:
    """A client frame's op (docs/api.md §5.3): the command it makes from the frame, the
    sender (``actor``) and the frame's ``client_id`` (or "websocket"); its answer is the
    command's answer as the bus carries it (§5.4)."""

    parse: Callable[[dict[str, Any], str, str], Command[Any]]
    echo_client_id: bool = True  # a permission's answer names it as ``by`` instead
    hold_s: float = 0.0  # events held for the answer even when run here (set_mode)

    def command(self, frame: dict[str, Any], actor: str, channel: str) -> Command[Any]:
        """The frame's command; a field the schema refuses is the frame's error (§5.4)."""
        try:
            return self.parse(frame, actor, channel)
        except ValidationError as exc:
            raise InvalidRequest(_first_error(exc), code=frame_error_code(exc)) from None


_OPS: dict[str, _Op] = {
    "prompt": _Op(lambda frame, actor, _cid: PromptIn.from_frame(frame).command(actor, trace.from_meta(frame))),
    "interrupt": _Op(lambda _frame, actor, _cid: Interrupt(actor=actor)),
    "raw": _Op(lambda frame, actor, _cid: RawIn.from_frame(frame).command(actor)),
    "permission": _Op(
        lambda frame, actor, cid: (body := PermissionFrame.from_frame(frame)).command(body.request_id, actor, cid),
        echo_client_id=False,
    ),
    "elicitation": _Op(elicitation_frame, echo_client_id=False),
    "set_mode": _Op(lambda frame, actor, _cid: ModeIn.from_frame(frame).command(actor), hold_s=MODE_TIMEOUT_S + 1.0),
    "set_config_option": _Op(
        lambda frame, actor, _cid: ConfigIn.from_frame(frame).command(actor), hold_s=CONFIG_TIMEOUT_S + 1.0
    ),
}
