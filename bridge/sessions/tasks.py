"""Sub-agent / background / workflow task state of one thread (issue #5 item 4).

Claude Code and CodeBuddy report tasks with four ``system`` subtypes on stream-json stdout
(docs/api.md §6.6; "spec" below is the CodeBuddy workflow stdio protocol, by section).
The codec turns each line into a ``task.updated`` event (the stream-json codec); the
caller hands that event's ``data`` plus the parsed original line (``raw``) to
:meth:`TaskTable.apply`. This module is pure: no I/O, no asyncio, and the clock is
injected (``now``, seconds; pass wall-clock time if the timestamps are shown or persisted —
the grace window only ever compares differences).

Rules implemented, with the spec section they come from:

* Tasks are keyed by ``task_id`` and correlated by ``tool_use_id`` (spec §5.1; Spanish
  stream-json contract §3.5): the first ``tool_use_id`` seen is kept on the task (its
  snapshot's ``tool_use_id``) and indexed, and an event without a ``task_id`` but with a
  known ``tool_use_id`` is routed to that task through the index.
* ``task_started`` creates the task, or revives one that is not terminal yet, with status
  ``running`` (spec §5.1).
* ``task_progress`` updates ``usage`` / ``last_tool_name`` / ``summary`` / ``description``.
  ``workflow_progress`` is an authoritative *snapshot*: a later one replaces the previous
  one entirely, it is never merged or diffed (spec §4.4, §5.2, §6 "快照替换语义").
* ``task_updated`` carries a ``patch``; only the keys present are applied (spec §5.3).
  Its ``status`` (``pending | running | paused | completed | failed | killed``) becomes the
  live status but is never terminal — an interrupt shows ``killed`` here first and the
  terminal state still comes from the notification (spec §4.3.2, §5.4 "完成判定不要从其它
  事件推导"). Unknown patch keys and status values are ignored (spec §7, §8).
* ``task_notification`` is the single authoritative terminal state: ``completed``,
  ``failed`` or ``stopped``; internal ``killed`` / ``cancelled`` map to ``stopped``
  (spec §4.3.3, §5.4). It is emitted once per task (spec §8): a second one is not applied
  and :meth:`TaskTable.apply` answers ``reason="duplicate"``. A notification whose status is
  missing or unrecognised still ends the task, as ``stopped`` (it ended; we do not claim an
  outcome we were not told).
* Late ``task_progress`` / ``task_updated`` (or ``task_started``) for a terminal task are
  applied to every field except the status for a grace window of 5 s after the
  notification (``ended_at``), then refused with ``reason="late"`` (spec §4.3.4, §6: on the
  interrupt path sub-agent progress may arrive after ``task_notification``).
* Events other than ``task_started`` for an unknown ``task_id`` create the task lazily,
  status from the event or ``running``: an agent resumed mid-stream never re-announces
  its tasks.
* Labels, previews and every other string are untrusted (spec §9): each string (ids
  included, at any depth of ``workflow_progress`` / ``usage``) is capped at
  ``max_str`` = 4096 characters — a longer one keeps its first 4095 and ends with "…".
  Containers nested in untrusted values keep at most 1000 items and 32 levels; non-finite
  floats and integers beyond 64 bits become null. A ``workflow_progress`` snapshot whose
  compact, ASCII-escaped JSON exceeds ``max_snapshot_bytes`` = 256 KiB keeps its leading
  entries that fit and sets ``workflow_progress_truncated``; a non-list value is ignored.
  ``usage`` larger than 16 KiB is ignored. Nothing is ever evaluated.
* At most ``max_tasks`` = 1000 tasks per thread: when a new task would exceed it, the
  terminal task that ended longest ago is evicted (then, only if none is terminal, the
  oldest-started one). Ids of evicted terminal tasks are remembered (as many as
  ``max_tasks``) so a straggler or duplicate notification for them is refused instead of
  resurrecting them.
* :meth:`TaskTable.to_json` / :meth:`TaskTable.from_json` persist and restore the table
  exactly (tasks, tool_use_id index, evicted ids).

The task record and its snapshot type are in :mod:`bridge.sessions.task_state`, the
bounding of untrusted values in :mod:`bridge.sessions.task_values`, and the persisted
format in :mod:`bridge.sessions.task_json`; this module holds the table and its rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal, NamedTuple

from bridge.sessions import task_json
from bridge.sessions.task_state import (
    LIVE_STATUSES,
    PATCH_STR_FIELDS,
    TERMINAL_STATUSES,
    TOP_STR_FIELDS,
    UNKNOWN_TERMINAL,
    Task,
    TaskSnapshot,
)
from bridge.sessions.task_values import (
    MAX_SNAPSHOT_BYTES,
    MAX_STR,
    as_number,
    as_str,
    bounded_snapshot,
    cap,
    clean_error,
    clean_usage,
)

__all__ = [
    "EVENTS",
    "GRACE_S",
    "LIVE_STATUSES",
    "MAX_SNAPSHOT_BYTES",
    "MAX_STR",
    "MAX_TASKS",
    "TERMINAL_STATUSES",
    "ApplyResult",
    "Reason",
    "TaskSnapshot",
    "TaskTable",
]

Reason = Literal["ok", "duplicate", "late", "invalid"]

EVENTS: Final = frozenset({"task_started", "task_progress", "task_updated", "task_notification"})

# task_notification.status → terminal status (spec §5.4: killed / cancelled → stopped).
_NOTIFIED: Final[Mapping[str, str]] = {
    "completed": "completed",
    "failed": "failed",
    "stopped": "stopped",
    "killed": "stopped",
    "cancelled": "stopped",
    "canceled": "stopped",
}

MAX_TASKS: Final = 1000
GRACE_S: Final = 5.0


class ApplyResult(NamedTuple):
    """What :meth:`TaskTable.apply` did.

    ``accepted`` is false for ``duplicate`` (a second notification), ``late`` (an event for a
    terminal task after the grace window, or for an evicted one) and ``invalid`` (no usable
    task id, or not a task event); the caller records those as ``agent.other``. ``task`` is
    the task after the event (or as it stands, when refused); None only for ``invalid`` and
    for events about evicted tasks."""

    accepted: bool
    reason: Reason
    task: TaskSnapshot | None


_INVALID: Final = ApplyResult(False, "invalid", None)

Getter = Callable[[str], Any]


class TaskTable:
    """All tasks of one thread. Not thread-safe; one caller (the conversation) uses it."""

    def __init__(
        self,
        *,
        max_tasks: int = MAX_TASKS,
        grace_s: float = GRACE_S,
        max_str: int = MAX_STR,
        max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES,
    ) -> None:
        if max_tasks < 1 or max_str < 1 or max_snapshot_bytes < 2 or not grace_s >= 0:
            raise ValueError("TaskTable limits must be positive")
        self.max_tasks = max_tasks
        self.grace_s = grace_s
        self.max_str = max_str
        self.max_snapshot_bytes = max_snapshot_bytes
        self._tasks: dict[str, Task] = {}
        self._by_tool: dict[str, str] = {}
        self._gone: dict[str, None] = {}  # evicted terminal task ids, oldest first

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def snapshot(self) -> list[TaskSnapshot]:
        """Every task, oldest ``started_at`` first (ties in arrival order); the API's
        ``GET /v1/threads/{id}/tasks``."""
        return [t.snapshot() for t in sorted(self._tasks.values(), key=lambda t: t.started_at)]

    # ------------------------------------------------------------------ events

    def apply(self, data: Mapping[str, Any] | None, raw: Mapping[str, Any] | None, now: float) -> ApplyResult:
        """Apply one ``task.updated`` event: ``data`` as the codec built it, ``raw`` the parsed
        agent line (either may be None; a key of ``raw`` wins over the same key of ``data``).
        Never raises on event content; ``now`` must be finite."""
        if not math.isfinite(now):
            raise ValueError("now must be a finite number")
        d: Mapping[str, Any] = data if isinstance(data, Mapping) else {}
        r: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}

        def get(key: str) -> Any:
            return r[key] if key in r else d.get(key)

        event = as_str(d.get("event")) or as_str(r.get("subtype"))
        if event not in EVENTS:
            return _INVALID
        task_id = self._task_id(get)
        if task_id is None:
            return _INVALID
        patch = self._patch(event, r, d)

        task = self._tasks.get(task_id)
        if task is None:
            if task_id in self._gone:
                return ApplyResult(False, "duplicate" if event == "task_notification" else "late", None)
            task = self._create(task_id, now)
        elif task.terminal:
            return self._after_end(task, event, get, patch, now)

        self._fields(task, get, patch)
        self._status(task, event, get, patch, now)
        task.updated_at = now
        return ApplyResult(True, "ok", task.snapshot())

    def _task_id(self, get: Getter) -> str | None:
        """The event's ``task_id`` (capped), else the task its known ``tool_use_id`` names."""
        task_id = as_str(get("task_id"))
        if not task_id:
            tool_use_id = as_str(get("tool_use_id"))
            task_id = self._by_tool.get(cap(tool_use_id, self.max_str)) if tool_use_id else None
            if not task_id:
                return None
        return cap(task_id, self.max_str)

    def _after_end(self, task: Task, event: str, get: Getter, patch: Mapping[str, Any], now: float) -> ApplyResult:
        """An event for a terminal task: a notification is a duplicate; anything else updates
        every field but the status within the grace window, and is late after it."""
        if event == "task_notification":
            return ApplyResult(False, "duplicate", task.snapshot())
        ended = task.ended_at if task.ended_at is not None else task.updated_at
        if now - ended > self.grace_s:
            return ApplyResult(False, "late", task.snapshot())
        self._fields(task, get, patch)
        task.updated_at = now
        return ApplyResult(True, "ok", task.snapshot())

    @staticmethod
    def _status(task: Task, event: str, get: Getter, patch: Mapping[str, Any], now: float) -> None:
        if event == "task_started":
            task.status = "running"
        elif event == "task_updated":
            status = as_str(patch.get("status"))
            if status in LIVE_STATUSES:
                task.status = status
        elif event == "task_notification":
            status = as_str(get("status"))
            task.status = _NOTIFIED.get(status or "", UNKNOWN_TERMINAL)
            task.terminal = True
            task.ended_at = now

    @staticmethod
    def _patch(event: str, r: Mapping[str, Any], d: Mapping[str, Any]) -> Mapping[str, Any]:
        if event != "task_updated":
            return {}
        for source in (r, d):
            patch = source.get("patch")
            if isinstance(patch, Mapping):
                return patch
        if r:  # a raw task_updated line without a patch object: nothing to apply
            return {}
        # Only the codec's data: it lifted patch.status / description / summary to the top.
        return {k: d[k] for k in ("status", "description", "summary") if d.get(k) is not None}

    def _fields(self, task: Task, get: Getter, patch: Mapping[str, Any]) -> None:
        """Every non-status field an event may carry; only keys present and well-typed."""
        limit = self.max_str
        tool_use_id = as_str(get("tool_use_id"))
        if tool_use_id and task.tool_use_id is None:
            task.tool_use_id = cap(tool_use_id, limit)
            self._by_tool[task.tool_use_id] = task.task_id
        for name in TOP_STR_FIELDS:
            value = as_str(get(name))
            if value is not None:
                setattr(task, name, cap(value, limit))
        self._common(task, get)
        progress = get("workflow_progress")
        if isinstance(progress, list):  # authoritative snapshot: replace, never merge
            task.workflow_progress, task.workflow_progress_truncated = bounded_snapshot(
                progress, limit, self.max_snapshot_bytes
            )
        if patch:
            for name in PATCH_STR_FIELDS:
                value = as_str(patch.get(name))
                if value is not None:
                    setattr(task, name, cap(value, limit))
            self._common(task, patch.get)
            end_time = as_number(patch.get("end_time"))
            if end_time is not None:
                task.end_time = end_time

    def _common(self, task: Task, get: Getter) -> None:
        usage = clean_usage(get("usage"), self.max_str)
        if usage is not None:
            task.usage = usage
        backgrounded = get("is_backgrounded")
        if isinstance(backgrounded, bool):
            task.is_backgrounded = backgrounded
        error = clean_error(get("error"), self.max_str)
        if error is not None:
            task.error = error

    # ------------------------------------------------------------------ capacity

    def _create(self, task_id: str, now: float) -> Task:
        while len(self._tasks) >= self.max_tasks:
            self._evict()
        task = Task(task_id=task_id, started_at=now, updated_at=now)
        self._tasks[task_id] = task
        return task

    def _evict(self) -> None:
        ended = [t for t in self._tasks.values() if t.terminal]
        if ended:
            victim = min(ended, key=lambda t: (t.ended_at or 0.0, t.started_at, t.task_id))
            self._gone[victim.task_id] = None
            self._trim_gone()
        else:
            victim = min(self._tasks.values(), key=lambda t: (t.started_at, t.task_id))
        del self._tasks[victim.task_id]
        tool_use_id = victim.tool_use_id
        if tool_use_id is not None and self._by_tool.get(tool_use_id) == victim.task_id:
            del self._by_tool[tool_use_id]
            heirs = [t for t in self._tasks.values() if t.tool_use_id == tool_use_id]
            if heirs:
                self._by_tool[tool_use_id] = max(heirs, key=lambda t: t.started_at).task_id

    def _trim_gone(self) -> None:
        while len(self._gone) > self.max_tasks:
            del self._gone[next(iter(self._gone))]

    # ------------------------------------------------------------------ persistence

    def to_json(self) -> str:
        """The whole table as a JSON object (``version``, ``tasks``, ``tool_use_ids``, ``gone``)."""
        return task_json.encode(self.snapshot(), self._by_tool, self._gone)

    @classmethod
    def from_json(
        cls,
        text: str | bytes,
        *,
        max_tasks: int = MAX_TASKS,
        grace_s: float = GRACE_S,
        max_str: int = MAX_STR,
        max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES,
    ) -> TaskTable:
        """Restore :meth:`to_json` output. Raises ValueError when ``text`` is not such an
        object; malformed task entries are skipped, and every cap applies again."""
        entries, index, gone = task_json.decode(text)
        table = cls(max_tasks=max_tasks, grace_s=grace_s, max_str=max_str, max_snapshot_bytes=max_snapshot_bytes)
        table._load(entries, index, gone)
        return table

    def _load(self, entries: Iterable[Any], index: Any, gone: Any) -> None:
        for entry in entries:
            task = task_json.restore_task(entry, self.max_str, self.max_snapshot_bytes)
            if task is None or task.task_id in self._tasks:
                continue
            if len(self._tasks) >= self.max_tasks:
                self._evict()
            self._tasks[task.task_id] = task
        self._by_tool.update(task_json.restore_index(index, self._tasks))
        for task_id in task_json.restore_gone(gone, self._tasks, self.max_str):
            self._gone[task_id] = None
        self._trim_gone()
