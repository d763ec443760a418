"""``POST /v1/threads/{id}/fork`` (docs/api.md §4.26): a thread the caller may see, forked
into a new thread of theirs. Thin: the fork point is a command run where the source runs
(sessions/fork.py), the new thread is made by the registry."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from bridge.api.auth import require_auth
from bridge.api.context import context
from bridge.api.users import check_owner, current_user
from bridge.api.views import shown_to, thread_view
from bridge.sessions.commands import BOUNDS, ForkPoint

router = APIRouter(prefix="/v1", dependencies=[Depends(require_auth)])


class ForkIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # StrictInt: "3", 3.0 or true is no seq (400, not coerced).
    after_seq: StrictInt | None = Field(None, ge=0, le=BOUNDS.seq)
    title: str | None = Field(None, max_length=512)


@router.post("/threads/{thread_id}/fork", status_code=201)
async def fork_thread(thread_id: str, body: ForkIn, request: Request) -> dict[str, Any]:
    """The new thread: the source's agent, cwd, model and options, its transcript up to
    the fork point, ``forked_from`` naming both; the caller owns it (users mode)."""
    reg = context(request).registry
    user = current_user(request)
    source = await reg.get(thread_id)
    check_owner(user, thread_id, source.thread.get("owner"))  # another's thread: thread_not_found
    point = await reg.port(source).run(ForkPoint(after_seq=body.after_seq, actor=user.name))
    conv = await reg.fork(source, point, title=body.title, owner=user.owner, admin=user.admin)
    return thread_view(conv.thread, shown_to(context(request).settings, user))


__all__ = ["router"]
