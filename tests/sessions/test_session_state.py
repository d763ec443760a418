"""The sessions layer's side of what an ACP agent says of its session (issue #37, the
dialect): the title rule (sessions/agent_title.py) and a config switch's answer and the
thread's model (sessions/config_options.py). Pure functions, checked one rule at a time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridge.sessions.agent_title import with_agent_title
from bridge.sessions.config_options import ConfigRefused, config_answer, model_option


def said(title: str | None) -> dict[str, Any]:
    return {"info": {"name": "fake"}, "session_info": {"title": title}}


@pytest.mark.parametrize(
    ("current", "before", "after", "title"),
    [
        ("", None, "A", "A"),  # unnamed: the agent names it
        ("A", "A", "B", "B"),  # still the agent's: its new title replaces it
        ("Mine", "A", "B", None),  # the user's: kept
        ("Mine", None, "B", None),  # given at creation: kept
        ("A", "A", None, ""),  # the agent clears its title: so is the thread's
        ("", "A", "A", None),  # nothing new
    ],
)
def test_the_agents_title_names_the_thread_only_while_the_user_has_not(
    current: str, before: str | None, after: str | None, title: str | None
) -> None:
    thread = {"title": current, "agent_info": said(before) if before is not None else {"info": {}}}
    fields = with_agent_title(thread, {"agent_info": said(after)})
    assert fields.get("title") == title


def test_session_info_outlives_the_agent_process_and_other_fields_pass_through() -> None:
    thread = {"title": "A", "agent_info": said("A")}
    fresh = {"agent_info": {"info": {"name": "fake"}}}  # a new process's initialize
    assert with_agent_title(thread, fresh) == {"agent_info": {"info": {"name": "fake"}, "session_info": {"title": "A"}}}
    plain = {"turn_active": True}
    assert with_agent_title(thread, plain) is plain
    assert with_agent_title({"title": ""}, {"agent_info": {"info": {}}}) == {"agent_info": {"info": {}}}


def test_the_threads_model_is_its_first_model_option_with_groups_flattened() -> None:
    options = [
        {"id": "mode", "category": "mode", "type": "select", "currentValue": "a", "options": []},
        {
            "id": "m",
            "category": "model",
            "type": "select",
            "currentValue": "x",
            "options": [
                {"value": "x", "name": "X"},
                {"group": "g", "name": "G", "options": [{"value": "y", "name": "Y"}]},
            ],
        },
        {"id": "m2", "category": "model", "type": "select", "currentValue": "z", "options": []},
    ]
    assert model_option({"agent_info": {"config_options": options}}) == {
        "config_id": "m",
        "current": "x",
        "choices": [{"value": "x", "name": "X"}, {"value": "y", "name": "Y"}],
    }
    assert model_option({"agent_info": None}) is None
    assert model_option({"agent_info": {"config_options": options[:1]}}) is None


def test_a_switchs_answer_is_the_full_list_or_the_agents_refusal() -> None:
    ok = json.dumps({"jsonrpc": "2.0", "id": 3, "result": {"configOptions": [{"id": "m"}]}})
    assert config_answer(ok, "m", "x") == {"config_id": "m", "value": "x", "config_options": [{"id": "m"}]}
    err = {"code": -32602, "message": "Invalid params", "data": {"details": "Unknown config option: q"}}
    with pytest.raises(ConfigRefused) as caught:
        config_answer(json.dumps({"jsonrpc": "2.0", "id": 3, "error": err}), "q", True)
    assert caught.value.rpc == err and caught.value.code == "config_refused" and caught.value.status == 400
    with pytest.raises(ConfigRefused) as caught:
        config_answer("not json", "q", "x")
    assert caught.value.rpc["code"] == -32603
