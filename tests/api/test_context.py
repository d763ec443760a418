"""The application context (bridge/api/context.py): built once by create_app, reached by
the app's ``context`` and by ``context(conn)`` from a route, with what only a running
daemon has (the store, the registry, the sessions) refused before the lifespan ran."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi import Request

from bridge.api.app import create_app
from bridge.api.context import AppContext, NotStarted, app_context, context
from bridge.config import load_settings
from bridge.sessions.registry import Registry

pytestmark = pytest.mark.timeout(30)


def test_what_create_app_knows_is_there_before_the_start_and_the_rest_is_refused(tmp_path: Path) -> None:
    settings = load_settings(data_dir=str(tmp_path / "data"), token="t" * 32, port=8765)
    app = create_app(settings)
    ctx = app.context
    assert ctx is app_context(app)
    assert ctx.settings is settings and ctx.token == "t" * 32 and ctx.tls is False
    assert not ctx.started
    with pytest.raises(NotStarted):
        _ = ctx.registry
    with pytest.raises(TypeError):
        app_context(object())


async def test_a_route_reaches_the_context_the_lifespan_filled(tmp_path: Path) -> None:
    settings = load_settings(data_dir=str(tmp_path / "data"), no_auth=True, port=8765)
    app = create_app(settings)
    seen: list[AppContext] = []

    @app.get("/probe-context")
    async def probe(request: Request) -> dict[str, bool]:
        seen.append(context(request))
        return {"ok": True}

    async with app.router.lifespan_context(app):
        assert app.context.started and isinstance(app.context.registry, Registry)
        assert app.context.users is None  # token mode: no user directory
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as client:
            assert (await client.get("/probe-context")).json() == {"ok": True}
    assert seen == [app.context]
