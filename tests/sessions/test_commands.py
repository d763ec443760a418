"""A client's commands (sessions/commands.py): one table of bounds that every surface
reads, checks made when a command is built (so one that exists is well-formed wherever it
came from), and a wire form that another replica reads back strictly."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from bridge.api.schema import ModeIn, PermissionFrame, PermissionIn, PromptIn
from bridge.errors import InvalidRequest
from bridge.sessions.commands import (
    BOUNDS,
    KINDS,
    AnswerElicitation,
    AnswerPermission,
    ForkPoint,
    Interrupt,
    MalformedAnswer,
    Prompt,
    Raw,
    SetConfigOption,
    SetMode,
    SetModel,
    from_wire,
)

TEXT = [{"type": "text", "text": "x"}]


def test_the_bounds_are_those_docs_api_states() -> None:
    # docs/api.md §4.6 (64 blocks, client_id 1–128), §4.8 (a message of 4096), §5.3 (256)
    assert (BOUNDS.content_blocks, BOUNDS.client_id, BOUNDS.permission_message) == (64, 128, 4096)
    assert (BOUNDS.request_id, BOUNDS.option_id, BOUNDS.mode_id) == (256, 256, 256)


@pytest.mark.parametrize(
    "build",
    [
        lambda: Prompt(content=TEXT * (BOUNDS.content_blocks + 1)),
        lambda: Prompt(content=[]),
        lambda: Prompt(content=[{"text": "no type"}]),
        lambda: Prompt(content=TEXT, client_id="c" * (BOUNDS.client_id + 1)),
        lambda: Prompt(content=TEXT, client_id=""),
        lambda: Prompt(content=TEXT, client_id="\ud800"),
        lambda: AnswerPermission(request_id="r", decision="allow", message="m" * (BOUNDS.permission_message + 1)),
        lambda: AnswerPermission(request_id="", decision="allow"),
        lambda: AnswerPermission(request_id="r", decision="allow", channel="c" * (BOUNDS.channel + 1)),
        lambda: SetMode(mode_id="m" * (BOUNDS.mode_id + 1)),
        lambda: Raw(message=[1]),  # type: ignore[arg-type]
        lambda: Interrupt(actor="u" * (BOUNDS.actor + 1)),
    ],
)
def test_a_command_out_of_bounds_cannot_be_built(build: Any) -> None:
    with pytest.raises(InvalidRequest) as caught:
        build()
    assert caught.value.code == "invalid_request" and caught.value.status == 400


def test_the_largest_command_within_bounds_is_built() -> None:
    Prompt(content=TEXT * BOUNDS.content_blocks, client_id="c" * BOUNDS.client_id)
    AnswerPermission(request_id="r" * 256, decision="deny", message="m" * BOUNDS.permission_message)
    SetMode(mode_id="m" * BOUNDS.mode_id)


def test_the_rest_and_websocket_schemas_hold_the_same_bounds() -> None:
    blocks = TEXT * (BOUNDS.content_blocks + 1)
    with pytest.raises(InvalidRequest) as caught:
        PromptIn.model_validate({"content": blocks})
    assert caught.value.code == "invalid_content"
    with pytest.raises(ValidationError):
        PromptIn.model_validate({"text": "x", "client_id": "c" * (BOUNDS.client_id + 1)})
    with pytest.raises(ValidationError):
        PermissionIn.model_validate({"decision": "deny", "message": "m" * (BOUNDS.permission_message + 1)})
    with pytest.raises(ValidationError):
        PermissionFrame.model_validate({"decision": "deny", "request_id": "r" * (BOUNDS.request_id + 1)})
    with pytest.raises(ValidationError):
        ModeIn.model_validate({"mode_id": "m" * (BOUNDS.mode_id + 1)})


def test_each_schema_makes_its_command_with_who_sent_it() -> None:
    assert PromptIn.model_validate({"text": "hi", "client_id": "c1"}).command("ann") == Prompt(
        content=[{"type": "text", "text": "hi"}], client_id="c1", actor="ann"
    )
    body = PermissionIn.model_validate({"decision": "deny", "message": "no"})
    assert body.command("r1", "ann", channel="rest") == AnswerPermission(
        request_id="r1", decision="deny", channel="rest", message="no", actor="ann"
    )
    assert ModeIn.model_validate({"mode_id": "plan"}).command("ann") == SetMode(mode_id="plan", actor="ann")


def test_actor_and_channel_cross_the_bus_under_their_old_wire_names() -> None:
    # Replicas of the previous version sent (and read) `user` for who acted and `by` for
    # how a permission answer came: both names are kept on the wire.
    kind, body = AnswerPermission(request_id="r", decision="allow", channel="web-1", actor="ann").to_wire()
    assert kind == "permission" and body["user"] == "ann" and body["by"] == "web-1"
    assert "actor" not in body and "channel" not in body
    assert SetMode(mode_id="plan").to_wire()[0] == "mode"  # the bus's name for the ws op set_mode


@pytest.mark.parametrize(
    ("kind", "body", "says"),
    [
        ("fork", {}, "unknown command"),
        ("prompt", {"content": TEXT, "extra": 1}, "unknown field 'extra'"),
        ("prompt", {"content": None}, "needs content"),
        ("permission", {"decision": "allow"}, "needs request_id"),
        ("mode", {"mode_id": 7}, "mode_id must be"),
    ],
)
def test_a_command_from_another_replica_is_read_strictly(kind: str, body: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        from_wire(kind, body)
    assert says in caught.value.message and caught.value.code == "invalid_request"


def test_a_field_sent_as_null_is_absent() -> None:
    assert from_wire("prompt", {"content": TEXT, "client_id": None, "user": None}) == Prompt(content=TEXT)
    assert from_wire("permission", {"request_id": "r", "decision": "allow"}).channel == "websocket"


def test_every_kind_round_trips_with_its_answer() -> None:
    samples = {
        "prompt": Prompt(content=TEXT, client_id="c"),
        "interrupt": Interrupt(actor="ann"),
        "permission": AnswerPermission(request_id="r", decision="allow", channel="acp", option_id="o"),
        "mode": SetMode(mode_id="plan"),
        "config": SetConfigOption(config_id="brave", value=True),
        "model": SetModel(model="claude-fake-2", actor="ann"),
        "raw": Raw(message={"method": "x"}),
        "elicitation": AnswerElicitation(request_id="r", action="accept", content={"a": 1}, channel="acp"),
        "fork_point": ForkPoint(after_seq=7, actor="ann"),
    }
    assert set(samples) == set(KINDS)  # a new kind gets a sample here
    for command in samples.values():
        assert from_wire(*command.to_wire()) == command
    assert samples["interrupt"].answer_from_wire(samples["interrupt"].answer_to_wire(True)) is True
    assert samples["raw"].answer_from_wire({"seq": 5}) == 5


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
_fields = st.sampled_from(
    ["content", "client_id", "user", "by", "request_id", "decision", "option_id", "message", "mode_id", "x"]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from([*KINDS, "", "Prompt", "delete", "x" * 40]) | st.text(max_size=20),
    body=st.dictionaries(_fields | st.text(max_size=8), _json, max_size=6),
)
def test_whatever_another_replica_sends_is_a_valid_command_or_invalid_request(kind: str, body: dict[str, Any]) -> None:
    """A replica's bus message is untrusted input: any kind and body either makes a command
    that passes its own bounds and survives its wire form unchanged, or is refused with
    invalid_request — never another exception."""
    try:
        command = from_wire(kind, body)
    except InvalidRequest as exc:
        assert exc.code == "invalid_request"
        return
    command.check()
    assert from_wire(*command.to_wire()) == command


def test_a_fork_point_is_a_seq_and_its_answer_is_read_strictly() -> None:
    assert from_wire("fork_point", {}) == ForkPoint()
    for bad in (-1, 2**53 + 1, True, "3", 1.5):
        with pytest.raises(InvalidRequest):
            ForkPoint(after_seq=bad)  # type: ignore[arg-type]
    point = ForkPoint()
    answer = {"seq": 4, "session": "s", "at": None}
    assert point.answer_from_wire(point.answer_to_wire(answer)) == answer
    for bad_answer in ({}, {"seq": -1}, {"seq": 4, "session": 5}, {"seq": 4, "at": ["x"]}):
        with pytest.raises(MalformedAnswer):
            point.answer_from_wire(bad_answer)
