"""``GET /v1/cluster`` (docs/api.md §4.15): the replicas sharing this store, each with its
last heartbeat (on the store's clock), the live leases it holds and whether the bus sees it
alive; and this replica's view of the bus."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from bridge.api.auth import require_admin, require_auth
from bridge.api.context import context
from bridge.bus.base import BusUnavailable

router = APIRouter(prefix="/v1", dependencies=[Depends(require_auth)])


@router.get("/cluster")
async def cluster(request: Request) -> dict[str, Any]:
    require_admin(request)
    ctx = context(request)
    store, bus = ctx.store, ctx.bus
    configured = ctx.settings.cluster.bus_url is not None
    on_bus: dict[str, Any] | None = None
    if configured:
        try:
            on_bus = await bus.live_replicas()
        except BusUnavailable:
            on_bus = None
    replicas = [
        {
            "replica_id": r.replica_id,
            "url": r.url,
            "started_at": r.started_at,
            "heartbeat_age_s": round(r.heartbeat_age_s, 3),
            "threads": r.threads,
            "on_bus": None if on_bus is None else r.replica_id in on_bus,
        }
        for r in await store.list_replicas()
    ]
    return {
        "replica_id": bus.replica_id,
        "replicas": replicas,
        "bus": {"configured": configured, "healthy": bus.healthy if configured else None},
    }
