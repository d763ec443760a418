"""Messages from another replica are untrusted: parse_message takes any bytes and returns
a well-formed message or None, never raises (fuzzed), and round-trips what we send."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.bus.base import MAX_MESSAGE_BYTES, Command, Commit, Reply, parse_message, valid_id

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = ["type", "id", "sender", "kind", "thread", "body", "deadline", "ok", "seq", "at"]


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_parse_to_a_message_or_none(data: bytes) -> None:
    parse_message(data)  # never raises


@settings(max_examples=600, deadline=None)
@given(
    st.sampled_from(["command", "reply", "commit", "changes", "other"]),
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8),
)
def test_objects_of_every_type_with_any_fields_never_raise(kind: str, fields: dict[str, object]) -> None:
    msg = parse_message(json.dumps({**fields, "type": kind}).encode())
    if isinstance(msg, Command):
        assert valid_id(msg.id) and valid_id(msg.thread_id) and isinstance(msg.body, dict)
    if isinstance(msg, Commit):
        assert isinstance(msg.last_seq, int) and msg.last_seq >= 0


def test_what_we_send_round_trips_and_bad_ids_and_sizes_are_refused() -> None:
    cmd = Command("c1", "a", "prompt", "thr_1", {"text": "hi"}, 12.5)
    assert parse_message(json.dumps(cmd.to_json()).encode()) == cmd
    reply = Reply("c1", False, {"code": "x"})
    assert parse_message(json.dumps(reply.to_json()).encode()) == reply
    bad = {**cmd.to_json(), "thread": "../../etc/passwd"}
    assert parse_message(json.dumps(bad).encode()) is None
    assert parse_message(json.dumps({**cmd.to_json(), "kind": "rm -rf"}).encode()) is None
    assert parse_message(json.dumps({**cmd.to_json(), "deadline": True}).encode()) is None
    commit = {"type": "commit", "sender": "a", "thread": "thr_1", "seq": -1, "at": 0}
    assert parse_message(json.dumps(commit).encode()) is None
    assert parse_message(b" " * (MAX_MESSAGE_BYTES + 1)) is None
