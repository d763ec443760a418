"""A thread's session modes (sessions/modes.py), in-process: the agent's answer to a
switch read strictly, its refusal passed on bounded, the stored modes read defensively."""

from __future__ import annotations

import json

import pytest

from bridge.errors import InvalidRequest
from bridge.sessions.modes import MAX_TEXT, ModeRefused, check_mode_id, mode_answer, modes_of


def test_an_accepted_switch_and_a_refusal_as_the_agent_gave_it() -> None:
    assert mode_answer(json.dumps({"jsonrpc": "2.0", "id": 3, "result": {}}), "plan") == {"mode_id": "plan"}
    err = {"code": -32603, "message": "Internal error", "data": {"details": "Invalid Mode"}}
    with pytest.raises(ModeRefused) as info:
        mode_answer(json.dumps({"jsonrpc": "2.0", "id": 3, "error": err}), "yolo")
    assert info.value.rpc == err and info.value.code == "mode_refused" and "Invalid" not in info.value.message
    assert "Internal error (-32603)" in info.value.message


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", json.dumps({"error": "a string"}), json.dumps({"error": {"code": True, "message": 5}})],
)
def test_an_answer_that_is_not_well_formed_is_a_refusal_never_a_success(text: str) -> None:
    with pytest.raises(ModeRefused) as info:
        mode_answer(text, "plan")
    assert info.value.rpc["code"] == -32603


def test_a_huge_refusal_is_cut_and_its_huge_detail_left_out() -> None:
    err = {"code": -32602, "message": "x" * 100_000, "data": {"blob": "y" * 100_000}}
    with pytest.raises(ModeRefused) as info:
        mode_answer(json.dumps({"error": err}), "plan")
    assert len(info.value.rpc["message"]) == MAX_TEXT and "data" not in info.value.rpc


def test_stored_modes_and_mode_ids() -> None:
    modes = {"currentModeId": "a", "availableModes": [{"id": "a", "name": "A"}]}
    assert modes_of({"agent_info": {"modes": modes}}) == modes
    assert modes_of({"agent_info": None}) is None and modes_of({"agent_info": {"modes": []}}) is None
    assert check_mode_id("plan") == "plan"
    for bad in ("", "x" * 257, 3, None):
        with pytest.raises(InvalidRequest):
            check_mode_id(bad)
