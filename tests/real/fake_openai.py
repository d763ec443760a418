"""A loopback fake of the OpenAI APIs for the real-agent suite (issue #17): chat
completions (Qwen Code, OpenCode) and Responses (Codex).

Served under ``/v1`` (the base URL the CLIs are given is ``{url}/v1``):

* ``GET /v1/models`` → the one model;
* ``POST /v1/chat/completions`` → a scripted reply, streamed as SSE ``chat.completion.chunk``
  objects then ``data: [DONE]`` when the request says ``stream: true``, else one
  ``chat.completion``;
* ``POST /v1/responses`` → a scripted reply as the Responses API's streamed events;
* anything else → 404 (logged, so a test sees it).

Strict as the real API: a request without a bearer key is refused 401, one whose body is
not a well-formed request 400, with OpenAI's error shape. The reply comes from
:func:`fakeserver.scenario`, keyed on marker words of the newest user message; a WRITE
calls the CLI's own shell tool, picked from the request's tool list.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fakeserver import FakeServer, Refused, Reply, Text, ToolUse, scenario, sse_data
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "gpt-fake-1"
ROLES = {"system", "developer", "user", "assistant", "tool"}


def _shell_tool(names: list[str]) -> Any:
    """The CLI's shell tool and how it takes a command, from the tools it offered."""
    if "run_shell_command" in names:  # Qwen Code, Gemini CLI
        return lambda cmd: ToolUse("run_shell_command", {"command": cmd, "description": "Create a file"})
    if "bash" in names:  # OpenCode
        return lambda cmd: ToolUse("bash", {"command": cmd, "description": "Create a file"})
    if "shell" in names:  # Codex
        return lambda cmd: ToolUse("shell", {"command": ["bash", "-lc", cmd]})
    if "exec_command" in names:  # Codex, unified exec
        return lambda cmd: ToolUse("exec_command", {"cmd": cmd})
    return None


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "\n".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def all_texts(body: Any) -> list[str]:
    """Every message text of a chat-completions or Responses request (history included)."""
    body = body if isinstance(body, dict) else {}
    items = body.get("messages") if isinstance(body.get("messages"), list) else body.get("input")
    out = []
    for m in items if isinstance(items, list) else []:
        if isinstance(m, dict):
            text = content_text(m.get("content")) if "content" in m else str(m.get("output", ""))
            if text:
                out.append(text)
    return out


# ---------------------------------------------------------------- chat completions


