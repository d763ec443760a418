"""The REST API in-process: httpx's ASGI transport against create_app, no socket (the
lifespan, the store and the demo agent are real). For what a socket adds nothing to."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

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
    assert r.status_code == 401 and r.json() == {
        "error": {"code": "unauthorized", "message": "missing or wrong credentials"}
    }


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
    registry = client._transport.app.state.registry  # type: ignore[attr-defined]
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
