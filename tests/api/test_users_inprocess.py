"""Users mode in-process (issue #20): the trusted-proxy header (honoured only from a peer in
``proxy_trusted``, ignored and logged without its value from anyone else), constant-time
token checks, and the token hash the store keeps. The app, its lifespan and the SQLite
store are real; the peer address is the ASGI scope's client, which is what uvicorn gives
(proxy_headers is off: X-Forwarded-For never makes a peer trusted; it only names
whom wrong credentials count against, tests/api/test_throttle.py)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from structlog.testing import capture_logs

from bridge.api.app import create_app
from bridge.api.context import BridgeApp
from bridge.api.users import new_token, token_hash
from bridge.config import load_settings
from bridge.errors import ConfigError

pytestmark = pytest.mark.timeout(30)
OPERATOR_TOKEN = "o" * 32
PROXY = "10.1.2.3"
CONFIG = """
[auth]
mode = "users"
proxy_user_header = "X-Forwarded-User"
proxy_trusted = ["10.1.2.0/24"]
"""


@asynccontextmanager
async def users_app(tmp_path: Path) -> AsyncIterator[tuple[BridgeApp, dict[str, str]]]:
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG)
    settings = load_settings(config=str(cfg), data_dir=str(tmp_path / "data"), token=OPERATOR_TOKEN, port=8765)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        tokens = {}
        for name in ("alice", "bob"):
            tokens[name] = new_token()
            assert await app.context.store.add_user(name, token_hash(tokens[name]), admin=False)
        yield app, tokens


def client(app: FastAPI, peer: str, **headers: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(peer, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765", headers=headers)


async def me(c: httpx.AsyncClient, **headers: str) -> tuple[int, Any]:
    r = await c.get("/v1/me", headers=headers)
    return r.status_code, r.json()


async def test_the_proxy_header_is_honoured_only_from_a_trusted_peer(tmp_path: Path) -> None:
    async with users_app(tmp_path) as (app, tokens):
        async with client(app, PROXY) as proxy:
            assert await me(proxy, **{"X-Forwarded-User": "alice"}) == (
                200,
                {"name": "alice", "admin": False, "mode": "users"},
            )
            # A name the store does not know (or no longer knows) is no one.
            status, body = await me(proxy, **{"X-Forwarded-User": "mallory"})
            assert status == 401 and body["error"]["code"] == "unauthorized"
            assert await app.context.store.revoke_user("bob")
            status, _ = await me(proxy, **{"X-Forwarded-User": "bob"})
            assert status == 401
        spoof = "spoofed-admin-7f3a"
        async with client(app, "127.0.0.1") as direct, client(app, "10.1.3.1") as neighbour:
            with capture_logs() as logs:
                for c in (direct, neighbour):
                    # The header alone is no credential from an untrusted peer...
                    status, body = await me(c, **{"X-Forwarded-User": "alice"})
                    assert status == 401 and body["error"]["code"] == "unauthorized"
                    # ...and beside a token it changes nothing: the token's owner is the caller.
                    status, body = await me(
                        c, **{"X-Forwarded-User": spoof, "Authorization": f"Bearer {tokens['alice']}"}
                    )
                    assert (status, body["name"]) == (200, "alice")
                    # X-Forwarded-For does not make a peer trusted either.
                    status, _ = await me(c, **{"X-Forwarded-User": "alice", "X-Forwarded-For": PROXY})
                    assert status == 401
        ignored = [e for e in logs if e["event"] == "auth.proxy_header_ignored"]
        assert {e["peer"] for e in ignored} == {"127.0.0.1", "10.1.3.1"}  # once per peer (rate-limited)
        assert all(e["header"] == "x-forwarded-user" for e in ignored)
        assert spoof not in repr(logs) and tokens["alice"] not in repr(logs)


async def test_tokens_are_compared_in_constant_time_and_only_their_hash_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real: Callable[[Any, Any], bool] = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((bytes(a), bytes(b)))
        return real(a, b)

    async with users_app(tmp_path) as (app, tokens):
        monkeypatch.setattr(hmac, "compare_digest", spy)
        stored = hashlib.sha256(tokens["alice"].encode()).hexdigest()
        assert token_hash(tokens["alice"]) == stored and tokens["alice"].startswith("abu_")
        async with client(app, "127.0.0.1") as c:
            assert (await me(c, Authorization=f"Bearer {tokens['alice']}"))[1]["name"] == "alice"
            # The operator token is checked first, in constant time; then the user's hash.
            assert (OPERATOR_TOKEN.encode(), tokens["alice"].encode()) in calls
            assert (stored.encode(), stored.encode()) in calls
            calls.clear()
            assert (await me(c, Authorization=f"Bearer {OPERATOR_TOKEN}"))[1] == {
                "name": "operator",
                "admin": True,
                "mode": "users",
            }
            assert calls == [(OPERATOR_TOKEN.encode(), OPERATOR_TOKEN.encode())]
            status, _ = await me(c, Authorization="Bearer abu_" + "x" * 43)
            assert status == 401
        found = await app.context.store.user_by_token(stored)
        assert found is not None and found[0].name == "alice"
    db = (tmp_path / "data" / "bridge.db").read_bytes() + b"".join(
        p.read_bytes() for p in (tmp_path / "data").glob("bridge.db-*")
    )
    assert tokens["alice"].encode() not in db and tokens["bob"].encode() not in db


def test_users_mode_settings_are_checked_at_start(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    for text, problem in (
        ('[auth]\nmode = "token"\nproxy_user_header = "X-User"\nproxy_trusted = ["10.0.0.1/32"]\n', "needs mode"),
        ('[auth]\nmode = "users"\nproxy_user_header = "X-User"\n', "needs proxy_trusted"),
        ('[auth]\nmode = "users"\nproxy_trusted = ["not-a-network"]\n', "proxy_trusted"),
        ('[auth]\nmode = "everyone"\n', "mode"),
    ):
        cfg.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_settings(config=str(cfg), data_dir=str(tmp_path))
        assert problem in info.value.message, (text, info.value.message)
    cfg.write_text('[auth]\nmode = "users"\n')
    settings = load_settings(config=str(cfg), data_dir=str(tmp_path), no_auth=True)
    with pytest.raises(ConfigError, match="--no-auth"):
        create_app(settings)
