"""Input hardening and secret hygiene through a real daemon (issue #6 items 5 and 6).

Whatever a client sends — oversized or deeply nested bodies, huge WebSocket frames, odd
thread ids, bad cursors, malformed content blocks — the daemon answers with a clear 4xx (or
``client.rejected`` / a documented close code) and the standard error body, never a 500;
it stays healthy, nothing is spawned and the thread's transcript is unchanged. And no
credential (the token, the session cookie, an agent profile's API key) ever reaches the
daemon's logs or its data directory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
import websockets.exceptions
from conftest import (
    STEP_TIMEOUT,
    Client,
    Daemon,
    agent_log,
    new_thread,
    profile_toml,
)

MiB = 1024 * 1024
MAX_FRAME = 8 * MiB  # a client WebSocket frame (docs/configuration.md, Limits)
UVICORN_MAX_FRAME = 16 * MiB  # beyond it uvicorn itself closes with 1009
DEEP = 100_000  # far beyond any recursion limit

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()


# --------------------------------------------------------------------------- helpers


def assert_error(
    r: httpx.Response, statuses: tuple[int, ...], codes: tuple[str, ...] | None = None, what: object = ""
) -> str:
    """``r`` is one of ``statuses`` with the standard body ``{"error": {"code", "message"}}``."""
    assert r.status_code in statuses, (what, r.status_code, r.text[:300])
    try:
        body = r.json()
    except ValueError:
        raise AssertionError(f"{what}: error body is not JSON: {r.text[:300]!r}") from None
    assert isinstance(body, dict) and set(body) == {"error"}, (what, body)
    err = body["error"]
    assert isinstance(err, dict) and isinstance(err.get("code"), str) and err["code"], (what, body)
    assert isinstance(err.get("message"), str), (what, body)
    if codes is not None:
        assert err["code"] in codes, (what, err)
    return str(err["code"])


class Findings(list[str]):
    """Every offending input of a table-driven test, reported together at the end."""

    def error(
        self,
        r: httpx.Response | BaseException,
        statuses: tuple[int, ...],
        codes: tuple[str, ...] | None = None,
        what: object = "",
    ) -> str | None:
        if isinstance(r, BaseException):
            self.append(f"{what}: no response ({r!r})")
            return None
        try:
            return assert_error(r, statuses, codes, what)
        except AssertionError as exc:
            self.append(str(exc)[:400])
            return None

    def check(self) -> None:
        assert not self, f"{len(self)} offending input(s):\n" + "\n".join(self)


async def fetch(d: Daemon, method: str, url: str, **kw: Any) -> httpx.Response | httpx.HTTPError:
    """One request on its own connection: a 500 makes uvicorn drop the connection, which
    must not turn the next, unrelated request into a transport error."""
    async with d.http() as http:
        try:
            r = await http.request(method, url, **kw)
            await r.aread()
            return r
        except httpx.HTTPError as exc:
            return exc


def log_problems(text: str) -> list[str]:
    """Lines of the daemon's stderr (JSON logs) that are a traceback, not JSON, or at
    error level or above."""
    problems = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            problems.append(line)
            continue
        if (
            not isinstance(entry, dict)
            or str(entry.get("level", "")).lower() in ("error", "critical", "exception", "fatal")
            or "exception" in entry
        ):
            problems.append(line)
    return problems


async def assert_healthy(d: Daemon) -> None:
    assert d.proc is not None and d.proc.returncode is None, "the daemon died"
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as anon:
        r = await anon.get("/healthz")
        assert (r.status_code, r.json()) == (200, {"status": "ok"})
    problems = log_problems(d.stderr())
    assert not problems, "the daemon logged problems:\n" + "\n".join(problems[:40])


def spawned(tmp_path: Path) -> int:
    return sum(1 for e in agent_log(tmp_path) if e.get("event") == "start")


def stdin_lines(tmp_path: Path) -> int:
    return sum(1 for e in agent_log(tmp_path) if e.get("event") == "stdin")


async def get_thread(http: httpx.AsyncClient, tid: str) -> dict[str, Any]:
    r = await http.get(f"/v1/threads/{tid}")
    assert r.status_code == 200, r.text
    return dict(r.json())


async def transcript(http: httpx.AsyncClient, tid: str) -> list[dict[str, Any]]:
    r = await http.get(f"/v1/threads/{tid}/events", params={"after": 0, "limit": 1000})
    assert r.status_code == 200, r.text
    return list(r.json()["events"])


async def reply(c: Client, timeout: float = STEP_TIMEOUT) -> dict[str, Any]:
    return await c.next(lambda f: f.get("kind") in ("client.accepted", "client.rejected"), timeout)


async def closed_with(conn: Any, timeout: float = STEP_TIMEOUT) -> int | None:
    """Read until the server closes; the close code it sent (None: no close frame)."""
    with pytest.raises(websockets.exceptions.ConnectionClosed) as info:
        while True:
            await asyncio.wait_for(conn.recv(), timeout)
    return info.value.rcvd.code if info.value.rcvd is not None else None


def nested(depth: int, open_: str = "[", close: str = "]") -> str:
    return open_ * depth + close * depth


# --------------------------------------------------------------------------- REST bodies


async def test_oversized_rest_body_is_refused_with_413(daemon: Daemon, tmp_path: Path) -> None:
    thread = await new_thread(daemon, "stream-json")
    tid = thread["id"]
    big = json.dumps({"text": "x" * (20 * MiB)}).encode()

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the limit must still hold
        for i in range(0, len(big), MiB):
            yield big[i : i + MiB]

    found = Findings()
    async with daemon.http() as http:
        before = await get_thread(http, tid)
    headers = {"Content-Type": "application/json"}
    # A valid prompt, only too big: nothing but its size can refuse it.
    for what, content in (("messages", big), ("messages chunked", chunked())):
        r = await fetch(daemon, "POST", f"/v1/threads/{tid}/messages", content=content, headers=headers)
        found.error(r, (413,), what=what)
    # Bodies that are invalid anyway: any clear 4xx, but read no further than the limit.
    for method, url, body in (
        ("POST", "/v1/threads", {"agent": "stream-json", "title": "t" * (20 * MiB)}),
        ("PATCH", f"/v1/threads/{tid}", {"title": "t" * (20 * MiB)}),
        ("POST", f"/v1/threads/{tid}/permissions/r", {"decision": "allow", "message": "m" * (20 * MiB)}),
    ):
        r = await fetch(daemon, method, url, content=json.dumps(body).encode(), headers=headers)
        found.error(r, (400, 404, 413), what=(method, url))
    found.check()
    async with daemon.http() as http:
        assert await get_thread(http, tid) == before
        assert await transcript(http, tid) == []
    assert spawned(tmp_path) == 0
    await assert_healthy(daemon)
    # The limit is not so low that an ordinary large prompt is refused.
    async with daemon.http() as http:
        r = await http.post(f"/v1/threads/{tid}/messages", json={"text": "y" * (256 * 1024)})
        assert r.status_code == 202, r.text[:300]


DEEP_BODIES: list[tuple[str, str]] = [
    ("array", nested(DEEP)),
    ("object", '{"a":' * DEEP + "1" + "}" * DEEP),
    ("content", '{"content":' + nested(DEEP) + "}"),
    ("content block", '{"content":[{"type":"text","text":' + nested(DEEP) + "}]}"),
    ("client_id", '{"text":"hi","client_id":' + nested(DEEP) + "}"),
    ("near the recursion limit", '{"content":[' + nested(990) + "]}"),
    ("deep but parseable", '{"content":[' + nested(900) + "]}"),
]


async def test_deeply_nested_rest_bodies_are_400(daemon: Daemon, tmp_path: Path) -> None:
    thread = await new_thread(daemon, "stream-json")
    tid = thread["id"]
    headers = {"Content-Type": "application/json"}
    found = Findings()
    async with daemon.http() as http:
        before = await get_thread(http, tid)
    for what, body in DEEP_BODIES:
        r = await fetch(daemon, "POST", f"/v1/threads/{tid}/messages", content=body, headers=headers)
        found.error(r, (400,), what=what)
    for what, body in (
        ("options", '{"agent":"stream-json","options":{"system_prompt":' + nested(DEEP) + "}}"),
        ("options near the limit", '{"agent":"stream-json","options":{"allowed_tools":' + nested(985) + "}}"),
        ("agent", '{"agent":' + nested(DEEP) + "}"),
    ):
        found.error(await fetch(daemon, "POST", "/v1/threads", content=body, headers=headers), (400,), what=what)
    r = await fetch(daemon, "PATCH", f"/v1/threads/{tid}", content='{"title":' + nested(DEEP) + "}", headers=headers)
    found.error(r, (400,), what="patch")
    r = await fetch(
        daemon,
        "POST",
        f"/v1/threads/{tid}/permissions/req_1",
        content='{"decision":' + nested(DEEP) + "}",
        headers=headers,
    )
    found.error(r, (400,), what="permission")
    found.check()
    async with daemon.http() as http:
        assert await get_thread(http, tid) == before
        assert [t["id"] for t in (await http.get("/v1/threads")).json()["threads"]] == [tid]
    assert spawned(tmp_path) == 0
    await assert_healthy(daemon)


# --------------------------------------------------------------------------- WebSocket frames


async def test_deeply_nested_websocket_frames_are_rejected(daemon: Daemon, tmp_path: Path) -> None:
    thread = await new_thread(daemon, "stream-json")
    c = await daemon.ws(thread["id"])
    frames = [
        nested(DEEP),
        '{"op":' * DEEP + "1" + "}" * DEEP,
        '{"op":"prompt","content":' + nested(DEEP) + "}",
        '{"op":"prompt","content":[' + nested(950) + "]}",
        '{"op":"prompt","text":' + nested(DEEP) + "}",
        '{"op":"raw","message":' + '{"a":' * DEEP + "1" + "}" * DEEP + "}",
        '{"op":"permission","request_id":' + nested(DEEP) + ',"decision":"allow"}',
    ]
    for frame in frames:
        await c.conn.send(frame)
        got = await reply(c)
        assert got["kind"] == "client.rejected" and got["data"]["code"], (frame[:60], got)
    # The socket still works.
    await c.send(op="interrupt")
    got = await reply(c)
    assert got["kind"] == "client.accepted" and got["data"]["active"] is False
    await c.close()
    async with daemon.http() as http:
        assert (await get_thread(http, thread["id"]))["last_seq"] == 0
    assert spawned(tmp_path) == 0
    await assert_healthy(daemon)


async def test_websocket_frames_over_8_mib_are_refused(daemon: Daemon, tmp_path: Path) -> None:
    thread = await new_thread(daemon, "stream-json")
    c = await daemon.ws(thread["id"])
    await c.send(op="prompt", text="z" * (MAX_FRAME + 1))
    got = await reply(c, 30)
    assert (got["kind"], got["data"]["code"]) == ("client.rejected", "frame_too_large")
    await c.conn.send(b"\0" * (MAX_FRAME + 1))
    got = await reply(c, 30)
    assert got["kind"] == "client.rejected", got
    await c.send(op="interrupt")  # the socket is still usable
    assert (await reply(c))["kind"] == "client.accepted"
    # Beyond uvicorn's own limit the frame never reaches the bridge: close 1009 (which may
    # arrive while the client is still sending it: uncompressed, it is 16 MiB on the wire).
    with contextlib.suppress(websockets.ConnectionClosed):
        await c.conn.send("[" + " " * UVICORN_MAX_FRAME + "]")
    assert await closed_with(c.conn, 30) == 1009
    # Raw mode has no reply frames: an oversized frame closes the socket with 1009.
    raw = await daemon.ws(thread["id"], mode="raw")
    await raw.conn.send(json.dumps({"type": "user", "pad": "z" * (MAX_FRAME + 1)}))
    assert await closed_with(raw.conn, 30) == 1009
    async with daemon.http() as http:
        assert (await get_thread(http, thread["id"]))["last_seq"] == 0
    assert spawned(tmp_path) == 0
    await assert_healthy(daemon)


async def test_raw_mode_bad_frame_closes_even_while_the_transcript_replays(daemon: Daemon, tmp_path: Path) -> None:
    """A raw-mode client whose first frame is not a JSON object gets close 1003 at once,
    even when the server is still replaying the transcript to it. (A cancelled sender
    must not survive its connection: the handler would then wait for it forever.)"""
    thread = await new_thread(daemon, "stream-json")
    c = await daemon.ws(thread["id"])
    await c.turn("flood 300")
    await c.close()
    for i in range(15):
        conn = await websockets.connect(
            f"{daemon.ws_url}/v1/threads/{thread['id']}/ws?mode=raw",
            additional_headers=daemon.headers,
            max_size=None,
            open_timeout=STEP_TIMEOUT,
        )
        try:
            await conn.send("[1]")
            try:
                code = await closed_with(conn, 5)
            except TimeoutError:
                raise AssertionError(f"attempt {i}: no close within 5 s of a non-object raw frame") from None
            assert code == 1003, f"attempt {i}: closed with {code}"
        finally:
            await conn.close()
    await assert_healthy(daemon)


async def test_a_deeply_nested_raw_message_does_not_poison_the_transcript(daemon: Daemon) -> None:
    """A raw message nested a few hundred levels deep (accepted or refused) must not make
    the thread's transcript unreadable over REST afterwards."""
    for depth in (300, 970):
        thread = await new_thread(daemon, "stream-json")
        c = await daemon.ws(thread["id"])
        await c.conn.send('{"op":"raw","message":{"type":"x","a":' + nested(depth) + "}}")
        await reply(c)
        await c.close()
        raw = await daemon.ws(thread["id"], mode="raw")
        await raw.conn.send('{"type":"y","b":' + nested(depth) + "}")
        # Deeper than the bridge takes (128 levels): the raw socket is closed with the
        # documented 1003, and nothing reached the agent or the transcript.
        assert await closed_with(raw.conn) == 1003, depth
        async with daemon.http() as http:
            for params in ({"after": 0}, {"after": 0, "limit": 1}):
                r = await http.get(f"/v1/threads/{thread['id']}/events", params=params)
                assert r.status_code == 200, (depth, params, r.status_code, r.text[:200])
    await assert_healthy(daemon)


