"""Sub-agent / background / workflow task state of one thread (issue #5 item 4).

Claude Code and CodeBuddy report tasks with four ``system`` subtypes on stream-json stdout
(protocols.md §1.5.2; CodeBuddy workflow stdio spec, ``codebuddy-workflow-stdio.zh.txt``).
The codec turns each line into a ``task.updated`` event (``StreamJsonCodec._task``); the
caller hands that event's ``data`` plus the parsed original line (``raw``) to
:meth:`TaskTable.apply`. This module is pure: no I/O, no asyncio, and the clock is
injected (``now``, seconds; pass wall-clock time if the timestamps are shown or persisted —
the grace window only ever compares differences).

Rules implemented, with the spec section they come from:

* Tasks are keyed by ``task_id`` and correlated by ``tool_use_id`` (spec §5.1; Spanish
  stream-json contract §3.5): the first ``tool_use_id`` seen is kept on the task and
  indexed, :meth:`TaskTable.by_tool_use_id` looks a task up by it, and an event without a
  ``task_id`` but with a known ``tool_use_id`` is routed to that task.
* ``task_started`` creates the task, or revives one that is not terminal yet, with status
  ``running`` (spec §5.1; protocols.md §1.5.2).
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
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple, TypedDict

__all__ = [
    "EVENTS",
    "LIVE_STATUSES",
    "TERMINAL_STATUSES",
    "ApplyResult",
    "Reason",
    "TaskSnapshot",
    "TaskTable",
]

Reason = Literal["ok", "duplicate", "late", "invalid"]

EVENTS: Final = frozenset({"task_started", "task_progress", "task_updated", "task_notification"})
TERMINAL_STATUSES: Final = frozenset({"completed", "failed", "stopped"})
LIVE_STATUSES: Final = frozenset({"pending", "running", "paused", "completed", "failed", "killed"})

# task_notification.status → terminal status (spec §5.4: killed / cancelled → stopped).
_NOTIFIED: Final[Mapping[str, str]] = {
    "completed": "completed",
    "failed": "failed",
    "stopped": "stopped",
    "killed": "stopped",
    "cancelled": "stopped",
    "canceled": "stopped",
}
_UNKNOWN_TERMINAL: Final = "stopped"

MAX_TASKS: Final = 1000
GRACE_S: Final = 5.0
MAX_STR: Final = 4096
MAX_SNAPSHOT_BYTES: Final = 256 * 1024
MAX_USAGE_BYTES: Final = 16 * 1024
_MAX_DEPTH: Final = 32
_MAX_ITEMS: Final = 1000
_INT_LIMIT: Final = 2**64
_FORMAT_VERSION: Final = 1

# String fields taken from the top level of any task event.
_TOP_STR_FIELDS: Final = (
    "task_type",
    "subagent_type",
    "workflow_name",
    "parent_task_id",
    "description",
    "summary",
    "last_tool_name",
    "output_file",
)
# String fields a task_updated patch may set (besides status, error, end_time, usage, is_backgrounded).
_PATCH_STR_FIELDS: Final = ("description", "summary", "last_tool_name", "output_file")


class TaskSnapshot(TypedDict):
    """One task as the API, the store and the tests see it.

    ``started_at`` / ``updated_at`` / ``ended_at`` are the injected clock; ``end_time`` is
    the agent's own ``patch.end_time`` (epoch milliseconds in practice), kept verbatim.
    ``terminal`` is true once the authoritative ``task_notification`` was applied, and only
    then; ``ended_at`` is set at the same moment."""

    task_id: str
    task_type: str | None
    subagent_type: str | None
    workflow_name: str | None
    status: str
    terminal: bool
    description: str | None
    summary: str | None
    tool_use_id: str | None
    parent_task_id: str | None
    workflow_progress: list[Any] | None
    workflow_progress_truncated: bool
    usage: dict[str, Any] | None
    last_tool_name: str | None
    is_backgrounded: bool | None
    error: str | None
    output_file: str | None
    end_time: int | float | None
    started_at: float
    updated_at: float
    ended_at: float | None


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


_Snapshots = list[TaskSnapshot]
_Ids = list[str]


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + "…"


def _clean(value: Any, limit: int, depth: int = 0) -> Any:
    """A JSON-only, bounded copy of an untrusted value."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -_INT_LIMIT < value < _INT_LIMIT else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return _cap(value, limit)
    if depth >= _MAX_DEPTH:
        return None
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for i, (key, val) in enumerate(value.items()):
            if i >= _MAX_ITEMS:
                break
            out[_cap(key if isinstance(key, str) else str(key), limit)] = _clean(val, limit, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_clean(v, limit, depth + 1) for v in value[:_MAX_ITEMS]]
    return None


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), allow_nan=False))


