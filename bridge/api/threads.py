"""REST (docs/api.md §4). Thin handlers: parse, call the registry/conversation, shape JSON."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Literal, TypeVar

import structlog
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from bridge.api.auth import require_auth
from bridge.api.context import context
from bridge.api.schema import ConfigIn, ModeIn, PermissionIn, PromptIn
from bridge.api.users import User, check_owner, current_user
from bridge.api.views import Shown, shown_to, thread_view
from bridge.errors import InvalidRequest, StoreError
from bridge.protocols import trace
from bridge.protocols.events import Record
from bridge.protocols.jsonline import dumps
from bridge.sessions.commands import Command, Interrupt, SetModel
from bridge.sessions.conversation import Conversation
from bridge.sessions.fanout import deliver
from bridge.sessions.registry import Registry

MAX_PAGE = 1000
MAX_WAIT_S = 60.0
MAX_SEQ = 2**53  # seqs are SQLite integers; anything larger is not a seq
MAX_HISTORY = 1000  # history items per page, and the page without a limit (docs/api.md §4.16)
HISTORY_CHUNK = 100  # a history page's items encoded at a time
A = TypeVar("A")  # a command's answer


log = structlog.get_logger("bridge.threads")
router = APIRouter(prefix="/v1", dependencies=[Depends(require_auth)])


def registry(request: Request) -> Registry:
    return context(request).registry


class CreateThread(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent: str | None = Field(None, max_length=128)
    cwd: str | None = Field(None, max_length=4096)
    model: str | None = Field(None, max_length=256)
    title: str | None = Field(None, max_length=512)
    options: dict[str, Any] | None = None
    # An agent session started elsewhere, adopted: the first prompt resumes it.
    native_session_id: str | None = Field(None, max_length=1024)
    # Its own git worktree of the repository holding cwd, from base (docs/api.md §4.27).
    worktree: bool = False
    base: str | None = Field(None, max_length=256)


class PatchThread(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str | None = Field(None, max_length=512)
    archived: bool | None = None  # docs/api.md §4.24
    # The next turn's model, the conversation kept (sessions/model_port.py).
    model: str | None = Field(None, min_length=1, max_length=256)


async def _conv(request: Request, thread_id: str) -> Conversation:
    """The thread, for a caller who may see it (anyone else: thread_not_found)."""
    conv = await registry(request).get(thread_id)
    check_owner(current_user(request), thread_id, conv.thread.get("owner"))
    return conv


def _shown(request: Request) -> Shown:
    """How the caller is shown the daemon's paths (users mode: never the data dir's to a
    non-admin, bridge/userdirs.py)."""
    return shown_to(context(request).settings, current_user(request))


def _view(request: Request, conv: Conversation) -> dict[str, Any]:
    return thread_view(conv.thread, _shown(request))


def _actor(request: Request) -> str:
    """Who sends this request's command, recorded as ``by`` in its client events: the
    caller's name (a user's, or "operator" for the daemon's own token, in token mode as in
    users mode)."""
    return current_user(request).name


async def _run(request: Request, conv: Conversation, command: Command[A]) -> A:
    """A client's command, run where the thread runs (this replica, or the one holding its
    lease)."""
    return await registry(request).port(conv).run(command)


@router.get("/agents")
async def list_agents(request: Request) -> list[dict[str, Any]]:
    settings = context(request).settings
    shown = _shown(request)
    default = settings.default_profile()
    return [
        {
            "name": name,
            "protocol": p.protocol,
            "model": p.model,
            "available": (problem := settings.profile_problem(name)) is None,
            "problem": shown.text(problem) if problem else None,
            "default": name == default,
            "sandbox": settings.confinement().for_profile(p.sandbox).mechanism,
        }
        for name, p in settings.agents.items()
    ]


@router.get("/agents/{name}/models")
async def list_models(name: str, request: Request) -> dict[str, Any]:
    """The models a profile's threads may run (docs/api.md §4.4): 404 for an unknown one."""
    user = current_user(request)
    return await registry(request).models(name, owner=None if user.admin else user.name)


