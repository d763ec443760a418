"""A loopback fake of the Anthropic Messages API for the real-agent suite (issue #9).

Real agent CLIs (Claude Code, claude-agent-acp) are pointed at it with
``ANTHROPIC_BASE_URL``. It answers what those CLIs call:

* ``HEAD /`` (a pre-connect probe) → 200, empty;
* ``POST /v1/messages`` (``?beta=true``) → a scripted reply, streamed as SSE when the
  request says ``stream: true``, else one JSON message;
* ``POST /v1/messages/count_tokens`` → ``{"input_tokens": N}``;
* anything else → 404 (and it is in the log, so a test sees it).

Every request is logged (method, path, query, a few headers, parsed body) before it is
answered, so tests assert what the agent sent and that nothing else was asked for.

What a ``/v1/messages`` request gets is decided by :attr:`FakeAnthropic.script`, a function
of the request body; the default, :func:`default_script`, keys on marker words in the
last user message (see :data:`MARKERS`), which is how the tests script each scenario.
The server runs uvicorn in a thread of its own with its own event loop, on 127.0.0.1
port 0, so a test's event loop never has to serve it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "claude-fake-1"
# Headers worth keeping in the log (never the key itself).
LOGGED_HEADERS = (
    "anthropic-version",
    "anthropic-beta",
    "user-agent",
    "x-app",
    "x-claude-code-session-id",
    "content-type",
)


@dataclass
class Text:
    """A text block, streamed as one ``text_delta`` per chunk."""

    chunks: list[str]


@dataclass
class ToolUse:
    name: str
    input: dict[str, Any]
    id: str = ""


@dataclass
class Reply:
    blocks: list[Text | ToolUse]
    delay: float = 0.0  # seconds before each delta: a slow reply
    status: int = 200  # not 200: an API error with this status
    error_type: str = "api_error"

    @property
    def stop_reason(self) -> str:
        return "tool_use" if any(isinstance(b, ToolUse) for b in self.blocks) else "end_turn"


@dataclass
class Logged:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    t: float
    # For streamed replies: "streaming" until the last event was sent ("completed") or
    # the client went away first ("aborted").
    stream: str = ""
    events_sent: int = 0

    @property
    def messages(self) -> list[dict[str, Any]]:
        body = self.body if isinstance(self.body, dict) else {}
        msgs = body.get("messages")
        return msgs if isinstance(msgs, list) else []


def block_texts(content: Any) -> list[str]:
    """Every text in a message's content (a string, or text / tool_result blocks)."""
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    for b in content if isinstance(content, list) else []:
        if not isinstance(b, dict):
            continue
        if isinstance(b.get("text"), str):
            out.append(b["text"])
        elif b.get("type") == "tool_result":
            out.extend(block_texts(b.get("content")))
    return out


def last_user(body: dict[str, Any]) -> dict[str, Any]:
    for msg in reversed(body.get("messages") or []):
        if isinstance(msg, dict) and msg.get("role") == "user":
            return msg
    return {}


def prompt_text(msg: dict[str, Any]) -> str:
    """The newest prompt in a user message: its last text that is not a ``<system-reminder>``.
    (After an interrupted turn the CLI sends the cancelled prompt and the new one together
    in one user message, so the last text is what the user just said.)"""
    texts = [t for t in block_texts(msg.get("content")) if not t.lstrip().startswith("<system-reminder>")]
    return texts[-1] if texts else ""


