"""The persisted form of a :class:`~bridge.sessions.tasks.TaskTable`: one JSON object with
``version`` (1), ``tasks`` (the snapshots), ``tool_use_ids`` (the tool_use_id → task_id
index) and ``gone`` (ids of evicted terminal tasks, oldest first).

Restoring trusts nothing: a malformed task entry is skipped, every field is checked and
bounded again (:mod:`bridge.sessions.task_values`), a task marked terminal without an
``ended_at`` is restored as live, a status that does not fit its terminal flag falls back
(``stopped`` / ``running``), and an index entry is kept only when its task carries that
tool_use_id (a missing one is re-derived from the tasks). The table itself admits the
restored tasks, so its capacity rules apply as they do to live events."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from bridge.sessions.task_state import LIVE_STATUSES, TERMINAL_STATUSES, TOP_STR_FIELDS, UNKNOWN_TERMINAL, Task
from bridge.sessions.task_values import as_number, as_str, bounded_snapshot, cap, clean_usage

__all__ = ["FORMAT_VERSION", "decode", "encode", "restore_gone", "restore_index", "restore_task"]

FORMAT_VERSION: Final = 1


def encode(tasks: Iterable[Mapping[str, Any]], index: Mapping[str, str], gone: Iterable[str]) -> str:
    """The JSON text of a table's ``tasks`` (snapshots), tool_use_id ``index`` and ``gone`` ids."""
    return json.dumps(
        {"version": FORMAT_VERSION, "tasks": list(tasks), "tool_use_ids": dict(index), "gone": list(gone)},
        separators=(",", ":"),
        allow_nan=False,
    )


def decode(text: str | bytes) -> tuple[list[Any], Any, Any]:
    """The raw ``tasks`` list, ``tool_use_ids`` and ``gone`` values of :func:`encode` output,
    unchecked but for the envelope. Raises ValueError when ``text`` is not such an object."""
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"task table is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION or not isinstance(doc.get("tasks"), list):
        raise ValueError("not a task table (version 1)")
    return doc["tasks"], doc.get("tool_use_ids"), doc.get("gone")


def restore_task(entry: Any, limit: int, max_snapshot_bytes: int) -> Task | None:
    """One task from a persisted snapshot, or None when it has no usable id or start time."""
    if not isinstance(entry, Mapping):
        return None
    task_id = as_str(entry.get("task_id"))
    started_at = as_number(entry.get("started_at"))
    if not task_id or started_at is None:
        return None
    updated_at = as_number(entry.get("updated_at"))
    ended_at = as_number(entry.get("ended_at"))
    terminal = entry.get("terminal") is True and ended_at is not None
    task = Task(
        task_id=cap(task_id, limit),
        started_at=float(started_at),
        updated_at=float(updated_at if updated_at is not None else started_at),
        status=_status(entry.get("status"), terminal),
        terminal=terminal,
        ended_at=float(ended_at) if terminal and ended_at is not None else None,
    )
    _restore_fields(task, entry, limit, max_snapshot_bytes)
    return task


def _status(value: Any, terminal: bool) -> str:
    status = as_str(value) or "running"
    if terminal and status not in TERMINAL_STATUSES:
        return UNKNOWN_TERMINAL
    if not terminal and status not in LIVE_STATUSES:
        return "running"
    return status


def _restore_fields(task: Task, entry: Mapping[str, Any], limit: int, max_snapshot_bytes: int) -> None:
    for name in (*TOP_STR_FIELDS, "tool_use_id", "error"):
        value = as_str(entry.get(name))
        if value is not None:
            setattr(task, name, cap(value, limit))
    usage = clean_usage(entry.get("usage"), limit)
    if usage is not None:
        task.usage = usage
    if isinstance(entry.get("is_backgrounded"), bool):
        task.is_backgrounded = entry["is_backgrounded"]
    task.end_time = as_number(entry.get("end_time"))
    progress = entry.get("workflow_progress")
    if isinstance(progress, list):
        task.workflow_progress, truncated = bounded_snapshot(progress, limit, max_snapshot_bytes)
        task.workflow_progress_truncated = truncated or entry.get("workflow_progress_truncated") is True


def restore_index(index: Any, tasks: Mapping[str, Task]) -> dict[str, str]:
    """The tool_use_id → task_id index: the persisted entries whose task carries that
    tool_use_id, then one for every task whose tool_use_id the persisted index lost."""
    out: dict[str, str] = {}
    if isinstance(index, Mapping):
        for tool_use_id, task_id in index.items():
            found = tasks.get(task_id) if isinstance(task_id, str) else None
            if found is not None and found.tool_use_id == tool_use_id:
                out[tool_use_id] = task_id
    for task in tasks.values():
        if task.tool_use_id is not None and task.tool_use_id not in out:
            out[task.tool_use_id] = task.task_id
    return out


def restore_gone(gone: Any, tasks: Mapping[str, Task], limit: int) -> list[str]:
    """The persisted evicted ids (capped, oldest first) that do not name a restored task."""
    if not isinstance(gone, list):
        return []
    return [cap(task_id, limit) for task_id in gone if isinstance(task_id, str) and task_id not in tasks]