@router.post("/threads", status_code=201)
async def create_thread(body: CreateThread, request: Request) -> dict[str, Any]:
    # An adopted native session is looked for in the HOME the thread's agents get: in users
    # mode the user's own (bridge/userdirs.py), so nobody adopts another user's session.
    user = current_user(request)
    conv = await registry(request).create(
        agent=body.agent,
        cwd=body.cwd,
        model=body.model,
        title=body.title,
        options=body.options,
        native_session_id=body.native_session_id,
        owner=user.owner,
        admin=user.admin,
        worktree=body.worktree,
        base=body.base,
    )
    return _view(request, conv)


@router.get("/agents/{name}/sessions")
async def list_native_sessions(
    name: str,
    request: Request,
    cwd: str = Query(..., min_length=1, max_length=4096),
    limit: int = Query(50, ge=1, le=200),
    cursor: str | None = Query(None, max_length=1024),
) -> dict[str, Any]:
    """The sessions the agent itself keeps for ``cwd`` (docs/api.md §4.13), in the HOME the
    caller's agents get (users mode: their own). ``cwd`` must be one the caller may start a
    thread in: an ACP agent is started there to list."""
    user = current_user(request)
    reg = registry(request)
    profile = reg.profile(name)
    real = await reg.allowed_cwd(cwd, owner=user.owner, admin=user.admin)
    out = await context(request).native_sessions.list(profile, real, limit, cursor, owner=user.owner)
    shown = _shown(request)
    return {**out, "cwd": shown.path(out["cwd"]), "detail": shown.text(out["detail"]) if out["detail"] else None}


@router.get("/threads")
async def list_threads(
    request: Request,
    limit: int = Query(50, ge=1, le=200),
    cursor: str | None = Query(None, max_length=512),
    agent: str | None = Query(None, max_length=128),
    archived: Literal["0", "1", "all"] = Query("0"),
) -> dict[str, Any]:
    reg = registry(request)
    user = current_user(request)
    owner = None if user.admin else user.name
    which = {"0": False, "1": True, "all": None}[archived]  # docs/api.md §4.24
    rows, next_cursor = await reg.list_threads(limit=limit, cursor=cursor, agent=agent, owner=owner, archived=which)
    shown = _shown(request)
    return {"threads": [thread_view(r, shown) for r in rows], "next_cursor": next_cursor}


@router.get("/threads/{thread_id}")
async def get_thread(thread_id: str, request: Request) -> dict[str, Any]:
    return _view(request, await _conv(request, thread_id))


@router.patch("/threads/{thread_id}")
async def patch_thread(thread_id: str, body: PatchThread, request: Request) -> dict[str, Any]:
    fields = body.model_dump(exclude_none=True)
    if not fields:
        raise InvalidRequest("give title, archived, model or more of them", code="invalid_request")
    conv = await _conv(request, thread_id)
    if (model := fields.pop("model", None)) is not None:  # first: a refused model changes nothing
        await _run(request, conv, SetModel(model=model, actor=_actor(request)))
    if fields:
        await conv.set_fields(fields)
    if model is not None and conv.thread.get("model") != model:
        # Switched by the replica that runs the thread: its row says so, this copy not yet.
        row = await conv.store.get_thread(thread_id)
        if row is not None:
            return thread_view(row, _shown(request))
    return _view(request, conv)


@router.delete("/threads/{thread_id}", status_code=204)
async def delete_thread(thread_id: str, request: Request) -> Response:
    await delete_thread_of(registry(request), current_user(request), thread_id)
    return Response(status_code=204)


async def delete_thread_of(reg: Registry, user: User, thread_id: str) -> None:
    """Delete a thread ``user`` may see (users mode: their own, an admin's any; another's
    is thread_not_found): ``DELETE /v1/threads/{id}`` and ACP's ``session/delete``."""
    conv = await reg.get(thread_id)
    check_owner(user, thread_id, conv.thread.get("owner"))
    await reg.delete(thread_id)