def _bounded_snapshot(entries: list[Any], limit: int, max_bytes: int) -> tuple[list[Any], bool]:
    out: list[Any] = []
    size = 2  # "[]"
    for entry in entries:
        clean = _clean(entry, limit, 1)
        cost = _size(clean) + (1 if out else 0)
        if size + cost > max_bytes:
            return out, True
        out.append(clean)
        size += cost
    return out, False


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -_INT_LIMIT < value < _INT_LIMIT else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return None


@dataclass(slots=True)
class _Task:
    task_id: str
    started_at: float
    updated_at: float
    status: str = "running"
    terminal: bool = False
    task_type: str | None = None
    subagent_type: str | None = None
    workflow_name: str | None = None
    description: str | None = None
    summary: str | None = None
    tool_use_id: str | None = None
    parent_task_id: str | None = None
    workflow_progress: list[Any] | None = None
    workflow_progress_truncated: bool = False
    usage: dict[str, Any] | None = None
    last_tool_name: str | None = None
    is_backgrounded: bool | None = None
    error: str | None = None
    output_file: str | None = None
    end_time: int | float | None = None
    ended_at: float | None = None

    def snapshot(self) -> TaskSnapshot:
        return TaskSnapshot(
            task_id=self.task_id,
            task_type=self.task_type,
            subagent_type=self.subagent_type,
            workflow_name=self.workflow_name,
            status=self.status,
            terminal=self.terminal,
            description=self.description,
            summary=self.summary,
            tool_use_id=self.tool_use_id,
            parent_task_id=self.parent_task_id,
            workflow_progress=copy.deepcopy(self.workflow_progress),
            workflow_progress_truncated=self.workflow_progress_truncated,
            usage=copy.deepcopy(self.usage),
            last_tool_name=self.last_tool_name,
            is_backgrounded=self.is_backgrounded,
            error=self.error,
            output_file=self.output_file,
            end_time=self.end_time,
            started_at=self.started_at,
            updated_at=self.updated_at,
            ended_at=self.ended_at,
        )


Getter = Callable[[str], Any]


