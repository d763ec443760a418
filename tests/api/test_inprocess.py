"""The REST API in-process: httpx's ASGI transport against create_app, no socket (the
lifespan, the store and the demo agent are real). For what a socket adds nothing to."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge.api.app import create_app
from bridge.config import load_settings
from bridge.protocols.jsonline import loads_strict, parse_object

pytestmark = pytest.mark.timeout(30)
TOKEN = "t" * 32


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = load_settings(data_dir=str(tmp_path), token=TOKEN, port=8765)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765", headers=headers) as c:
            yield c


async def test_a_prompt_body_and_a_frame_are_validated_by_the_same_schema(client: httpx.AsyncClient) -> None:
    thread = (await client.post("/v1/threads", json={"agent": "demo"})).json()
    url = f"/v1/threads/{thread['id']}/messages"
    r = await client.post(url, json={"text": "hi", "content": [{"type": "text", "text": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_content"
    r = await client.post(url, json={"text": "hi", "client_id": ""})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    r = await client.post(url, json={"text": "hi", "surprise": 1})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    r = await client.post(url, json={"text": "hello", "client_id": "c1"})
    assert r.status_code == 202 and r.json()["queued"] is False
    again = await client.post(url, json={"text": "hello", "client_id": "c1"})
    assert again.status_code == 200 and again.json()["duplicate"] is True and again.json()["seq"] == r.json()["seq"]


async def test_a_refused_body_or_query_is_explained_in_plain_words(client: httpx.AsyncClient) -> None:
    """Issue #34: messages named the validation library ("Input should be a valid
    dictionary or object to extract fields from"), not what to send."""
    thread = (await client.post("/v1/threads", json={"agent": "demo"})).json()
    url = f"/v1/threads/{thread['id']}/messages"
    events = f"/v1/threads/{thread['id']}/events"
    cases: list[tuple[str, str, Any, dict[str, Any] | None, str]] = [
        ("POST", url, ["hi"], None, "the request body: must be a JSON object"),
        ("POST", url, {"text": "hi", "surprise": 1}, None, "surprise: is not a field this request takes"),
        ("POST", f"/v1/threads/{thread['id']}/mode", {"mode_id": 5}, None, "mode_id: must be a string"),
        ("POST", url, {"text": "hi", "client_id": ""}, None, "client_id: must be at least 1 character(s) long"),
        ("GET", events, None, {"limit": 0}, "query.limit: must be at least 1"),
    ]
    for method, path, body, params, message in cases:
        r = await client.request(method, path, json=body, params=params)
        assert r.status_code == 400, r.text
        assert r.json()["error"] == {"code": "invalid_request", "message": message}


async def test_every_refusal_has_the_one_error_body(client: httpx.AsyncClient) -> None:
    for method, path, body, status in [
        ("GET", "/v1/threads/thr_0000000000000000", None, 404),
        ("POST", "/v1/threads", {"agent": "nope"}, 404),
        ("GET", "/v1/nowhere", None, 404),
        ("POST", "/v1/threads/thr_0000000000000000/permissions/p1", {"decision": "allow"}, 404),
        ("GET", "/assets/../../etc/passwd", None, 404),
    ]:
        r = await client.request(method, path, json=body)
        assert r.status_code == status, (path, r.text)
        err = r.json()["error"]
        assert set(err) == {"code", "message"} and err["code"] and err["message"]
    r = await client.get("/v1/threads", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert r.json()["error"]["message"].startswith("the bearer token is wrong: send the daemon's token")


def test_an_infinite_number_is_refused_in_a_client_frame_and_in_an_agent_line_alike() -> None:
    # One strict parser: a client frame (loads_strict) and an agent line (parse_object).
    for text in ('{"op":"raw","message":{"n":1e400}}', '{"n":-1e400}', '{"n":NaN}', '{"n":Infinity}'):
        with pytest.raises(ValueError):
            loads_strict(text)
        obj, _, problem = parse_object(text.encode())
        assert obj is None and problem == "line is not JSON"
    assert loads_strict('{"n":1e308}') == {"n": 1e308} == parse_object(b'{"n":1e308}')[0]


async def test_a_raw_frame_with_an_infinite_number_never_reaches_the_agent(client: httpx.AsyncClient) -> None:
    """Before: 1e400 was read as infinity and written to the agent as null."""
    from bridge.api.ws import _Session  # the frame handler, without a socket

    thread = (await client.post("/v1/threads", json={"agent": "demo"})).json()
    registry = client._transport.app.context.registry  # type: ignore[attr-defined]
    conv = await registry.get(thread["id"])
    rejected: list[tuple[str | None, str]] = []

    class Probe(_Session):
        def __init__(self) -> None:
            self.conv = conv

        async def _reject(self, op: str | None, code: str, message: str, **extra: object) -> None:
            rejected.append((op, code))

    await Probe()._op_frame(json.dumps({"op": "raw", "message": {"n": 1}})[:-1] + ', "x": 1e400}')
    assert rejected == [(None, "invalid_json")]
    assert not conv.running  # nothing was started, nothing written


def test_refusals_are_throttled_per_peer_and_logged_at_a_bounded_rate(capsys: pytest.CaptureFixture[str]) -> None:
    from bridge.api.throttle import Refusals

    now = [0.0]
    r = Refusals(max_failures=3, window_s=60, log_every_s=10, clock=lambda: now[0])
    for _ in range(3):
        assert r.retry_after("10.0.0.1") is None
        r.refused("10.0.0.1", "token", guess=True)
    assert r.retry_after("10.0.0.1") == 60 and r.retry_after("10.0.0.2") is None
    for _ in range(50):
        r.refused("10.0.0.2", "no credentials", guess=False)  # not a guess: never throttled
    assert r.retry_after("10.0.0.2") is None
    now[0] = 59.5
    assert r.retry_after("10.0.0.1") == 1
    now[0] = 60.0
    assert r.retry_after("10.0.0.1") is None
    captured = capsys.readouterr()
    lines = [x for x in (captured.out + captured.err).splitlines() if "auth.refused" in x]
    assert 2 <= len(lines) <= 4  # one per peer per 10 s (and after), never one per attempt


async def test_wrong_tokens_and_login_codes_get_429_with_retry_after_and_no_secret_in_the_log(
    client: httpx.AsyncClient, capfd: pytest.CaptureFixture[str]
) -> None:
    """Hardening II #9: 3,000 wrong login codes were neither logged nor slowed down."""
    for i in range(20):
        r = await client.post("/v1/session", json={"code": f"guess-{i}"}, headers={"Authorization": ""})
        assert r.status_code == 401
    r = await client.post("/v1/session", json={"code": "guess-x"}, headers={"Authorization": ""})
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
    assert r.json()["error"]["code"] == "too_many_failures"
    r = await client.get("/v1/threads", headers={"Authorization": "Bearer wrong-token-value"})
    assert r.status_code == 429  # a wrong token too (a valid one passes: tests/api/test_throttle.py)
    out = capfd.readouterr()
    logged = out.out + out.err
    assert "auth.refused" in logged and "guess-" not in logged and "wrong-token-value" not in logged
