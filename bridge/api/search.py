"""Full-text search over the caller's threads (docs/api.md §4.22): ``GET /v1/search``.

The store answers (bridge/store/search_text.py says what is indexed and the query's
syntax); this is who may see what: in users mode a user's own threads only, an admin's
every thread (as ``GET /v1/threads`` lists them); in token mode every thread. Archived
threads are searched too: archiving tidies the list, it does not hide what was said.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from bridge.api.auth import require_auth
from bridge.api.context import context
from bridge.api.users import current_user

MAX_LIMIT = 100

router = APIRouter(prefix="/v1", dependencies=[Depends(require_auth)])


@router.get("/search")
async def search(
    request: Request,
    q: str = Query(...),
    limit: int = Query(20, ge=1, le=MAX_LIMIT),
    cursor: str | None = Query(None, max_length=512),
) -> dict[str, Any]:
    """The newest matching events first: ``{"hits": [...], "next_cursor"}``. A query that
    is too long or has no word to look for is 400 ``invalid_query``; a cursor this did not
    give, 400 ``invalid_cursor``."""
    user = current_user(request)
    store = context(request).registry.store
    hits, next_cursor = await store.search(q, owner=None if user.admin else user.name, limit=limit, cursor=cursor)
    return {"hits": hits, "next_cursor": next_cursor}