@router.post("/threads/{thread_id}/messages", status_code=202)
async def post_message(thread_id: str, body: PromptIn, request: Request, response: Response) -> dict[str, Any]:
    conv = await _conv(request, thread_id)
    # W3C trace context headers: carried to the agent and into the logs when well-formed.
    traced = trace.from_headers(request.headers.getlist("traceparent"), request.headers.getlist("tracestate"))
    command = body.command(_actor(request), traced)
    acc = await _run(request, conv, command)
    if acc.duplicate:
        response.status_code = 200
    return command.answer_to_wire(acc)


@router.post("/threads/{thread_id}/interrupt", status_code=202)
async def interrupt(thread_id: str, request: Request) -> dict[str, Any]:
    conv = await _conv(request, thread_id)
    return {"interrupted": await _run(request, conv, Interrupt(actor=_actor(request)))}


@router.post("/threads/{thread_id}/mode")
async def set_mode(thread_id: str, body: ModeIn, request: Request) -> dict[str, Any]:
    """The agent's session mode (ACP ``session/set_mode``, docs/api.md §4.19)."""
    conv = await _conv(request, thread_id)
    return await _run(request, conv, body.command(_actor(request)))


@router.post("/threads/{thread_id}/config")
async def set_config_option(thread_id: str, body: ConfigIn, request: Request) -> dict[str, Any]:
    """One of the agent's session config options (ACP ``session/set_config_option``, docs/api.md §4.21)."""
    conv = await _conv(request, thread_id)
    return await _run(request, conv, body.command(_actor(request)))


@router.post("/threads/{thread_id}/resume", status_code=202)
async def resume(thread_id: str, request: Request) -> dict[str, Any]:
    conv = await _conv(request, thread_id)
    await conv.ensure_started()
    return _view(request, conv)


@router.post("/threads/{thread_id}/stop", status_code=202)
async def stop(thread_id: str, request: Request) -> dict[str, Any]:
    conv = await _conv(request, thread_id)
    await conv.stop("stopped")
    return _view(request, conv)


@router.get("/threads/{thread_id}/permissions")
async def list_permissions(thread_id: str, request: Request) -> dict[str, Any]:
    conv = await _conv(request, thread_id)
    return {"permissions": await conv.waiting_permissions()}


@router.post("/threads/{thread_id}/permissions/{request_id}")
async def answer_permission(thread_id: str, request_id: str, body: PermissionIn, request: Request) -> dict[str, Any]:
    conv = await _conv(request, thread_id)
    return await _run(request, conv, body.command(request_id, _actor(request), channel="rest"))


@router.get("/threads/{thread_id}/tasks")
async def list_tasks(thread_id: str, request: Request) -> dict[str, Any]:
    conv = await _conv(request, thread_id)
    return {"tasks": conv.tasks.snapshot()}


@router.get("/threads/{thread_id}/history")
async def history(
    thread_id: str,
    request: Request,
    limit: int = Query(MAX_HISTORY, ge=1, le=MAX_HISTORY),
    before: int | None = Query(None, ge=1, le=MAX_SEQ),
) -> Response:
    """The compacted history (docs/api.md §4.16): messages merged, tools joined; a page of
    it from its end, ``before`` a seq toward older items."""
    conv = await _conv(request, thread_id)
    page = await conv.journal.history_page(before, limit)
    tail = dumps({"last_seq": page.last_seq, "more": page.more, "before": page.before})
    if len(page.items) <= HISTORY_CHUNK:
        body = f'{{"items":{dumps(page.items)},{tail[1:]}'
        return Response(body, media_type="application/json")
    return StreamingResponse(_history_body(page.items, tail), media_type="application/json")


async def _history_body(items: list[dict[str, Any]], tail: str) -> AsyncIterator[bytes]:
    """A large page encoded a chunk of items at a time, the event loop free between them."""
    yield b'{"items":['
    for i in range(0, len(items), HISTORY_CHUNK):
        chunk = ",".join(map(dumps, items[i : i + HISTORY_CHUNK]))
        yield (chunk if i == 0 else "," + chunk).encode()
        await asyncio.sleep(0)
    yield f"],{tail[1:]}".encode()