SURROGATE_FRAMES = [
    '{"op":"prompt","text":"\\ud800 a lone surrogate"}',
    '{"op":"prompt","content":[{"type":"text","text":"\\udfff"}]}',
    '{"op":"prompt","text":"hi","client_id":"\\ud800"}',
    '{"op":"raw","message":{"type":"x","k":"\\udc00"}}',
    '{"op":"raw","message":{"\\ud800":1}}',
    '{"op":"permission","request_id":"\\ud800","decision":"allow"}',
    '{"op":"interrupt","client_id":"\\ud800"}',
    '{"op":"\\ud800"}',
]


async def test_lone_surrogates_never_break_a_thread(daemon: Daemon) -> None:
    """JSON may carry a lone surrogate (``"\\ud800"``), which UTF-8 cannot: each such frame
    still gets exactly one reply, and the thread's transcript stays readable over REST."""
    found = Findings()
    for frame in SURROGATE_FRAMES:
        thread = await new_thread(daemon, "stream-json")
        tid = thread["id"]
        c = await daemon.ws(tid)
        await c.conn.send(frame)
        try:
            got = await reply(c, 10)
            if got["kind"] == "client.accepted" and got["data"].get("op") == "prompt":
                await c.kind("turn.ended", turn_id=got["data"]["turn_id"])
        except (websockets.exceptions.ConnectionClosed, AssertionError) as exc:
            found.append(f"{frame}: no reply ({exc!r})"[:300])
        await c.close()
        for url in (f"/v1/threads/{tid}", f"/v1/threads/{tid}/events", "/v1/threads"):
            r = await fetch(daemon, "GET", url)
            if isinstance(r, BaseException) or r.status_code != 200:
                found.append(f"{frame}: then GET {url} -> {r if isinstance(r, BaseException) else r.status_code}")
    for body in (
        '{"text":"\\ud800 x"}',
        '{"content":[{"type":"text","text":"\\udfff"}]}',
        '{"text":"x","client_id":"\\udc00"}',
    ):
        tid = (await new_thread(daemon, "stream-json"))["id"]
        r = await fetch(
            daemon, "POST", f"/v1/threads/{tid}/messages", content=body, headers={"Content-Type": "application/json"}
        )
        if isinstance(r, BaseException) or r.status_code >= 500:
            found.append(f"POST {body}: {r if isinstance(r, BaseException) else r.status_code}")
        r = await fetch(daemon, "GET", f"/v1/threads/{tid}/events", params={"wait": 2})
        if isinstance(r, BaseException) or r.status_code != 200:
            found.append(f"POST {body}: then GET events -> {r if isinstance(r, BaseException) else r.status_code}")
    found.check()
    await assert_healthy(daemon)


