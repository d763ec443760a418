"""What an ACP agent says about its session besides the conversation, read the way the
client codec (protocols/acp.py) keeps it: session config options (and the older ``models``
they replace), context and cost reports (``usage_update``) with the prompt answer's token
counts, and session metadata (``session_info_update``). Pure functions and one small
ledger; docs/api.md §4.3, §6.3 and §7.3 say what the bridge makes of them.

Everything an agent sends here is bounded and checked the way the ACP SDKs' own models
check it: a malformed option, value or report is left out, never passed on half-read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bridge.protocols.acp_updates import d, items
from bridge.protocols.events import Event

MAX_CONFIG_OPTIONS = 64  # config options kept from an agent's list
MAX_CONFIG_VALUES = 256  # values of one select option (all its groups together)
MAX_CONFIG_TEXT = 1024  # characters of an id, name, value, category or description
MAX_TITLE = 512  # characters of a session title (a thread's title holds as many)
MAX_STAMP = 64  # characters of an updatedAt timestamp

# The option the bridge makes from an older agent's ``models`` (its unstable
# ``session/set_model``): set like any option, through that method.
MODEL_OPTION_ID = "model"

# ACP token counts (the prompt answer's ``usage``) → the names stream-json's turn.ended
# usage has for the same numbers (Anthropic's), so totals add up across dialects.
TOKEN_KEYS = (
    ("inputTokens", "input_tokens"),
    ("outputTokens", "output_tokens"),
    ("cachedReadTokens", "cache_read_input_tokens"),
    ("cachedWriteTokens", "cache_creation_input_tokens"),
    ("thoughtTokens", "thought_tokens"),
    ("totalTokens", "total_tokens"),
)


def _text(v: Any, limit: int = MAX_CONFIG_TEXT) -> str | None:
    return v if isinstance(v, str) and 0 < len(v) <= limit else None


def _count(v: Any) -> int | None:
    """A token count: a non-negative integer (a bool is not one)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


# ---------------------------------------------------------------------- config options


def _labelled(src: dict[str, Any], key: str) -> dict[str, Any] | None:
    """``{key, name, description?}`` of one option or value, or None when malformed."""
    ident, name = _text(src.get(key)), _text(src.get("name"))
    if ident is None or name is None:
        return None
    out: dict[str, Any] = {key: ident, "name": name}
    if (text := _text(src.get("description"))) is not None:
        out["description"] = text
    return out


def _select_values(raw: Any) -> tuple[list[dict[str, Any]], set[str]] | None:
    """A select option's ``options``: a flat list of values or a list of groups (ACP
    allows either, never both); the well-formed part, and every value it offers."""
    listed = items(raw)
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    grouped = bool(listed) and all(isinstance(g, dict) and "group" in g for g in listed)
    for entry in listed:
        if len(seen) >= MAX_CONFIG_VALUES:
            break
        if grouped:
            group = _labelled(d(entry), "group")
            if group is None:
                continue
            values = [v for v in map(lambda x: _labelled(d(x), "value"), items(entry.get("options"))) if v]
            group["options"] = values[: MAX_CONFIG_VALUES - len(seen)]
            seen.update(v["value"] for v in group["options"])
            out.append(group)
        elif (value := _labelled(d(entry), "value")) is not None:
            seen.add(value["value"])
            out.append(value)
    return (out, seen) if seen else None


def _config_option(raw: Any) -> dict[str, Any] | None:
    src = d(raw)
    option = _labelled(src, "id")
    kind = src.get("type")
    if option is None or kind not in ("select", "boolean"):
        return None  # an unknown type is ignored, as the spec asks of clients
    if (category := _text(src.get("category"))) is not None:
        option["category"] = category
    option["type"] = kind
    current = src.get("currentValue")
    if kind == "boolean":
        if not isinstance(current, bool):
            return None
        option["currentValue"] = current
        return option
    values = _select_values(src.get("options"))
    if values is None or not isinstance(current, str) or current not in values[1]:
        return None
    option["currentValue"] = current
    option["options"] = values[0]
    return option


def config_options(value: Any) -> list[dict[str, Any]] | None:
    """An agent's ``configOptions`` (ACP ``SessionConfigOption``s, in its order): the
    well-formed ones, at most :data:`MAX_CONFIG_OPTIONS`; None when it sent no list."""
    if not isinstance(value, list):
        return None
    out: list[dict[str, Any]] = []
    ids: set[str] = set()
    for raw in value:
        option = _config_option(raw)
        if option is not None and option["id"] not in ids:
            ids.add(option["id"])
            out.append(option)
        if len(out) >= MAX_CONFIG_OPTIONS:
            break
    return out


