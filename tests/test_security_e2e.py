"""Who may talk to the daemon (issue #6 items 1-4, docs/security.md), through a real daemon
and real HTTP / WebSocket clients (httpx, websockets, raw sockets for hand-made upgrades).

1. Credentials: bearer header, subprotocol (tests/test_rest_e2e.py), and the session cookie
   from ``POST /v1/session``; never a URL query.
2. ``--no-auth`` on a non-loopback address is refused: covered by
   tests/test_config_cli.py::test_no_auth_on_a_non_loopback_address_is_refused.
3. DNS rebinding: the Host header is checked before routing (421 ``host_not_allowed``).
4. Cross-site WebSocket hijacking / CSRF: foreign Origins are refused before anything
   happens (403 ``origin_not_allowed``); CORS only for ``allowed_origins``.

Nothing sleeps: every step waits on an HTTP answer or a frame, with a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import websockets
import websockets.exceptions
from conftest import STEP_TIMEOUT, TOKEN, Daemon, agent_log, base_config, new_thread

COOKIE = "agent_bridge_session"

# --------------------------------------------------------------------------- helpers


def port_of(d: Daemon) -> int:
    port = urlsplit(d.url).port
    assert port is not None
    return port


def anon(d: Daemon, **headers: str) -> httpx.AsyncClient:
    """An HTTP client with no credentials unless given."""
    return httpx.AsyncClient(base_url=d.url, headers=headers, timeout=STEP_TIMEOUT)


def set_cookie(r: httpx.Response) -> tuple[str, set[str]]:
    """The session cookie's value and its attributes (``Max-Age=…`` kept whole)."""
    headers = r.headers.get_list("set-cookie")
    assert len(headers) == 1, headers
    first, *attrs = (p.strip() for p in headers[0].split(";"))
    name, _, value = first.partition("=")
    assert name == COOKIE, headers
    return value, set(attrs)


async def login(d: Daemon) -> str:
    async with d.http() as http:
        r = await http.post("/v1/session")
    assert r.status_code == 204, r.text
    return set_cookie(r)[0]


