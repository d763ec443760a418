"""A thread's session config options (ACP ``session/set_config_option``, docs/api.md §4.3
and §4.21): what the agent last reported, and its answer to a switch. Pure: no I/O.

The options live in the thread's ``agent_info.config_options`` (the agent's
``configOptions``, in its order: ``{id, name, description?, category?, type, currentValue,
options?}``), which the ACP codec keeps up to date — from the agent's
``session/new``/``load``/``resume`` answer, every ``config_option_update``, and every switch
it accepted — and which is stored with the thread. An agent that still reports only
``models`` (set with the unstable ``session/set_model``) has one option of the ``model``
category made from them, set the same way.

The ``model`` category is the thread's model as its agent sees it: :func:`model_option`
gives its id, current value and choices, for whoever switches the model of an ACP thread.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from bridge.errors import BridgeError, InvalidRequest
from bridge.protocols.events import Event
from bridge.sessions.actions import Action, Emit, Write
from bridge.sessions.modes import AgentRefused, refusal

# A switch waits this long for the agent: its start and handshake when it was not running,
# then its answer (as a mode switch does).
CONFIG_TIMEOUT_S = 30.0


class ConfigRefused(AgentRefused):
    """The agent refused ``session/set_config_option`` (an unknown option or value, say)."""

    code = "config_refused"


class ConfigTimeout(BridgeError):
    code = "agent_timeout"
    status = 504


@runtime_checkable
class ConfigSetter(Protocol):
    """A dialect whose agent has session config options (ACP): an optional capability of
    a codec, looked up with ``isinstance``."""

    def set_config_option(self, config_id: str, value: str | bool, route: str) -> str | None:
        """The line asking the agent to set ``config_id`` to ``value``, its answer routed to
        ``route``; None when the agent reported no config options."""
        ...


def config_options_of(thread: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The thread's config options as its agent last reported them, or None (none
    reported, or the agent has not run yet)."""
    info = thread.get("agent_info")
    options = info.get("config_options") if isinstance(info, dict) else None
    return options if isinstance(options, list) else None


def model_option(thread: Mapping[str, Any]) -> dict[str, Any] | None:
    """The thread's model as its agent reports it: ``{config_id, current, choices}`` from
    the first option of the ``model`` category (``choices``: ``[{value, name,
    description?}]``, groups flattened); None when the agent reports none."""
    for option in config_options_of(thread) or ():
        if isinstance(option, dict) and option.get("category") == "model" and option.get("type") == "select":
            choices: list[dict[str, Any]] = []
            for entry in option.get("options") or ():
                choices += entry.get("options", []) if "group" in entry else [entry]
            return {"config_id": option.get("id"), "current": option.get("currentValue"), "choices": choices}
    return None


def config_request(codec: object, config_id: str, value: str | bool, route: str, actor: str | None) -> list[Action]:
    """What asks the agent to switch (the codec's line, recorded as a ``client.other``
    ``set_config_option`` event, then written); raises InvalidRequest
    ``config_not_supported`` when the agent reported no config options."""
    line = codec.set_config_option(config_id, value, route) if isinstance(codec, ConfigSetter) else None
    if line is None:
        raise InvalidRequest("this thread's agent reports no session config options", code="config_not_supported")
    data: dict[str, Any] = {"op": "set_config_option", "config_id": config_id, "value": value}
    if actor is not None:
        data["by"] = actor
    return [Emit([Event("client", "client.other", data, line)]), Write(line, required=True)]


def config_answer(text: str, config_id: str, value: str | bool) -> dict[str, Any]:
    """The answer to a switch, from the codec's routed reply (a JSON-RPC answer with the
    full ``configOptions``, or the agent's error as it came); raises
    :class:`ConfigRefused` with the agent's error."""
    try:
        reply = json.loads(text)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        reply = {"error": {"message": "the agent's answer is not JSON"}}
    error = reply.get("error")
    if error is None:
        result = reply.get("result")
        options = result.get("configOptions") if isinstance(result, dict) else None
        return {"config_id": config_id, "value": value, "config_options": options if isinstance(options, list) else []}
    rpc = refusal(error)
    raise ConfigRefused(f"the agent refused {config_id} = {value!r}: {rpc['message']} ({rpc['code']})", rpc)


def agent_models(model: str | None, models: Sequence[str], threads: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What a profile's threads may run (``GET /v1/agents/{name}/models``, docs/api.md
    §4.4): the models the agent advertised on its newest thread that reported any (its
    ``model`` option's choices, in its order, with their names), then the profile's
    ``model`` and ``models`` not among them; ``current``: the profile's ``model``, the one
    a new thread starts with, when it names one."""
    listed: dict[str, dict[str, Any]] = {}
    advertised = next((o for o in map(model_option, threads) if o is not None), None)
    for choice in advertised["choices"] if advertised else ():
        value, name = choice.get("value"), choice.get("name")
        if isinstance(value, str) and value and value not in listed:
            listed[value] = {"id": value, "name": name} if isinstance(name, str) and name else {"id": value}
    for value in [model, *models] if model else models:
        listed.setdefault(value, {"id": value})
    return {"models": list(listed.values()), **({"current": model} if model else {})}