@router.get("/threads/{thread_id}/events")
async def events(
    thread_id: str,
    request: Request,
    after: int = Query(0, ge=0, le=MAX_SEQ),
    limit: int = Query(200, ge=1, le=MAX_PAGE),
    wait: float = Query(0, ge=0, le=MAX_WAIT_S, allow_inf_nan=False),
    until: Literal["event", "turn_end"] = Query("event"),
) -> Response:
    conv = await _conv(request, thread_id)
    if until == "turn_end" and wait > 0:
        # The long-poll that waits for the reply itself (README "Talk to it").
        await conv.wait_turns_over(wait)
    page = await conv.journal.read_page(after, limit)
    if not page and wait > 0 and until == "event":
        await conv.wait_beyond(after, wait)
        page = await conv.journal.read_page(after, limit)
    # The page may already hold events whose commit has not reached the in-memory counter.
    last_seq = max(conv.thread["last_seq"], page[-1].seq if page else 0)
    # Our own JSON writer: agent text may hold lone surrogates, which plain UTF-8 cannot carry.
    return Response(dumps({"events": [r.to_dict() for r in page], "last_seq": last_seq}), media_type="application/json")


SSE_HEARTBEAT_S = 15.0


@router.get("/threads/{thread_id}/events/stream")
async def events_stream(thread_id: str, request: Request, after: int = Query(0, ge=0, le=MAX_SEQ)) -> StreamingResponse:
    """Server-Sent Events: the same envelopes, order and seq as the WebSocket, for networks
    that break WebSockets. ``id:`` is the seq, so a reconnecting EventSource resumes
    from ``Last-Event-ID`` (which wins over ``after``)."""
    last_id = request.headers.get("last-event-id")
    if last_id:
        after = validate_after(last_id)
    conv = await _conv(request, thread_id)
    user = current_user(request)
    sub = conv.subscribe()
    queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=64)

    async def pump() -> None:
        try:
            try:
                reason = await deliver(sub, after, conv.journal, _SseSink(queue))
            except StoreError as exc:  # the replay could not read the store: the client reconnects later
                log.info("sse.store_unavailable", thread_id=thread_id, error=exc.message)
                reason = "store_unavailable"
            await queue.put(f"event: close\ndata: {dumps({'reason': reason})}\n\n")
        finally:
            await queue.put(None)

    async def body() -> AsyncIterator[str]:
        task = asyncio.create_task(pump())
        streams = context(request).streams
        try:
            with streams.held(user, lambda: sub.close("user_revoked")):
                async for item in _sse_items(queue):
                    yield item
        finally:
            conv.unsubscribe(sub)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )


async def _sse_items(queue: asyncio.Queue[str | None]) -> AsyncIterator[str]:
    """What the pump queued, with a keep-alive comment whenever it is quiet; ends at None."""
    yield "retry: 2000\n\n"
    while True:
        try:
            item = await asyncio.wait_for(queue.get(), SSE_HEARTBEAT_S)
        except TimeoutError:
            yield ": ping\n\n"  # keeps proxies from timing the stream out
            continue
        if item is None:
            return
        yield item


class _SseSink:
    """fanout.Sink for an SSE stream: notices as plain ``data:`` events, records with their
    seq as the event ``id`` (what ``Last-Event-ID`` resumes from)."""

    replay_frames = False

    def __init__(self, queue: asyncio.Queue[str | None]) -> None:
        self._queue = queue

    async def send(self, texts: list[str], records: list[Record]) -> None:
        for text in texts:
            await self._queue.put(f"data: {text}\n\n")
        for rec in records:
            await self._queue.put(f"id: {rec.seq}\ndata: {rec.envelope()}\n\n")

    async def send_frames(self, frames: list[bytes]) -> None:
        raise AssertionError("replay_frames is False")


def validate_after(value: str | None) -> int:
    if value is None or value == "":
        return 0
    if not (value.isascii() and value.isdigit()) or len(value) > 15:
        raise InvalidRequest("after must be a non-negative integer", code="invalid_cursor")
    return int(value)


__all__ = ["delete_thread_of", "router", "validate_after"]
