"""W3C trace context carried with a prompt (docs/api.md §4.6, §11): ``traceparent`` and
``tracestate``, read from an ACP client's ``_meta`` or a REST request's headers, passed
to an ACP agent in its ``session/prompt``'s ``_meta`` and put into the log lines.

Pure: strings in, strings out. Everything here is untrusted input, so it is checked
against the trace-context grammar and kept only when it matches exactly: a malformed
``traceparent`` is dropped whole (and its ``tracestate`` with it, which means nothing
without one), a malformed ``tracestate`` is dropped alone. Nothing that failed the check
is ever logged or forwarded, so a log line never carries more than these bounded forms.
``baggage`` is not carried: it is free-form data a client may fill with anything, and the
bridge has no use for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
KEYS = (TRACEPARENT, TRACESTATE)

# Version 00 is the only one defined; its form is exactly 55 characters, lower-case hex.
# A later version would be allowed more after the fourth field, but with none defined yet
# there is nothing to check it against, so it is dropped like any other unknown form.
TRACEPARENT_LEN = 55
_TRACEPARENT_RE = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

# tracestate: at most 32 comma-separated members of key=value, 512 characters in all
# (what every participant must at least carry; anything longer is dropped, not cut).
MAX_TRACESTATE = 512
MAX_MEMBERS = 32
_KEY = r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER_RE = re.compile(rf"({_KEY})=({_VALUE})")


def traceparent(value: Any) -> str | None:
    """``value`` when it is a valid version-00 traceparent (ids not all zeros), else None."""
    if not isinstance(value, str) or len(value) != TRACEPARENT_LEN:
        return None
    m = _TRACEPARENT_RE.fullmatch(value)
    if m is None or m.group(1) == "0" * 32 or m.group(2) == "0" * 16:
        return None
    return value


def tracestate(value: Any) -> str | None:
    """``value`` when it is a valid tracestate (members separated by commas and optional
    spaces or tabs, no key twice), else None. An empty one is None: nothing to carry."""
    if not isinstance(value, str) or not value or len(value) > MAX_TRACESTATE:
        return None
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]  # empty members are allowed and mean nothing
    if not members or len(members) > MAX_MEMBERS:
        return None
    keys: set[str] = set()
    for member in members:
        m = _MEMBER_RE.fullmatch(member)
        if m is None or m.group(1) in keys:
            return None
        keys.add(m.group(1))
    return value


def context(parent: Any, state: Any = None) -> dict[str, str] | None:
    """The trace context to carry: ``{"traceparent": …[, "tracestate": …]}``, or None
    when ``parent`` is not a valid traceparent."""
    tp = traceparent(parent)
    if tp is None:
        return None
    ts = tracestate(state)
    return {TRACEPARENT: tp} if ts is None else {TRACEPARENT: tp, TRACESTATE: ts}


def from_meta(meta: Any) -> dict[str, str] | None:
    """From an ACP ``_meta`` object (its root keys ``traceparent`` and ``tracestate``)."""
    if not isinstance(meta, Mapping):
        return None
    return context(meta.get(TRACEPARENT), meta.get(TRACESTATE))


def from_headers(parents: list[str], states: list[str]) -> dict[str, str] | None:
    """From HTTP headers: exactly one ``traceparent`` (two make it invalid), and the
    ``tracestate`` headers joined as one list, as trace context says to read them."""
    if len(parents) != 1:
        return None
    return context(parents[0], ",".join(states) if states else None)


def checked(trace: Any) -> dict[str, str] | None:
    """A trace context that came from elsewhere (another replica, a stored command): kept
    only if it is exactly what :func:`context` makes."""
    if not isinstance(trace, Mapping) or set(trace) - set(KEYS):
        return None
    again = context(trace.get(TRACEPARENT), trace.get(TRACESTATE))
    return again if again is not None and len(again) == len(trace) else None


def with_trace(params: dict[str, Any], trace: Mapping[str, str] | None) -> dict[str, Any]:
    """ACP request ``params`` with the trace context at the root of their ``_meta`` (the
    keys ACP reserves for it), when there is a valid one."""
    again = checked(trace)
    if again is None:
        return params
    outer = params.get("_meta")
    return {**params, "_meta": {**(outer if isinstance(outer, dict) else {}), **again}}


def log_fields(trace: Mapping[str, str] | None) -> dict[str, str]:
    """What the log lines carry of a trace context: its trace id and the caller's span id
    (the parts a log search joins on), never the tracestate (vendor data)."""
    tp = traceparent(trace.get(TRACEPARENT)) if isinstance(trace, Mapping) else None
    if tp is None:
        return {}
    return {"trace_id": tp[3:35], "parent_span_id": tp[36:52]}


__all__ = [
    "KEYS",
    "MAX_TRACESTATE",
    "TRACEPARENT",
    "TRACESTATE",
    "checked",
    "context",
    "from_headers",
    "from_meta",
    "log_fields",
    "traceparent",
    "tracestate",
    "with_trace",
]