def tool_results(msg: dict[str, Any]) -> list[dict[str, Any]]:
    content = msg.get("content")
    return (
        [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        if isinstance(content, list)
        else []
    )


def tool_names(body: dict[str, Any]) -> list[str]:
    return [t.get("name", "") for t in body.get("tools") or [] if isinstance(t, dict)]


def subagent_tool(body: dict[str, Any]) -> str:
    """The sub-agent tool this CLI offers: ``Agent`` in newer releases, ``Task`` before."""
    names = tool_names(body)
    return next((n for n in ("Agent", "Task") if n in names), "Task")


# Marker words in a prompt → what the model does. A test's prompt carries one of them.
MARKERS = {
    "CHAT": "streams a text reply in several deltas",
    "WRITE <path>": "asks to run Bash `touch <path>` (a mutating command: permission prompt)",
    "SLOW": "streams a long reply, one delta every 0.1 s, for about 30 s",
    "DELEGATE": "calls the sub-agent tool with a prompt carrying SUBTASK",
    "SUBTASK": "(the sub-agent's own request) answers with a short text",
}
CHAT_CHUNKS = ["Hello ", "from ", "the ", "fake ", "model."]


def default_script(body: dict[str, Any]) -> Reply:
    user = last_user(body)
    results = tool_results(user)
    if results:
        text = " ".join(block_texts(results[-1].get("content")))[:200]
        err = " (error)" if results[-1].get("is_error") else ""
        return Reply([Text([f"Tool said{err}: ", text])])
    prompt = prompt_text(user)
    if "SUBTASK" in prompt:
        return Reply([Text(["Sub-agent ", "found 3 files."])])
    if "DELEGATE" in prompt:
        return Reply(
            [
                Text(["Delegating."]),
                ToolUse(
                    subagent_tool(body),
                    {
                        "description": "Count files",
                        "prompt": "SUBTASK: count the files here",
                        "subagent_type": "general-purpose",
                    },
                ),
            ]
        )
    if "WRITE " in prompt:
        path = prompt.split("WRITE ", 1)[1].split()[0]
        return Reply([ToolUse("Bash", {"command": f"touch {path}", "description": "Create a file"})])
    if "SLOW" in prompt:
        return Reply([Text([f"tick {i} " for i in range(300)])], delay=0.1)
    if "CHAT" in prompt:
        return Reply([Text(CHAT_CHUNKS)])
    return Reply([Text(["ok"])])


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class FakeAnthropic:
    def __init__(self, script: Callable[[dict[str, Any]], Reply] = default_script) -> None:
        self.script = script
        self.log: list[Logged] = []
        self._lock = threading.Lock()
        self._counter = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""
        self.app = Starlette(
            routes=[
                Route("/", self._root, methods=["GET", "HEAD"]),
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
                Route("/{path:path}", self._other, methods=["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]),
            ]
        )

    # ------------------------------------------------------------------ log

    async def _record(self, request: Request) -> Logged:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        entry = Logged(
            request.method,
            request.url.path,
            request.url.query,
            {h: request.headers[h] for h in LOGGED_HEADERS if h in request.headers},
            body,
            time.time(),
        )
        with self._lock:
            self.log.append(entry)
        return entry

    def model_requests(self) -> list[Logged]:
        with self._lock:
            return [e for e in self.log if e.path == "/v1/messages"]

    def paths(self) -> set[tuple[str, str]]:
        with self._lock:
            return {(e.method, e.path) for e in self.log}

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            self._counter += 1
            return f"{prefix}_fake_{self._counter:04d}"

    # ------------------------------------------------------------------ routes

    async def _root(self, request: Request) -> Response:
        await self._record(request)
        return Response(b"", status_code=200)

    async def _other(self, request: Request) -> Response:
        await self._record(request)
        return JSONResponse(
            {"type": "error", "error": {"type": "not_found_error", "message": "not faked"}}, status_code=404
        )

    async def _count_tokens(self, request: Request) -> Response:
        await self._record(request)
        return JSONResponse({"input_tokens": 123})

    async def _messages(self, request: Request) -> Response:
        entry = await self._record(request)
        body = entry.body if isinstance(entry.body, dict) else {}
        reply = self.script(body)
        for b in reply.blocks:
            if isinstance(b, ToolUse) and not b.id:
                b.id = self._next_id("toolu")
        if reply.status != 200:
            return JSONResponse(
                {"type": "error", "error": {"type": reply.error_type, "message": "scripted error"}},
                status_code=reply.status,
            )
        msg_id = self._next_id("msg")
        if not body.get("stream"):
            content: list[dict[str, Any]] = [
                {"type": "text", "text": "".join(b.chunks)}
                if isinstance(b, Text)
                else {"type": "tool_use", "id": b.id, "name": b.name, "input": b.input}
                for b in reply.blocks
            ]
            return JSONResponse(
                {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": MODEL,
                    "content": content,
                    "stop_reason": reply.stop_reason,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 50,
                        "output_tokens": 10,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 0,
                    },
                }
            )
        entry.stream = "streaming"
        return StreamingResponse(
            self._stream(entry, msg_id, reply),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "request-id": self._next_id("req")},
        )

    async def _stream(self, entry: Logged, msg_id: str, reply: Reply) -> AsyncIterator[bytes]:
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": msg_id,
                        "type": "message",
                        "role": "assistant",
                        "model": MODEL,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {
                            "input_tokens": 50,
                            "output_tokens": 1,
                            "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": 0,
                        },
                    },
                },
            )
        ]
        for i, b in enumerate(reply.blocks):
            if isinstance(b, Text):
                events.append(
                    (
                        "content_block_start",
                        {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                    )
                )
                events += [
                    (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": c}},
                    )
                    for c in b.chunks
                ]
            else:
                events.append(
                    (
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {"type": "tool_use", "id": b.id, "name": b.name, "input": {}},
                        },
                    )
                )
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "input_json_delta", "partial_json": json.dumps(b.input)},
                        },
                    )
                )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reply.stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": 12},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        try:
            for name, data in events:
                if reply.delay and name == "content_block_delta":
                    await asyncio.sleep(reply.delay)
                yield _sse(name, data)
                entry.events_sent += 1
            entry.stream = "completed"
        finally:
            if entry.stream != "completed":
                entry.stream = "aborted"

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        server = self._server
        self._thread = threading.Thread(target=lambda: server.run(sockets=[sock]), name="fake-anthropic", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake Anthropic API did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(10)
