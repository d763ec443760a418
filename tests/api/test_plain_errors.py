"""Errors a person can act on (issue #34 item 5), in-process: JSON bodies without a
content-type header (and what a cross-site page still cannot send), and 401s that say how
to authenticate, for REST, SSE and a WebSocket upgrade."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge.api.app import create_app
from bridge.config import load_settings

pytestmark = pytest.mark.timeout(30)
TOKEN = "t" * 32
BASE = "http://127.0.0.1:8765"
BODY = b'{"agent": "demo", "title": "x"}'


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A client with no credentials of its own: each test sends the ones it is about."""
    settings = load_settings(data_dir=str(tmp_path), token=TOKEN, port=8765, discover_path=False)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
            yield c


BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def threads(client: httpx.AsyncClient) -> list[object]:
    r = await client.get("/v1/threads", headers=BEARER)
    return list(r.json()["threads"])


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "text/plain;charset=UTF-8", "application/json"],
)
async def test_a_json_body_with_a_bearer_token_needs_no_content_type(
    client: httpx.AsyncClient, content_type: str | None
) -> None:
    """Issue #34: ``curl -d '{…}'`` sends application/x-www-form-urlencoded, and a body with
    no content type was refused as not an object."""
    headers = dict(BEARER) if content_type is None else {**BEARER, "Content-Type": content_type}
    r = await client.post("/v1/threads", content=BODY, headers=headers)
    assert r.status_code == 201, r.text
    assert r.json()["agent"] == "demo" and r.json()["title"] == "x"


async def test_a_form_that_is_not_json_is_said_to_be_not_json(client: httpx.AsyncClient) -> None:
    headers = {**BEARER, "Content-Type": "application/x-www-form-urlencoded"}
    r = await client.post("/v1/threads", content=b"agent=demo", headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text
    assert r.json()["error"]["message"] == "the request body: is not valid JSON (at character 0)"
    r = await client.post("/v1/threads", content=b'{"agent": "demo"', headers=BEARER)
    assert r.json()["error"]["message"] == "the request body: is not valid JSON (at character 16)", r.text
    r = await client.post("/v1/threads", content=b"agent=demo", headers={**BEARER, "Content-Type": "image/png"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", r.text


async def session_cookie(client: httpx.AsyncClient) -> dict[str, str]:
    r = await client.post("/v1/session", headers=BEARER)
    assert r.status_code == 204, r.text
    return {"Cookie": f"agent_bridge_session={r.cookies['agent_bridge_session']}"}


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
async def test_a_cross_site_form_or_text_post_with_the_cookie_creates_nothing(
    client: httpx.AsyncClient, content_type: str
) -> None:
    """What a foreign page can send without a preflight: the session cookie (were it not
    SameSite=Strict), a form or text/plain body, and an Origin of its own or none at all
    (a stripped one). None of it creates a thread; only the page's own JSON does."""
    cookie = await session_cookie(client)
    hostile = {**cookie, "Content-Type": content_type}
    r = await client.post("/v1/threads", content=BODY, headers={**hostile, "Origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", r.text
    r = await client.post("/v1/threads", content=BODY, headers=hostile)  # no Origin
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", r.text
    assert "application/json" in r.json()["error"]["message"]
    r = await client.post("/v1/threads", content=BODY, headers=cookie)  # no content type either
    assert r.status_code == 415, r.text
    assert await threads(client) == []
    own = {**cookie, "Content-Type": "application/json", "Origin": BASE}
    r = await client.post("/v1/threads", content=BODY, headers=own)
    assert r.status_code == 201, r.text


async def test_a_request_without_a_body_needs_no_content_type(client: httpx.AsyncClient) -> None:
    cookie = await session_cookie(client)
    tid = (await client.post("/v1/threads", json={"agent": "demo"}, headers=BEARER)).json()["id"]
    r = await client.post(f"/v1/threads/{tid}/stop", headers=cookie)
    assert r.status_code == 202, r.text
    r = await client.delete("/v1/session", headers=cookie)
    assert r.status_code == 204, r.text


@pytest.mark.parametrize(
    ("headers", "what"),
    [
        ({}, "no credentials were sent"),
        ({"Authorization": "Bearer wrong"}, "the bearer token is wrong"),
        ({"Cookie": "agent_bridge_session=stale"}, "the browser session has expired or was signed out"),
    ],
)
async def test_a_401_says_what_was_wrong_and_how_to_authenticate(
    client: httpx.AsyncClient, headers: dict[str, str], what: str
) -> None:
    """Issue #34: a 401 said "missing or wrong credentials" and nothing of how to send
    the right ones."""
    for path in ("/v1/threads", "/v1/events"):  # REST, and an SSE stream
        r = await client.get(path, headers=headers)
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"] == 'Bearer realm="agent-bridge"'
        message = r.json()["error"]["message"]
        assert message.startswith(f"{what}: send the daemon's token"), message
        assert "Authorization: Bearer <token>" in message and "<data-dir>/token" in message
        assert "agent-bridge login-link" in message
        assert TOKEN not in message and "wrong" not in message.replace("is wrong", "")


async def test_a_refused_websocket_upgrade_says_how_to_authenticate(tmp_path: Path) -> None:
    """The upgrade is answered with an HTTP 401 before anything is accepted (the server's
    denial-response extension), its body saying how to authenticate, as REST's does."""
    settings = load_settings(data_dir=str(tmp_path), token=TOKEN, port=8765, discover_path=False)
    app = create_app(settings)
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "scheme": "ws",
        "path": "/v1/ws",
        "raw_path": b"/v1/ws",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:8765"), (b"sec-websocket-protocol", b"agent-bridge.v1, bearer.wrong")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8765),
        "subprotocols": ["agent-bridge.v1", "bearer.wrong"],
        "extensions": {"websocket.http.response": {}},
        "state": {},
    }

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with app.router.lifespan_context(app):
        await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "websocket.http.response.start")
    assert start["status"] == 401
    assert (b"www-authenticate", b'Bearer realm="agent-bridge"') in start["headers"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "websocket.http.response.body")
    message = json.loads(body)["error"]["message"]
    assert message.startswith("the bearer token is wrong: "), message
    assert "subprotocols agent-bridge.v1, bearer.<token>" in message and str(tmp_path) not in message
