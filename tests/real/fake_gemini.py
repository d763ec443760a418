"""A loopback fake of the Gemini API (``generativelanguage``) for the real-agent suite
(issue #17): what Gemini CLI calls with ``GEMINI_API_KEY`` and ``GOOGLE_GEMINI_BASE_URL``.

* ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse`` → a scripted reply as SSE
  ``GenerateContentResponse`` chunks (the last one with ``finishReason``);
* ``POST /v1beta/models/{model}:generateContent`` → one ``GenerateContentResponse`` (a JSON
  object when the request asks for JSON output);
* ``POST /v1beta/models/{model}:countTokens`` → ``{"totalTokens": N}``;
* anything else → 404 (logged, so a test sees it).

Strict as the real API: no ``x-goog-api-key`` → 403 ``PERMISSION_DENIED``; a body that is
not a well-formed request (``contents`` a non-empty list of ``{role, parts}``, roles
``user``/``model``, each part one of text / functionCall / functionResponse / …) → 400
``INVALID_ARGUMENT``, in Google's error shape.
"""

from __future__ import annotations

import json
from typing import Any

from fakeserver import FakeServer, Refused, Reply, Text, ToolUse, scenario, sse_data
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "gemini-fake-1"
PART_KEYS = {
    "text",
    "functionCall",
    "functionResponse",
    "inlineData",
    "fileData",
    "thought",
    "thoughtSignature",
    "executableCode",
    "codeExecutionResult",
}


def check_request(body: Any) -> None:
    if not isinstance(body, dict):
        raise Refused("Invalid JSON payload received.")
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise Refused("* GenerateContentRequest.contents: contents is not specified")
    for i, c in enumerate(contents):
        if not isinstance(c, dict) or c.get("role", "user") not in ("user", "model", "function"):
            raise Refused(f"* GenerateContentRequest.contents[{i}].role: invalid role")
        parts = c.get("parts")
        if not isinstance(parts, list) or not parts:
            raise Refused(f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty.")
        for p in parts:
            if not isinstance(p, dict) or not (set(p) & PART_KEYS):
                raise Refused(f"* GenerateContentRequest.contents[{i}].parts: a part must have data")
    for t in body.get("tools") or []:
        if not isinstance(t, dict):
            raise Refused("* GenerateContentRequest.tools: invalid tool")
        for f in t.get("functionDeclarations") or []:
            if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                raise Refused("* GenerateContentRequest.tools[].function_declarations[].name: name is required")


def parts_text(parts: Any) -> str:
    return "\n".join(p["text"] for p in parts or [] if isinstance(p, dict) and isinstance(p.get("text"), str))


def all_texts(body: Any) -> list[str]:
    """Every text of a request's contents (history included), one per content."""
    contents = body.get("contents") if isinstance(body, dict) else None
    return [t for c in contents or [] if (t := parts_text(c.get("parts")))]


def tool_names(body: dict[str, Any]) -> list[str]:
    return [f.get("name", "") for t in body.get("tools") or [] for f in t.get("functionDeclarations") or []]


def script(body: dict[str, Any]) -> Reply:
    last = body["contents"][-1]
    responses = [p["functionResponse"] for p in last["parts"] if "functionResponse" in p]
    if responses:
        text = json.dumps(responses[-1].get("response"))
        return scenario("", (text, "error" in text.lower()), None) or Reply([Text(["ok"])])
    prompt = next((parts_text(c["parts"]) for c in reversed(body["contents"]) if c.get("role") == "user"), "")
    shell = None
    if "run_shell_command" in tool_names(body):

        def shell(cmd: str) -> ToolUse:
            return ToolUse("run_shell_command", {"command": cmd, "description": "Create a file"})

    return scenario(prompt, None, shell) or Reply([Text(["ok"])])


class FakeGemini(FakeServer):
    name = "fake-gemini"
    logged_headers = ("user-agent", "content-type", "x-goog-api-client")

    def __init__(self) -> None:
        super().__init__(
            [
                Route("/v1beta/models/{call:path}", self._model_call, methods=["POST"]),
                Route("/{path:path}", self._other, methods=["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]),
            ]
        )

    def is_model_path(self, path: str) -> bool:
        return path.endswith((":streamGenerateContent", ":generateContent"))

    def chat_requests(self) -> list[Any]:
        """The streamed model requests: the agent's turns (not its side queries)."""
        return [e for e in self.model_requests() if e.path.endswith(":streamGenerateContent")]

    @staticmethod
    def _error(message: str, status: int, kind: str) -> Response:
        return JSONResponse({"error": {"code": status, "message": message, "status": kind}}, status)

    async def _other(self, request: Request) -> Response:
        await self.record(request)
        return self._error(f"Method not found: {request.url.path}", 404, "NOT_FOUND")

    async def _model_call(self, request: Request) -> Response:
        entry = await self.record(request)
        model, _, method = request.path_params["call"].partition(":")
        if not request.headers.get("x-goog-api-key"):
            return self._error("Method doesn't allow unregistered callers.", 403, "PERMISSION_DENIED")
        if method == "countTokens":
            return JSONResponse({"totalTokens": 123})
        if method not in ("generateContent", "streamGenerateContent") or not model:
            return self._error(f"Method not found: {method}", 404, "NOT_FOUND")
        try:
            check_request(entry.body)
        except Refused as exc:
            return self._error(str(exc), exc.status, "INVALID_ARGUMENT")
        body = entry.body
        usage = {"promptTokenCount": 50, "candidatesTokenCount": 10, "totalTokenCount": 60}
        rid = self.next_id("resp")

        def response(parts: list[dict[str, Any]], finish: str | None = None) -> dict[str, Any]:
            cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
            if finish:
                cand["finishReason"] = finish
            return {"candidates": [cand], "usageMetadata": usage, "modelVersion": model, "responseId": rid}

        if method == "generateContent":
            config = body.get("generationConfig") or {}
            if config.get("responseMimeType") == "application/json":
                # Side queries (next speaker, routing, …) ask for JSON: a neutral answer.
                answer = {"reasoning": "fake", "next_speaker": "user", "model_choice": "flash", "complexity": 1}
                return JSONResponse(response([{"text": json.dumps(answer)}], "STOP"))
            reply = script(body)
            text = "".join(c for b in reply.blocks if isinstance(b, Text) for c in b.chunks)
            return JSONResponse(response([{"text": text or "ok"}], "STOP"))
        if request.query_params.get("alt") != "sse":
            return self._error("this fake streams as SSE only (alt=sse)", 400, "INVALID_ARGUMENT")
        reply = script(body)
        frames: list[tuple[bytes, bool]] = []
        for b in reply.blocks:
            if isinstance(b, Text):
                frames += [(sse_data(response([{"text": c}])), True) for c in b.chunks]
            else:
                frames.append((sse_data(response([{"functionCall": {"name": b.name, "args": b.input}}])), True))
        frames.append((sse_data(response([{"text": ""}], "STOP")), False))
        return StreamingResponse(self.stream(entry, frames, reply.delay), media_type="text/event-stream")
