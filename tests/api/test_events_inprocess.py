"""The change stream's logic in-process (bridge/api/events.py change_frames), against the
app's own lifespan (real SQLite store, real registry and notifier) and httpx's ASGI
transport for REST; what a socket adds is in tests/test_events_e2e.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import wait_until

import bridge.api.events as events_mod
from bridge.api.app import create_app
from bridge.api.events import change_frames
from bridge.config import load_settings
from bridge.store import sqlite_sql

pytestmark = pytest.mark.timeout(30)
TOKEN = "t" * 32
STEP = 5.0


@pytest.fixture
async def app_client(tmp_path: Path) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    settings = load_settings(data_dir=str(tmp_path), token=TOKEN, port=8765)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765", headers=headers) as c:
            yield app, c


class Feed:
    """change_frames, read frame by frame under a deadline."""

    def __init__(self, app: Any, since: int | None) -> None:
        reg = app.context.registry
        self._gen = change_frames(reg.store, reg.changes, since)
        self._ready: list[dict[str, Any]] = []

    async def next(self, timeout: float = STEP) -> dict[str, Any]:
        while not self._ready:
            self._ready = list(await asyncio.wait_for(anext(self._gen), timeout))
        return self._ready.pop(0)

    async def close(self) -> None:
        await self._gen.aclose()


async def test_a_feed_tells_creation_update_and_deletion_with_the_thread_object(app_client: Any) -> None:
    app, client = app_client
    feed = Feed(app, None)
    try:
        ready = await feed.next()
        assert ready == {"cursor": 0, "kind": "ready"}
        thread = (await client.post("/v1/threads", json={"agent": "demo", "title": "one"})).json()
        created = await feed.next()
        assert created["kind"] == "thread.created" and created["cursor"] > ready["cursor"]
        assert created["thread"] == (await client.get(f"/v1/threads/{thread['id']}")).json()
        assert created["thread"]["pending_permissions"] == 0
        await client.patch(f"/v1/threads/{thread['id']}", json={"title": "two"})
        updated = await feed.next()
        assert updated["kind"] == "thread.updated" and updated["cursor"] > created["cursor"]
        assert updated["thread"]["title"] == "two"
        assert (await client.delete(f"/v1/threads/{thread['id']}")).status_code == 204
        deleted = await feed.next()
        assert deleted["kind"] == "thread.deleted" and deleted["cursor"] > updated["cursor"]
        assert deleted["thread"]["id"] == thread["id"] and deleted["thread"]["deleted_at"]
    finally:
        await feed.close()


async def test_a_cursor_outside_the_log_gets_one_resync_then_the_stream_goes_on(app_client: Any) -> None:
    app, client = app_client
    store = app.context.registry.store
    for title in ("a", "b"):
        await client.post("/v1/threads", json={"agent": "demo", "title": title})
    latest = await store.latest_change()
    ahead = Feed(app, latest + 5)  # e.g. a cursor from another daemon's store
    try:
        assert await ahead.next() == {"cursor": latest, "kind": "resync", "reason": "cursor_unknown"}
        await client.post("/v1/threads", json={"agent": "demo", "title": "c"})
        nxt = await ahead.next()
        assert nxt["kind"] == "thread.created" and nxt["thread"]["title"] == "c"
    finally:
        await ahead.close()
    # Below the horizon (tombstones pruned): resync with the newest cursor.
    await store._run(sqlite_sql.execute, "UPDATE change_log SET horizon = 2", [])
    old = Feed(app, 1)
    try:
        first = await old.next()
        assert first == {"cursor": await store.latest_change(), "kind": "resync", "reason": "cursor_expired"}
    finally:
        await old.close()
    # At the horizon exactly: served.
    at = Feed(app, 2)
    try:
        assert await at.next() == {"cursor": 2, "kind": "ready"}
        assert (await at.next())["thread"]["title"] == "c"
    finally:
        await at.close()


async def test_a_missed_wake_up_loses_nothing_the_slow_poll_reads_it(
    app_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, client = app_client
    monkeypatch.setattr(events_mod, "POLL_S", 0.05)
    app.context.registry.store.listeners.change.clear()  # no wake-ups at all
    feed = Feed(app, None)
    try:
        await feed.next()
        await client.post("/v1/threads", json={"agent": "demo", "title": "unannounced"})
        frame = await feed.next()
        while frame["kind"] != "thread.created":  # idle polls yield nothing; frames only
            frame = await feed.next()
        assert frame["thread"]["title"] == "unannounced"
    finally:
        await feed.close()


async def test_a_client_behind_is_caught_up_from_the_store_a_page_at_a_time(
    app_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, client = app_client
    monkeypatch.setattr(events_mod, "PAGE", 3)
    reg = app.context.registry
    gen = change_frames(reg.store, reg.changes, 0)
    try:
        assert await asyncio.wait_for(anext(gen), STEP) == [{"cursor": 0, "kind": "ready"}]
        for i in range(7):
            await client.post("/v1/threads", json={"agent": "demo", "title": f"t{i}"})
        pages = []
        while sum(len(p) for p in pages) < 7:
            page = await asyncio.wait_for(anext(gen), STEP)
            if page:
                pages.append(page)
        assert [len(p) for p in pages] == [3, 3, 1]
        frames = [f for p in pages for f in p]
        assert [f["thread"]["title"] for f in frames] == [f"t{i}" for i in range(7)]
        assert [f["cursor"] for f in frames] == sorted({f["cursor"] for f in frames})
    finally:
        await gen.aclose()


async def test_a_closed_notifier_ends_every_feed_at_once(app_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    app, _ = app_client
    monkeypatch.setattr(events_mod, "POLL_S", 60.0)  # only the close can end the wait in time
    notifier = app.context.registry.changes
    feed = Feed(app, None)
    await feed.next()
    waiting = asyncio.ensure_future(feed.next(timeout=STEP))
    await wait_until(lambda: bool(notifier._event._waiters), what="the feed to wait for a change")
    notifier.close("daemon_shutdown")
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, STEP)


async def test_bad_cursors_and_missing_credentials_are_refused(app_client: Any) -> None:
    _, client = app_client
    for params, headers in (({"since": "abc"}, {}), ({"since": "-1"}, {}), ({}, {"Last-Event-ID": "1.5"})):
        r = await client.get("/v1/events", params=params, headers=headers)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_cursor", r.text
    r = await client.get("/v1/events", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