def check_chat_request(body: Any) -> None:
    if not isinstance(body, dict):
        raise Refused("We could not parse the JSON body of your request.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise Refused("you must provide a model parameter")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Refused("'messages' must be a non-empty array")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise Refused(f"Invalid value for 'messages[{i}].role'")
        if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise Refused(f"Missing required parameter: 'messages[{i}].tool_call_id'")
        for call in m.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(call.get("id"), str):
                raise Refused(f"Invalid 'messages[{i}].tool_calls'")
            json.loads(fn.get("arguments") or "{}")  # must be a JSON string
    for t in body.get("tools") or []:
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise Refused("Invalid 'tools': each must be {type: function, function: {...}}")
        if not isinstance(t["function"].get("name"), str):
            raise Refused("Missing required parameter: 'tools[].function.name'")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise Refused("Invalid type for 'stream': expected a boolean")
    if body.get("stream_options") is not None and not body.get("stream"):
        raise Refused("The 'stream_options' parameter is only allowed when 'stream' is enabled.")


def chat_tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools") or []]


def chat_script(body: dict[str, Any]) -> Reply:
    messages = body["messages"]
    last = messages[-1]
    if last["role"] == "tool":
        text = content_text(last.get("content"))
        return scenario("", (text, "error" in text.lower() or "denied" in text.lower()), None) or Reply([Text(["ok"])])
    prompt = next((content_text(m.get("content")) for m in reversed(messages) if m["role"] == "user"), "")
    return scenario(prompt, None, _shell_tool(chat_tool_names(body))) or Reply([Text(["ok"])])


# ---------------------------------------------------------------- Responses


def check_responses_request(body: Any) -> None:
    if not isinstance(body, dict):
        raise Refused("We could not parse the JSON body of your request.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise Refused("you must provide a model parameter")
    items = body.get("input")
    if not isinstance(items, (list, str)) or not items:
        raise Refused("Missing required parameter: 'input'")
    for i, item in enumerate(items if isinstance(items, list) else []):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") not in ROLES:
            raise Refused(f"Invalid value for 'input[{i}].role'")
        if kind == "function_call_output" and not isinstance(item.get("call_id"), str):
            raise Refused(f"Missing required parameter: 'input[{i}].call_id'")
        if kind is None:
            raise Refused(f"Invalid 'input[{i}]'")
    for t in body.get("tools") or []:
        if not isinstance(t, dict) or not isinstance(t.get("type"), str):
            raise Refused("Invalid 'tools'")


def responses_tool_names(body: dict[str, Any]) -> list[str]:
    return [t.get("name", "") for t in body.get("tools") or [] if t.get("type") == "function"]


def responses_script(body: dict[str, Any]) -> Reply:
    items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
    last = items[-1]
    if last.get("type") == "function_call_output":
        out = last.get("output")
        text = out if isinstance(out, str) else json.dumps(out)
        return scenario("", (text, "denied" in text.lower() or "rejected" in text.lower()), None) or Reply(
            [Text(["ok"])]
        )
    prompt = next(
        (
            content_text(m.get("content"))
            for m in reversed(items)
            if m.get("type", "message") == "message" and m.get("role") == "user"
        ),
        "",
    )
    return scenario(prompt, None, _shell_tool(responses_tool_names(body))) or Reply([Text(["ok"])])


class FakeOpenAI(FakeServer):
    name = "fake-openai"
    model_paths = ("/v1/chat/completions", "/v1/responses")
    logged_headers = ("user-agent", "content-type", "openai-beta", "session_id", "originator", "x-stainless-lang")

    def __init__(self) -> None:
        super().__init__(
            [
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/{path:path}", self._other, methods=["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]),
            ]
        )

    @staticmethod
    def _error(message: str, status: int, kind: str = "invalid_request_error") -> Response:
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status)

    def _authorized(self, request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        return auth.startswith("Bearer ") and len(auth) > len("Bearer ") + 3

    async def _other(self, request: Request) -> Response:
        await self.record(request)
        return self._error(f"Unknown request URL: {request.method} {request.url.path}", 404)

    async def _models(self, request: Request) -> Response:
        await self.record(request)
        if not self._authorized(request):
            return self._error("You didn't provide an API key.", 401)
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "fake"}]})

    async def _checked(self, request: Request, check: Any) -> tuple[Any, Response | None]:
        entry = await self.record(request)
        if not self._authorized(request):
            return entry, self._error("You didn't provide an API key.", 401)
        try:
            check(entry.body)
        except (Refused, ValueError, TypeError, AttributeError) as exc:
            return entry, self._error(str(exc), getattr(exc, "status", 400))
        return entry, None

    async def _chat(self, request: Request) -> Response:
        entry, refused = await self._checked(request, check_chat_request)
        if refused is not None:
            return refused
        body = entry.body
        reply = chat_script(body)
        for b in reply.blocks:
            if isinstance(b, ToolUse) and not b.id:
                b.id = self.next_id("call")
        cid, created = self.next_id("chatcmpl"), int(time.time())
        finish = "tool_calls" if reply.has_tool_use else "stop"
        calls = [b for b in reply.blocks if isinstance(b, ToolUse)]
        if not body.get("stream"):
            message: dict[str, Any] = {
                "role": "assistant",
                "content": "".join(c for b in reply.blocks if isinstance(b, Text) for c in b.chunks) or None,
            }
            if calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.input)}}
                    for c in calls
                ]
            return JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
                }
            )

        def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> bytes:
            choices = [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
            obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": body["model"]}
            return sse_data({**obj, "choices": choices, **extra})

        frames: list[tuple[bytes, bool]] = [(chunk({"role": "assistant", "content": ""}), False)]
        for b in reply.blocks:
            if isinstance(b, Text):
                frames += [(chunk({"content": c}), True) for c in b.chunks]
        for i, c in enumerate(calls):
            call = {"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
            frames.append((chunk({"tool_calls": [call]}), False))
            args = {"index": i, "function": {"arguments": json.dumps(c.input)}}
            frames.append((chunk({"tool_calls": [args]}), True))
        frames.append((chunk({}, finish), False))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}
            obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": body["model"]}
            frames.append((sse_data({**obj, "choices": [], "usage": usage}), False))
        frames.append((b"data: [DONE]\n\n", False))
        return StreamingResponse(self.stream(entry, frames, reply.delay), media_type="text/event-stream")

    async def _responses(self, request: Request) -> Response:
        entry, refused = await self._checked(request, check_responses_request)
        if refused is not None:
            return refused
        body = entry.body
        if body.get("stream") is not True:
            return self._error("this fake streams Responses only ('stream': true)", 400)
        reply = responses_script(body)
        rid = self.next_id("resp")
        seq = iter(range(1, 10_000))

        def event(kind: str, **data: Any) -> bytes:
            return sse_data({"type": kind, "sequence_number": next(seq), **data}, kind)

        base = {"id": rid, "object": "response", "created_at": int(time.time()), "model": body["model"]}
        frames: list[tuple[bytes, bool]] = [
            (event("response.created", response={**base, "status": "in_progress", "output": []}), False)
        ]
        output: list[dict[str, Any]] = []
        for i, b in enumerate(reply.blocks):
            if isinstance(b, Text):
                item_id = self.next_id("msg")
                item = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
                frames.append((event("response.output_item.added", output_index=i, item=item), False))
                part = {"type": "output_text", "text": "", "annotations": []}
                frames.append(
                    (
                        event(
                            "response.content_part.added", item_id=item_id, output_index=i, content_index=0, part=part
                        ),
                        False,
                    )
                )
                frames += [
                    (
                        event("response.output_text.delta", item_id=item_id, output_index=i, content_index=0, delta=c),
                        True,
                    )
                    for c in b.chunks
                ]
                text = "".join(b.chunks)
                done = {**item, "status": "completed", "content": [{**part, "text": text}]}
                frames.append((event("response.output_item.done", output_index=i, item=done), False))
                output.append(done)
            else:
                b.id = b.id or self.next_id("call")
                item = {
                    "id": self.next_id("fc"),
                    "type": "function_call",
                    "status": "completed",
                    "call_id": b.id,
                    "name": b.name,
                    "arguments": json.dumps(b.input),
                }
                frames.append((event("response.output_item.added", output_index=i, item=item), False))
                frames.append((event("response.output_item.done", output_index=i, item=item), True))
                output.append(item)
        usage = {
            "input_tokens": 50,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 10,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 60,
        }
        done_resp = {**base, "status": "completed", "output": output, "usage": usage}
        frames.append((event("response.completed", response=done_resp), False))
        return StreamingResponse(self.stream(entry, frames, reply.delay), media_type="text/event-stream")