# --------------------------------------------------------------------------- ids and cursors

ODD_IDS = [
    "thr_%00",
    "%00",
    "a" * 10_000,
    "thr_" + "f" * 10_000,
    "%E2%98%83",
    "thr_%F0%9F%92%A9",
    "%ED%A0%80",
    "%FF%FE",
    "thr_%0A",
    "thr_%0D%0ASet-Cookie:%20x=1",
    "thr_0000000000000000",
    "THR_0123456789ABCDEF",
    "thr_'%20OR%20'1'='1",
    "%25",
    "thr_%22%3E%3Cscript%3E",
    "%20",
    "thr_%5C..%5Cetc",
    "thr_" + "%C3%A9" * 2000,
]

THREAD_ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "", None),
    ("PATCH", "", {"title": "x"}),
    ("DELETE", "", None),
    ("POST", "/messages", {"text": "hi"}),
    ("POST", "/interrupt", None),
    ("POST", "/resume", None),
    ("POST", "/stop", None),
    ("GET", "/events", None),
    ("GET", "/events/stream", None),
    ("GET", "/permissions", None),
    ("POST", "/permissions/req_1", {"decision": "allow"}),
    ("GET", "/tasks", None),
]


async def test_odd_thread_ids_are_404_never_500(daemon: Daemon, tmp_path: Path) -> None:
    real = await new_thread(daemon, "stream-json")
    found = Findings()
    async with daemon.http() as http:
        before = await get_thread(http, real["id"])
        for tid in ODD_IDS:
            for method, suffix, body in THREAD_ROUTES:
                try:
                    r = await http.request(method, f"/v1/threads/{tid}{suffix}", json=body)
                except httpx.HTTPError as exc:
                    found.error(exc, (), what=(method, tid[:40], suffix))
                    continue
                found.error(r, (400, 404), what=(method, tid[:40], suffix))
        found.check()
        assert await get_thread(http, real["id"]) == before
        listed = (await http.get("/v1/threads")).json()["threads"]
        assert [t["id"] for t in listed] == [real["id"]]
    for tid in [i for i in ODD_IDS if len(i) < 2000]:
        try:
            c = await daemon.ws(tid)
        except websockets.exceptions.InvalidStatus as exc:  # refused before the upgrade
            assert 400 <= exc.response.status_code < 500, (tid, exc.response.status_code)
            continue
        assert await closed_with(c.conn) == 4404, tid
    assert spawned(tmp_path) == 0
    await assert_healthy(daemon)


