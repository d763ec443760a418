"""create_app(settings): the lifespan owns the store and the registry; RequestGuard (Host,
Origin, CORS) wraps everything, and every ``/v1`` route needs credentials (auth.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bridge import __version__, user_secrets
from bridge.api import health, signin
from bridge.api.auth import WWW_AUTHENTICATE
from bridge.api.browser_sessions import Sessions
from bridge.api.context import AppContext, BridgeApp, Running
from bridge.api.guard import JsonBodies, PageHeaders, RequestGuard
from bridge.api.limits import BodyLimit
from bridge.api.login_codes import LoginCodes
from bridge.api.schema import plain_error
from bridge.api.throttle import Refusals
from bridge.api.tokens import resolve_token
from bridge.api.users import Streams, UserDirectory, watch_revocations
from bridge.api.views import shown_message
from bridge.bus.factory import make_bus
from bridge.clock import now_iso
from bridge.config import Settings
from bridge.errors import BridgeError, ConfigError, Unauthorized, error_body
from bridge.network import is_loopback_host
from bridge.push.sender import Pusher
from bridge.sessions.cluster import ClusterLink
from bridge.sessions.native import NativeSessions
from bridge.sessions.registry import Registry
from bridge.store.factory import open_store
from bridge.store.urls import redact

log = structlog.get_logger("bridge.api")


def create_app(
    settings: Settings,
    *,
    on_ready: Callable[[], None] | None = None,
    bound_port: int | None = None,
    unix_socket: bool = False,
) -> BridgeApp:
    """``bound_port``: the port actually listened on (``--port 0`` is only resolved once
    the socket is bound); the Host check needs it. Defaults to ``settings.port``.
    ``unix_socket``: the daemon listens on a Unix socket only (``--uds``, §3.3)."""
    from bridge.api import (
        acp_gateway,
        changes,
        cluster,
        daemon,
        elicitations,
        events,
        export,
        fork,
        me_secrets,
        push,
        search,
        threads,
        usage,
        web,
        workspace,
        ws,
    )

    if settings.no_auth and not unix_socket and not is_loopback_host(settings.host):
        raise ConfigError("--no-auth is refused unless the bind address is loopback or a Unix socket")
    if settings.no_auth and settings.auth.mode == "users":
        raise ConfigError('--no-auth cannot be used with [auth] mode = "users"')
    token = resolve_token(settings)
    server = settings.server
    tls = bool(server.tls_cert and server.tls_key)

    ctx = AppContext(
        settings=settings,
        token=token,
        tls=tls,
        login_codes=LoginCodes(server.login_code_ttl_s),
        refusals=Refusals(trusted_proxies=settings.auth.proxy_trusted),
        streams=Streams(),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await open_store(
            settings.store_url, replica_id=settings.cluster.replica_id, writer=settings.store.writer
        )
        try:
            await store.register_replica(uuid.uuid4().hex, None)  # refused if the id is taken
        except BaseException:
            await store.close()
            raise
        sessions = Sessions(server.session_ttl_s, server.max_sessions, secret=token, store=store, shared=store.shared)
        await sessions.load()
        users, watcher = None, None
        if settings.auth.mode == "users":
            users = UserDirectory(store, settings.auth)
            watcher = asyncio.create_task(watch_revocations(store, ctx.streams, sessions.drop_user), name="revocations")
        registry = Registry(settings, store)
        pusher = Pusher(store, settings.push, settings.data_dir) if settings.push.enabled else None
        if pusher is not None:
            registry.on_records = pusher.committed
        await registry.start()
        bus = make_bus(settings.cluster.bus_url, settings.cluster.replica_id, {"version": __version__})
        link = ClusterLink(
            store,
            bus,
            registry,
            heartbeat_s=settings.cluster.lease_ttl_s / 3,
            lease_ttl_s=settings.cluster.lease_ttl_s,
            shared=settings.cluster.bus_url is not None,
        )
        await link.start()
        ctx.start(
            Running(
                store=store,
                registry=registry,
                bus=bus,
                cluster=link,
                sessions=sessions,
                users=users,
                native_sessions=NativeSessions(settings),
                started_at=now_iso(),
                started_monotonic=time.monotonic(),
                push=pusher,
            )
        )
        log.info(
            "daemon.started",
            data_dir=str(settings.data_dir),
            agents=list(settings.agents),
            store=redact(settings.store_url),
            replica_id=settings.cluster.replica_id,
            bus=None if settings.cluster.bus_url is None else redact(settings.cluster.bus_url),
        )
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            log.info("daemon.stopping")
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            await registry.shutdown()
            if pusher is not None:
                await pusher.close()
            await link.close()
            await store.close()
            log.info("daemon.stopped")

    app = BridgeApp(ctx, title="agent-bridge", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    user_secrets.keyring(settings.data_dir)  # a malformed AGENT_BRIDGE_SECRETS_KEY stops the start here
    app.add_middleware(JsonBodies)  # inside the guard: a foreign Origin is refused first
    app.add_middleware(BodyLimit)
    app.add_middleware(
        RequestGuard,
        bind_host=settings.host,
        port=settings.port if bound_port is None else bound_port,
        allowed_hosts=server.allowed_hosts,
        allowed_origins=server.allowed_origins,
        tls=tls,
        trust_proxy_headers=server.trust_proxy_headers,
        unix_socket=unix_socket,
    )
    app.add_middleware(PageHeaders)  # outermost: refusals carry the headers too

    @app.exception_handler(BridgeError)
    async def bridge_error(request: Request, exc: BridgeError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
        if isinstance(exc, Unauthorized):
            headers = {"WWW-Authenticate": WWW_AUTHENTICATE}
        message = shown_message(request, exc.message)  # never the data dir's path to a non-admin
        return JSONResponse(error_body(exc.code, message), status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Framework-level refusals (unparsable body, unknown route, wrong method) in the
        # same machine-readable shape as ours.
        code = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(
            exc.status_code, "http_error"
        )
        return JSONResponse(
            error_body(code, str(exc.detail)), status_code=exc.status_code, headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        return JSONResponse(error_body("invalid_request", plain_error(first, skip=("body",))), status_code=400)

    app.include_router(health.router)
    app.include_router(signin.router)
    app.include_router(daemon.router)
    app.include_router(me_secrets.router)
    app.include_router(push.router)
    app.include_router(cluster.router)
    app.include_router(threads.router)
    app.include_router(changes.router)
    app.include_router(fork.router)
    app.include_router(search.router)
    app.include_router(usage.router)
    app.include_router(export.router)
    app.include_router(elicitations.router)
    app.include_router(ws.router)
    app.include_router(acp_gateway.router)
    app.include_router(events.router)
    app.include_router(events.ws_router)
    app.include_router(workspace.router)
    app.include_router(web.make_router())
    return app