def models_option(value: Any) -> list[dict[str, Any]] | None:
    """An older agent's ``models`` (``{currentModelId, availableModels: [{modelId, name,
    description?}]}``, set with ``session/set_model``) as the one config option of the
    ``model`` category it stands for; None when absent or malformed. A current model the
    list leaves out (one the user named at launch: Gemini CLI does this) is offered first,
    so that the thread still shows its model and can switch back to it."""
    src = d(value)
    values = []
    for m in items(src.get("availableModels"))[:MAX_CONFIG_VALUES]:
        entry = _labelled({**d(m), "value": d(m).get("modelId")}, "value")
        if entry is not None:
            values.append(entry)
    current = _text(src.get("currentModelId"))
    if current is None:
        return None
    if current not in {v["value"] for v in values}:
        values = [{"value": current, "name": current}, *values[: MAX_CONFIG_VALUES - 1]]
    option = {
        "id": MODEL_OPTION_ID,
        "name": "Model",
        "category": "model",
        "type": "select",
        "currentValue": current,
        "options": values,
    }
    return [option]


def with_value(options: list[dict[str, Any]], config_id: str, value: str | bool) -> list[dict[str, Any]]:
    """``options`` with ``config_id`` set to ``value`` (an answer that did not list them
    again: ``session/set_model``'s, or an agent's that left its list out)."""
    return [{**o, "currentValue": value} if o.get("id") == config_id else o for o in options]


def model_of(options: list[dict[str, Any]] | None) -> str | None:
    """The session's current model: the first ``model`` option's value (the spec's order
    breaks ties)."""
    for o in options or ():
        if o.get("category") == "model" and isinstance(o.get("currentValue"), str):
            return str(o["currentValue"])
    return None


def set_config_params(session_id: str, config_id: str, value: str | bool) -> dict[str, Any]:
    """``session/set_config_option`` params: a boolean is sent with ``type: "boolean"``."""
    params: dict[str, Any] = {"sessionId": session_id, "configId": config_id, "value": value}
    if isinstance(value, bool):
        params["type"] = "boolean"
    return params


# ---------------------------------------------------------------------- session info


def session_info(update: dict[str, Any]) -> dict[str, Any]:
    """A ``session_info_update``'s fields that were sent: ``title`` and ``updatedAt``, a
    string or null (null clears it); a title longer than a thread's is cut."""
    out: dict[str, Any] = {}
    for key, limit in (("title", MAX_TITLE), ("updatedAt", MAX_STAMP)):
        if key in update:
            v = update[key]
            if v is None:
                out[key] = None
            elif isinstance(v, str) and v.strip():
                out[key] = v.strip()[:limit]
    return out


# ---------------------------------------------------------------------- usage


def usage_report(update: dict[str, Any]) -> dict[str, Any] | None:
    """A ``usage_update``'s ``{used, size, cost?}``: the tokens in context now, the
    context window, and the session's cumulative cost ``{amount, currency}``; None
    when ``used`` or ``size`` is missing (both are required)."""
    used, size = _count(update.get("used")), _count(update.get("size"))
    if used is None or size is None:
        return None
    report: dict[str, Any] = {"used": used, "size": size}
    cost = _cost(update.get("cost"))
    if cost is not None:
        report["cost"] = cost
    return report


def _cost(v: Any) -> dict[str, Any] | None:
    src = d(v)
    amount, currency = src.get("amount"), _text(src.get("currency"), 16)
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount):
        return None
    return None if currency is None else {"amount": amount, "currency": currency}


@dataclass(slots=True)
class CostLedger:
    """What of the agent's cumulative session cost the turns ended so far account for,
    so each ``turn.ended`` carries its own share and the shares add up to the agent's
    total (docs/api.md §6.3). ``base`` None: not known (a session restored in a new
    process, whose agent may count from before it); a new session starts at nothing."""

    base: dict[str, Any] | None = None
    known: bool = False

    def start(self, fresh: bool) -> None:
        self.base, self.known = None, fresh

    def outside_turn(self, cost: dict[str, Any] | None) -> None:
        """A report between turns: the first one fixes an unknown base; later ones are
        left for the next turn's share."""
        if cost is not None and not self.known:
            self.base, self.known = cost, True

    def turn_share(self, cost: dict[str, Any] | None) -> dict[str, Any] | None:
        """The share of the turn that ends with the agent at ``cost`` (its last report),
        and that cost becomes the base. None when the base is unknown or in another
        currency; a total that went down (the agent counts afresh) is all this turn's."""
        if cost is None:
            return None
        base, known = self.base, self.known
        self.base, self.known = cost, True
        if not known:
            return None
        if base is None:
            return dict(cost)
        if base["currency"] != cost["currency"]:
            return None
        share = cost["amount"] - base["amount"]
        return {"amount": round(share if share >= 0 else cost["amount"], 10), "currency": cost["currency"]}


