"""A loopback fake of OpenAI's chat-completions API for ``bench/qwen_peer.py``.

Both peers of that benchmark (the bridge running ``qwen --acp`` and ``qwen serve``) run
Qwen Code against this one server, so the model costs them the same. It runs in a process
of its own (``python -m bench.fake_model``), so serving the model never competes with the
bench's clients for the GIL; it prints ``fake-model listening on http://127.0.0.1:PORT``.

Strict as the real API where Qwen Code touches it: a request without a bearer key is
refused 401, a chat request without a model or with malformed messages 400, in OpenAI's
error shape; any other path is 404. The reply is picked by a marker in the newest user
message:

* ``DELTAS n`` → n text deltas (``"w0 "``, ``"w1 "``, …), streamed as fast as the socket
  takes them (written in batches of 200 chunks: the fake is never the bottleneck);
* anything else → ``ok``.

``GET /_fake/log`` (no key needed; loopback only) lists every ``[method, path, time]`` the
fake was asked for (``time``: ``time.time()`` on arrival), so the bench can check Qwen Code
asked for nothing but the model, and tell when a prompt reached it.

The tests/real suite has a richer fake of the same API (tests/real/fake_openai.py), whose
replies are fixed scenarios of a few deltas; the bench needs replies of thousands.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "gpt-fake-bench"
ROLES = {"system", "developer", "user", "assistant", "tool"}
BATCH = 200
LOG: list[tuple[str, str, float]] = []


def _error(message: str, status: int) -> Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
    return JSONResponse(body, status)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "\n".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def chunks_for(prompt: str) -> list[str]:
    """The reply's text deltas for the newest user message."""
    if "DELTAS " in prompt:
        word = prompt.split("DELTAS ", 1)[1].split()[0]
        if word.isdigit():
            return [f"w{i} " for i in range(int(word))]
    return ["ok"]


def check(body: Any) -> str | None:
    """Why OpenAI would refuse this chat request, or None."""
    if not isinstance(body, dict):
        return "We could not parse the JSON body of your request."
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter"
    if "stream" in body and not isinstance(body["stream"], bool):
        return "Invalid type for 'stream': expected a boolean"
    return check_messages(body.get("messages"))


def check_messages(messages: Any) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            return f"Invalid value for 'messages[{i}].role'"
    return None


def _authorized(request: Request) -> bool:
    auth = request.headers.get("authorization", "")
    return auth.startswith("Bearer ") and len(auth) > len("Bearer ") + 3


async def chat(request: Request) -> Response:
    LOG.append((request.method, request.url.path, time.time()))
    if not _authorized(request):
        return _error("You didn't provide an API key.", 401)
    try:
        body = json.loads(await request.body())
    except ValueError:
        body = None
    refused = check(body)
    if refused is not None:
        return _error(refused, 400)
    prompt = next((_text(m.get("content")) for m in reversed(body["messages"]) if m.get("role") == "user"), "")
    parts = chunks_for(prompt)
    head = {"id": f"chatcmpl-{len(LOG)}", "object": "chat.completion.chunk", "created": int(time.time())}
    head["model"] = body["model"]
    usage = {"prompt_tokens": 50, "completion_tokens": len(parts), "total_tokens": 50 + len(parts)}
    if not body.get("stream"):
        message = {"role": "assistant", "content": "".join(parts)}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return JSONResponse({**head, "object": "chat.completion", "choices": [choice], "usage": usage})

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"

    async def frames() -> AsyncIterator[bytes]:
        yield chunk({"role": "assistant", "content": ""}).encode()
        for i in range(0, len(parts), BATCH):
            yield "".join(chunk({"content": c}) for c in parts[i : i + BATCH]).encode()
        tail = chunk({}, "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            tail += f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
        yield (tail + "data: [DONE]\n\n").encode()

    return StreamingResponse(frames(), media_type="text/event-stream")


async def models(request: Request) -> Response:
    LOG.append((request.method, request.url.path, time.time()))
    if not _authorized(request):
        return _error("You didn't provide an API key.", 401)
    return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "fake"}]})


async def other(request: Request) -> Response:
    LOG.append((request.method, request.url.path, time.time()))
    print(f"fake-model: unexpected {request.method} {request.url.path}", file=sys.stderr, flush=True)
    return _error(f"Unknown request URL: {request.method} {request.url.path}", 404)


async def log(request: Request) -> Response:
    return JSONResponse(LOG)


APP = Starlette(
    routes=[
        Route("/_fake/log", log, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/{path:path}", other, methods=["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]),
    ]
)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fake_model", description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on connections whose
    # socket says it is TCP, and without it the first streamed chunk (a small write right
    # after the headers) waited for the agent's delayed ACK, 40 ms, in some runs: a model
    # API flushes its stream as it goes.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    config = uvicorn.Config(APP, log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    print(f"fake-model listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
