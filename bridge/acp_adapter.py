"""``agent-bridge acp``: a stdio ACP agent that relays to a daemon's ACP gateway
(docs/api.md §11.6, docs/acp-gateway.md), for editors that spawn their agents.

Each stdin line (one JSON-RPC message, ACP's stdio framing) goes to the WebSocket as one
text frame; each frame comes back as one stdout line. The relay reads only what it needs
to survive a dropped connection:

* the editor's ``initialize`` params, and the sessions it attached (``session/new``,
  ``load``, ``resume`` answers), with the newest transcript seq each session's updates
  carried (``_meta.agent-bridge.seq``);
* the ``session/prompt`` requests still waiting, each given a ``client_id``
  (``_meta.agent-bridge.client_id``) so that sending one again never runs it twice.

When the connection drops, the relay reconnects with backoff (for up to
``RECONNECT_FOR_S``), says ``initialize`` again, ``session/load``s every session from the
last seq it relayed (only what the editor missed is replayed), then sends the waiting
prompts again: each is answered when its turn ends, even if that happened while the
connection was down. Its own requests use ids of its own and their answers are not
relayed. It exits 0 when stdin closes, 1 when the daemon cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from bridge import discovery
from bridge.protocols import jsonrpc
from bridge.protocols.jsonrpc import Notification, Request, Response, RpcError

DEFAULT_URL = "http://127.0.0.1:8765"
META = "agent-bridge"
CONNECT_TIMEOUT_S = 10.0
RECONNECT_FOR_S = 60.0
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
MAX_LINE = 64 * 1024 * 1024
OWN_PREFIX = "agent-bridge-relay-"
# Requests in flight when the connection dropped that are sent again on the next one:
# harmless twice (a prompt carries its client_id); any other is answered "connection lost".
RESENT = frozenset({"session/prompt", "session/list"})


def gateway_url(url: str, agent: str | None) -> str:
    """``http(s)://host:port`` (or ``ws(s)://``) as the gateway's WebSocket URL; a URL
    that already has a path is used as it is."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss") or not parts.netloc:
        raise ValueError(f"not an http(s) or ws(s) URL: {url}")
    path = parts.path.rstrip("/")
    if not path:
        path = "/v1/acp" + (f"/{quote(agent, safe='')}" if agent else "")
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def local_daemon(data_dir: Path) -> tuple[str, str | None]:
    """The local daemon's URL and token: its discovery file (docs/api.md §1.6), else the
    default address and the data dir's token file."""
    rec = discovery.read(data_dir)
    if isinstance(rec, discovery.Record) and rec.url is not None:
        return rec.url, discovery.token_for(rec)
    token = os.environ.get("AGENT_BRIDGE_TOKEN")
    if not token:
        with contextlib.suppress(OSError):
            token = (data_dir / "token").read_text(encoding="utf-8").strip() or None
    return DEFAULT_URL, token


@dataclass
class _Session:
    cwd: str | None
    last_seq: int = 0


