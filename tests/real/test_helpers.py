"""The suite's own instruments, without any agent CLI: the fake model APIs answer and log
what the real CLIs call and refuse what the real APIs refuse, and the strace reader finds
every peer address."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from fake_anthropic import FakeAnthropic, Reply, Text, prompt_text
from fake_gemini import FakeGemini
from fake_openai import FakeOpenAI
from fakeserver import CHAT_TEXT
from realagents import network_peers


def test_fake_api_answers_and_logs_every_request() -> None:
    fake = FakeAnthropic()
    fake.start()
    try:
        with httpx.Client(base_url=fake.url, timeout=10) as http:
            assert http.head("/").status_code == 200
            assert http.post("/v1/messages/count_tokens?beta=true", json={}).json() == {"input_tokens": 123}
            body = {"model": "m", "stream": False, "messages": [{"role": "user", "content": "CHAT hi"}]}
            msg = http.post("/v1/messages?beta=true", json=body).json()
            assert msg["content"] == [{"type": "text", "text": "Hello from the fake model."}]
            with http.stream("POST", "/v1/messages", json={**body, "stream": True}) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                events = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
            assert events[0] == "message_start" and events[-1] == "message_stop"
            assert events.count("content_block_delta") == 5
            assert http.get("/api/event_logging/v2/batch").status_code == 404
            fake.script = lambda _body: Reply([Text(["x"])], status=529, error_type="overloaded_error")
            err = http.post("/v1/messages", json=body)
            assert err.status_code == 529 and err.json()["error"]["type"] == "overloaded_error"
    finally:
        fake.stop()
    assert [(e.method, e.path) for e in fake.log] == [
        ("HEAD", "/"),
        ("POST", "/v1/messages/count_tokens"),
        ("POST", "/v1/messages"),
        ("POST", "/v1/messages"),
        ("GET", "/api/event_logging/v2/batch"),
        ("POST", "/v1/messages"),
    ]
    assert fake.log[3].stream == "completed" and fake.log[2].query == "beta=true"


def test_the_newest_prompt_is_the_last_text_that_is_not_a_reminder() -> None:
    msg = {
        "role": "user",
        "content": [
            {"type": "text", "text": "SLOW please"},
            {"type": "text", "text": "CHAT again"},
            {"type": "text", "text": "<system-reminder>x</system-reminder>"},
        ],
    }
    assert prompt_text(msg) == "CHAT again"


def test_network_peers_reads_ipv4_and_ipv6_addresses_from_strace(tmp_path: Path) -> None:
    log = tmp_path / "strace.log"
    log.write_text(
        '10 connect(16, {sa_family=AF_INET, sin_port=htons(38335), sin_addr=inet_addr("127.0.0.1")}, 16) = -1\n'
        '10 connect(17, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("192.0.2.53")}, 16) = 0\n'
        "11 connect(5, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), "
        'inet_pton(AF_INET6, "2001:db8::1", &sin6_addr), sin6_scope_id=0}, 28) = 0\n'
        '12 connect(3, {sa_family=AF_UNIX, sun_path="/run/x.sock"}, 110) = 0\n'
    )
    assert network_peers(log) == [("127.0.0.1", 38335), ("192.0.2.53", 53), ("2001:db8::1", 443)]


def test_fake_openai_streams_chat_and_responses_and_refuses_what_the_api_would() -> None:
    fake = FakeOpenAI()
    fake.start()
    try:
        key = {"authorization": "Bearer sk-fake-0123456789"}
        with httpx.Client(base_url=fake.url, timeout=10, headers=key) as http:
            chat = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "CHAT hi"}]}
            with http.stream("POST", "/v1/chat/completions", json=chat) as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                data = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
            assert data[-1] == "[DONE]"
            chunks = [json.loads(d) for d in data[:-1]]
            assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == CHAT_TEXT
            assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
            tools = [{"type": "function", "function": {"name": "run_shell_command", "parameters": {}}}]
            write = {**chat, "stream": False, "tools": tools, "messages": [{"role": "user", "content": "WRITE /x"}]}
            [call] = http.post("/v1/chat/completions", json=write).json()["choices"][0]["message"]["tool_calls"]
            assert call["function"]["name"] == "run_shell_command"
            assert json.loads(call["function"]["arguments"])["command"] == "touch /x"
            resp = {"model": "m", "stream": True, "input": [{"role": "user", "content": "CHAT hi"}]}
            with http.stream("POST", "/v1/responses", json=resp) as r:
                kinds = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            assert kinds.count("response.output_text.delta") == 5
            # refused, as the real API refuses them
            assert http.post("/v1/chat/completions", json={"model": "m", "messages": []}).status_code == 400
            bad_role = {"model": "m", "messages": [{"role": "robot", "content": "x"}]}
            assert http.post("/v1/chat/completions", json=bad_role).status_code == 400
            no_id = {"model": "m", "messages": [{"role": "tool", "content": "x"}]}
            assert http.post("/v1/chat/completions", json=no_id).json()["error"]["type"] == "invalid_request_error"
            opts = {**chat, "stream": False, "stream_options": {"include_usage": True}}
            assert http.post("/v1/chat/completions", json=opts).status_code == 400
            assert http.post("/v1/chat/completions", content=b"{nope").status_code == 400
            assert http.post("/v1/responses", json={"model": "m", "input": []}).status_code == 400
            assert http.post("/v1/chat/completions", json=chat, headers={"authorization": ""}).status_code == 401
            assert http.get("/v1/telemetry").status_code == 404
    finally:
        fake.stop()
    assert len(fake.model_requests()) == 10  # every one logged, the refused ones too
    assert fake.log[0].stream == "completed"


def test_fake_gemini_streams_and_refuses_what_the_api_would() -> None:
    fake = FakeGemini()
    fake.start()
    try:
        with httpx.Client(base_url=fake.url, timeout=10, headers={"x-goog-api-key": "k-0123456789"}) as http:
            body = {"contents": [{"role": "user", "parts": [{"text": "CHAT hi"}]}]}
            with http.stream("POST", "/v1beta/models/g:streamGenerateContent?alt=sse", json=body) as r:
                data = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
            texts = "".join(p.get("text", "") for d in data for p in d["candidates"][0]["content"]["parts"])
            assert texts == CHAT_TEXT and data[-1]["candidates"][0]["finishReason"] == "STOP"
            tools = [{"functionDeclarations": [{"name": "run_shell_command"}]}]
            write = {"contents": [{"role": "user", "parts": [{"text": "WRITE /x"}]}], "tools": tools}
            with http.stream("POST", "/v1beta/models/g:streamGenerateContent?alt=sse", json=write) as r:
                data = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
            assert data[0]["candidates"][0]["content"]["parts"][0]["functionCall"]["args"]["command"] == "touch /x"
            assert http.post("/v1beta/models/g:countTokens", json=body).json() == {"totalTokens": 123}
            empty = {"contents": [{"role": "user", "parts": []}]}
            r = http.post("/v1beta/models/g:streamGenerateContent?alt=sse", json=empty)
            assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
            assert http.post("/v1beta/models/g:generateContent", json={"contents": []}).status_code == 400
            bad_role = {"contents": [{"role": "bot", "parts": [{"text": "x"}]}]}
            assert http.post("/v1beta/models/g:generateContent", json=bad_role).status_code == 400
            assert http.post("/v1beta/models/g:streamGenerateContent", json=body).status_code == 400  # no alt=sse
            r = http.post("/v1beta/models/g:generateContent", json=body, headers={"x-goog-api-key": ""})
            assert r.status_code == 403 and r.json()["error"]["status"] == "PERMISSION_DENIED"
            assert http.post("/v1beta/models/g:embedContent", json=body).status_code == 404
    finally:
        fake.stop()
    assert [e.stream for e in fake.chat_requests()][:2] == ["completed", "completed"]
