"""What every loopback fake model API of the real-agent suite shares (issue #17).

A fake is a :class:`FakeServer` subclass that lists its routes and renders a scripted
:class:`Reply` in its API's wire format (fake_anthropic.py: the Anthropic Messages API;
fake_openai.py: OpenAI chat completions and Responses; fake_gemini.py: the Gemini API).
Here: the reply model, the request log, the strict-request refusal, streaming with
"completed"/"aborted" bookkeeping, the marker-word scenarios every fake answers
(:func:`scenario`), and the server's life (uvicorn in a thread of its own, with its own
event loop, on 127.0.0.1 port 0, so a test's event loop never has to serve it).
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
from starlette.routing import Route


@dataclass
class Text:
    """A text block, streamed as one delta per chunk."""

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
    def has_tool_use(self) -> bool:
        return any(isinstance(b, ToolUse) for b in self.blocks)


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


class Refused(Exception):
    """A request the real API would refuse: answered with ``status`` and the API's error shape."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# Marker words in a prompt → what the model does. A test's prompt carries one of them.
MARKERS = {
    "CHAT": "streams a text reply in several deltas",
    "WRITE <path>": "asks to run the CLI's shell tool with `touch <path>` (a mutating command: permission prompt)",
    "SLOW": "streams a long reply, one delta every 0.1 s, for about 30 s",
    "DELEGATE": "(Anthropic only) calls the sub-agent tool with a prompt carrying SUBTASK",
    "SUBTASK": "(Anthropic only; the sub-agent's own request) answers with a short text",
    "QUESTION": "(Anthropic only) asks the user with the AskUserQuestion tool when the CLI offers it",
}
CHAT_CHUNKS = ["Hello ", "from ", "the ", "fake ", "model."]
CHAT_TEXT = "".join(CHAT_CHUNKS)
SLOW_CHUNKS = [f"tick {i} " for i in range(300)]


def scenario(prompt: str, tool_result: tuple[str, bool] | None, shell: Callable[[str], ToolUse] | None) -> Reply | None:
    """The reply for the newest prompt, or for the result of the tool the model asked for
    (``(text, is_error)``); ``shell(command)`` makes the CLI's own shell tool call. None:
    no marker (the caller decides)."""
    if tool_result is not None:
        text, is_error = tool_result
        return Reply([Text([f"Tool said{' (error)' if is_error else ''}: ", text[:200]])])
    if "WRITE " in prompt and shell is not None:
        path = prompt.split("WRITE ", 1)[1].split()[0]
        return Reply([shell(f"touch {path}")])
    if "SLOW" in prompt:
        return Reply([Text(SLOW_CHUNKS)], delay=0.1)
    if "CHAT" in prompt:
        return Reply([Text(CHAT_CHUNKS)])
    return None


class FakeServer:
    """Routes, request log and life of one loopback fake. Subclasses pass their routes and
    list the paths of their model requests in ``model_paths``."""

    name = "fake"
    model_paths: tuple[str, ...] = ()
    logged_headers: tuple[str, ...] = ("user-agent", "content-type")

    def __init__(self, routes: list[Route]) -> None:
        self.log: list[Logged] = []
        self._lock = threading.Lock()
        self._counter = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""
        self.app = Starlette(routes=routes)

    # ------------------------------------------------------------------ log

    async def record(self, request: Request) -> Logged:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        entry = Logged(
            request.method,
            request.url.path,
            request.url.query,
            {h: request.headers[h] for h in self.logged_headers if h in request.headers},
            body,
            time.time(),
        )
        with self._lock:
            self.log.append(entry)
        return entry

    def model_requests(self) -> list[Logged]:
        with self._lock:
            return [e for e in self.log if self.is_model_path(e.path)]

    def is_model_path(self, path: str) -> bool:
        return path in self.model_paths

    def paths(self) -> set[tuple[str, str]]:
        with self._lock:
            return {(e.method, e.path) for e in self.log}

    def next_id(self, prefix: str) -> str:
        with self._lock:
            self._counter += 1
            return f"{prefix}_fake_{self._counter:04d}"

    # ------------------------------------------------------------------ streaming

    @staticmethod
    async def stream(entry: Logged, frames: list[tuple[bytes, bool]], delay: float) -> AsyncIterator[bytes]:
        """Send ``frames`` (bytes, is-a-delta); ``delay`` seconds before each delta. The
        entry's ``stream`` ends "completed", or "aborted" when the client left first."""
        entry.stream = "streaming"
        try:
            for frame, is_delta in frames:
                if delay and is_delta:
                    await asyncio.sleep(delay)
                yield frame
                entry.events_sent += 1
            entry.stream = "completed"
        finally:
            if entry.stream != "completed":
                entry.stream = "aborted"

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        # IPPROTO_TCP: asyncio sets TCP_NODELAY only on connections whose socket says it is
        # TCP; without it a streamed reply's first small write could wait for the agent's
        # delayed ACK (40 ms), which a real model API does not make it do.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        server = self._server
        self._thread = threading.Thread(target=lambda: server.run(sockets=[sock]), name=self.name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"{self.name} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(10)


def sse_data(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()