@dataclass
class Relay:
    url: str
    token: str | None
    out: Any = field(default_factory=lambda: sys.stdout.buffer)
    init: dict[str, Any] | None = None
    sessions: dict[str, _Session] = field(default_factory=dict)
    waiting: dict[Any, dict[str, Any]] = field(default_factory=dict)  # editor's requests in flight
    _ws: ClientConnection | None = None
    # The relay's own requests (ids of a prefix no editor uses), each with its answer to come.
    _own: jsonrpc.Pending[asyncio.Future[dict[str, Any]]] = field(
        default_factory=lambda: jsonrpc.Pending(first=1, prefix=OWN_PREFIX)
    )
    _up: asyncio.Event = field(default_factory=asyncio.Event)

    # ------------------------------------------------------------------ editor → daemon

    def from_editor(self, line: bytes) -> tuple[str, dict[str, Any] | None] | None:
        """The line to send on (a prompt gets its client_id) and, for a request, the
        request; None for a blank line."""
        text = line.decode("utf-8", errors="replace").strip()
        if not text:
            return None
        try:
            msg = json.loads(text)
        except ValueError:
            return text, None  # the gateway answers it (parse error)
        if not isinstance(jsonrpc.classify(msg), Request):
            return text, None  # a notification or a response; anything invalid the gateway answers
        params = msg.get("params")
        if not isinstance(params, dict):
            return text, msg
        if msg["method"] == "initialize":
            self.init = params
        elif msg["method"] == "session/prompt":
            _ours(params, create=True).setdefault("client_id", f"relay-{uuid.uuid4().hex}")
            text = json.dumps(msg, separators=(",", ":"))
        return text, msg

    # ------------------------------------------------------------------ daemon → editor

    def from_daemon(self, text: str) -> bool:
        """Bookkeeping for one message from the gateway; False when it is an answer to the
        relay's own request (not for the editor)."""
        try:
            msg = json.loads(text)
        except ValueError:
            return True
        kind = jsonrpc.classify(msg)
        if isinstance(kind, Notification) and kind.method == "session/update" and isinstance(kind.params, dict):
            self._seen(kind.params.get("sessionId"), _ours(kind.params).get("seq"))
        if not isinstance(kind, Response) or kind.id is None:
            return True
        if (fut := self._own.take(kind.id)) is not None:
            if not fut.done():
                fut.set_result(msg)
            return False
        if kind.id in self.waiting:
            self._answered(self.waiting.pop(kind.id), msg)
        return True

    def reserve(self) -> tuple[jsonrpc.Id, asyncio.Future[dict[str, Any]]]:
        """An id for a request of the relay's own, and the future its answer settles."""
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        return self._own.add(fut), fut

    def _seen(self, sid: Any, seq: Any) -> None:
        sess = self.sessions.get(sid) if isinstance(sid, str) else None
        if sess is not None and isinstance(seq, int) and seq > sess.last_seq:
            sess.last_seq = seq

    def _answered(self, request: dict[str, Any], msg: dict[str, Any]) -> None:
        """A session the editor attached: remembered, with the seq it is at."""
        result, params, method = msg.get("result"), request.get("params"), request.get("method")
        if not isinstance(result, dict) or not isinstance(params, dict):
            return
        if method not in ("session/new", "session/load", "session/resume"):
            return
        sid = result.get("sessionId") if method == "session/new" else params.get("sessionId")
        if isinstance(sid, str):
            cwd = params.get("cwd")
            self.sessions.setdefault(sid, _Session(cwd if isinstance(cwd, str) else None))
            self._seen(sid, _ours(result).get("last_seq"))

    # ------------------------------------------------------------------ the connection

    async def _connect(self) -> ClientConnection:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return await connect(
            self.url, additional_headers=headers, max_size=None, open_timeout=CONNECT_TIMEOUT_S, ping_interval=20
        )

    async def _own_request(self, ws: ClientConnection, method: str, params: dict[str, Any]) -> dict[str, Any]:
        rid, fut = self.reserve()
        try:
            await ws.send(json.dumps(jsonrpc.request(rid, method, params)))
            return await asyncio.wait_for(fut, CONNECT_TIMEOUT_S)
        finally:
            self._own.drop(rid)

    async def _restore(self, ws: ClientConnection) -> None:
        """After a reconnection: initialize (the editor's own request again if it had no
        answer yet), load every session from where the editor is, then send the waiting
        requests again (any other, such as a new session that may have been made, is
        answered "connection lost")."""
        inits = [r for r in self.waiting.values() if r.get("method") == "initialize"]
        for request in inits:
            await ws.send(json.dumps(request, separators=(",", ":")))
        if self.init is not None and not inits:
            await self._own_request(ws, "initialize", self.init)
        await self._load_all(ws)
        for rid, request in list(self.waiting.items()):
            if request.get("method") in RESENT:
                await ws.send(json.dumps(request, separators=(",", ":")))
            elif request.get("method") != "initialize":
                self.waiting.pop(rid)
                self._write(jsonrpc.error(rid, RpcError.internal("connection lost")))

    async def _load_all(self, ws: ClientConnection) -> None:
        """Every session the editor had, loaded from the last seq relayed to it; one the
        daemon no longer has is forgotten."""
        for sid, sess in list(self.sessions.items()):
            params: dict[str, Any] = {"sessionId": sid, "mcpServers": [], "_meta": {META: {"after": sess.last_seq}}}
            if sess.cwd is not None:
                params["cwd"] = sess.cwd
            answer = await self._own_request(ws, "session/load", params)
            if "error" in answer:
                self.sessions.pop(sid, None)

    def _write(self, msg: dict[str, Any] | str) -> None:
        line = msg if isinstance(msg, str) else json.dumps(msg, separators=(",", ":"))
        self.out.write(line.encode() + b"\n")
        self.out.flush()

    async def _pump_daemon(self, ws: ClientConnection) -> None:
        try:
            async for frame in ws:
                text = frame if isinstance(frame, str) else frame.decode("utf-8", errors="replace")
                if self.from_daemon(text):
                    self._write(text)
        finally:
            # The connection is gone: the relay's own requests on it will get no answer.
            for _, fut in self._own.fail_all():
                if not fut.done():
                    fut.set_exception(ConnectionError("the connection closed"))

    async def _linked(self, first: bool) -> ClientConnection:
        """A connection, with backoff; raises ConnectionError after RECONNECT_FOR_S."""
        loop = asyncio.get_running_loop()
        end = loop.time() + RECONNECT_FOR_S
        attempt = 0
        while True:
            try:
                ws = await self._connect()
                if not first:
                    reader = asyncio.ensure_future(self._pump_daemon(ws))
                    try:
                        await self._restore(ws)
                    finally:
                        reader.cancel()
                        with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                            await reader
                return ws
            except InvalidHandshake as exc:
                response = getattr(exc, "response", None)
                if getattr(response, "status_code", 0) in (401, 403, 404):
                    said = _refusal(getattr(response, "body", None))
                    raise ConnectionError(f"the daemon refused the connection: {exc}{said}") from None
                problem: Exception = exc
            except (OSError, TimeoutError, ConnectionClosed) as exc:
                problem = exc
            if loop.time() > end:
                raise ConnectionError(f"cannot reach {self.url}: {problem}")
            await asyncio.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
            attempt += 1

    async def run(self, stdin: asyncio.StreamReader) -> int:
        try:
            ws = await self._linked(first=True)
        except (ConnectionError, InvalidURI) as exc:
            print(f"agent-bridge acp: {exc}", file=sys.stderr)
            return 1
        editor = asyncio.ensure_future(self._pump_editor(stdin))
        try:
            while True:
                self._ws = ws
                self._up.set()
                daemon = asyncio.ensure_future(self._pump_daemon(ws))
                done, _ = await asyncio.wait({editor, daemon}, return_when=asyncio.FIRST_COMPLETED)
                if editor in done:
                    daemon.cancel()
                    await ws.close()
                    return 0
                self._up.clear()
                self._ws = None
                print("agent-bridge acp: connection lost, reconnecting", file=sys.stderr)
                again = asyncio.ensure_future(self._linked(first=False))
                await asyncio.wait({editor, again}, return_when=asyncio.FIRST_COMPLETED)
                if not again.done():  # the editor left while the daemon was away
                    again.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                        await again
                    return 0
                try:
                    ws = again.result()
                except ConnectionError as exc:
                    print(f"agent-bridge acp: {exc}", file=sys.stderr)
                    return 1
        finally:
            editor.cancel()

    async def _pump_editor(self, stdin: asyncio.StreamReader) -> None:
        while line := await stdin.readline():
            got = self.from_editor(line)
            if got is None:
                continue
            text, request = got
            while True:
                await self._up.wait()  # while reconnecting, the editor waits here
                ws = self._ws
                assert ws is not None
                if request is not None:
                    # Sent on a connection: a reconnection sends it again if still unanswered.
                    self.waiting[request["id"]] = request
                try:
                    await ws.send(text)
                except ConnectionClosed:
                    if request is None:
                        self._up.clear()
                        continue  # sent on the next connection
                break


