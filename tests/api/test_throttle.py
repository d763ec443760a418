"""Throttling wrong credentials (issue #32 B7, docs/security.md §1): the throttle counts
wrong tokens and login codes per source and never refuses a valid credential; behind a
trusted proxy the source is the client the proxy names. :class:`Refusals` alone with an
injected clock, then the app in-process (httpx's ASGI transport, which sets the socket
peer) for the order of the checks. Through a real daemon: tests/test_throttle_e2e.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from structlog.testing import capture_logs

from bridge.api.app import create_app
from bridge.api.throttle import Refusals
from bridge.config import load_settings

pytestmark = pytest.mark.timeout(30)
TOKEN = "t" * 43


def refusals(now: list[float], **kw: object) -> Refusals:
    return Refusals(max_failures=3, window_s=60, clock=lambda: now[0], **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Refusals


def test_a_burst_of_one_kind_never_hides_the_first_of_another_in_the_log() -> None:
    """Issue #34: wrong login codes right after wrong tokens from the same source logged no
    line; the log's limit is per source and kind, and each line counts its own kind."""
    now = [0.0]
    r = Refusals(max_failures=1000, window_s=60, log_every_s=10, clock=lambda: now[0])
    with capture_logs() as logs:
        for _ in range(5):
            r.wrong("10.0.0.1", "token")
        now[0] = 1.0
        for _ in range(3):
            r.wrong("10.0.0.1", "login code")
        r.refused("10.0.0.1", "no credentials", guess=False)
        now[0] = 11.0
        r.wrong("10.0.0.1", "token")
    lines = [(e["refused"], e["count"]) for e in logs if e["event"] == "auth.refused"]
    # the first of each kind at once; the next token line counts the 4 held back and itself
    assert lines == [("token", 1), ("login code", 1), ("no credentials", 1), ("token", 5)]


def test_wrong_ones_are_401_until_the_limit_then_429_for_as_long_as_they_keep_coming() -> None:
    now = [0.0]
    r = refusals(now)
    assert [r.wrong("10.0.0.1", "token") for _ in range(3)] == [None, None, None]  # 401, 401, 401
    assert r.retry_after("10.0.0.1") == 60
    assert r.wrong("10.0.0.1", "token") == 60  # the 4th: 429, Retry-After 60
    assert r.wrong("10.0.0.2", "token") is None  # another source is not throttled
    now[0] = 30.0
    assert r.wrong("10.0.0.1", "login code") == 30  # still guessing: still throttled
    now[0] = 59.0
    # The last three wrong ones were at 0, 0 and 30: free once the one at 0 has aged out.
    assert r.retry_after("10.0.0.1") == 1
    now[0] = 60.0
    assert r.retry_after("10.0.0.1") is None
    # Those at 0 have aged out: 30 and two more make three again.
    assert [r.wrong("10.0.0.1", "token") for _ in range(2)] == [None, None]
    # Throttled again; this one counts too, so Retry-After is 60: the last three are all at 60.
    assert r.wrong("10.0.0.1", "token") == 60


def test_missing_credentials_and_stale_cookies_are_never_counted() -> None:
    now = [0.0]
    r = refusals(now)
    for _ in range(50):
        r.refused("10.0.0.1", "no credentials", guess=False)
        r.refused("10.0.0.1", "session cookie", guess=False)
    assert r.retry_after("10.0.0.1") is None and r.wrong("10.0.0.1", "token") is None


def test_memory_is_bounded_by_sources_and_by_failures_per_source() -> None:
    now = [0.0]
    r = Refusals(max_failures=3, window_s=60, max_peers=4, clock=lambda: now[0])
    for _ in range(10_000):
        r.wrong("10.0.0.1", "token")
    assert len(r._failures["10.0.0.1"]) == 3  # a flood keeps max_failures times, not all
    for i in range(2, 5):
        r.wrong(f"10.0.0.{i}", "token")
    r.wrong("10.0.0.1", "token")  # 10.0.0.1 failed most recently: kept
    r.wrong("10.0.0.5", "token")  # a fifth source: the one that failed least recently goes
    assert list(r._failures) == ["10.0.0.3", "10.0.0.4", "10.0.0.1", "10.0.0.5"]
    assert r.retry_after("10.0.0.1") == 60


