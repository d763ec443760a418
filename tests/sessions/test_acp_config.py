"""A thread's ACP config options (sessions/acp_config.py), in process: rows in, the
``configOptions`` a session offers out, each validated against the official SDK's models."""

from __future__ import annotations

from typing import Any

from acp import schema

from bridge.sessions import acp_config as c

MODES = {
    "currentModeId": "ask",
    "availableModes": [{"id": "ask", "name": "Ask", "description": "asks first"}, {"id": "code", "name": "Code"}],
}


def valid(options: list[dict[str, Any]]) -> list[dict[str, Any]]:
    schema.NewSessionResponse.model_validate({"sessionId": "thr_x", "configOptions": options})
    return options


def test_a_stream_json_thread_offers_its_models_and_an_acp_one_its_modes() -> None:
    options = valid(c.config_options({"model": "opus"}, ["sonnet", "haiku"]))
    assert options == [
        {
            "id": "model",
            "name": "Model",
            "category": "model",
            "type": "select",
            "currentValue": "opus",
            "options": [{"value": v, "name": v} for v in ("sonnet", "haiku", "opus")],
        }
    ]
    assert c.config_options({"model": None}, []) == []  # no model known: nothing to choose
    (mode,) = valid(c.config_options({"agent_info": {"modes": MODES}}, []))
    assert mode["id"] == "mode" and mode["category"] == "mode" and mode["currentValue"] == "ask"
    assert mode["options"][0] == {"value": "ask", "name": "Ask", "description": "asks first"}


def test_an_acp_agents_own_options_come_first_and_win_their_categories() -> None:
    own = [
        {
            "id": "model_id",
            "name": "Model",
            "category": "model",
            "type": "select",
            "currentValue": "a",
            "options": [
                {"group": "g", "name": "G", "options": [{"value": "a", "name": "A"}, {"value": "b", "name": "B"}]}
            ],
        },
        {"id": "brave", "name": "Brave", "type": "boolean", "currentValue": True},
        {"id": "broken", "name": "No type"},
    ]
    row = {"model": "x", "agent_info": {"modes": MODES, "config_options": own}}
    options = valid(c.config_options(row, []))
    assert [o["id"] for o in options] == ["model_id", "mode"]  # no boolean for a client that did not say it takes them
    assert options[0]["options"] == [{"value": "a", "name": "A"}, {"value": "b", "name": "B"}]
    assert [o["id"] for o in valid(c.config_options(row, [], booleans=True))] == ["model_id", "brave", "mode"]
    assert c.owner_of(row, "model_id") == "agent" and c.owner_of(row, "mode") == "mode"
    assert c.check_value(options, "model_id", "b") is None
    assert c.check_value(options, "model_id", "z") is not None
    assert c.check_value(options, "nope", "a") is not None
    assert c.with_value(options, "model_id", "b")[0]["currentValue"] == "b"
