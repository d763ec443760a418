"""The suite's own instruments, without any agent CLI: the fake Messages API answers and
logs what the real CLIs call, and the strace reader finds every peer address."""

from __future__ import annotations

from pathlib import Path

import httpx
from fake_anthropic import FakeAnthropic, Reply, Text, prompt_text
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