def test_the_source_is_the_peer_unless_the_peer_is_a_trusted_proxy() -> None:
    now = [0.0]
    direct = refusals(now)
    # Without trusted proxies X-Forwarded-For is never read: a client cannot pick its source.
    assert direct.source("127.0.0.1", ["198.51.100.7"]) == "127.0.0.1"
    behind = refusals(now, trusted_proxies=["127.0.0.1/32", "10.0.0.0/8"])
    assert behind.source("192.0.2.1", ["198.51.100.7"]) == "192.0.2.1"  # not a trusted peer
    assert behind.source("127.0.0.1", []) == "127.0.0.1"  # a proxy that names nobody
    assert behind.source("127.0.0.1", ["198.51.100.7"]) == "198.51.100.7"
    # What the client wrote itself is left of what the proxy appended: never believed.
    assert behind.source("127.0.0.1", ["203.0.113.9, 198.51.100.7"]) == "198.51.100.7"
    # Proxies in front of the proxy (trusted) are skipped; a second header value counts.
    assert behind.source("127.0.0.1", ["203.0.113.9, 198.51.100.7", "10.1.1.1"]) == "198.51.100.7"
    assert behind.source("127.0.0.1", ["10.2.2.2, 10.1.1.1"]) == "10.2.2.2"  # all trusted: the first
    # An entry that is not an address ends the walk at the last address read.
    assert behind.source("127.0.0.1", ["198.51.100.7, garbage"]) == "127.0.0.1"
    assert behind.source("127.0.0.1", ["garbage, 198.51.100.7"]) == "198.51.100.7"
    # Ports and brackets as some proxies write them.
    assert behind.source("127.0.0.1", ["198.51.100.7:5555"]) == "198.51.100.7"
    assert behind.source("127.0.0.1", ["[2001:db8:1:2::7]:5555"]) == "2001:db8:1:2::/64"
    assert behind.source("unknown", ["198.51.100.7"]) == "unknown"  # a Unix socket


def test_an_ipv6_source_is_its_slash_64_and_a_mapped_ipv4_is_the_ipv4() -> None:
    r = refusals([0.0])
    assert r.source("2001:db8:1:2::7") == r.source("2001:db8:1:2:ffff::1") == "2001:db8:1:2::/64"
    assert r.source("2001:db8:1:3::7") == "2001:db8:1:3::/64"
    assert r.source("::ffff:192.0.2.1") == "192.0.2.1"


# --------------------------------------------------------------------------- the app


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    cfg = tmp_path / "config.toml"
    cfg.write_text('[auth]\nproxy_trusted = ["10.9.0.1/32"]\n')
    settings = load_settings(config=str(cfg), data_dir=str(tmp_path / "data"), token=TOKEN, port=8765)
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


