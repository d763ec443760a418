"""One task's record and its snapshot, shared by :mod:`bridge.sessions.tasks` (the table and
its event rules) and :mod:`bridge.sessions.task_json` (its persistence)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Final, TypedDict

__all__ = [
    "LIVE_STATUSES",
    "PATCH_STR_FIELDS",
    "TERMINAL_STATUSES",
    "TOP_STR_FIELDS",
    "UNKNOWN_TERMINAL",
    "Task",
    "TaskSnapshot",
]

TERMINAL_STATUSES: Final = frozenset({"completed", "failed", "stopped"})
LIVE_STATUSES: Final = frozenset({"pending", "running", "paused", "completed", "failed", "killed"})
# The terminal status of a task whose end we were told of without a recognised outcome.
UNKNOWN_TERMINAL: Final = "stopped"

# String fields taken from the top level of any task event.
TOP_STR_FIELDS: Final = (
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
PATCH_STR_FIELDS: Final = ("description", "summary", "last_tool_name", "output_file")


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


@dataclass(slots=True)
class Task:
    """The mutable record behind a :class:`TaskSnapshot`; only the table changes it."""

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
