"""A thread's ACP session config options (docs/api.md §11.2, ``configOptions`` and
``session/set_config_option``). Pure: no I/O.

What a session offers, in this order:

1. the options its ACP agent reported itself (the thread's ``agent_info.config_options``,
   which the ACP dialect keeps as the agent last sent them), ``select`` ones only unless
   the client said it takes ``boolean`` ones;
2. ``mode`` (category ``mode``), from the session modes the agent reported (sessions/modes.py),
   unless the agent's own options already have a ``mode`` category;
3. ``model`` (category ``model``): the profile's ``models`` and the thread's model, unless
   the agent's own options already have a ``model`` category, and only when there is a model.

Each option says whose it is (:func:`owner_of`): the agent's own are set by the agent,
``mode`` through ``session/set_mode``, ``model`` on the thread (the agent is restarted with it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bridge.sessions.modes import modes_of

MODE, MODEL = "mode", "model"
MAX_OPTIONS = 64
MAX_VALUES = 256


def _s(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _choice(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict) or _s(value.get("value")) is None or not isinstance(value.get("name"), str):
        return None
    out = {"value": value["value"], "name": value["name"]}
    if isinstance(value.get("description"), str):
        out["description"] = value["description"]
    return out


def _group(value: Any) -> list[Any]:
    """A select's entry: one value, or a group of them (``{group, name, options}``)."""
    inner = value.get("options") if isinstance(value, dict) and "group" in value else None
    return inner if isinstance(inner, list) else [value]


def _agent_option(opt: Any, booleans: bool) -> dict[str, Any] | None:
    """One of the agent's options, well-formed, or None."""
    if not isinstance(opt, dict) or _s(opt.get("id")) is None or not isinstance(opt.get("name"), str):
        return None
    out: dict[str, Any] = {"id": opt["id"], "name": opt["name"]}
    for key in ("description", "category"):
        if isinstance(opt.get(key), str):
            out[key] = opt[key]
    if opt.get("type") == "boolean" and booleans and isinstance(opt.get("currentValue"), bool):
        return {**out, "type": "boolean", "currentValue": opt["currentValue"]}
    return _select(out, opt)


def _select(out: dict[str, Any], opt: dict[str, Any]) -> dict[str, Any] | None:
    """A ``select`` option's value and choices, or None when it is not a good one."""
    raw = opt.get("options")
    if opt.get("type") != "select" or _s(opt.get("currentValue")) is None or not isinstance(raw, list):
        return None
    # Grouped options ({group, name, options}) are flattened: a client picks a value either way.
    flat = [v for g in raw for v in _group(g)]
    choices = [c for c in map(_choice, flat[:MAX_VALUES]) if c is not None]
    return {**out, "type": "select", "currentValue": opt["currentValue"], "options": choices}


def agent_options(row: Mapping[str, Any], *, booleans: bool) -> list[dict[str, Any]]:
    info = row.get("agent_info")
    raw = info.get("config_options") if isinstance(info, dict) else None
    if not isinstance(raw, list):
        return []
    return [o for o in (_agent_option(x, booleans) for x in raw[:MAX_OPTIONS]) if o is not None]


def mode_option(row: Mapping[str, Any]) -> dict[str, Any] | None:
    modes = modes_of(row)
    current = _s(modes.get("currentModeId")) if modes else None
    available = modes.get("availableModes") if modes else None
    if current is None or not isinstance(available, list):
        return None
    choices = []
    for mode in available[:MAX_VALUES]:
        if isinstance(mode, dict) and _s(mode.get("id")) and isinstance(mode.get("name"), str):
            choice = {"value": mode["id"], "name": mode["name"]}
            if isinstance(mode.get("description"), str):
                choice["description"] = mode["description"]
            choices.append(choice)
    return {"id": MODE, "name": "Mode", "category": MODE, "type": "select", "currentValue": current, "options": choices}


def model_option(row: Mapping[str, Any], models: Sequence[str]) -> dict[str, Any] | None:
    current = _s(row.get("model"))
    values = [m for m in models if _s(m)]
    if current is not None and current not in values:
        values.append(current)
    if not values:
        return None
    choices = [{"value": m, "name": m} for m in values[:MAX_VALUES]]
    return {
        "id": MODEL,
        "name": "Model",
        "category": MODEL,
        "type": "select",
        "currentValue": current or values[0],
        "options": choices,
    }


def config_options(row: Mapping[str, Any], models: Sequence[str], *, booleans: bool = False) -> list[dict[str, Any]]:
    """The session's options, as ``configOptions`` (see the module's docstring)."""
    options = agent_options(row, booleans=booleans)
    categories = {o.get("category") for o in options}
    ids = {o["id"] for o in options}
    for category, own in ((MODE, mode_option(row)), (MODEL, model_option(row, models))):
        if own is not None and category not in categories and own["id"] not in ids:
            options.append(own)
    return options


def owner_of(row: Mapping[str, Any], config_id: str) -> str:
    """Who sets option ``config_id``: ``agent`` (one of its own), ``mode`` or ``model``."""
    if any(o["id"] == config_id for o in agent_options(row, booleans=True)):
        return "agent"
    return config_id


def check_value(options: list[dict[str, Any]], config_id: str, value: Any) -> str | None:
    """Why ``value`` cannot be set for ``config_id`` among ``options``, or None."""
    option = next((o for o in options if o["id"] == config_id), None)
    if option is None:
        return f"no config option {config_id!r} in this session"
    if option["type"] == "boolean":
        return None if isinstance(value, bool) else f"{config_id} takes true or false"
    if not any(c["value"] == value for c in option["options"]):
        return f"{value!r} is not one of the values of {config_id}"
    return None


def with_value(options: list[dict[str, Any]], config_id: str, value: Any) -> list[dict[str, Any]]:
    """``options`` with ``config_id`` set to ``value`` (what was just accepted, before the
    thread's row says so)."""
    return [{**o, "currentValue": value} if o["id"] == config_id else o for o in options]
