"""A thread's own worktree, over REST (docs/api.md §4.27): its changes against its base,
commit, merge into the base in the original repository, discard. Thin: who may see the
thread, whether its agent is between turns, then sessions/worktree_ops.py."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from bridge.api.auth import require_auth
from bridge.api.context import context
from bridge.api.users import check_owner, current_user
from bridge.api.views import shown_message
from bridge.errors import Conflict, error_body
from bridge.sessions import worktree_ops
from bridge.sessions.conversation import Conversation
from bridge.sessions.worktree import MAX_MESSAGE, Worktree, from_json

router = APIRouter(prefix="/v1", dependencies=[Depends(require_auth)])


class CommitIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: str = Field(..., min_length=1, max_length=MAX_MESSAGE)


async def _thread(request: Request, thread_id: str) -> tuple[Conversation, Worktree]:
    """The thread, for a caller who may see it (anyone else: thread_not_found), and its
    worktree (409 ``no_worktree``, ``worktree_discarded``)."""
    conv = await context(request).registry.get(thread_id)
    check_owner(current_user(request), thread_id, conv.thread.get("owner"))
    wt = from_json(conv.thread.get("worktree"))
    if wt is None:
        raise Conflict("this thread has no worktree of its own (create it with worktree: true)", code="no_worktree")
    if wt.discarded:
        raise Conflict("this thread's worktree was discarded", code="worktree_discarded")
    return conv, wt


def _between_turns(conv: Conversation) -> None:
    """What moves the branch or the files waits for the agent to be between turns: its
    tools write the worktree while a turn runs."""
    if conv.busy or conv.thread.get("turn_active"):
        raise Conflict("the agent is in a turn: interrupt it or wait for its end", code="turn_active")


@router.get("/threads/{thread_id}/changes")
async def get_changes(thread_id: str, request: Request) -> dict[str, Any]:
    _, wt = await _thread(request, thread_id)
    return await worktree_ops.changes(wt)


@router.post("/threads/{thread_id}/changes/commit")
async def commit(thread_id: str, body: CommitIn, request: Request) -> dict[str, Any]:
    conv, wt = await _thread(request, thread_id)
    _between_turns(conv)
    async with worktree_ops.locked(wt):
        return await worktree_ops.commit(wt, body.message, thread_id)


@router.post("/threads/{thread_id}/changes/merge", response_model=None)
async def merge(thread_id: str, request: Request) -> dict[str, Any] | JSONResponse:
    conv, wt = await _thread(request, thread_id)
    _between_turns(conv)
    try:
        async with worktree_ops.locked(wt):
            return await worktree_ops.merge(wt, thread_id)
    except worktree_ops.MergeConflict as exc:  # the error body, and the files in it
        body = error_body(exc.code, shown_message(request, exc.message))
        return JSONResponse({"error": {**body["error"], "files": exc.files}}, status_code=exc.status)


@router.post("/threads/{thread_id}/changes/discard")
async def discard(thread_id: str, request: Request) -> dict[str, Any]:
    """The worktree and its branch removed; the agent, stopped first, cannot start again
    (its directory is gone); the thread and its transcript stay."""
    conv, wt = await _thread(request, thread_id)
    _between_turns(conv)
    await conv.stop("worktree_discarded")
    async with worktree_ops.locked(wt):
        await worktree_ops.remove(wt, keep_branch=False)
        await conv.set_fields({"worktree": {**wt.to_json(), "discarded": True}})
    return {"discarded": True, "branch": wt.branch}


__all__ = ["router"]
