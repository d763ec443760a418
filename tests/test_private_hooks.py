"""The private hooks of other projects that the hot path leans on, checked one by one, so
that an upgrade which renames or removes one fails here, by name, instead of the daemon
quietly taking its slower fallback.

- CPython asyncio's ``loop._ready`` (the callbacks due in this round of the loop): the
  SQLite store commits an append in place when nothing else is ready
  (``bridge.store.sqlite._loop_idle``); without it every append waits for a group commit.
- uvicorn's sans-I/O websockets protocol (``WebSocketsSansIOProtocol``), which
  ``bridge.api.ws_handshake`` and ``bridge.api.ws_transport`` subclass: the methods they
  override and the attributes they read. Without them ``ws_transport.PROTOCOL`` is None (one
  socket write per frame) or a handshake the parser refuses is left unanswered.

The uvicorn tests run the bridge's protocol class on a real listening socket, in process,
with a tiny ASGI app: the daemon adds nothing these hooks depend on.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvicorn
import websockets.exceptions
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.asyncio.client import connect
from websockets.protocol import State
from websockets.server import ServerProtocol

from bridge.api import ws_handshake, ws_transport
from bridge.protocols.events import Record
from bridge.store.sqlite import SqliteStore, _loop_idle

DEADLINE = 10.0

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


# -- asyncio: loop._ready ---------------------------------------------------------------


def _noop() -> None:
    pass


async def test_the_running_asyncio_loop_keeps_its_ready_callbacks_in_a_sized_ready_queue() -> None:
    loop = asyncio.get_running_loop()
    # The daemon runs on asyncio.run's loop: the same class as a new default loop.
    fresh = asyncio.new_event_loop()
    try:
        assert type(loop) is type(fresh), (type(loop), type(fresh))
    finally:
        fresh.close()
    assert hasattr(loop, "_ready"), f"{type(loop).__name__} has no _ready: the store never commits in place"
    ready = loop._ready
    before = len(ready)
    handle = loop.call_soon(_noop)
    try:
        assert len(ready) == before + 1, "a callback made ready is not in loop._ready"
        assert _loop_idle(loop) is False
    finally:
        handle.cancel()


def test_the_store_sees_an_idle_loop_as_idle_and_a_loop_with_a_ready_callback_as_busy() -> None:
    loop = asyncio.new_event_loop()
    try:
        assert _loop_idle(loop) is True, "an idle loop looks busy: every append goes through a group commit"
        handle = loop.call_soon(_noop)
        assert _loop_idle(loop) is False
        handle.cancel()
    finally:
        loop.close()


async def test_an_append_on_a_quiet_loop_commits_in_place_without_yielding_to_the_loop(tmp_path: Path) -> None:
    """The direct path of ``SqliteStore.append``: with nothing else ready it commits and
    returns on its first step; through the writer (the fallback) it has to wait."""
    store = SqliteStore(tmp_path / "bridge.db", writer="thread")  # the inline path is the thread writer's
    ts = "2026-01-01T00:00:00Z"
    async with asyncio.timeout(DEADLINE):
        await store.open()
        try:
            await store.create_thread(
                {
                    "id": "t1",
                    "agent": "a",
                    "protocol": "stream-json",
                    "cwd": "/tmp",
                    "title": "",
                    "state": "idle",
                    "turn_active": False,
                    "last_seq": 0,
                    "created_at": ts,
                    "updated_at": ts,
                    "options": {},
                }
            )
            in_place = 0
            for seq in range(1, 6):  # a few tries: the writer task may still be on the loop
                await asyncio.sleep(0)
                step = store.append("t1", [Record(seq, ts, "agent", "message.delta", {}, None, False)], [None], {})
                try:
                    step.send(None)
                except StopIteration:
                    in_place += 1  # committed, and not a single yield
                else:
                    step.close()  # it waits for the writer, which commits it all the same
            assert in_place, "no append on a quiet loop committed in place"
        finally:
            await store.close()
    db = sqlite3.connect(tmp_path / "bridge.db")
    try:
        assert db.execute("SELECT count(*) FROM events WHERE thread_id = 't1'").fetchone()[0] == 5
    finally:
        db.close()


# -- uvicorn: the sans-I/O websockets protocol ----------------------------------------


def test_the_bridge_protocol_extends_uvicorn_sansio_protocol_with_this_uvicorn() -> None:
    assert ws_transport.PROTOCOL is not None, "ws_transport could not import what it extends"
    assert issubclass(ws_transport.PROTOCOL, ws_handshake.WebSocketProtocol)
    assert issubclass(ws_handshake.WebSocketProtocol, WebSocketsSansIOProtocol)


@pytest.mark.parametrize(
    ("method", "params", "is_async"),
    [
        ("data_received", ["self", "data"], False),
        ("send", ["self", "message"], True),
        ("handle_connect", ["self", "event"], False),
        # ws_transport's Inbox: the receive side (issue #22)
        ("send_receive_event_to_app", ["self"], False),
        ("handle_parser_exception", ["self"], False),
        ("receive", ["self"], True),
    ],
)
def test_uvicorn_still_defines_each_method_the_bridge_overrides(method: str, params: list[str], is_async: bool) -> None:
    fn = vars(WebSocketsSansIOProtocol).get(method)
    assert fn is not None, f"WebSocketsSansIOProtocol.{method} is gone: the bridge's override is never called"
    assert list(inspect.signature(fn).parameters) == params
    assert inspect.iscoroutinefunction(fn) is is_async


def _config(app: ASGIApp, *, deflate: bool = True) -> uvicorn.Config:
    assert ws_transport.PROTOCOL is not None
    config = uvicorn.Config(
        app,
        ws=ws_transport.PROTOCOL,
        log_config=None,
        lifespan="off",
        proxy_headers=False,
        ws_per_message_deflate=deflate,
    )
    config.load()
    return config


async def test_a_new_uvicorn_protocol_has_every_attribute_the_bridge_reads() -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        pass

    assert ws_transport.PROTOCOL is not None
    proto = ws_transport.PROTOCOL(_config(app), ServerState(), {}, _loop=asyncio.get_running_loop())
    # Read by ws_handshake.WebSocketProtocol and ws_transport.BatchingWebSocketProtocol.
    for name in ("conn", "handshake_complete", "close_sent", "disconnected", "writable", "transport"):
        assert hasattr(proto, name), f"uvicorn's protocol has no {name!r}"
    # Read and replaced by ws_transport's inbox: the ASGI queue (moved over, then replaced
    # by the inbox, which uvicorn keeps calling put_nowait on), the read pause it shares,
    # and the message being assembled.
    assert isinstance(proto.queue, asyncio.Queue)
    assert proto.read_paused is False
    assert proto.frames == [] and proto.curr_msg_data_type in ("text", "bytes")
    assert isinstance(proto.writable, asyncio.Event)
    assert proto.handshake_complete is False and proto.close_sent is False and proto.disconnected is False
    conn = proto.conn
    assert isinstance(conn, ServerProtocol)
    assert conn.handshake_exc is None
    assert conn.state is State.CONNECTING
    assert isinstance(conn.extensions, list)
    assert callable(conn.data_to_send) and callable(conn.send_text)
    # ws_handshake maps the parser's refusals to a status by exception class name.
    for name in ws_handshake._REFUSALS:
        assert isinstance(getattr(websockets.exceptions, name, None), type), f"websockets has no {name}"


@asynccontextmanager
async def serving(app: ASGIApp, *, deflate: bool = True) -> AsyncIterator[tuple[int, ServerState]]:
    """The bridge's protocol class on a real socket (127.0.0.1, a free port); yields the port
    and the server state (its ``tasks``: the app's running calls)."""
    assert ws_transport.PROTOCOL is not None
    protocol = ws_transport.PROTOCOL
    loop = asyncio.get_running_loop()
    config, state = _config(app, deflate=deflate), ServerState()
    server = await loop.create_server(lambda: protocol(config, state, {}, _loop=loop), "127.0.0.1", 0)
    try:
        sock: socket.socket = server.sockets[0]
        yield sock.getsockname()[1], state
    finally:
        server.close()
        for task in list(state.tasks):
            task.cancel()
        await server.wait_closed()


@pytest.mark.parametrize("compression", ["deflate", None])
async def test_a_real_handshake_offers_the_batched_send_and_its_frames_arrive_in_order(compression: str | None) -> None:
    scopes: list[Scope] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        scopes.append(scope)
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        send_texts = scope["extensions"].get(ws_transport.SEND_TEXTS)
        if send_texts is None:  # the test below says so
            await send({"type": "websocket.close", "code": 1011})
            return
        await send_texts(["one", "twö", "three"])
        await send_texts([b"four"])
        await send({"type": "websocket.close", "code": 1000})

    async with asyncio.timeout(DEADLINE), serving(app) as (port, _):
        async with connect(f"ws://127.0.0.1:{port}/x", compression=compression) as ws:
            got = [await ws.recv() for _ in range(4)]
            negotiated = ws.protocol.extensions
        assert ws_transport.SEND_TEXTS in scopes[0]["extensions"], "the handshake no longer installs the batched send"
        assert got == ["one", "twö", "three", "four"]
        assert bool(negotiated) is (compression is not None)


async def _raw(port: int, request: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        data = await reader.read()  # until the server closes
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _upgrade(path: str = "/x", headers: str = "") -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{headers}\r\n"
    ).encode()


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (_upgrade("/x?pad=" + "x" * 9000), 414, "request_line_too_long"),
        (_upgrade(headers=f"X-Big: {'a' * 9000}\r\n"), 431, "headers_too_large"),
        (_upgrade(headers="".join(f"X-H{i}: v\r\n" for i in range(140))), 431, "headers_too_large"),
        (b"\x16\x03\x01 not http at all\r\n\r\n", 400, "bad_request"),
    ],
)
async def test_an_upgrade_the_parser_refuses_is_answered_with_the_bridge_error_body(
    request_bytes: bytes, status: int, code: str
) -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        raise AssertionError("the app must not see a refused handshake")

    async with asyncio.timeout(DEADLINE), serving(app) as (port, _):
        got_status, body = await _raw(port, request_bytes)
    assert (got_status, orjson.loads(body)["error"]["code"]) == (status, code)


async def test_an_upgrade_the_app_refuses_with_http_logs_no_handshake_error(caplog: pytest.LogCaptureFixture) -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.http.response.start", "status": 403, "headers": [(b"content-length", b"2")]})
        await send({"type": "websocket.http.response.body", "body": b"no"})

    with caplog.at_level(logging.ERROR, logger="uvicorn.error"):
        async with asyncio.timeout(DEADLINE), serving(app) as (port, state):
            status, body = await _raw(port, _upgrade())
            if state.tasks:  # the app's call, and uvicorn's check after it returns
                await asyncio.wait(list(state.tasks))
    assert (status, body) == (403, b"no")
    assert not [r for r in caplog.records if "handshake" in r.getMessage()], caplog.text
