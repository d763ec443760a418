"""``GET /v1/daemon`` (docs/api.md §4.14): what a local shell asks the daemon about itself
(``agent-bridge status``). Authenticated like every ``/v1`` route: the pid and data dir
are nobody else's business."""

from __future__ import annotations

import os
import time
from typing import Any

from fastapi import APIRouter, Depends, Request

from bridge import __version__
from bridge.api.auth import require_admin, require_auth
from bridge.api.context import context
from bridge.api.users import current_user, me_view

router = APIRouter(prefix="/v1", dependencies=[Depends(require_auth)])


@router.get("/me")
async def me(request: Request) -> dict[str, Any]:
    """Who the caller is (docs/api.md §4.18): ``{"name", "admin", "mode"}``."""
    return me_view(current_user(request), context(request).settings.auth.mode)


@router.get("/daemon")
async def daemon_info(request: Request) -> dict[str, Any]:
    require_admin(request)
    ctx = context(request)
    reg = ctx.registry
    return {
        "pid": os.getpid(),
        "version": __version__,
        "started_at": ctx.running.started_at,
        "uptime_s": round(time.monotonic() - ctx.running.started_monotonic, 3),
        "data_dir": str(ctx.settings.data_dir),
        "live_agents": reg.live_count(),
        "loaded_threads": reg.loaded_count(),
        "subscribers": reg.subscriber_count(),
        # The confinement in force for agents (docs/security.md "Confinement").
        "sandbox": (box := ctx.settings.confinement()).mechanism,
        "sandbox_detail": box.describe(),
    }
