"""structlog setup: JSON or console lines on stderr (stdout's first line is reserved for
the "listening" line). Secrets are redacted by key name before anything is rendered."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

from bridge.protocols.events import REDACTED
from bridge.protocols.events import SECRET_KEY_RE as _SECRET_KEY
from bridge.protocols.trace import log_fields as trace_fields


def redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        if _SECRET_KEY.search(key):
            event[key] = REDACTED
    return event


# Library messages that can repeat per attempt (asyncio retries accept() after EMFILE/ENFILE):
# logged at most once per this interval, with how many were dropped since.
RATE_LIMITED_PREFIXES = ("socket.accept() out of system resource",)
RATE_LIMIT_INTERVAL_S = 10.0


class RateLimit(logging.Filter):
    """Passes a record whose message starts with one of ``prefixes`` at most once per
    ``interval_s`` (per prefix); the next one passed says how many were dropped."""

    def __init__(self, prefixes: tuple[str, ...] = RATE_LIMITED_PREFIXES, interval_s: float = RATE_LIMIT_INTERVAL_S):
        super().__init__()
        self.prefixes = prefixes
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        prefix = next((p for p in self.prefixes if msg.startswith(p)), None)
        if prefix is None:
            return True
        now = time.monotonic()
        if now - self._last.get(prefix, -self.interval_s) < self.interval_s:
            self._dropped[prefix] = self._dropped.get(prefix, 0) + 1
            return False
        self._last[prefix] = now
        dropped = self._dropped.pop(prefix, 0)
        if dropped:
            record.msg = f"{msg} ({dropped} more like this were not logged in the last {self.interval_s:g} s)"
        record.exc_info = None  # the same traceback every time: the message says it all
        record.exc_text = None
        return True


def configure_logging(fmt: str = "console", level: int = logging.INFO) -> None:
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries that log through the standard library (uvicorn, asyncio) come out in the
    # same format, so a JSON log is JSON on every line.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.format_exc_info,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, redact, renderer],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    aio = logging.getLogger("asyncio")
    for old_filter in [f for f in aio.filters if isinstance(f, RateLimit)]:
        aio.removeFilter(old_filter)
    aio.addFilter(RateLimit())


def traced_turn(thread_id: str, turn_id: str | None, trace: Mapping[str, str] | None) -> None:
    """A prompt carried a trace context (protocols/trace.py): one line joining its turn to
    the trace (``trace_id``, ``parent_span_id``), so the turn's other lines, which carry
    ``thread_id`` and ``turn_id``, are found from a trace. Only the checked forms are
    logged: a malformed traceparent was dropped before it got here."""
    fields = trace_fields(trace)
    if fields:
        structlog.get_logger("bridge.trace").info("turn.traced", thread_id=thread_id, turn_id=turn_id, **fields)


def bound_trace(trace: Mapping[str, str] | None) -> contextlib.AbstractContextManager[Any]:
    """The trace's ids bound to every log line written inside (structlog's context
    variables: this task's lines and those of tasks it starts)."""
    return structlog.contextvars.bound_contextvars(**trace_fields(trace))
