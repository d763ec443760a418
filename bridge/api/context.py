"""The daemon's application context: everything its routes share, typed, in one object.

``create_app`` builds one :class:`AppContext` (what is known before the daemon starts: the
settings, the token, the login codes, the throttle, the open streams) and the lifespan
fills in :class:`Running` (what exists only while it runs: the store, the registry, the bus,
the cluster link, the browser sessions, the user directory). A route reaches it with
``context(request)`` (or ``ctx: Ctx`` as a FastAPI parameter), a test or the CLI with
``app.context``; mypy sees every attribute's type, where ``request.app.state.x`` was Any.

Something new that routes share (a cache, a limiter) becomes a field here: of
:class:`AppContext` when ``create_app`` can build it, of :class:`Running` when it needs the
store or the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, FastAPI
from starlette.requests import HTTPConnection

from bridge.api.browser_sessions import Sessions
from bridge.api.login_codes import LoginCodes
from bridge.api.throttle import Refusals
from bridge.api.users import Streams, UserDirectory
from bridge.bus.base import Bus
from bridge.config import Settings
from bridge.push.sender import Pusher
from bridge.sessions.cluster import ClusterLink
from bridge.sessions.native import NativeSessions
from bridge.sessions.registry import Registry
from bridge.store.base import Store


@dataclass(frozen=True, slots=True)
class Running:
    """What the lifespan opens, from the moment the daemon is ready until it stops."""

    store: Store
    registry: Registry
    bus: Bus
    cluster: ClusterLink
    sessions: Sessions
    users: UserDirectory | None  # users mode only
    native_sessions: NativeSessions
    started_at: str  # ISO time, as GET /v1/daemon reports it
    started_monotonic: float  # for uptime, immune to clock steps
    push: Pusher | None = None  # Web Push ([push] enabled)


@dataclass(slots=True)
class AppContext:
    """One per app. The fields are there from ``create_app`` on; the properties below them
    are :class:`Running`'s, and reading one before the lifespan started raises
    :class:`NotStarted` (a route never can: the server serves nothing before)."""

    settings: Settings
    token: str | None  # None: --no-auth, every caller is the operator
    tls: bool  # the daemon terminates TLS itself: cookies get Secure
    login_codes: LoginCodes
    refusals: Refusals
    streams: Streams
    _running: Running | None = field(default=None, init=False, repr=False)

    def start(self, running: Running) -> None:
        self._running = running

    @property
    def running(self) -> Running:
        if self._running is None:
            raise NotStarted("the daemon has not started (its lifespan has not run)")
        return self._running

    @property
    def started(self) -> bool:
        return self._running is not None

    @property
    def store(self) -> Store:
        return self.running.store

    @property
    def registry(self) -> Registry:
        return self.running.registry

    @property
    def bus(self) -> Bus:
        return self.running.bus

    @property
    def cluster(self) -> ClusterLink:
        return self.running.cluster

    @property
    def sessions(self) -> Sessions:
        return self.running.sessions

    @property
    def users(self) -> UserDirectory | None:
        return self.running.users

    @property
    def native_sessions(self) -> NativeSessions:
        return self.running.native_sessions


class NotStarted(RuntimeError):
    """A part of the context that exists only while the daemon runs was read before."""


class BridgeApp(FastAPI):
    """The daemon's FastAPI application, carrying its :class:`AppContext` as ``context``."""

    def __init__(self, context: AppContext, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.context = context


def app_context(app: object) -> AppContext:
    """The context of ``app`` (a :class:`BridgeApp`)."""
    if not isinstance(app, BridgeApp):
        raise TypeError(f"not the daemon's app: {type(app).__name__}")
    return app.context


def context(conn: HTTPConnection) -> AppContext:
    """The context of the app serving ``conn`` (a request or a WebSocket)."""
    return app_context(conn.app)


Ctx = Annotated[AppContext, Depends(context)]
"""A route parameter ``ctx: Ctx`` is the app's context (FastAPI resolves it per call)."""