def _ours(params: dict[str, Any], *, create: bool = False) -> dict[str, Any]:
    """``params._meta["agent-bridge"]`` (made when ``create``; ``{}`` when not a dict)."""
    meta = params.setdefault("_meta", {}) if create else params.get("_meta")
    if not isinstance(meta, dict):
        return {}
    ours = meta.setdefault(META, {}) if create else meta.get(META)
    return ours if isinstance(ours, dict) else {}


async def _stdin_reader() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def _main(url: str, token: str | None) -> int:
    return await Relay(url, token).run(await _stdin_reader())


def run(url: str | None, token: str | None, agent: str | None, data_dir: Path) -> int:
    """The ``acp`` command: exit status 0 on stdin EOF, 1 when the daemon is unreachable
    or refuses, 2 for a bad URL."""
    if url is None:
        url, found_token = local_daemon(data_dir)
        token = token or found_token
    else:
        token = token or os.environ.get("AGENT_BRIDGE_TOKEN")
    try:
        target = gateway_url(url, agent)
    except ValueError as exc:
        print(f"agent-bridge acp: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_main(target, token))


def _refusal(body: object) -> str:
    """The daemon's own words for a refused upgrade (its ``{"error": {"message"}}`` body,
    which says how to authenticate), or nothing when the body is not that."""
    try:
        message = json.loads(bytes(body))["error"]["message"] if isinstance(body, bytes | bytearray) else None
    except (ValueError, TypeError, KeyError):
        return ""
    return f": {message}" if isinstance(message, str) and message else ""
