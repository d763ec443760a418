"""A turn's usage as ACP's ``usage_update`` (docs/api.md §11.3), and the little an
attached session must remember of a turn to tell it. Pure: no I/O.

ACP wants the tokens *in the context now* (``used``), the context window (``size``), both
required, and optionally the session's cost so far. What the agents give:

* an ACP agent: its own ``usage_update``s, which the ACP dialect records as ``usage``
  events (passed on as they come) and keeps the turn's last in its ``turn.ended`` usage
  (``context``, ``session_cost``: passed on at the turn's end unless just sent);
* Claude Code (stream-json): its ``result`` line (the ``turn.ended`` record's raw line)
  has ``modelUsage`` with each model's ``contextWindow`` and ``total_cost_usd`` (what this
  agent process has spent, as the agent counts it); its ``usage`` is the sum of the
  turn's model calls, not what is in the context, so ``used`` comes from the turn's last
  model call (its ``message_start``, or its whole assistant message, with the output
  tokens of its ``message_delta``).

Anything missing or malformed: no ``usage_update`` (``used`` and ``size`` cannot be left out).
"""

from __future__ import annotations

import json
from typing import Any

_INPUT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _amount(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and value >= 0
    return float(value) if ok else None


def _parse(raw: str | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        line = json.loads(raw)
    except ValueError:
        return {}
    return line if isinstance(line, dict) else {}


def _d(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class LastCall:
    """What the turn's last model call put in the context (stream-json): the input side
    from its ``message_start`` (or whole message), the output from its ``message_delta``."""

    def __init__(self) -> None:
        self.input: int | None = None
        self.output = 0
        self.model: str | None = None

    def clear(self) -> None:
        self.input, self.output, self.model = None, 0, None

    def started(self, raw: str | None) -> None:
        """A ``message_start`` stream event, or a whole assistant message: its message's usage."""
        line = _parse(raw)
        msg = _d(_d(line.get("event")).get("message")) or _d(line.get("message"))
        usage = _d(msg.get("usage"))
        counts = [_count(usage.get(k)) for k in _INPUT_KEYS]
        if counts[0] is None:
            return
        self.input = sum(c or 0 for c in counts)
        self.output = _count(usage.get("output_tokens")) or 0
        model = msg.get("model")
        self.model = model if isinstance(model, str) else None

    def delta(self, raw: str | None) -> None:
        """A ``message_delta`` stream event: the call's output tokens so far."""
        out = _count(_d(_d(_parse(raw).get("event")).get("usage")).get("output_tokens"))
        if out is not None:
            self.output = out

    @property
    def used(self) -> int | None:
        return None if self.input is None else self.input + self.output


def _cost(value: Any) -> dict[str, Any] | None:
    cost = _d(value)
    amount, currency = _amount(cost.get("amount")), cost.get("currency")
    if amount is None or not isinstance(currency, str) or not currency:
        return None
    return {"amount": amount, "currency": currency}


def _window(model_usage: dict[str, Any], model: str | None) -> int | None:
    """The context window of the model the turn last called (Claude Code names it with a
    suffix, ``claude-x[1m]``); the only model's when there is one; else none."""
    windows = {k: _count(_d(v).get("contextWindow")) for k, v in model_usage.items()}
    if model is not None:
        for key, size in windows.items():
            if key == model or key.startswith(model + "["):
                return size
    return next(iter(windows.values())) if len(windows) == 1 else None


def reported(data: dict[str, Any]) -> dict[str, Any] | None:
    """An ACP agent's own report (a ``usage`` event: ``used``, ``size``, ``cost``?) as
    ``usage_update``, or None."""
    used, size = _count(data.get("used")), _count(data.get("size"))
    if used is None or size is None:
        return None
    update: dict[str, Any] = {"sessionUpdate": "usage_update", "used": used, "size": size}
    if (cost := _cost(data.get("cost"))) is not None:
        update["cost"] = cost
    return update


def usage_update(data: dict[str, Any], raw: str | None, last: LastCall) -> dict[str, Any] | None:
    """The ``usage_update`` for a ``turn.ended`` record (``data``, its raw line), or None."""
    usage = _d(data.get("usage"))
    context = _d(usage.get("context"))
    if context:  # an ACP agent's last report of the turn (the dialect's turn usage)
        return reported({**context, "cost": usage.get("session_cost")})
    line = _parse(raw)
    if line.get("type") != "result" or last.used is None:
        return None
    size = _window(_d(line.get("modelUsage")), last.model)
    if size is None:
        return None
    update = {"sessionUpdate": "usage_update", "used": last.used, "size": size}
    if (amount := _amount(line.get("total_cost_usd"))) is not None:
        update["cost"] = {"amount": amount, "currency": "USD"}
    return update
