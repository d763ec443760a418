"""The WebSocket receive side outside the ASGI queue (issue #22, api/ws_transport.py): after
the handshake the handler reads client messages from the connection's ``Inbox``, filled by
the protocol's ``data_received``. Each test runs the bridge's protocol class on a real
listening socket, in process, with a tiny ASGI app, and a real websockets client."""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvicorn
import websockets
from conftest import wait_until
from uvicorn.server import ServerState
from websockets.asyncio.client import connect

from bridge.api import ws_transport
from bridge.api.ws_transport import FEED_BYTES, RECEIVE, Inbox

DEADLINE = 20.0
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


@asynccontextmanager
async def serving(app: ASGIApp, *, max_size: int = 16 * 1024 * 1024) -> AsyncIterator[int]:
    protocol = ws_transport.PROTOCOL
    assert protocol is not None
    config = uvicorn.Config(app, ws=protocol, log_config=None, lifespan="off", ws_max_size=max_size)
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: protocol(config, state, {}, _loop=loop), "127.0.0.1", 0)
    try:
        sock: socket.socket = server.sockets[0]
        yield sock.getsockname()[1]
    finally:
        server.close()
        for task in list(state.tasks):
            task.cancel()
        await server.wait_closed()


class Probe:
    """An app that accepts, takes the inbox and hands it to the test."""

    def __init__(self, before_inbox: Callable[[Any], Awaitable[None]] | None = None) -> None:
        self.inbox: asyncio.Future[Inbox] = asyncio.get_running_loop().create_future()
        self.receive: Callable[[], Awaitable[Any]] | None = None
        self.release = asyncio.Event()
        self._before = before_inbox

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        direct = scope["extensions"][RECEIVE]
        if self._before is not None:
            await self._before(direct.__self__)
        self.receive = receive
        self.inbox.set_result(direct())
        await self.release.wait()


async def test_client_messages_arrive_in_order_as_text_and_bytes_and_a_close_as_disconnect() -> None:
    probe = Probe()
    async with asyncio.timeout(DEADLINE), serving(probe) as port:
        async with connect(f"ws://127.0.0.1:{port}/x") as ws:
            inbox = await probe.inbox
            await ws.send("one")
            await ws.send(b"\x00two")
            await ws.send("thrée")
            assert [await inbox.get() for _ in range(3)] == ["one", b"\x00two", "thrée"]
        event = await inbox.get()
        assert isinstance(event, dict) and event["type"] == "websocket.disconnect"
        # The ASGI receive is not a second way in once the inbox is taken.
        assert probe.receive is not None
        with pytest.raises(RuntimeError, match="inbox"):
            await probe.receive()
        probe.release.set()


async def test_messages_that_arrived_before_the_inbox_was_taken_come_first_and_in_order() -> None:
    async def until_three_queued(proto: Any) -> None:
        await wait_until(lambda: proto.queue.qsize() >= 3, timeout=DEADLINE)

    probe = Probe(until_three_queued)
    async with asyncio.timeout(DEADLINE), serving(probe) as port:
        async with connect(f"ws://127.0.0.1:{port}/x") as ws:
            for text in ("a", "b", "c"):
                await ws.send(text)
            inbox = await probe.inbox
            await ws.send("d")
            assert [await inbox.get() for _ in range(4)] == ["a", "b", "c", "d"]
            assert inbox.reading  # uvicorn paused after "a"; the inbox resumed it
        probe.release.set()


@pytest.mark.parametrize("compression", [None, "deflate"])
async def test_a_flood_of_client_frames_is_bounded_and_reading_resumes_when_taken(compression: str | None) -> None:
    """A client that sends far faster than the handler reads: the inbox stops reading the
    socket at its mark, plus at most what one slice of a read holds, TCP then holds the
    client back, and every message still arrives, once, in order, when the handler reads
    again. (A repeated text deflates to a few bytes a frame: before the slices one 256 KiB
    read of them put 5.7 MB in uvicorn's queue; fresh random hex still takes 500 bytes or more a frame, so
    the client is held back with or without compression.)"""
    probe = Probe()
    n = 20_000  # 20 MB: far beyond the inbox and the socket buffers
    payloads = [secrets.token_hex(500) for _ in range(n)]
    size = 1000 + 6 + 6
    if compression is None:
        most = Inbox.HIGH + FEED_BYTES // size + 1  # messages complete in one slice, at most
    else:
        most = Inbox.HIGH + FEED_BYTES // 6 + 1  # a masked frame is at least 6 bytes long
    async with asyncio.timeout(DEADLINE), serving(probe) as port:
        async with connect(f"ws://127.0.0.1:{port}/x", compression=compression, max_queue=None) as ws:
            inbox = await probe.inbox

            async def flood() -> None:
                for i in range(n):
                    await ws.send(f"{i:06d}{payloads[i]}")

            sender = asyncio.create_task(flood())
            await wait_until(lambda: not inbox.reading, timeout=DEADLINE)
            peak = len(inbox)
            await asyncio.sleep(0.2)  # let the client fill every buffer it can
            assert len(inbox) == peak, "the inbox grew while reading was paused"
            assert inbox.full and len(inbox) <= most, (len(inbox), most)
            assert not sender.done(), "the client was never held back"
            got = []
            while len(got) < n:
                item = await inbox.get()
                assert isinstance(item, str)
                got.append(int(item[:6]))
                assert len(inbox) <= most
            await sender
            assert got == list(range(n))
            assert inbox.reading
        probe.release.set()


async def test_many_tiny_frames_pause_at_the_message_count_mark() -> None:
    probe = Probe()
    async with asyncio.timeout(DEADLINE), serving(probe) as port:
        async with connect(f"ws://127.0.0.1:{port}/x") as ws:
            inbox = await probe.inbox
            for i in range(Inbox.HIGH):
                await ws.send(str(i))
            await wait_until(lambda: not inbox.reading, timeout=DEADLINE)
            assert len(inbox) >= Inbox.HIGH and inbox.size < Inbox.HIGH_BYTES
            assert [await inbox.get() for _ in range(Inbox.HIGH)] == [str(i) for i in range(Inbox.HIGH)]
            assert inbox.reading
        probe.release.set()


async def test_invalid_utf8_in_a_text_frame_closes_with_1007() -> None:
    probe = Probe()
    async with asyncio.timeout(DEADLINE), serving(probe) as port:
        async with connect(f"ws://127.0.0.1:{port}/x") as ws:
            inbox = await probe.inbox
            await ws.send(b"ok \xff\xfe", text=True)  # a text frame whose payload is not UTF-8
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1007
        event = await inbox.get()
        assert isinstance(event, dict) and (event["type"], event["code"]) == ("websocket.disconnect", 1007)
        probe.release.set()


async def test_a_message_over_the_size_limit_closes_with_1009() -> None:
    probe = Probe()
    async with asyncio.timeout(DEADLINE), serving(probe, max_size=1024) as port:
        async with connect(f"ws://127.0.0.1:{port}/x") as ws:
            inbox = await probe.inbox
            await ws.send("y" * 1024)
            assert await inbox.get() == "y" * 1024
            await ws.send("z" * 1025)
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1009
        event = await inbox.get()
        assert isinstance(event, dict) and event["type"] == "websocket.disconnect"
        probe.release.set()