async def test_a_client_that_leaves_right_after_the_upgrade_causes_no_traceback(daemon: Daemon) -> None:
    """The server's close (4404 / 4400) racing a client that already left is not an error."""
    host, port = daemon.url.removeprefix("http://").rsplit(":", 1)
    for path in ("/v1/threads/thr_0000000000000000/ws", "/v1/threads/nope/ws?mode=bogus"):
        for _ in range(10):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                (
                    f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                    f"Authorization: Bearer {daemon.token}\r\nUpgrade: websocket\r\n"
                    "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    "Sec-WebSocket-Version: 13\r\n\r\n"
                ).encode()
            )
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP_TIMEOUT)
            assert head.startswith(b"HTTP/1.1 101"), head
            writer.transport.abort()  # gone, without a close frame
    await assert_healthy(daemon)
    # A graceful stop waits for every connection handler, so the whole log is in.
    assert await daemon.stop() == 0
    problems = log_problems(daemon.stderr())
    assert not problems, "the daemon logged problems:\n" + "\n".join(problems[:40])


def upgrade_request(host: str, port: str, path: str, extra: str = "", token: str = "") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}Upgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        f"Sec-WebSocket-Version: 13\r\n{extra}\r\n"
    ).encode()


async def raw_response(host: str, port: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` on a fresh connection; the status, headers and body of the answer
    (the server must answer and close within the step timeout)."""
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), STEP_TIMEOUT)  # until the server closes
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)}
    return int(status_line.split()[1]), headers, body


async def test_oversized_upgrade_requests_get_a_clear_answer(daemon: Daemon, tmp_path: Path) -> None:
    """A WebSocket upgrade whose request line or headers are too big for the handshake
    parser is answered (414 / 431, error body) and closed, instead of left hanging."""
    thread = await new_thread(daemon, "stream-json")
    host, port = daemon.url.removeprefix("http://").rsplit(":", 1)
    path = f"/v1/threads/{thread['id']}/ws"
    cases = [
        (upgrade_request(host, port, path, f"X-Big: {'a' * 9000}\r\n", daemon.token), 431, "headers_too_large"),
        (upgrade_request(host, port, path, f"X-Big: {'a' * 70_000}\r\n", daemon.token), 431, "headers_too_large"),
        (
            upgrade_request(host, port, path, "".join(f"X-H{i}: v\r\n" for i in range(140)), daemon.token),
            431,
            "headers_too_large",
        ),
        (
            upgrade_request(host, port, path + "?after=0&pad=" + "x" * 9000, token=daemon.token),
            414,
            "request_line_too_long",
        ),
    ]
    for request, status, code in cases:
        got, headers, body = await raw_response(host, port, request)
        assert (got, headers.get("content-type")) == (status, "application/json"), (got, headers, body[:200])
        assert json.loads(body)["error"]["code"] == code
    # Refusals by the app itself (no credentials) are answered too, and are not errors.
    got, _, body = await raw_response(host, port, upgrade_request(host, port, path))
    assert got == 401 and json.loads(body)["error"]["code"] == "unauthorized", body
    assert spawned(tmp_path) == 0
    async with daemon.http() as http:
        r = await http.get(f"/v1/threads/{thread['id']}/events", params={"after": 0})
        assert r.json()["events"] == []
    assert await daemon.stop() == 0
    problems = log_problems(daemon.stderr())
    assert not problems, "the daemon logged problems:\n" + "\n".join(problems[:40])


# "²" is a digit to str.isdigit() but not to int().
BAD_AFTER = [
    "-1",
    "abc",
    "1" * 10_000,
    "9223372036854775808",
    "99999999999999999999999",
    "1e3",
    "0x10",
    "1.5",
    "nan",
    "%00",
    "²",
    "¹²",
]


async def test_invalid_cursors_and_after_values_are_400(daemon: Daemon, tmp_path: Path) -> None:
    thread = await new_thread(daemon, "stream-json")
    tid = thread["id"]
    codes = ("invalid_cursor", "invalid_request")
    found = Findings()
    events = f"/v1/threads/{tid}/events"
    for value in BAD_AFTER:
        found.error(
            await fetch(daemon, "GET", events, params={"after": value}),
            (400,),
            codes,
            what=("events after", value[:30]),
        )
        for what, kw in (
            ("sse after", {"params": {"after": value}}),
            ("sse Last-Event-ID", {"headers": {"Last-Event-ID": value.encode("latin-1")}}),
        ):
            async with daemon.http() as http, http.stream("GET", f"{events}/stream", **kw) as resp:
                if resp.status_code == 200:
                    found.append(f"{what} {value[:30]!r}: accepted as a stream")
                    continue
                await resp.aread()
                found.error(resp, (400,), codes, what=(what, value[:30]))
    for params in (
        {"limit": "-1"},
        {"limit": "0"},
        {"limit": "99999999999999999999"},
        {"limit": "x"},
        {"wait": "-1"},
        {"wait": "nan"},
        {"wait": "inf"},
        {"wait": "1e309"},
        {"wait": "61"},
    ):
        found.error(await fetch(daemon, "GET", events, params=params), (400,), codes, what=params)
    bad_cursors = [
        "-1",
        "x" * 10_000,
        "!!",
        "%00",
        "W10",
        "WyJhIiwxXQ",
        "bnVsbA",
        "e30",
        base64.urlsafe_b64encode(json.dumps(["a", "b", "c"]).encode()).decode(),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
        base64.urlsafe_b64encode(nested(300).encode()).decode(),
    ]
    for cursor in bad_cursors:
        found.error(
            await fetch(daemon, "GET", "/v1/threads", params={"cursor": cursor}),
            (400,),
            codes,
            what=("cursor", cursor[:30]),
        )
    for params in ({"limit": "0"}, {"limit": "201"}, {"limit": "-5"}, {"limit": "1" * 500}, {"agent": "a" * 10_000}):
        found.error(await fetch(daemon, "GET", "/v1/threads", params=params), (400,), codes, what=params)
    # (Longer than ~8 KiB, the request line meets test_very_long_websocket_path_… instead.)
    for value in ["-1", "abc", "9223372036854775808", "1" * 4_000, "%C2%B2", "1e3"]:
        c = await daemon.ws(tid, after=value)  # type: ignore[arg-type]
        code = await closed_with(c.conn)
        if code != 4400:
            found.append(f"websocket after={value[:30]}: closed with {code}, not 4400")
    found.check()
    for mode in ("bogus", "RAW", "", "events%00"):
        c = await daemon.ws(tid, mode=mode)
        assert await closed_with(c.conn) == 4400, mode
    assert spawned(tmp_path) == 0
    await assert_healthy(daemon)


# --------------------------------------------------------------------------- content blocks


def _img(media_type: Any = "image/png", data: Any = PNG, stype: Any = "base64") -> dict[str, Any]:
    return {"type": "image", "source": {"type": stype, "media_type": media_type, "data": data}}


def _doc(media_type: Any = "application/pdf", data: Any = PNG) -> dict[str, Any]:
    return {"type": "document", "source": {"type": "base64", "media_type": media_type, "data": data}}


BAD_BLOCKS: list[Any] = [
    # unknown or malformed types
    {"type": "video"},
    {"type": "tool_use", "id": "t", "name": "Bash", "input": {}},
    {"type": "tool_result", "tool_use_id": "t", "content": "x"},
    {"type": "thinking", "thinking": "x"},
    {"type": ""},
    {"type": None},
    {"type": 5},
    {"type": "TEXT", "text": "x"},
    {"type": ["text"]},
    {},
    {"text": "no type"},
    # text blocks with the wrong field types
    {"type": "text"},
    {"type": "text", "text": 5},
    {"type": "text", "text": None},
    {"type": "text", "text": ["a"]},
    {"type": "text", "text": {"nested": {"junk": [1, 2]}}},
    # bad base64
    _img(data="not base64!"),
    _img(data="aGk"),
    _img(data="aGk=\n"),
    _img(data=""),
    _img(data=5),
    _img(data=None),
    _img(data="é"),
    _img(data="====" * 10),
    _img(data=["aGk="]),
    _doc(data="%%%"),
    # wrong media types
    _img(media_type="image/svg+xml"),
    _img(media_type="text/html"),
    _img(media_type="IMAGE/PNG"),
    _img(media_type="image/png; charset=x"),
    _img(media_type=None),
    _img(media_type=""),
    _img(media_type="application/pdf"),
    _doc(media_type="application/x-sh"),
    _doc(media_type="text/html"),
    _doc(media_type="image/png"),
    _doc(media_type=["text/plain"]),
    # sources that are not inline base64
    {"type": "image", "source": {"type": "url", "url": "http://example.invalid/x.png"}},
    {"type": "image", "source": {"type": "url", "url": "file:///etc/passwd", "media_type": "image/png"}},
    {"type": "document", "source": {"type": "file", "file_id": "file_123"}},
    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "hello"}},
    _img(stype="BASE64"),
    _img(stype=None),
    {"type": "image", "source": "base64"},
    {"type": "image", "source": [PNG]},
    {"type": "image"},
    {"type": "image", "url": "http://example.invalid/x.png"},
    # nested junk
    [[["text"]]],
    "hello",
    5,
    None,
    True,
    {"type": {"type": {"type": "text"}}},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": {"nested": [PNG]}}},
]

BAD_BODIES: list[dict[str, Any]] = [
    *({"content": [block]} for block in BAD_BLOCKS),
    {"content": [{"type": "text", "text": "fine"}, *BAD_BLOCKS[:1]]},  # one bad block spoils all
    {"content": [{"type": "text", "text": "a"}] * 65},  # 65 blocks
    {"content": [{"type": "text", "text": "a"}] * 1000},
    {"content": [_img()] * 64 + [{"type": "text", "text": "the 65th"}]},
    {"content": []},
    {"content": "text"},
    {"content": {"type": "text", "text": "a"}},
    {"content": None, "text": None},
    {"text": "a", "content": [{"type": "text", "text": "b"}]},
    {"text": ""},
    {"text": "   "},
    {"text": 5},
    {"text": ["a"]},
    {"text": {"a": 1}},
    {},
]


def _short(body: Any) -> str:
    text = json.dumps(body)
    return text if len(text) < 200 else text[:200] + "…"


async def _refuse_everything(daemon: Daemon, tid: str) -> None:
    found = Findings()
    for body in BAD_BODIES:
        r = await fetch(daemon, "POST", f"/v1/threads/{tid}/messages", json=body)
        code = found.error(r, (400,), ("invalid_content", "invalid_request"), what=_short(body))
        if code and isinstance(body.get("content"), list) and body["content"] and code != "invalid_content":
            found.append(f"{_short(body)}: code {code}, not invalid_content")
    c: Client | None = None
    for body in BAD_BODIES:
        if c is None:
            c = await daemon.ws(tid, after=10**9)
        try:
            await c.send(op="prompt", **body)
            got = await reply(c)
        except (websockets.exceptions.ConnectionClosed, AssertionError) as exc:
            found.append(f"websocket {_short(body)}: no reply ({exc!r})"[:400])
            c = None
            continue
        if got["kind"] != "client.rejected" or got["data"].get("code") not in (
            "invalid_content",
            "invalid_request",
            "invalid_frame",
        ):
            found.append(f"websocket {_short(body)}: {got}")
    if c is not None:
        await c.close()
    found.check()


async def test_bad_content_blocks_are_refused_and_change_nothing(daemon: Daemon, tmp_path: Path) -> None:
    # A thread that never ran: nothing may be spawned, the thread object stays identical.
    fresh = await new_thread(daemon, "stream-json")
    async with daemon.http() as http:
        before = await get_thread(http, fresh["id"])
    await _refuse_everything(daemon, fresh["id"])
    async with daemon.http() as http:
        assert await get_thread(http, fresh["id"]) == before
        assert await transcript(http, fresh["id"]) == []
    assert spawned(tmp_path) == 0

    # A thread with a live agent and a finished turn: nothing more is written to the agent
    # and the transcript does not move.
    live = await new_thread(daemon, "stream-json")
    c = await daemon.ws(live["id"])
    await c.turn("hello")
    await c.close()
    async with daemon.http() as http:
        before = await get_thread(http, live["id"])
        events_before = await transcript(http, live["id"])
    lines_before, starts_before = stdin_lines(tmp_path), spawned(tmp_path)
    await _refuse_everything(daemon, live["id"])
    async with daemon.http() as http:
        after = await get_thread(http, live["id"])
        assert after["last_seq"] == before["last_seq"] and after["turn_active"] is False
        assert await transcript(http, live["id"]) == events_before
    assert (stdin_lines(tmp_path), spawned(tmp_path)) == (lines_before, starts_before)
    await assert_healthy(daemon)

    # The limit is 64: exactly 64 good blocks are accepted.
    async with daemon.http() as http:
        r = await http.post(
            f"/v1/threads/{live['id']}/messages", json={"content": [{"type": "text", "text": "a"}] * 63 + [_img()]}
        )
        assert r.status_code == 202, r.text


async def test_unknown_routes_and_methods_answer_with_the_error_body(daemon: Daemon) -> None:
    thread = await new_thread(daemon, "stream-json")
    found = Findings()
    for method, path, status in (
        ("GET", "/v1/nope", 404),
        ("GET", "/nope", 404),
        ("GET", "/v1/threads/a%2Fb", 404),
        ("PUT", f"/v1/threads/{thread['id']}", 405),
        ("POST", "/healthz", 405),
        ("DELETE", "/v1/agents", 405),
    ):
        found.error(await fetch(daemon, method, path), (status,), what=(method, path))
    json_type = {"Content-Type": "application/json"}
    for what, content in (
        ("truncated JSON", b"{"),
        ("UTF-16 with a BOM", b"\xff\xfe{}"),
        ("not UTF-8", b'{"text": "\xff"}'),
        ("empty", b""),
    ):
        r = await fetch(daemon, "POST", f"/v1/threads/{thread['id']}/messages", content=content, headers=json_type)
        found.error(r, (400,), ("invalid_request",), what=what)
    found.check()
    await assert_healthy(daemon)


# --------------------------------------------------------------------------- secrets (item 6)

API_KEY = "sk-ant-test-SECRETVALUE123456"


async def test_secrets_never_reach_the_logs_or_the_data_dir(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    token = "tok-SECRET-" + secrets.token_hex(16)
    config = "[server]\nstop_grace_s = 2\n" + profile_toml(
        "claude", "stream-json", {**agent_env, "ANTHROPIC_API_KEY": API_KEY}, permission_prompts=True
    )
    d: Daemon = await daemon_factory(config, token=token)
    cookies: list[str] = []

    # 1. REST with the Authorization header: a thread and a whole turn.
    async with d.http() as http:
        r = await http.post("/v1/threads", json={"agent": "claude", "title": "secrets"})
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        r = await http.post(f"/v1/threads/{tid}/messages", json={"text": "hello over rest"})
        assert r.status_code == 202, r.text
        turn_id = r.json()["turn_id"]
        after = 0
        for _ in range(50):
            events = (await http.get(f"/v1/threads/{tid}/events", params={"after": after, "wait": 5})).json()["events"]
            after = events[-1]["seq"] if events else after
            if any(e["kind"] == "turn.ended" and e["data"].get("turn_id") == turn_id for e in events):
                break
        else:
            raise AssertionError("the REST turn never ended")

        # 2. The session cookie, minted by POST /v1/session (issue #6).
        r = await http.post("/v1/session")
        assert r.status_code == 204, r.text
        jar = {k: v for k, v in r.cookies.items()}
        assert jar, r.headers
        cookies += jar.values()
    async with httpx.AsyncClient(base_url=d.url, cookies=jar, timeout=STEP_TIMEOUT) as browser:
        assert (await browser.get(f"/v1/threads/{tid}")).status_code == 200
    cookie_header = "; ".join(f"{k}={v}" for k, v in jar.items())
    conn = await websockets.connect(
        f"{d.ws_url}/v1/threads/{tid}/ws?after={after}",
        additional_headers={"Cookie": cookie_header},
        open_timeout=STEP_TIMEOUT,
        max_size=None,
    )
    by_cookie = Client(conn)
    d.clients.append(by_cookie)
    await by_cookie.turn("hello over a cookie socket")
    await by_cookie.close()

    # 3. The WebSocket subprotocol bearer.<token>: a turn that makes the agent print its
    #    API key (redacted on the way in), and a permission prompt answered over the socket.
    conn = await websockets.connect(
        f"{d.ws_url}/v1/threads/{tid}/ws?after={after}",
        subprotocols=["agent-bridge.v1", f"bearer.{token}"],  # type: ignore[list-item]
        open_timeout=STEP_TIMEOUT,
        max_size=None,
    )
    c = Client(conn)
    d.clients.append(c)
    ended = await c.turn("leak ANTHROPIC_API_KEY")
    assert ended["data"]["status"] == "success"
    # The agent did hold the key (so there was something to leak) and printed it; the
    # bridge showed it redacted.
    starts = [e for e in agent_log(tmp_path) if e["event"] == "start"]
    assert starts and starts[-1]["env"].get("ANTHROPIC_API_KEY") == API_KEY
    assert any("[redacted]" in t for t in c.texts if "the value of ANTHROPIC_API_KEY" in t)
    acc = await c.prompt("ask")
    assert acc["kind"] == "client.accepted"
    req = await c.kind("permission.requested")
    await c.send(op="permission", request_id=req["data"]["request_id"], decision="allow")
    await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert API_KEY not in "".join(c.texts)

    # 4. Wrong credentials, each carrying the real token (or cookie) somewhere in what was sent.
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as anon:
        for headers in (
            {"Authorization": f"Bearer {token}x"},
            {"Authorization": f"Basic {token}"},
            {"Authorization": f"Bearer x{token}"},
            {"Authorization": token},
            {"Cookie": f"agent_bridge_session={token}"},
            {"Authorization": "Bearer wrong", "Cookie": cookie_header},
        ):
            r = await anon.get(f"/v1/threads/{tid}", headers=headers)
            assert_error(r, (401,), ("unauthorized",), what=list(headers))
        r = await anon.post("/v1/session", headers={"Authorization": f"Bearer {token}-not"})
        assert_error(r, (401,), ("unauthorized",), what="login")
    for kwargs in (
        {"subprotocols": ["agent-bridge.v1", f"bearer.{token}0"]},
        {"additional_headers": {"Authorization": f"Bearer {token}0"}},
        {"additional_headers": {"Cookie": f"agent_bridge_session={token}"}},
    ):
        with pytest.raises(websockets.exceptions.InvalidStatus) as info:
            await websockets.connect(f"{d.ws_url}/v1/threads/{tid}/ws", open_timeout=STEP_TIMEOUT, **kwargs)  # type: ignore[arg-type]
        assert info.value.response.status_code == 401

    # 5. Log out, stop the daemon, then look everywhere it writes.
    async with d.http() as http:
        r = await http.delete("/v1/session", headers={"Cookie": cookie_header})
        assert r.status_code == 204
    await c.close()
    assert await d.stop() == 0

    needles = {
        "the token": token,
        "Bearer <token>": f"Bearer {token}",
        "the API key": API_KEY,
        **{f"cookie {i}": v for i, v in enumerate(cookies)},
    }
    logs = d.stderr()
    assert '"daemon.stopped"' in logs  # the log is there to search
    for what, needle in needles.items():
        assert needle not in logs, f"{what} is in the daemon's log"
    assert d.data_dir.is_dir()
    searched = 0
    for path in sorted(d.data_dir.rglob("*")):
        if not path.is_file() or path.name == "token":
            continue
        blob = path.read_bytes()
        searched += 1
        for what, needle in needles.items():
            for form in {needle.encode(), needle.encode("utf-16-le")}:
                assert form not in blob, f"{what} is in {path.relative_to(d.data_dir)}"
    assert searched, "nothing in the data dir to search"


async def test_library_log_lines_are_json_too(daemon: Daemon) -> None:
    """With --log-format json every stderr line is one JSON object, the lines uvicorn
    writes included (here: its warning about a request that is not HTTP)."""
    host, port = daemon.url.removeprefix("http://").rsplit(":", 1)
    got, _, _ = await raw_response(host, port, b"\x16\x03\x01 not http at all\r\n\r\n")
    assert got == 400
    assert await daemon.stop() == 0
    lines = [json.loads(line) for line in daemon.stderr().splitlines() if line.strip()]  # each one JSON
    assert all(isinstance(e, dict) and "event" in e and "level" in e for e in lines), lines
    assert any(e.get("logger") == "uvicorn.error" and e["level"] == "warning" for e in lines), lines
