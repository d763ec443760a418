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

import json
from collections.abc import Callable
from typing import Any

from fakeserver import CHAT_CHUNKS, MARKERS, FakeServer, Logged, Reply, Text, ToolUse, scenario, sse_data
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = ["CHAT_CHUNKS", "MARKERS", "FakeAnthropic", "Logged", "Reply", "Text", "ToolUse"]

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


def asked_with(fake: Any, text: str) -> Any:
    """The newest model request whose last user message holds ``text``: that turn's own.
    The newer CLIs may ask the model again on their own after a turn's request
    (claude-agent-acp 0.101.0 names its sessions), so the newest request is not always the
    turn's."""
    asked = [
        r for r in fake.model_requests() if any(text in t for t in block_texts(last_user(r.body).get("content") or []))
    ]
    # A side request of the CLI's own (naming the session) may quote the prompt as its last
    # user message too, with no tools and none of the conversation: the turn's request is the
    # one that offers the agent its tools.
    turns = [r for r in asked if r.body.get("tools")]
    if not asked:
        raise AssertionError(f"no model request asked {text!r}")
    return (turns or asked)[-1]


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


def subagent_input(body: dict[str, Any], tool: str) -> dict[str, Any]:
    """What a model asking for a sub-agent's answer in this turn passes: newer CLIs offer
    ``run_in_background`` and start an agent in the background unless told otherwise."""
    args: dict[str, Any] = {
        "description": "Count files",
        "prompt": "SUBTASK: count the files here",
        "subagent_type": "general-purpose",
    }
    for t in body.get("tools") or []:
        if isinstance(t, dict) and t.get("name") == tool:
            if "run_in_background" in ((t.get("input_schema") or {}).get("properties") or {}):
                args["run_in_background"] = False
    return args


# Claude Code's tool for a multiple-choice question to the user (offered by claude-agent-acp
# to a client that shows form elicitations).
ASK_USER = "AskUserQuestion"
QUESTION = {
    "question": "Which colour should the file be?",
    "header": "Colour",
    "options": [{"label": "red", "description": "warm"}, {"label": "green", "description": "cool"}],
    "multiSelect": False,
}


def _bash(command: str) -> ToolUse:
    return ToolUse("Bash", {"command": command, "description": "Create a file"})


def default_script(body: dict[str, Any]) -> Reply:
    user = last_user(body)
    results = tool_results(user)
    if results:
        text = " ".join(block_texts(results[-1].get("content")))
        return scenario("", (text, bool(results[-1].get("is_error"))), None) or Reply([Text(["ok"])])
    prompt = prompt_text(user)
    if "SUBTASK" in prompt:
        return Reply([Text(["Sub-agent ", "found 3 files."])])
    if "DELEGATE" in prompt:
        return Reply(
            [
                Text(["Delegating."]),
                ToolUse(subagent_tool(body), subagent_input(body, subagent_tool(body))),
            ]
        )
    if "QUESTION" in prompt and ASK_USER in tool_names(body):
        return Reply([ToolUse(ASK_USER, {"questions": [QUESTION]})])
    return scenario(prompt, None, _bash) or Reply([Text(["ok"])])


def _stop_reason(reply: Reply) -> str:
    return "tool_use" if reply.has_tool_use else "end_turn"


class FakeAnthropic(FakeServer):
    name = "fake-anthropic"
    model_paths = ("/v1/messages",)
    logged_headers = LOGGED_HEADERS

    def __init__(self, script: Callable[[dict[str, Any]], Reply] = default_script) -> None:
        self.script = script
        super().__init__(
            [
                Route("/", self._root, methods=["GET", "HEAD"]),
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
                Route("/{path:path}", self._other, methods=["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]),
            ]
        )

    # ------------------------------------------------------------------ routes

    async def _root(self, request: Request) -> Response:
        await self.record(request)
        return Response(b"", status_code=200)

    async def _other(self, request: Request) -> Response:
        await self.record(request)
        return JSONResponse(
            {"type": "error", "error": {"type": "not_found_error", "message": "not faked"}}, status_code=404
        )

    async def _count_tokens(self, request: Request) -> Response:
        await self.record(request)
        return JSONResponse({"input_tokens": 123})

    async def _messages(self, request: Request) -> Response:
        entry = await self.record(request)
        body = entry.body if isinstance(entry.body, dict) else {}
        reply = self.script(body)
        for b in reply.blocks:
            if isinstance(b, ToolUse) and not b.id:
                b.id = self.next_id("toolu")
        if reply.status != 200:
            return JSONResponse(
                {"type": "error", "error": {"type": reply.error_type, "message": "scripted error"}},
                status_code=reply.status,
            )
        msg_id = self.next_id("msg")
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
                    "stop_reason": _stop_reason(reply),
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 50,
                        "output_tokens": 10,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 0,
                    },
                }
            )
        return StreamingResponse(
            self.stream(entry, _frames(msg_id, reply), reply.delay),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "request-id": self.next_id("req")},
        )


def _frames(msg_id: str, reply: Reply) -> list[tuple[bytes, bool]]:
    """The SSE events of one streamed message; (bytes, is-a-delta)."""
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
                "delta": {"stop_reason": _stop_reason(reply), "stop_sequence": None},
                "usage": {"output_tokens": 12},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return [(sse_data(data, name), name == "content_block_delta") for name, data in events]
