"""The server-wide change stream (docs/api.md §6): ``GET /v1/events`` (Server-Sent Events)
and ``GET /v1/ws`` (the same frames over a WebSocket).

Each stream reads the store's change log (``Store.read_changes``) from its own cursor, a
page at a time, and waits for the registry's ChangeNotifier (or a slow poll) in between:
nothing is queued per client beyond the page being sent, so a slow client falls behind in
the store and is caught up from it, never buffered without bound.

Frames (JSON objects, one per change, in cursor order):

* first, exactly one ``{"cursor","kind":"ready"}`` (the cursor the stream continues from)
  or ``{"cursor","kind":"resync","reason"}`` (the cursor asked for cannot be served: the
  client re-lists and continues from this cursor);
* ``{"cursor","kind":"thread.created"|"thread.updated","thread":{…the thread object…}}``;
* ``{"cursor","kind":"thread.deleted","thread":{"id","deleted_at"}}``;
* a later ``resync`` if the client fell behind the change horizon while connected.

In users mode a non-admin sees only changes of their own threads (docs/security.md).

WebSocket close codes: 1000 normal · 1001 daemon shutting down · 4400 bad ``since`` ·
4401 the user was revoked;
HTTP 401/429 before the upgrade without good credentials, as for the thread WebSocket.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import structlog
from fastapi import APIRouter, Depends, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from starlette.websockets import WebSocketState

from bridge.api.auth import require_auth
from bridge.api.context import context
from bridge.api.tokens import SUBPROTOCOL
from bridge.api.users import OPERATOR, User, current_user, visible
from bridge.api.views import AS_IS, Shown, shown_to, thread_view
from bridge.api.ws import upgrade_user
from bridge.api.ws_transport import SEND_TEXTS
from bridge.errors import STORE_UNAVAILABLE_CLOSE, InvalidRequest, StoreError
from bridge.protocols.jsonline import dumps
from bridge.sessions.changes import ChangeNotifier
from bridge.sessions.registry import Registry
from bridge.store.base import Change, ChangesPruned, Store

log = structlog.get_logger("bridge.events")
T = TypeVar("T")

PAGE = 200  # changes read (and sent) at a time
POLL_S = 2.0  # a stream reads the store at least this often, woken or not
SSE_HEARTBEAT_S = 15.0  # an idle SSE stream sends a comment this often (proxies, dead peers)
MAX_CURSOR = 2**53

router = APIRouter(prefix="/v1", dependencies=[Depends(require_auth)])
ws_router = APIRouter()


def parse_cursor(value: str | None) -> int | None:
    """A ``since`` / ``Last-Event-ID`` value: None when absent; InvalidRequest unless a
    non-negative integer."""
    if value is None or value == "":
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 16 or int(value) > MAX_CURSOR:
        raise InvalidRequest("since must be a non-negative integer (a cursor)", code="invalid_cursor")
    return int(value)


def change_frame(change: Change, view: Shown = AS_IS) -> dict[str, Any]:
    if change.thread is None:
        thread: dict[str, Any] = {"id": change.thread_id, "deleted_at": change.deleted_at}
    else:
        thread = thread_view(change.thread, view)
    return {"cursor": change.cursor, "kind": change.kind, "thread": thread}


async def _first_frame(store: Store, since: int | None) -> dict[str, Any]:
    """``ready`` at the cursor the stream continues from, or ``resync`` at the newest."""
    latest = await store.latest_change()
    if since is None:
        return {"cursor": latest, "kind": "ready"}
    if since > latest:
        return {"cursor": latest, "kind": "resync", "reason": "cursor_unknown"}
    if since < await store.change_horizon():
        return {"cursor": latest, "kind": "resync", "reason": "cursor_expired"}
    return {"cursor": since, "kind": "ready"}


def change_owner(change: Change) -> str | None:
    return change.owner if change.thread is None else change.thread.get("owner")


async def change_frames(
    store: Store, notifier: ChangeNotifier, since: int | None, user: User = OPERATOR, view: Shown = AS_IS
) -> AsyncIterator[list[dict[str, Any]]]:
    """The stream's frames, a page at a time; an empty list when a slow poll found nothing
    (a chance for a keep-alive), or when none of a page's changes is ``user``'s to see
    (shown as ``view`` says). Ends when the notifier is closed."""
    first = await _first_frame(store, since)
    cursor = first["cursor"]
    yield [first]
    while notifier.close_reason is None:
        seen = notifier.generation  # before the read: a change committed after it wakes us
        try:
            changes = await store.read_changes(cursor, PAGE)
        except ChangesPruned:
            # Fell behind the horizon while connected (a client that did not read).
            cursor = await store.latest_change()
            yield [{"cursor": cursor, "kind": "resync", "reason": "cursor_expired"}]
            continue
        except StoreError as exc:
            log.warning("events.read_failed", error=exc.message, retry_in_s=POLL_S)
            changes = []
        if changes:
            cursor = changes[-1].cursor
            yield [change_frame(c, view) for c in changes if visible(user, change_owner(c))]
            if len(changes) == PAGE:
                continue
        await notifier.wait(seen, POLL_S)
        if notifier.generation == seen and notifier.close_reason is None:
            yield []


# --------------------------------------------------------------------------- SSE


def _sse(frame: dict[str, Any]) -> str:
    return f"id: {frame['cursor']}\nevent: {frame['kind']}\ndata: {dumps(frame)}\n\n"


@router.get("/events")
async def events(
    request: Request, since: str | None = Query(None, max_length=32, description="a cursor from an earlier frame")
) -> StreamingResponse:
    """``Last-Event-ID`` (an EventSource reconnecting) wins over ``since``."""
    start = parse_cursor(request.headers.get("last-event-id") or since)
    ctx = context(request)
    reg = ctx.registry
    store, notifier = reg.store, reg.changes
    user = current_user(request)
    streams = ctx.streams

    async def body() -> AsyncIterator[str]:
        notifier.attach()
        revoked = asyncio.Event()
        try:
            yield "retry: 2000\n\n"
            last_write = time.monotonic()
            reason: str | None = None
            with streams.held(user, revoked.set):
                view = shown_to(ctx.settings, user)
                try:
                    async for frames in until_set(change_frames(store, notifier, start, user, view), revoked):
                        if frames:
                            yield "".join(_sse(f) for f in frames)
                        elif time.monotonic() - last_write >= SSE_HEARTBEAT_S:
                            yield ": ping\n\n"
                        else:
                            continue
                        last_write = time.monotonic()
                except StoreError as exc:  # the first read failed: the client reconnects later
                    log.info("events.store_unavailable", error=exc.message)
                    reason = "store_unavailable"
            reason = reason or ("user_revoked" if revoked.is_set() else notifier.close_reason)
            yield f"event: close\ndata: {dumps({'reason': reason})}\n\n"
        finally:
            notifier.detach()

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )


# --------------------------------------------------------------------------- WebSocket


async def until_set(frames: AsyncIterator[T], stop: asyncio.Event) -> AsyncIterator[T]:
    """``frames`` until ``stop`` is set (the one waiting for its next item is cancelled).
    However it ends (stopped, exhausted, or this generator closed or cancelled), the read
    in flight is cancelled and awaited before ``frames`` is closed."""
    stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    nxt: asyncio.Future[Any] | None = None
    try:
        while True:
            nxt = asyncio.ensure_future(anext(frames))
            await asyncio.wait({nxt, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():
                return
            done, nxt = nxt, None
            try:
                item = done.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        await _settle(nxt, stopper)
        aclose = getattr(frames, "aclose", None)
        if aclose is not None:
            await aclose()


async def _settle(*futures: asyncio.Future[Any] | None) -> None:
    """Cancel what still runs and wait for it; nothing is left unretrieved."""
    for fut in futures:
        if fut is None:
            continue
        fut.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
            await fut


@ws_router.websocket("/v1/ws")
async def changes_ws(ws: WebSocket) -> None:
    user = await upgrade_user(ws)
    if not isinstance(user, User):
        await ws.send_denial_response(user)  # Host and Origin were checked before routing
        return
    offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",")]
    await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    try:
        since = parse_cursor(ws.query_params.get("since"))
    except InvalidRequest as exc:
        with contextlib.suppress(Exception):
            await ws.close(code=4400, reason=exc.message)
        return
    ctx = context(ws)
    revoked = asyncio.Event()
    with ctx.streams.held(user, revoked.set):
        await _serve_ws(ws, ctx.registry, since, user, revoked)


async def _serve_ws(ws: WebSocket, reg: Registry, since: int | None, user: User, revoked: asyncio.Event) -> None:
    server = context(ws).settings.server
    # A peer that takes no frame for a whole ping round is gone (see ws._Session).
    deadline = server.ws_ping_interval_s + server.ws_ping_timeout_s
    reg.changes.attach()
    sender = asyncio.create_task(_send_changes(ws, reg, since, deadline, user))
    receiver = asyncio.create_task(_drain(ws))
    stopper = asyncio.create_task(revoked.wait())
    try:
        done, _ = await asyncio.wait({sender, receiver, stopper}, return_when=asyncio.FIRST_COMPLETED)
        code = 1001 if sender in done and reg.changes.close_reason == "daemon_shutdown" else 1000
        reason = reg.changes.close_reason or ""
        if sender in done and not sender.cancelled() and isinstance(sender.exception(), StoreError):
            code, reason = STORE_UNAVAILABLE_CLOSE, "store_unavailable"  # the first read failed: not a normal end
        if revoked.is_set():
            code, reason = 4401, "user_revoked"
    finally:
        for t in (sender, receiver, stopper):
            t.cancel()
        for t in (sender, receiver, stopper):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if ws.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(deadline):
                    await ws.close(code=code, reason=reason)
        reg.changes.detach()


async def _send_changes(ws: WebSocket, reg: Registry, since: int | None, deadline: float, user: User) -> None:
    send_texts = ws.scope.get("extensions", {}).get(SEND_TEXTS)
    async for frames in change_frames(reg.store, reg.changes, since, user, shown_to(reg.settings, user)):
        if not frames:
            continue  # the WebSocket's own pings keep it alive
        texts = [dumps(f) for f in frames]
        async with asyncio.timeout(deadline):
            if send_texts is not None:
                await send_texts(texts)  # one socket write per page (ws_transport.py)
            else:
                for text in texts:
                    await ws.send_text(text)


async def _drain(ws: WebSocket) -> None:
    """This socket takes no frames: whatever a client sends is read and dropped, until it
    leaves."""
    with contextlib.suppress(WebSocketDisconnect):
        while (await ws.receive())["type"] != "websocket.disconnect":
            pass


__all__ = ["change_frames", "parse_cursor", "router", "ws_router"]