async def raw_http(d: Daemon, head: str) -> tuple[int, dict[str, str], bytes]:
    """Send a hand-made request head over a fresh TCP connection; the status, headers and
    body of the answer (a 101 answer ends the exchange: the body is empty)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(d))
    try:
        writer.write(head.encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP_TIMEOUT)
        status_line, *lines = raw.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        for line in lines:
            if line:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
        body = b""
        if status != 101 and "content-length" in headers:
            body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), STEP_TIMEOUT)
        return status, headers, body
    finally:
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), STEP_TIMEOUT)


async def upgrade(
    d: Daemon, tid: str, *, host: str | None = None, origin: str | None = None, auth: bool = True, extra: str = ""
) -> tuple[int, dict[str, str], bytes]:
    """A WebSocket upgrade by hand, with any Host and Origin."""
    key = base64.b64encode(os.urandom(16)).decode()
    head = (
        f"GET /v1/threads/{tid}/ws HTTP/1.1\r\n"
        f"Host: {host or f'127.0.0.1:{port_of(d)}'}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    )
    if origin is not None:
        head += f"Origin: {origin}\r\n"
    if auth:
        head += f"Authorization: Bearer {TOKEN}\r\n"
    return await raw_http(d, head + extra + "\r\n")


def error_code(body: bytes | str) -> str:
    code = json.loads(body)["error"]["code"]
    assert isinstance(code, str)
    return code


async def subscribers(d: Daemon) -> int:
    async with anon(d) as http:
        r = await http.get("/metrics")
    line = next(x for x in r.text.splitlines() if x.startswith("agent_bridge_subscribers "))
    return int(line.split()[1])


async def thread_count(d: Daemon) -> int:
    async with d.http() as http:
        r = await http.get("/v1/threads")
    assert r.status_code == 200, r.text
    return len(r.json()["threads"])


def assert_no_secrets_logged(d: Daemon, *secrets_: str) -> None:
    err = d.stderr()
    for s in (TOKEN, *secrets_):
        assert s not in err, "a credential reached the daemon's log"


@pytest.fixture
def make(daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]) -> Callable[..., Any]:
    """A daemon with extra ``[server]`` lines."""

    async def start(server: str = "") -> Daemon:
        d: Daemon = await daemon_factory(base_config(tmp_path, agent_env, server=server))
        return d

    return start


# --------------------------------------------------------------------------- 1. session cookie


async def test_cookie_session_authenticates_rest_and_websocket_until_logout(daemon: Daemon) -> None:
    thread = await new_thread(daemon, "stream-json", title="cookie thread")
    async with daemon.http() as http:
        r = await http.post("/v1/session")
    assert r.status_code == 204 and r.content == b""
    sid, attrs = set_cookie(r)
    assert len(sid) >= 43  # 256 random bits, url-safe base64
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= attrs
    assert "Secure" not in attrs  # plain http
    assert "Max-Age=43200" in attrs
    assert r.headers["cache-control"] == "no-store"

    cookie = {"Cookie": f"{COOKIE}={sid}"}
    async with anon(daemon, **cookie) as http:
        r = await http.get("/v1/threads")
        assert r.status_code == 200 and [t["id"] for t in r.json()["threads"]] == [thread["id"]]
        # No Origin (a script): the cookie alone may also change state.
        r = await http.patch(f"/v1/threads/{thread['id']}", json={"title": "renamed"})
        assert r.status_code == 200 and r.json()["title"] == "renamed"

    conn = await websockets.connect(
        f"{daemon.ws_url}/v1/threads/{thread['id']}/ws", additional_headers=cookie, open_timeout=STEP_TIMEOUT
    )
    await conn.send(json.dumps({"op": "interrupt", "client_id": "c1"}))
    frame = json.loads(await asyncio.wait_for(conn.recv(), STEP_TIMEOUT))
    assert frame["kind"] == "client.accepted" and frame["data"]["op"] == "interrupt"
    await conn.close()

    async with anon(daemon, **cookie) as http:
        r = await http.delete("/v1/session")
        assert r.status_code == 204
        value, attrs = set_cookie(r)
        assert value == "" and "Max-Age=0" in attrs
        for _ in range(2):  # the old cookie is dead for REST…
            r = await http.get("/v1/threads")
            assert r.status_code == 401 and error_code(r.text) == "unauthorized"
            assert "cookie thread" not in r.text and thread["id"] not in r.text
        assert (await http.delete("/v1/session")).status_code == 401
    with pytest.raises(websockets.exceptions.InvalidStatus) as info:  # …and the WebSocket
        await websockets.connect(
            f"{daemon.ws_url}/v1/threads/{thread['id']}/ws", additional_headers=cookie, open_timeout=STEP_TIMEOUT
        )
    assert info.value.response.status_code == 401
    assert_no_secrets_logged(daemon, sid)


async def test_forged_cookies_and_query_tokens_are_refused(daemon: Daemon) -> None:
    thread = await new_thread(daemon, "stream-json")
    sid = await login(daemon)
    ws_url = f"{daemon.ws_url}/v1/threads/{thread['id']}/ws"
    forged = [secrets.token_urlsafe(32), sid[:-1] + ("A" if sid[-1] != "A" else "B"), "", TOKEN, sid + "x"]
    for value in forged:
        async with anon(daemon, Cookie=f"{COOKIE}={value}") as http:
            r = await http.get(f"/v1/threads/{thread['id']}")
            assert r.status_code == 401 and error_code(r.text) == "unauthorized", value
        with pytest.raises(websockets.exceptions.InvalidStatus) as info:
            await websockets.connect(
                ws_url, additional_headers={"Cookie": f"{COOKIE}={value}"}, open_timeout=STEP_TIMEOUT
            )
        assert info.value.response.status_code == 401
    # The session id under another cookie name is nothing.
    async with anon(daemon, Cookie=f"session={sid}") as http:
        assert (await http.get("/v1/threads")).status_code == 401
    # A present but wrong bearer token fails even beside a good cookie.
    async with anon(daemon, Cookie=f"{COOKIE}={sid}", Authorization="Bearer wrong") as http:
        assert (await http.get("/v1/threads")).status_code == 401

    async with anon(daemon) as http:
        # The token in a URL query is never a credential, not even to mint a session.
        for name in ("token", "access_token", "auth", "bearer"):
            r = await http.post("/v1/session", params={name: TOKEN})
            assert r.status_code == 401 and "set-cookie" not in r.headers, name
            r = await http.get("/v1/threads", params={name: TOKEN})
            assert r.status_code == 401, name
        with pytest.raises(websockets.exceptions.InvalidStatus) as info:
            await websockets.connect(f"{ws_url}?token={TOKEN}", open_timeout=STEP_TIMEOUT)
        assert info.value.response.status_code == 401
        # Minting a session takes the bearer header: neither a cookie nor nothing will do.
        r = await http.post("/v1/session", headers={"Cookie": f"{COOKIE}={sid}"})
        assert r.status_code == 401 and "set-cookie" not in r.headers
        assert (await http.post("/v1/session")).status_code == 401
        r = await http.post("/v1/session", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and error_code(r.text) == "unauthorized"
    assert_no_secrets_logged(daemon, sid)


async def test_sessions_expire_and_their_number_is_bounded(make: Callable[..., Any]) -> None:
    d = await make("max_sessions = 2\n")
    first, second, third = [await login(d) for _ in range(3)]
    statuses = []
    for sid in (first, second, third):
        async with anon(d, Cookie=f"{COOKIE}={sid}") as http:
            statuses.append((await http.get("/v1/threads")).status_code)
    assert statuses == [401, 200, 200]  # the oldest made room


async def test_an_expired_session_is_refused(make: Callable[..., Any]) -> None:
    d = await make("session_ttl_s = 0.000001\n")  # expired by the next request
    sid = await login(d)
    async with anon(d, Cookie=f"{COOKIE}={sid}") as http:
        r = await http.get("/v1/threads")
    assert r.status_code == 401 and error_code(r.text) == "unauthorized"


async def test_cookie_is_secure_behind_a_trusted_tls_proxy_only(make: Callable[..., Any]) -> None:
    d = await make("trust_proxy_headers = true\n")
    async with d.http() as http:
        r = await http.post("/v1/session", headers={"X-Forwarded-Proto": "https"})
        assert "Secure" in set_cookie(r)[1]
        r = await http.post("/v1/session")
        assert "Secure" not in set_cookie(r)[1]
        # The proxy says https: the page origin is https://<Host>, not http://.
        port = port_of(d)
        r = await http.post(
            "/v1/threads",
            json={"agent": "stream-json"},
            headers={"X-Forwarded-Proto": "https", "Origin": f"https://127.0.0.1:{port}"},
        )
        assert r.status_code == 201, r.text
        r = await http.post(
            "/v1/threads",
            json={"agent": "stream-json"},
            headers={"X-Forwarded-Proto": "https", "Origin": f"http://127.0.0.1:{port}"},
        )
        assert r.status_code == 403 and error_code(r.text) == "origin_not_allowed"


async def test_forwarded_proto_is_ignored_unless_trusted(daemon: Daemon) -> None:
    port = port_of(daemon)
    async with daemon.http() as http:
        r = await http.post("/v1/session", headers={"X-Forwarded-Proto": "https"})
        assert "Secure" not in set_cookie(r)[1]
        r = await http.post(
            "/v1/threads",
            json={"agent": "stream-json"},
            headers={"X-Forwarded-Proto": "https", "Origin": f"https://127.0.0.1:{port}"},
        )
        assert r.status_code == 403 and error_code(r.text) == "origin_not_allowed"
    assert await thread_count(daemon) == 0


# --------------------------------------------------------------------------- 3. Host (DNS rebinding)


async def test_host_header_must_be_loopback_with_the_bound_port(daemon: Daemon) -> None:
    port = port_of(daemon)
    refused = [
        f"evil.example:{port}",
        "evil.example",
        f"localhost:{port + 1}",
        "localhost",
        f"127.0.0.1:{port + 1}",
        f"10.0.0.1:{port}",
        f"localhost.evil.example:{port}",
        f"127.0.0.1.nip.io:{port}",
        f"[::2]:{port}",
        f"evil.example:{port}@x",
        f"localhost:{port}:{port}",
        "",
    ]
    accepted = [
        f"localhost:{port}",
        f"127.0.0.1:{port}",
        f"127.0.0.2:{port}",
        f"LOCALHOST:{port}",
        f"localhost.:{port}",
        f"app.localhost:{port}",
        f"[::1]:{port}",
    ]
    async with daemon.http() as http:
        for host in refused:
            for method, path in (
                ("GET", "/healthz"),
                ("GET", "/v1/threads"),
                ("POST", "/v1/threads"),
                ("GET", "/metrics"),
            ):
                r = await http.request(
                    method, path, headers={"Host": host}, json={"agent": "stream-json"} if method == "POST" else None
                )
                assert r.status_code == 421, (host, path, r.status_code)
                assert error_code(r.text) == "host_not_allowed"
        for host in accepted:
            r = await http.get("/v1/threads", headers={"Host": host})
            assert r.status_code == 200, (host, r.text)
            assert (await http.get("/healthz", headers={"Host": host})).status_code == 200
    assert await thread_count(daemon) == 0  # no refused POST created anything
    # No Host header at all (HTTP/1.0), and two Host headers, are refused too.
    status, _, body = await raw_http(daemon, "GET /healthz HTTP/1.0\r\n\r\n")
    assert status == 421 and error_code(body) == "host_not_allowed"
    status, _, body = await raw_http(
        daemon, f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
    )
    assert status in (400, 421)


async def test_websocket_upgrade_with_a_foreign_host_is_refused(daemon: Daemon) -> None:
    thread = await new_thread(daemon, "stream-json")
    port = port_of(daemon)
    for host in (f"evil.example:{port}", f"localhost:{port + 1}", "attacker.example"):
        status, headers, body = await upgrade(daemon, thread["id"], host=host)
        assert status == 421, (host, status)
        assert error_code(body) == "host_not_allowed"
        assert "upgrade" not in headers
    assert await subscribers(daemon) == 0
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        status, headers, _ = await upgrade(daemon, thread["id"], host=host)
        assert status == 101, host
        assert headers["upgrade"].lower() == "websocket"


async def test_allowed_hosts_entries_are_accepted(make: Callable[..., Any]) -> None:
    d = await make('allowed_hosts = ["bridge.example:443", "Bridge.LAN"]\n')
    thread = await new_thread(d, "stream-json")
    port = port_of(d)
    async with d.http() as http:
        for host in (
            "bridge.example:443",
            "bridge.example",
            "BRIDGE.example:443",
            "bridge.lan",
            f"bridge.lan:{port}",
            "bridge.lan:1234",
            f"localhost:{port}",
        ):
            r = await http.get("/v1/threads", headers={"Host": host})
            assert r.status_code == 200, (host, r.text)
        for host in ("bridge.example:8443", f"evil.example:{port}", "sub.bridge.example:443", f"localhost:{port + 1}"):
            r = await http.get("/v1/threads", headers={"Host": host})
            assert r.status_code == 421 and error_code(r.text) == "host_not_allowed", host
    status, _, _ = await upgrade(d, thread["id"], host="bridge.example:443")
    assert status == 101
    status, _, body = await upgrade(d, thread["id"], host="bridge.example:8443")
    assert status == 421 and error_code(body) == "host_not_allowed"


async def test_non_loopback_bind_checks_hosts_only_when_allowed_hosts_is_set(make: Callable[..., Any]) -> None:
    d = await make('host = "0.0.0.0"\nallowed_hosts = ["bridge.lan:8765"]\n')
    port = port_of(d)
    d.url = f"http://127.0.0.1:{port}"
    async with d.http() as http:
        assert (await http.get("/v1/threads", headers={"Host": "bridge.lan:8765"})).status_code == 200
        assert (await http.get("/v1/threads", headers={"Host": f"localhost:{port}"})).status_code == 200
        r = await http.get("/v1/threads", headers={"Host": f"evil.example:{port}"})
        assert r.status_code == 421 and error_code(r.text) == "host_not_allowed"
    async with anon(d, Host="bridge.lan:8765") as http:  # and the token is still needed
        assert (await http.get("/v1/threads")).status_code == 401


async def test_non_loopback_bind_without_allowed_hosts_relies_on_the_token(make: Callable[..., Any]) -> None:
    d = await make('host = "0.0.0.0"\n')
    d.url = f"http://127.0.0.1:{port_of(d)}"
    async with d.http() as http:
        assert (await http.get("/v1/threads", headers={"Host": "anything.example"})).status_code == 200
    async with anon(d, Host="anything.example") as http:
        assert (await http.get("/v1/threads")).status_code == 401


# --------------------------------------------------------------------------- 4. Origin, CORS


async def test_websocket_from_a_foreign_origin_is_refused_before_accept(daemon: Daemon) -> None:
    thread = await new_thread(daemon, "stream-json")
    port = port_of(daemon)
    url = f"{daemon.ws_url}/v1/threads/{thread['id']}/ws"
    foreign = [
        "https://evil.example",
        f"http://evil.example:{port}",
        "null",
        f"http://localhost:{port}",  # another origin than the Host it talks to
        f"https://127.0.0.1:{port}",  # another scheme
        f"http://127.0.0.1:{port + 1}",  # another port
        "http://127.0.0.1",
    ]
    for origin in foreign:
        with pytest.raises(websockets.exceptions.InvalidStatus) as info:
            await websockets.connect(url, origin=origin, additional_headers=daemon.headers, open_timeout=STEP_TIMEOUT)
        assert info.value.response.status_code == 403, origin
        assert error_code(info.value.response.body or b"") == "origin_not_allowed"
    # The browser way (subprotocol token) and the cookie way are refused alike.
    sid = await login(daemon)
    status, _, body = await upgrade(
        daemon, thread["id"], origin="https://evil.example", auth=False, extra=f"Cookie: {COOKIE}={sid}\r\n"
    )
    assert status == 403 and error_code(body) == "origin_not_allowed"
    status, _, body = await upgrade(
        daemon,
        thread["id"],
        origin="https://evil.example",
        auth=False,
        extra=f"Sec-WebSocket-Protocol: agent-bridge.v1, bearer.{TOKEN}\r\n",
    )
    assert status == 403 and error_code(body) == "origin_not_allowed"
    assert await subscribers(daemon) == 0
    async with daemon.http() as http:
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
    assert t["last_seq"] == 0 and t["state"] == "idle"

    # The daemon's own origin (as the client sees it) is fine.
    conn = await websockets.connect(
        url, origin=f"http://127.0.0.1:{port}", additional_headers=daemon.headers, open_timeout=STEP_TIMEOUT
    )
    await conn.send(json.dumps({"op": "interrupt"}))
    frame = json.loads(await asyncio.wait_for(conn.recv(), STEP_TIMEOUT))
    assert frame["kind"] == "client.accepted"
    assert await subscribers(daemon) == 1
    await conn.close()
    status, _, _ = await upgrade(daemon, thread["id"], host=f"localhost:{port}", origin=f"http://localhost:{port}")
    assert status == 101


async def test_state_changing_rest_from_a_foreign_origin_does_nothing(daemon: Daemon, tmp_path: Path) -> None:
    port = port_of(daemon)
    evil = {"Origin": "https://evil.example"}
    async with daemon.http() as http:
        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=evil)
        assert r.status_code == 403 and error_code(r.text) == "origin_not_allowed"
        assert "access-control-allow-origin" not in r.headers
        assert (await http.get("/v1/threads")).json()["threads"] == []
        # The cookie does not help a foreign origin either.
        sid = await login(daemon)
        r = await http.post(
            "/v1/threads",
            json={"agent": "stream-json"},
            headers={**evil, "Authorization": "", "Cookie": f"{COOKIE}={sid}"},
        )
        assert r.status_code == 403
        assert (await http.get("/v1/threads")).json()["threads"] == []

        thread = await new_thread(daemon, "stream-json", title="mine")
        tid = thread["id"]
        for method, path, body in (
            ("POST", f"/v1/threads/{tid}/messages", {"text": "rm -rf"}),
            ("POST", f"/v1/threads/{tid}/resume", None),
            ("PATCH", f"/v1/threads/{tid}", {"title": "pwned"}),
            ("PUT", f"/v1/threads/{tid}", {"title": "pwned"}),
            ("DELETE", f"/v1/threads/{tid}", None),
            ("POST", "/v1/session", None),
            ("DELETE", "/v1/session", None),
        ):
            r = await http.request(method, path, json=body, headers=evil)
            assert r.status_code == 403 and error_code(r.text) == "origin_not_allowed", path
            assert "set-cookie" not in r.headers
        t = (await http.get(f"/v1/threads/{tid}")).json()
        assert (t["title"], t["last_seq"], t["state"]) == ("mine", 0, "idle")
        assert agent_log(tmp_path) == []  # nothing was spawned

        # Reads carry no CORS grant for a foreign origin (the browser will not show them).
        r = await http.get("/v1/threads", headers=evil)
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers

        # The daemon's own origin may change state.
        own = {"Origin": f"http://127.0.0.1:{port}"}
        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=own)
        assert r.status_code == 201
        assert "access-control-allow-origin" not in r.headers  # same origin needs no CORS
        r = await http.patch(f"/v1/threads/{tid}", json={"title": "ok"}, headers=own)
        assert r.status_code == 200
    assert await thread_count(daemon) == 2


async def test_allowlisted_origin_gets_cors_and_others_get_nothing(make: Callable[..., Any]) -> None:
    d = await make('allowed_origins = ["https://app.example", "http://localhost:3000"]\n')
    thread = await new_thread(d, "stream-json")
    app = "https://app.example"
    async with d.http() as http:
        for origin in (app, "https://APP.example:443", "http://localhost:3000"):
            r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers={"Origin": origin})
            assert r.status_code == 201, (origin, r.text)
            assert r.headers["access-control-allow-origin"] == origin
            assert r.headers["access-control-allow-credentials"] == "true"
            assert "Origin" in r.headers["vary"]
        # A 401 is readable by the allowlisted page too (it must know to log in).
        r = await http.get("/v1/threads", headers={"Origin": app, "Authorization": ""})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == app

        preflight = {
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
            "Access-Control-Request-Private-Network": "true",
        }
        async with anon(d) as nobody:  # preflights carry no credentials
            r = await nobody.options("/v1/threads", headers={**preflight, "Origin": app})
            assert r.status_code == 204, r.text
            assert r.headers["access-control-allow-origin"] == app
            assert r.headers["access-control-allow-credentials"] == "true"
            assert {"authorization", "content-type"} <= {
                h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")
            }
            assert {"GET", "POST", "PATCH", "DELETE"} <= {
                m.strip() for m in r.headers["access-control-allow-methods"].split(",")
            }
            assert r.headers["access-control-allow-private-network"] == "true"
            assert r.headers["vary"] == "Origin"
            for origin in (
                "https://evil.example",
                "https://app.example.evil.example",
                "http://app.example",
                "https://app.example:8443",
                "null",
            ):
                r = await nobody.options("/v1/threads", headers={**preflight, "Origin": origin})
                assert r.status_code == 403 and error_code(r.text) == "origin_not_allowed"
                assert not [h for h in r.headers if h.startswith("access-control-")], origin

        for origin in ("https://evil.example", "http://app.example"):
            r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers={"Origin": origin})
            assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
            r = await http.get("/v1/threads", headers={"Origin": origin})
            assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    assert await thread_count(d) == 4

    url = f"{d.ws_url}/v1/threads/{thread['id']}/ws"
    conn = await websockets.connect(
        url, origin=app, open_timeout=STEP_TIMEOUT, subprotocols=["agent-bridge.v1", f"bearer.{TOKEN}"]
    )
    assert conn.subprotocol == "agent-bridge.v1"
    await conn.close()
    with pytest.raises(websockets.exceptions.InvalidStatus) as info:
        await websockets.connect(
            url,
            origin="https://evil.example",
            open_timeout=STEP_TIMEOUT,
            subprotocols=["agent-bridge.v1", f"bearer.{TOKEN}"],
        )
    assert info.value.response.status_code == 403


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "line",
    [
        'allowed_hosts = ["http://bridge.example"]',
        'allowed_hosts = ["bridge.example:99999"]',
        'allowed_origins = ["app.example"]',
        'allowed_origins = ["https://app.example/path"]',
        'allowed_origins = ["null"]',
    ],
)
def test_malformed_allowlists_refuse_to_start(tmp_path: Path, line: str) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[server]\n{line}\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bridge",
            "serve",
            "--port",
            "0",
            "--config",
            str(cfg),
            "--data-dir",
            str(tmp_path / "d"),
            "--token",
            TOKEN,
        ],
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT,
        check=False,
    )
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    assert "[server]" in r.stderr and ("allowed_hosts" in r.stderr or "allowed_origins" in r.stderr)


async def test_no_auth_on_loopback_still_checks_host_and_origin(tmp_path: Path) -> None:
    """With --no-auth (loopback only), Host and Origin are all that stop a web page."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_BRIDGE_", "AWP_"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "serve",
        "--no-auth",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "d"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
        cwd=str(tmp_path),
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), STEP_TIMEOUT)).decode().strip()
        url = line.removeprefix("agent-bridge listening on ")
        port = urlsplit(url).port
        async with httpx.AsyncClient(base_url=url, timeout=STEP_TIMEOUT) as http:
            r = await http.post("/v1/threads", json={}, headers={"Host": f"evil.example:{port}"})
            assert r.status_code == 421 and error_code(r.text) == "host_not_allowed"
            r = await http.post("/v1/threads", json={}, headers={"Origin": "https://evil.example"})
            assert r.status_code == 403 and error_code(r.text) == "origin_not_allowed"
            assert (await http.get("/v1/threads")).json()["threads"] == []
            r = await http.post("/v1/threads", json={}, headers={"Origin": url})
            assert r.status_code == 201, r.text
            with pytest.raises(websockets.exceptions.InvalidStatus) as info:
                await websockets.connect(
                    f"ws://127.0.0.1:{port}/v1/threads/{r.json()['id']}/ws",
                    origin="https://evil.example",
                    open_timeout=STEP_TIMEOUT,
                )
            assert info.value.response.status_code == 403
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