def turn_usage(
    agent_usage: Any, report: dict[str, Any] | None, share: dict[str, Any] | None, raw_report: Any = None
) -> dict[str, Any] | None:
    """A turn's ``usage`` for its ``turn.ended`` (docs/api.md §6.3): the prompt answer's
    token counts under stream-json's names, the context at the turn's last report, its
    share of the cost and the agent's cumulative cost, and under ``acp`` what the agent
    sent, unchanged. None when the agent reported nothing."""
    out: dict[str, Any] = {}
    tokens = d(agent_usage)
    for src, dst in TOKEN_KEYS:
        if (n := _count(tokens.get(src))) is not None:
            out[dst] = n
    if report is not None:
        out["context"] = {"used": report["used"], "size": report["size"]}
        if "cost" in report:
            out["session_cost"] = report["cost"]
    if share is not None:
        out["cost"] = share
    sent: dict[str, Any] = {}
    if isinstance(agent_usage, dict):
        sent["usage"] = agent_usage
    if isinstance(raw_report, dict):
        sent["usage_update"] = raw_report
    if sent:
        out["acp"] = sent
    return out or None


# ---------------------------------------------------------------------- the codec's part


class SessionState:
    """The part of an ACP session the client codec keeps beyond its modes: the config
    options (``agent_info.config_options``), the session info (``agent_info.session_info``)
    and the usage of the turn in flight. Each ``session/update`` of those kinds is read
    here (:meth:`update`): the events it makes, and whether agent_info changed."""

    def __init__(self) -> None:
        self.options: list[dict[str, Any]] | None = None
        self.via_models = False  # the options stand for an older agent's ``models``
        self.info: dict[str, Any] = {}  # title / updatedAt as the agent last said them
        self.report: dict[str, Any] | None = None  # the turn's last usage_update, read
        self.raw_report: dict[str, Any] | None = None  # …and as the agent sent it
        self.turn_cost: dict[str, Any] | None = None  # the turn's last reported cost (a report may have none)
        self.costs = CostLedger()

    def opened(self, result: dict[str, Any], how: str) -> bool:
        """A session/new|load|resume answer: its options (or, from an agent without
        them, its ``models``) replace the last process's. True when agent_info changes."""
        self.costs.start(how == "new")
        self.report = self.raw_report = self.turn_cost = None
        options = config_options(result.get("configOptions"))
        self.via_models = False
        if options is None and (options := models_option(result.get("models"))) is not None:
            self.via_models = True
        changed = options != self.options
        self.options = options
        return changed

    def agent_info(self) -> dict[str, Any]:
        """What this state adds to the thread's agent_info."""
        fields: dict[str, Any] = {}
        if self.options is not None:
            fields["config_options"] = self.options
        if self.info:
            fields["session_info"] = dict(self.info)
        return fields

    def config_method(self, config_id: str, value: str | bool) -> str:
        """The method that sets ``config_id``: ``session/set_model`` for the option made
        from an older agent's ``models``, else ``session/set_config_option``."""
        if self.via_models and config_id == MODEL_OPTION_ID and isinstance(value, str):
            return "session/set_model"
        return "session/set_config_option"

    def config_set(self, result: dict[str, Any], config_id: str, value: str | bool) -> list[dict[str, Any]]:
        """The agent accepted a switch: its answer's full list (ACP: it MUST send one),
        else the known list with the value changed."""
        options = config_options(result.get("configOptions"))
        if options is None:
            options = with_value(self.options or [], config_id, value)
        self.options = options
        return options

    def update(self, kind: str, u: dict[str, Any], raw: str, in_turn: bool) -> tuple[list[Event], bool] | None:
        """A ``session/update`` of the kinds kept here: its events, and whether
        agent_info changed; None for any other kind."""
        if kind == "usage_update":
            report = usage_report(u)
            if report is None:
                return [Event("agent", "agent.other", {"session_update": kind, "invalid": True}, raw)], False
            if in_turn:
                self.report, self.raw_report = report, {k: v for k, v in u.items() if k != "sessionUpdate"}
                self.turn_cost = report.get("cost", self.turn_cost)
            else:
                self.costs.outside_turn(report.get("cost"))
            return [Event("agent", "usage", dict(report), raw)], False
        if kind == "session_info_update":
            info = session_info(u)
            self.info = {**self.info, **info}
            data = {{"updatedAt": "updated_at"}.get(k, k): v for k, v in info.items()}
            return [Event("agent", "session.info", data, raw)], bool(info)
        if kind == "config_option_update":
            options = config_options(u.get("configOptions"))
            if options is None:
                return [Event("agent", "agent.other", {"session_update": kind, "invalid": True}, raw)], False
            self.options, self.via_models = options, False
            return [config_changed(options, raw)], True
        return None

    def turn_usage(self, agent_usage: Any) -> dict[str, Any] | None:
        """The ending turn's usage (:func:`turn_usage`); the next turn starts afresh."""
        report, raw_report, cost = self.report, self.raw_report, self.turn_cost
        self.report = self.raw_report = self.turn_cost = None
        if report is not None and cost is not None:
            report = {**report, "cost": cost}  # a later report without a cost does not hide it
        share = self.costs.turn_share(cost)
        return turn_usage(agent_usage, report, share, raw_report)


def config_changed(options: list[dict[str, Any]], raw: str | None) -> Event:
    """The session's config options changed (docs/api.md §6.3)."""
    return Event("agent", "agent.status", {"status": "config_changed", "config_options": options}, raw)
