"""What turns used, added up (docs/api.md §4.25): the numbers a ``turn.ended`` event's
``usage`` holds that can be summed (§6.3), a thread's totals as its row keeps them, and the
groups ``GET /v1/usage`` answers with. Both stores and the journal use these functions, so
a thread's totals are the same whether read back from the store or kept in memory. Pure:
no I/O (the SQLite writer process imports it).

A turn's summable numbers are its token counts under the names stream-json's usage has
(``TOKENS``; a count that is not a non-negative integer is taken as 0) and its own cost
``{amount, currency}`` (``usage.cost``: its share of the agent's running total, never
``session_cost``). Amounts of different currencies are never added together: totals hold
one amount per currency.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bridge.errors import InvalidRequest

TOKENS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "thought_tokens",
)
GROUPS = {"thread": "thread_id", "agent": "agent", "user": "owner", "day": "substr(ts, 1, 10)"}
MAX_CURRENCY = 16  # characters of a currency code kept (ISO 4217 codes have 3)
MAX_GROUPS = 1000
AMOUNT_DIGITS = 10  # amounts are rounded to this many decimals (float sums drift below it)


@dataclass(frozen=True, slots=True)
class Turn:
    """One ended turn's summable numbers."""

    tokens: tuple[int, ...]  # in TOKENS order
    cost: float | None = None
    currency: str | None = None


NONE = Turn((0,) * len(TOKENS))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 53 else 0


def _cost(value: Any) -> tuple[float | None, str | None]:
    cost = value if isinstance(value, dict) else {}
    amount, currency = cost.get("amount"), cost.get("currency")
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount < 0:
        return None, None
    if not isinstance(currency, str) or not 0 < len(currency) <= MAX_CURRENCY or "\x00" in currency:
        return None, None
    return float(amount), currency


def of_turn(data: Any) -> Turn:
    """A ``turn.ended`` event's data (a dict): its summable numbers."""
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return NONE
    cost, currency = _cost(usage.get("cost"))
    return Turn(tuple(_count(usage.get(k)) for k in TOKENS), cost, currency)


def of_json(text: str) -> Turn:
    """The same from the event's data as stored (JSON text)."""
    try:
        return of_turn(json.loads(text))
    except ValueError:
        return NONE


def empty() -> dict[str, Any]:
    return {"turns": 0, **dict.fromkeys(TOKENS, 0), "cost": {}}


def copied_upto(forked_from: Any) -> int:
    """The seqs of a fork's transcript that are its source's copy (``forked_from``, the
    column's JSON text or None): their ``turn.ended`` events are the source's turns, counted
    there, so a fork's own usage (and GET /v1/usage) counts only the turns after them
    (docs/api.md §4.26). 0 for a thread that is no fork."""
    if isinstance(forked_from, str):
        try:
            forked_from = json.loads(forked_from)
        except ValueError:
            return 0
    seq = forked_from.get("seq") if isinstance(forked_from, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else 0


def add(totals: Any, turn: Turn) -> dict[str, Any]:
    """``totals`` (a thread's, or None for none yet) with one more ended turn."""
    out = shown(totals)
    out["turns"] += 1
    for name, n in zip(TOKENS, turn.tokens, strict=True):
        out[name] += n
    if turn.currency is not None and turn.cost is not None:
        cost = out["cost"]
        cost[turn.currency] = round(cost.get(turn.currency, 0.0) + turn.cost, AMOUNT_DIGITS)
    return out


def shown(totals: Any) -> dict[str, Any]:
    """Totals as a client is shown them (a copy): every count, zero when none was kept."""
    out = empty()
    if isinstance(totals, dict):
        out["turns"] = _count(totals.get("turns"))
        for name in TOKENS:
            out[name] = _count(totals.get(name))
        cost = totals.get("cost")
        if isinstance(cost, dict):
            out["cost"] = {k: float(v) for k, v in cost.items() if isinstance(v, (int, float))}
    return out


def total_of(turns: Iterable[Turn]) -> dict[str, Any] | None:
    """The totals of a thread's ended turns (a migration's back-fill); None for none."""
    totals: dict[str, Any] | None = None
    for turn in turns:
        totals = add(totals, turn)
    return totals


def row(thread_id: str, seq: int, ts: str, owner: str | None, agent: str, turn: Turn) -> tuple[Any, ...]:
    """A ``turn_usage`` row (``INSERT_ROW``'s order)."""
    return (thread_id, seq, ts, owner, agent, *turn.tokens, turn.cost, turn.currency)


# The per-turn table's insert: both stores' columns, in ``row``'s order.
COLUMNS = ("thread_id", "seq", "ts", "owner", "agent", *TOKENS, "cost", "currency")
INSERT_ROW = f"INSERT INTO turn_usage ({','.join(COLUMNS)}) VALUES ({','.join('?' for _ in COLUMNS)})"  # noqa: S608


# ---------------------------------------------------------------------- GET /v1/usage


def since_ts(value: str | None, name: str) -> str | None:
    """An ISO 8601 time given by a client as the transcript's ``ts`` text (UTC, milliseconds),
    so it compares with stored times as text; InvalidRequest when it is not one."""
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)  # a time without a zone is read as UTC
        when = when.astimezone(UTC)  # (OverflowError for a zone that moves it out of years 1-9999)
    except (ValueError, OverflowError):
        raise InvalidRequest(f"{name} is not an ISO 8601 time", code="invalid_request") from None
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def report_query(group_by: str, owner: str | None, since: str | None, until: str | None) -> tuple[str, list[Any]]:
    """The statement (``?`` placeholders) summing the turns of the window, a row per group
    and currency: (key, currency, turns, *TOKENS, cost)."""
    key = GROUPS[group_by]
    where, params = [], []
    for cond, value in (("owner = ?", owner), ("ts >= ?", since), ("ts < ?", until)):
        if value is not None:
            where.append(cond)
            params.append(value)
    sums = ",".join(f"sum({k})" for k in TOKENS)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {key}, currency, count(*), {sums}, sum(cost) FROM turn_usage{clause} GROUP BY 1, 2", params  # noqa: S608


def report(found: Sequence[Sequence[Any]], group_by: str, limit: int) -> dict[str, Any]:
    """The answer of ``GET /v1/usage`` from ``report_query``'s rows: the groups (days newest
    first, the others by tokens in and out, most first; at most ``limit``), and the total."""
    groups: dict[Any, dict[str, Any]] = {}
    total = empty()
    for key, currency, turns, *sums in found:
        for into in (groups.setdefault(key, empty()), total):
            into["turns"] += int(turns)
            for name, n in zip(TOKENS, sums, strict=False):
                into[name] += int(n or 0)
            if currency is not None and sums[-1] is not None:
                into["cost"][currency] = round(into["cost"].get(currency, 0.0) + float(sums[-1]), AMOUNT_DIGITS)
    if group_by == "day":
        order = sorted(groups, key=str, reverse=True)
    else:
        order = sorted(groups, key=lambda k: (-(groups[k]["input_tokens"] + groups[k]["output_tokens"]), str(k)))
    return {
        "group_by": group_by,
        "groups": [{"key": k, "usage": groups[k]} for k in order[:limit]],
        "truncated": len(order) > limit,
        "total": total,
    }