async def test_browser_sessions_survive_a_restart_but_not_a_logout_or_a_new_token(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    """A page stays signed in across a daemon restart (same data dir, same token); a
    session logged out stays dead after one; a new token ends every session. Only a keyed
    hash of a session id is stored, never the id."""
    cfg = base_config(tmp_path, agent_env)
    d1 = await daemon_factory(cfg)
    kept, dropped = await login(d1), await login(d1)
    async with anon(d1, Cookie=f"{COOKIE}={dropped}") as http:
        assert (await http.delete("/v1/session")).status_code == 204
    assert await d1.stop() == 0
    db = (d1.data_dir / "bridge.db").read_bytes()
    assert kept.encode() not in db and dropped.encode() not in db

    d2 = await daemon_factory(cfg)
    for sid, status in ((kept, 200), (dropped, 401)):
        async with anon(d2, Cookie=f"{COOKIE}={sid}") as http:
            assert (await http.get("/v1/threads")).status_code == status, sid == kept
    assert await d2.stop() == 0

    d3 = await daemon_factory(cfg, token="another-token-" + secrets.token_hex(16))
    async with anon(d3, Cookie=f"{COOKIE}={kept}") as http:
        r = await http.get("/v1/threads")
        assert r.status_code == 401 and error_code(r.text) == "unauthorized"