def client(app: FastAPI, peer: str, **headers: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(peer, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765", headers=headers)


async def flood(c: httpx.AsyncClient, n: int = 25, **headers: str) -> list[int]:
    statuses = []
    for i in range(n):
        r = await c.get("/v1/threads", headers={"Authorization": f"Bearer wrong-{i}", **headers})
        statuses.append(r.status_code)
    return statuses


async def test_a_valid_token_cookie_or_code_passes_from_a_throttled_source(app: FastAPI) -> None:
    async with client(app, "192.0.2.1") as c:
        assert await flood(c) == [401] * 20 + [429] * 5
        r = await c.get("/v1/threads", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
        assert r.json()["error"]["code"] == "too_many_failures"
        ok = {"Authorization": f"Bearer {TOKEN}"}
        assert (await c.get("/v1/threads", headers=ok)).status_code == 200
        code = (await c.post("/v1/login-codes", headers=ok)).json()["code"]
        assert (await c.post("/v1/session", json={"code": "not-it"})).status_code == 429
        signed_in = await c.post("/v1/session", json={"code": code})
        assert signed_in.status_code == 204, signed_in.text
        cookie = signed_in.headers["set-cookie"].split(";")[0]
        assert (await c.get("/v1/threads", headers={"Cookie": cookie})).status_code == 200
        assert (await c.post("/v1/session", headers=ok)).status_code == 204
        c.cookies.clear()
        # Nothing at all, or a stale cookie, is no guess: 401, not 429 (a page then signs in).
        assert (await c.get("/v1/threads")).status_code == 401
        stale = {"Cookie": "agent_bridge_session=expired"}
        assert (await c.get("/v1/threads", headers=stale)).status_code == 401
    async with client(app, "192.0.2.2") as other:
        assert (await other.get("/v1/threads", headers={"Authorization": "Bearer wrong"})).status_code == 401


async def test_behind_the_trusted_proxy_each_forwarded_client_is_its_own_source(app: FastAPI) -> None:
    async with client(app, "10.9.0.1") as proxy:
        assert await flood(proxy, **{"X-Forwarded-For": "198.51.100.7"}) == [401] * 20 + [429] * 5
        wrong = {"Authorization": "Bearer wrong"}
        r = await proxy.get("/v1/threads", headers={**wrong, "X-Forwarded-For": "198.51.100.8"})
        assert r.status_code == 401  # another client behind the same proxy
        # A client that writes its own X-Forwarded-For is still the address the proxy appended.
        r = await proxy.get("/v1/threads", headers={**wrong, "X-Forwarded-For": "198.51.100.8, 198.51.100.7"})
        assert r.status_code == 429
        ok = {"Authorization": f"Bearer {TOKEN}", "X-Forwarded-For": "198.51.100.7"}
        assert (await proxy.get("/v1/threads", headers=ok)).status_code == 200
    # Anyone else's X-Forwarded-For is not read: a direct client cannot pick its source.
    async with client(app, "192.0.2.9") as direct:
        assert await flood(direct, **{"X-Forwarded-For": "198.51.100.20"}) == [401] * 20 + [429] * 5
        r = await direct.get("/v1/threads", headers={"Authorization": "Bearer x", "X-Forwarded-For": "198.51.100.21"})
        assert r.status_code == 429


async def test_in_users_mode_a_users_token_and_the_proxys_user_pass_from_a_throttled_source(tmp_path: Path) -> None:
    from bridge.api.users import new_token, token_hash

    cfg = tmp_path / "config.toml"
    cfg.write_text('[auth]\nmode = "users"\nproxy_user_header = "X-User"\nproxy_trusted = ["10.9.0.1/32"]\n')
    settings = load_settings(config=str(cfg), data_dir=str(tmp_path / "data"), token=TOKEN, port=8765)
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        alice = new_token()
        assert await application.context.store.add_user("alice", token_hash(alice), admin=False)
        async with client(application, "192.0.2.1") as c:
            assert await flood(c) == [401] * 20 + [429] * 5
            r = await c.get("/v1/me", headers={"Authorization": f"Bearer {alice}"})
            assert r.status_code == 200 and r.json()["name"] == "alice"
            assert (await c.get("/v1/me", headers={"Authorization": "Bearer abu_wrong"})).status_code == 429
        async with client(application, "10.9.0.1") as proxy:
            forwarded = {"X-Forwarded-For": "198.51.100.7"}
            assert await flood(proxy, **forwarded) == [401] * 20 + [429] * 5
            r = await proxy.get("/v1/me", headers={"X-User": "alice", **forwarded})
            assert r.status_code == 200 and r.json()["name"] == "alice"