class TaskTable:
    """All tasks of one thread. Not thread-safe; one owner (the conversation) calls it."""

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
        self._tasks: dict[str, _Task] = {}
        self._by_tool: dict[str, str] = {}
        self._gone: dict[str, None] = {}  # evicted terminal task ids, oldest first

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def get(self, task_id: str) -> TaskSnapshot | None:
        task = self._tasks.get(task_id)
        return None if task is None else task.snapshot()

    def by_tool_use_id(self, tool_use_id: str) -> TaskSnapshot | None:
        task_id = self._by_tool.get(tool_use_id)
        return None if task_id is None else self.get(task_id)

    def snapshot(self) -> _Snapshots:
        """Every task, oldest ``started_at`` first (ties in arrival order)."""
        return [t.snapshot() for t in sorted(self._tasks.values(), key=lambda t: t.started_at)]

    def unfinished(self) -> _Ids:
        """Ids of the tasks still waiting for their ``task_notification`` (spec §4.4 drain)."""
        return [t.task_id for t in sorted(self._tasks.values(), key=lambda t: t.started_at) if not t.terminal]

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

        event = _str(d.get("event")) or _str(r.get("subtype"))
        if event not in EVENTS:
            return ApplyResult(False, "invalid", None)
        task_id = _str(get("task_id"))
        if not task_id:
            tool_use_id = _str(get("tool_use_id"))
            task_id = self._by_tool.get(_cap(tool_use_id, self.max_str)) if tool_use_id else None
            if not task_id:
                return ApplyResult(False, "invalid", None)
        task_id = _cap(task_id, self.max_str)
        patch = self._patch(event, r, d)

        task = self._tasks.get(task_id)
        if task is None:
            if task_id in self._gone:
                return ApplyResult(False, "duplicate" if event == "task_notification" else "late", None)
            task = self._create(task_id, now)
        elif task.terminal:
            if event == "task_notification":
                return ApplyResult(False, "duplicate", task.snapshot())
            ended = task.ended_at if task.ended_at is not None else task.updated_at
            if now - ended > self.grace_s:
                return ApplyResult(False, "late", task.snapshot())
            self._fields(task, get, patch)
            task.updated_at = now
            return ApplyResult(True, "ok", task.snapshot())

        self._fields(task, get, patch)
        if event == "task_started":
            task.status = "running"
        elif event == "task_updated":
            status = _str(patch.get("status"))
            if status in LIVE_STATUSES:
                task.status = status
        elif event == "task_notification":
            status = _str(get("status"))
            task.status = _NOTIFIED.get(status or "", _UNKNOWN_TERMINAL)
            task.terminal = True
            task.ended_at = now
        task.updated_at = now
        return ApplyResult(True, "ok", task.snapshot())

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

    def _fields(self, task: _Task, get: Getter, patch: Mapping[str, Any]) -> None:
        """Every non-status field an event may carry; only keys present and well-typed."""
        limit = self.max_str
        tool_use_id = _str(get("tool_use_id"))
        if tool_use_id and task.tool_use_id is None:
            task.tool_use_id = _cap(tool_use_id, limit)
            self._by_tool[task.tool_use_id] = task.task_id
        for name in _TOP_STR_FIELDS:
            value = _str(get(name))
            if value is not None:
                setattr(task, name, _cap(value, limit))
        self._common(task, get)
        progress = get("workflow_progress")
        if isinstance(progress, list):  # authoritative snapshot: replace, never merge
            task.workflow_progress, task.workflow_progress_truncated = _bounded_snapshot(
                progress, limit, self.max_snapshot_bytes
            )
        if patch:
            for name in _PATCH_STR_FIELDS:
                value = _str(patch.get(name))
                if value is not None:
                    setattr(task, name, _cap(value, limit))
            self._common(task, patch.get)
            end_time = _number(patch.get("end_time"))
            if end_time is not None:
                task.end_time = end_time

    def _common(self, task: _Task, get: Getter) -> None:
        usage = get("usage")
        if isinstance(usage, Mapping):
            clean = _clean(usage, self.max_str)
            if _size(clean) <= MAX_USAGE_BYTES:
                task.usage = clean
        backgrounded = get("is_backgrounded")
        if isinstance(backgrounded, bool):
            task.is_backgrounded = backgrounded
        error = get("error")
        if isinstance(error, str):
            task.error = _cap(error, self.max_str)
        elif error is not None:
            task.error = _cap(json.dumps(_clean(error, self.max_str), allow_nan=False), self.max_str)

    # ------------------------------------------------------------------ capacity

    def _create(self, task_id: str, now: float) -> _Task:
        while len(self._tasks) >= self.max_tasks:
            self._evict()
        task = _Task(task_id=task_id, started_at=now, updated_at=now)
        self._tasks[task_id] = task
        return task

    def _evict(self) -> None:
        ended = [t for t in self._tasks.values() if t.terminal]
        if ended:
            victim = min(ended, key=lambda t: (t.ended_at or 0.0, t.started_at, t.task_id))
            self._gone[victim.task_id] = None
            while len(self._gone) > self.max_tasks:
                del self._gone[next(iter(self._gone))]
        else:
            victim = min(self._tasks.values(), key=lambda t: (t.started_at, t.task_id))
        del self._tasks[victim.task_id]
        tool_use_id = victim.tool_use_id
        if tool_use_id is not None and self._by_tool.get(tool_use_id) == victim.task_id:
            del self._by_tool[tool_use_id]
            heirs = [t for t in self._tasks.values() if t.tool_use_id == tool_use_id]
            if heirs:
                self._by_tool[tool_use_id] = max(heirs, key=lambda t: t.started_at).task_id

    # ------------------------------------------------------------------ persistence

    def to_json(self) -> str:
        """The whole table as a JSON object (``version``, ``tasks``, ``tool_use_ids``, ``gone``)."""
        return json.dumps(
            {
                "version": _FORMAT_VERSION,
                "tasks": self.snapshot(),
                "tool_use_ids": dict(self._by_tool),
                "gone": list(self._gone),
            },
            separators=(",", ":"),
            allow_nan=False,
        )

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
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"task table is not JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("version") != _FORMAT_VERSION or not isinstance(doc.get("tasks"), list):
            raise ValueError("not a task table (version 1)")
        table = cls(max_tasks=max_tasks, grace_s=grace_s, max_str=max_str, max_snapshot_bytes=max_snapshot_bytes)
        table._load(doc["tasks"], doc.get("tool_use_ids"), doc.get("gone"))
        return table

    def _load(self, entries: Iterable[Any], index: Any, gone: Any) -> None:
        limit = self.max_str
        for entry in entries:
            task = self._restore(entry, limit)
            if task is None or task.task_id in self._tasks:
                continue
            if len(self._tasks) >= self.max_tasks:
                self._evict()
            self._tasks[task.task_id] = task
        if isinstance(index, Mapping):
            for tool_use_id, task_id in index.items():
                owner = self._tasks.get(task_id) if isinstance(task_id, str) else None
                if owner is not None and owner.tool_use_id == tool_use_id:
                    self._by_tool[tool_use_id] = task_id
        for task in self._tasks.values():  # an index entry lost or stripped: re-derive it
            if task.tool_use_id is not None and task.tool_use_id not in self._by_tool:
                self._by_tool[task.tool_use_id] = task.task_id
        if isinstance(gone, list):
            for task_id in gone:
                if isinstance(task_id, str) and task_id not in self._tasks:
                    self._gone[_cap(task_id, limit)] = None
            while len(self._gone) > self.max_tasks:
                del self._gone[next(iter(self._gone))]

    def _restore(self, entry: Any, limit: int) -> _Task | None:
        if not isinstance(entry, Mapping):
            return None
        task_id = _str(entry.get("task_id"))
        started_at = _number(entry.get("started_at"))
        if not task_id or started_at is None:
            return None
        updated_at = _number(entry.get("updated_at"))
        ended_at = _number(entry.get("ended_at"))
        terminal = entry.get("terminal") is True and ended_at is not None
        status = _str(entry.get("status")) or "running"
        if terminal and status not in TERMINAL_STATUSES:
            status = _UNKNOWN_TERMINAL
        elif not terminal and status not in LIVE_STATUSES:
            status = "running"
        task = _Task(
            task_id=_cap(task_id, limit),
            started_at=float(started_at),
            updated_at=float(updated_at if updated_at is not None else started_at),
            status=status,
            terminal=terminal,
            ended_at=float(ended_at) if terminal and ended_at is not None else None,
        )
        for name in (*_TOP_STR_FIELDS, "tool_use_id", "error"):
            value = _str(entry.get(name))
            if value is not None:
                setattr(task, name, _cap(value, limit))
        if isinstance(entry.get("usage"), Mapping):
            self._common(task, {"usage": entry["usage"]}.get)
        if isinstance(entry.get("is_backgrounded"), bool):
            task.is_backgrounded = entry["is_backgrounded"]
        task.end_time = _number(entry.get("end_time"))
        progress = entry.get("workflow_progress")
        if isinstance(progress, list):
            task.workflow_progress, truncated = _bounded_snapshot(progress, limit, self.max_snapshot_bytes)
            task.workflow_progress_truncated = truncated or entry.get("workflow_progress_truncated") is True
        return task

    # Last in the class body, and annotated through module aliases, so that the method
    # named ``list`` never shadows the builtin in an annotation above.
    def list(self) -> _Snapshots:
        """Same as :meth:`snapshot` (API: ``GET /v1/threads/{id}/tasks``)."""
        return self.snapshot()
