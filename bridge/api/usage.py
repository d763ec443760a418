"""What turns used (docs/api.md §4.25): ``GET /v1/usage``, the turns ended in a time window
summed per thread, agent, user or day.

The store answers from what it recorded as each ``turn.ended`` committed
(bridge/store/usage.py); this is who may see what: in users mode a user's own threads
only, an admin's every thread (as ``GET /v1/threads`` lists them); in token mode every
thread. Deleted threads are gone from it with their transcripts.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from bridge.api.auth import require_auth
from bridge.api.context import context
from bridge.api.users import current_user
from bridge.errors import InvalidRequest
from bridge.store import usage

router = APIRouter(prefix="/v1", dependencies=[Depends(require_auth)])


@router.get("/usage")
async def get_usage(
    request: Request,
    group_by: Literal["thread", "agent", "user", "day"] = Query("thread"),
    since: str | None = Query(None, max_length=64),
    until: str | None = Query(None, max_length=64),
    limit: int = Query(100, ge=1, le=usage.MAX_GROUPS),
) -> dict[str, Any]:
    """``{group_by, since, until, groups: [{key, usage}], truncated, total}``. A time that
    is not ISO 8601, or a window that ends before it starts, is 400 ``invalid_request``."""
    start, end = usage.since_ts(since, "since"), usage.since_ts(until, "until")
    if start is not None and end is not None and end < start:
        raise InvalidRequest("until is before since", code="invalid_request")
    user = current_user(request)
    store = context(request).registry.store
    owner = None if user.admin else user.name
    found = await store.usage_report(group_by=group_by, owner=owner, since=start, until=end, limit=limit)
    return {**found, "since": start, "until": end}
