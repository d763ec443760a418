"""An ACP client for the gateway's tests, built on the official SDK (agent-client-protocol):
it keeps every update, answers permission requests as a test tells it, and validates every
message the gateway sends against the SDK's schema models (a message that does not
validate is a test failure, reported by ``problems``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import acp
from acp import schema
from acp.connection import StreamDirection, StreamEvent
from acp.ws import create_websocket_stream
from pydantic import TypeAdapter, ValidationError

STEP = 15.0

RESPONSES: dict[str, Any] = {
    "initialize": schema.InitializeResponse,
    "session/new": schema.NewSessionResponse,
    "session/load": schema.LoadSessionResponse,
    "session/resume": schema.ResumeSessionResponse,
    "session/prompt": schema.PromptResponse,
    "session/list": schema.ListSessionsResponse,
    "session/set_mode": schema.SetSessionModeResponse,
    "session/set_config_option": schema.SetSessionConfigOptionResponse,
    "session/close": schema.CloseSessionResponse,
    "session/delete": schema.DeleteSessionResponse,
}
INCOMING: dict[str, Any] = {  # a model, or a union of models (elicitation)
    "session/update": schema.SessionNotification,
    "session/request_permission": schema.RequestPermissionRequest,
    "$/cancel_request": schema.CancelRequestNotification,
    "elicitation/create": schema.CreateElicitationRequest,
    "elicitation/complete": schema.CompleteElicitationNotification,
}


class Validator:
    """A stream observer: every incoming message checked against the schema."""

    def __init__(self) -> None:
        self.sent: dict[Any, str] = {}  # our request id → method
        self.received: list[dict[str, Any]] = []
        self.problems: list[str] = []

    def __call__(self, event: StreamEvent) -> None:
        msg = event.message
        if event.direction is StreamDirection.OUTGOING:
            if "method" in msg and "id" in msg:
                self.sent[msg["id"]] = msg["method"]
            return
        self.received.append(msg)
        self.check(msg)

    def check(self, msg: dict[str, Any]) -> None:
        if msg.get("jsonrpc") != "2.0":
            self.problems.append(f"not JSON-RPC 2.0: {msg}")
            return
        try:
            if "method" in msg:
                model = INCOMING.get(msg["method"])
                if model is None:
                    self.problems.append(f"unexpected method {msg['method']}")
                else:
                    TypeAdapter(model).validate_python(msg.get("params"))
            elif "error" in msg:
                err = msg["error"]
                assert isinstance(err.get("code"), int) and isinstance(err.get("message"), str), msg
            else:
                model = RESPONSES.get(self.sent.get(msg.get("id"), ""))
                if model is None:
                    self.problems.append(f"a response to no request of ours: {msg}")
                else:
                    TypeAdapter(model).validate_python(msg.get("result"))
        except (ValidationError, AssertionError) as exc:
            self.problems.append(f"{msg}: {exc}")


Answer = Callable[[dict[str, Any]], Any]


class Recorder:
    """The SDK ``Client`` side: updates kept per session, permission requests answered by
    ``answer`` (a dict outcome, or an awaitable of one)."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, dict[str, Any]]] = []
        self.asks: list[dict[str, Any]] = []
        self.answer: Callable[[dict[str, Any]], Any] = lambda ask: {"outcome": "cancelled"}
        self._changed = asyncio.Event()

    async def request_permission(self, session_id: str, tool_call: Any, options: Any, **kw: Any) -> Any:
        ask = {
            "sessionId": session_id,
            "toolCall": tool_call.model_dump(by_alias=True, exclude_none=True),
            "options": [o.model_dump(by_alias=True, exclude_none=True) for o in options],
        }
        self.asks.append(ask)
        self._poke()
        outcome = self.answer(ask)
        if asyncio.iscoroutine(outcome) or isinstance(outcome, asyncio.Future):
            outcome = await outcome
        return schema.RequestPermissionResponse.model_validate({"outcome": outcome})

    async def session_update(self, session_id: str, update: Any, **kw: Any) -> None:
        self.updates.append((session_id, update.model_dump(by_alias=True, exclude_none=True)))
        self._poke()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, pred: Callable[[], bool], what: str, timeout: float = STEP) -> None:
        async with asyncio.timeout(timeout):
            while not pred():
                await self._changed.wait()

    def text(self, session_id: str, kind: str = "agent_message_chunk") -> str:
        return "".join(
            u["content"].get("text", "") for s, u in self.updates if s == session_id and u["sessionUpdate"] == kind
        )

    def of(self, session_id: str, kind: str) -> list[dict[str, Any]]:
        return [u for s, u in self.updates if s == session_id and u["sessionUpdate"] == kind]

    async def write_text_file(self, *a: Any, **kw: Any) -> Any:
        raise acp.RequestError.method_not_found("fs/write_text_file")

    async def read_text_file(self, *a: Any, **kw: Any) -> Any:
        raise acp.RequestError.method_not_found("fs/read_text_file")

    def on_connect(self, conn: Any) -> None:
        pass


class Session:
    """A connected SDK client: ``conn`` (ClientSideConnection), ``rec``, ``validator``."""

    def __init__(self, conn: Any, rec: Recorder, validator: Validator, transport: Any) -> None:
        self.conn, self.rec, self.validator, self.transport = conn, rec, validator, transport

    @property
    def connection_id(self) -> str | None:
        headers = self.transport._ws.response.headers
        return headers.get("Acp-Connection-Id")

    async def initialize(self) -> Any:
        return await asyncio.wait_for(self.conn.initialize(protocol_version=1), STEP)

    async def close(self) -> None:
        await asyncio.wait_for(self.conn.close(), STEP)
        assert not self.validator.problems, self.validator.problems


async def connect(ws_url: str, token: str | None, path: str = "/v1/acp") -> Session:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = await asyncio.wait_for(create_websocket_stream(ws_url + path, headers=headers), STEP)
    rec, validator = Recorder(), Validator()
    conn = acp.connect_to_agent(rec, transport, observers=[validator])  # type: ignore[arg-type]
    return Session(conn, rec, validator, transport)
