"""Elicitation's checks, pure: an agent's schema is untrusted (bounded, restricted to the
flat form the ACP specification allows, refused cleanly otherwise), a client's answer is
checked against it, a URL is only an absolute http(s) one; and the ACP codec side."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridge.protocols import jsonrpc
from bridge.protocols.acp_elicit import AcpElicitations, request_data
from bridge.protocols.codec import Decoded
from bridge.protocols.elicitation import (
    MAX_OPTIONS,
    MAX_PROPERTIES,
    Refused,
    check_content,
    form_schema,
    suspicious_host,
    url_target,
)

FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 5, "_meta": {"x": 1}, "extra": True},
        "n": {"type": "integer", "minimum": 1, "maximum": 3, "default": 9},
        "ratio": {"type": "number"},
        "ok": {"type": "boolean", "default": True},
        "pick": {"type": "string", "oneOf": [{"const": "a", "title": "A"}, {"const": "b", "title": "B"}]},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}, "maxItems": 1},
        "when": {"type": "string", "format": "date"},
        "mail": {"type": "string", "format": "email"},
    },
    "required": ["name"],
}


def test_a_spec_form_is_kept_normalized() -> None:
    schema = form_schema(FORM)
    assert schema["properties"]["name"] == {"type": "string", "minLength": 1, "maxLength": 5}
    assert "default" not in schema["properties"]["n"]  # 9 is outside its own range: dropped
    assert schema["properties"]["ok"]["default"] is True
    assert schema["required"] == ["name"]


def _nested(depth: int) -> dict[str, Any]:
    prop: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        prop = {"type": "object", "properties": {"p": prop}}
    return {"type": "object", "properties": {"p": prop}}


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        "object",
        {"type": "array"},
        {"properties": []},
        {"properties": {"p": {"type": "object", "properties": {}}}},
        _nested(200),
        {"properties": {"p": {"$ref": "#/x"}}},
        {"properties": {"p": {"type": "_custom"}}},
        {"properties": {"p": {"type": "string", "maxLength": -1}}},
        {"properties": {"p": {"type": "string", "maxLength": True}}},
        {"properties": {"p": {"type": "string", "minLength": 5, "maxLength": 1}}},
        {"properties": {"p": {"type": "string", "format": "password"}}},
        {"properties": {"p": {"type": "string", "enum": []}}},
        {"properties": {"p": {"type": "string", "enum": ["a", "a"]}}},
        {"properties": {"p": {"type": "string", "enum": [1, 2]}}},
        {"properties": {"p": {"type": "string", "enum": ["a"] * (MAX_OPTIONS + 1)}}},
        {"properties": {"p": {"type": "string", "oneOf": [{"const": "a"}]}}},
        {"properties": {"p": {"type": "number", "minimum": "1"}}},
        {"properties": {"p": {"type": "number", "minimum": float("nan")}}},
        {"properties": {"p": {"type": "integer", "maximum": 1.5}}},
        {"properties": {"p": {"type": "array", "items": {"type": "number"}}}},
        {"properties": {"p": {"type": "array"}}},
        {"properties": {f"p{i}": {"type": "boolean"} for i in range(MAX_PROPERTIES + 1)}},
        {"properties": {"": {"type": "boolean"}}},
        {"properties": {"p": {"type": "boolean"}}, "required": ["q"]},
        {"properties": {"p": {"type": "string", "description": "d" * 100_000}}},
        {"properties": {"p": {"type": "string"}}, "padding": "x" * 100_000},
    ],
)
def test_hostile_or_malformed_schemas_are_refused(raw: Any) -> None:
    with pytest.raises(Refused):
        form_schema(raw)


def test_answers_are_checked_against_the_form() -> None:
    schema = form_schema(FORM)
    good = {"name": "Ada", "n": 2.0, "ratio": 0.5, "ok": False, "pick": "b", "tags": ["y"], "when": "2026-01-02"}
    assert check_content(schema, good)["n"] == 2
    for bad in (
        {},  # required missing
        {"name": ""},
        {"name": "toolong"},
        {"name": "a", "n": 4},
        {"name": "a", "n": True},
        {"name": "a", "ratio": "1"},
        {"name": "a", "ratio": float("inf")},
        {"name": "a", "ok": "yes"},
        {"name": "a", "pick": "c"},
        {"name": "a", "tags": ["x", "y"]},
        {"name": "a", "tags": ["z"]},
        {"name": "a", "tags": "x"},
        {"name": "a", "when": "tomorrow"},
        {"name": "a", "mail": "nobody"},
        {"name": "a", "other": 1},
        [],
    ):
        with pytest.raises(Refused):
            check_content(schema, bad)


@pytest.mark.parametrize(
    "url",
    [
        "javascript:alert(1)",
        "data:text/html,x",
        "file:///etc/passwd",
        "https://user:pw@example.com/",
        "https://exa mple.com/",
        "https://example.com/\nx",
        "/relative",
        "x" * 5000,
        42,
    ],
)
def test_url_mode_takes_only_plain_http_urls(url: Any) -> None:
    with pytest.raises(Refused):
        url_target(url)


def test_url_host_and_lookalikes() -> None:
    assert url_target("https://Example.com:8443/a?b=c") == ("https://Example.com:8443/a?b=c", "example.com")
    assert suspicious_host("xn--pple-43d.com") and not suspicious_host("apple.com")


def test_request_scope_and_modes() -> None:
    assert (
        request_data({"mode": "form", "message": "m", "requestId": 3, "requestedSchema": {}}, None)["scope"]
        == "request"
    )
    with pytest.raises(Refused):
        request_data({"mode": "form", "message": "m", "sessionId": "other", "requestedSchema": {}}, "mine")
    with pytest.raises(Refused):
        request_data({"mode": "voice", "message": "m", "sessionId": "mine"}, "mine")
    with pytest.raises(Refused):
        request_data({"mode": "form", "message": "m"}, "mine")


def test_codec_side_answers_refuses_and_withdraws() -> None:
    el = AcpElicitations()
    out = Decoded()
    el.requested(7, {"mode": "form", "message": "m", "sessionId": "s", "requestedSchema": {}}, "s", "raw", out)
    assert [e.kind for e in out.events] == ["elicitation.requested"] and out.events[0].data["request_id"] == "7"
    assert json.loads(el.answer("7", "accept", {"a": 1}) or "") == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"action": "accept", "content": {"a": 1}},
    }
    assert el.answer("7", "decline", None) is None  # answered once
    bad = Decoded()
    el.requested("x", {"mode": "form", "message": "m", "sessionId": "s", "requestedSchema": []}, "s", "raw", bad)
    assert [e.kind for e in bad.events] == ["diagnostic"]
    assert json.loads(bad.replies[0])["error"]["code"] == jsonrpc.INVALID_PARAMS
    el.requested(8, {"mode": "form", "message": "m", "sessionId": "s", "requestedSchema": {}}, "s", "raw", Decoded())
    gone = Decoded()
    assert el.withdrawn(8, "raw", gone) and gone.events[0].data == {
        "request_id": "8",
        "action": "cancel",
        "by": "agent",
    }
    assert json.loads(gone.replies[0])["error"]["code"] == jsonrpc.REQUEST_CANCELLED
    el.requested(9, {"mode": "form", "message": "m", "sessionId": "s", "requestedSchema": {}}, "s", "raw", Decoded())
    assert [json.loads(line)["result"] for line in el.cancel_all()] == [{"action": "cancel"}]
