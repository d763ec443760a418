"""The unauthenticated probes: ``/healthz`` (the process answers), ``/readyz`` (it can serve:
the store answers) and ``/metrics`` (Prometheus text), docs/api.md §4.2. Outside ``/v1``:
a load balancer or a scraper holds no token."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from bridge.api.context import context
from bridge.bus.base import Bus
from bridge.errors import BridgeError
from bridge.sessions.cluster import ClusterLink
from bridge.sessions.registry import Registry

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    # The store is the truth: without it nothing is served (503). The bus only wakes:
    # without it every replica still serves (streams poll the store), so it is reported,
    # and /metrics has it, but readiness does not fail on it.
    ctx = context(request)
    bus = "none" if ctx.settings.cluster.bus_url is None else "ok"
    if bus == "ok" and not ctx.bus.healthy:
        bus = "down"
    try:
        await ctx.store.ping()
    except BridgeError as exc:
        body = {"status": "unavailable", "error": exc.message, "store": "down", "bus": bus}
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ok", "store": "ok", "bus": bus})


@router.get("/metrics")
async def metrics(request: Request) -> PlainTextResponse:
    ctx = context(request)
    reg, store = ctx.registry, ctx.store
    live = reg.live_count()
    body = (
        "# HELP agent_bridge_live_agents Agent processes running now.\n"
        "# TYPE agent_bridge_live_agents gauge\n"
        f"agent_bridge_live_agents {live}\n"
        "# HELP agent_bridge_loaded_threads Threads loaded in memory.\n"
        "# TYPE agent_bridge_loaded_threads gauge\n"
        f"agent_bridge_loaded_threads {reg.loaded_count()}\n"
        "# HELP agent_bridge_subscribers Live WebSocket and SSE subscribers.\n"
        "# TYPE agent_bridge_subscribers gauge\n"
        f"agent_bridge_subscribers {reg.subscriber_count()}\n"
        "# HELP agent_bridge_store_healthy 1 while the transcript store accepts writes.\n"
        "# TYPE agent_bridge_store_healthy gauge\n"
        f"agent_bridge_store_healthy {int(store.healthy)}\n"
        "# HELP agent_bridge_store_batches_total Group commits of transcript events.\n"
        "# TYPE agent_bridge_store_batches_total counter\n"
        f"agent_bridge_store_batches_total {store.batches}\n"
        "# HELP agent_bridge_events_total Transcript events committed.\n"
        "# TYPE agent_bridge_events_total counter\n"
        f"agent_bridge_events_total {store.appended}\n"
    )
    body += lease_metrics(reg) + bus_metrics(ctx.bus, ctx.cluster) + reg.memory.exposition()
    body += await cap_metrics(reg)
    if ctx.running.push is not None:
        body += ctx.running.push.exposition()
    return PlainTextResponse(body, media_type="text/plain; version=0.0.4")


async def cap_metrics(reg: Registry) -> str:
    """[capacity] caps (sessions/caps.py): the threads in the store against max_threads (the
    count left out while the store cannot be read), creations refused, agents stopped."""
    caps = reg.caps
    try:
        held = await reg.store.count_threads()
    except BridgeError:
        threads = ""
    else:
        threads = (
            "# HELP agent_bridge_threads Threads in the store (every replica's).\n"
            "# TYPE agent_bridge_threads gauge\n"
            f"agent_bridge_threads {held}\n"
        )
    return threads + (
        "# HELP agent_bridge_max_threads The cap on threads in the store ([capacity] max_threads).\n"
        "# TYPE agent_bridge_max_threads gauge\n"
        f"agent_bridge_max_threads {caps.capacity.max_threads}\n"
        "# HELP agent_bridge_thread_limit_refusals_total Thread creations refused at a cap (thread_limit).\n"
        "# TYPE agent_bridge_thread_limit_refusals_total counter\n"
        f"agent_bridge_thread_limit_refusals_total {caps.refused}\n"
        "# HELP agent_bridge_transcript_full_stops_total Agents stopped because their thread's transcript "
        "reached max_transcript_mb.\n"
        "# TYPE agent_bridge_transcript_full_stops_total counter\n"
        f"agent_bridge_transcript_full_stops_total {caps.transcripts_full}\n"
    )


_BUS_METRICS = {
    "bus_healthy": ("gauge", "1 while the bus between replicas is connected"),
    "bus_lag_ms": ("gauge", "From another replica's announcement to its arrival here, the last one (same-host clocks)"),
    "bus_received": ("counter", "Announcements received from other replicas"),
    "bus_dropped": ("counter", "Announcements and commands dropped (bus down, or expired)"),
    "bus_malformed": ("counter", "Messages from the bus that were not well-formed"),
    "bus_reconnects": ("counter", "Reconnections to the bus"),
    "bus_stalls": ("counter", "Bus subscriptions dropped because Redis stopped answering (a frozen server or path)"),
    "forwarded": ("counter", "Client inputs this replica sent to the replica that runs the thread"),
    "followed_events": ("counter", "Events another replica committed, read from the store for clients here"),
}


def lease_metrics(reg: Registry) -> str:
    """Leases held by this replica (0 with no shared store) and the store's commit latency."""
    leases = reg.ownership
    held = 0 if leases is None else leases.count()
    lost = 0 if leases is None else leases.lost_total
    return (
        "# HELP agent_bridge_leases_held Thread leases this replica holds now.\n"
        "# TYPE agent_bridge_leases_held gauge\n"
        f"agent_bridge_leases_held {held}\n"
        "# HELP agent_bridge_leases_lost_total Leases this replica lost (not renewed in time, or refused).\n"
        "# TYPE agent_bridge_leases_lost_total counter\n"
        f"agent_bridge_leases_lost_total {lost}\n"
        + reg.commits.exposition(
            "agent_bridge_store_commit_seconds",
            "From a transcript append to its durable commit (group commit included).",
        )
    )


def bus_metrics(bus: Bus, link: ClusterLink) -> str:
    """The bus's gauges and counters, and what crossed it (none with no bus configured)."""
    out = []
    for key, value in {**bus.stats(), **link.stats()}.items():
        kind, text = _BUS_METRICS.get(key, ("gauge", key))
        name = f"agent_bridge_{key}" + ("_total" if kind == "counter" else "")
        out.append(f"# HELP {name} {text}.\n# TYPE {name} {kind}\n{name} {value:g}\n")
    return "".join(out)
