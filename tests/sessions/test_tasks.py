"""TaskTable (issue #5 item 4): sub-agent / workflow task state fed by the stream-json codec's
``task.updated`` events (docs/api.md §6.6), as Claude Code and CodeBuddy workflows report them."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.protocols.stream_json import StreamJsonCodec
from bridge.sessions.tasks import (
    LIVE_STATUSES,
    MAX_SNAPSHOT_BYTES,
    MAX_STR,
    TERMINAL_STATUSES,
    ApplyResult,
    TaskSnapshot,
    TaskTable,
)

CODEC = StreamJsonCodec()


def decode(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (data, raw) pair the conversation hands over for one agent line."""
    events = CODEC.decode(json.dumps({"type": "system", **obj}).encode()).events
    assert events[0].kind == "task.updated", events
    assert events[0].raw is not None
    return events[0].data, json.loads(events[0].raw)


def feed(table: TaskTable, now: float, **obj: Any) -> ApplyResult:
    data, raw = decode(obj)
    return table.apply(data, raw, now)


def started(table: TaskTable, now: float, task_id: str = "t1", **extra: Any) -> ApplyResult:
    return feed(table, now, subtype="task_started", task_id=task_id, **extra)


def notify(table: TaskTable, now: float, status: str, task_id: str = "t1", **extra: Any) -> ApplyResult:
    return feed(table, now, subtype="task_notification", task_id=task_id, status=status, **extra)


def task_of(table: TaskTable, task_id: str) -> TaskSnapshot | None:
    """The one task with that id as ``snapshot()`` lists it, or None."""
    found = [t for t in table.snapshot() if t["task_id"] == task_id]
    assert len(found) <= 1, found
    return found[0] if found else None


def ids(table: TaskTable) -> list[str]:
    return [t["task_id"] for t in table.snapshot()]


def unfinished(table: TaskTable) -> list[str]:
    """Ids of the tasks still waiting for their ``task_notification``, oldest first."""
    return [t["task_id"] for t in table.snapshot() if not t["terminal"]]


def routed_to(table: TaskTable, tool_use_id: str) -> str | None:
    """The task an event carrying only ``tool_use_id`` (no ``task_id``) is routed to, found by
    applying such an event to a copy of the table so the table itself is left untouched."""
    probe = copy.deepcopy(table)
    res = probe.apply({"event": "task_progress", "tool_use_id": tool_use_id}, None, 0.0)
    assert (res.reason == "invalid") == (res.task is None), res
    return None if res.task is None else res.task["task_id"]


def phase(title: str) -> dict[str, Any]:
    return {"type": "workflow_phase", "index": 1, "title": title}


def agent(label: str, state: str = "start", **extra: Any) -> dict[str, Any]:
    return {
        "type": "workflow_agent",
        "index": 1,
        "agentId": f"v2:{label}",
        "state": state,
        "startedAt": 1785470000000,
        "label": label,
        "phaseTitle": "Gather",
        "phaseIndex": 1,
        **extra,
    }


# ---------------------------------------------------------------------- task_started


def test_task_started_creates_a_running_task_with_its_identity() -> None:
    table = TaskTable()
    res = started(
        table,
        10.0,
        tool_use_id="toolu_01",
        description="Explore repo",
        subagent_type="Explore",
        parent_task_id="t0",
        is_backgrounded=True,
        task_type="local_workflow",
        workflow_name="path:simple.workflow.js",
        prompt="ignored",
    )
    assert res.accepted and res.reason == "ok"
    task = res.task
    assert task is not None
    assert task["task_id"] == "t1" and task["status"] == "running" and not task["terminal"]
    assert task["description"] == "Explore repo"
    assert task["task_type"] == "local_workflow" and task["subagent_type"] == "Explore"
    assert task["workflow_name"] == "path:simple.workflow.js"
    assert task["tool_use_id"] == "toolu_01" and task["parent_task_id"] == "t0"
    assert task["is_backgrounded"] is True
    assert task["started_at"] == task["updated_at"] == 10.0 and task["ended_at"] is None
    assert table.snapshot() == [task] and "t1" in table and len(table) == 1


def test_task_type_falls_back_to_subagent_type_as_the_codec_reports_it() -> None:
    table = TaskTable()
    task = started(table, 1.0, subagent_type="Explore").task
    assert task is not None and task["task_type"] == "Explore" and task["subagent_type"] == "Explore"


def test_task_started_revives_a_task_that_is_not_terminal_and_keeps_its_first_sighting() -> None:
    table = TaskTable()
    feed(table, 1.0, subtype="task_updated", task_id="t1", patch={"status": "paused"})
    res = started(table, 2.0, description="again")
    assert res.accepted and res.task is not None
    assert res.task["status"] == "running" and res.task["description"] == "again"
    assert res.task["started_at"] == 1.0 and res.task["updated_at"] == 2.0
    assert len(table) == 1


def test_task_started_does_not_revive_a_terminal_task() -> None:
    table = TaskTable()
    started(table, 1.0)
    notify(table, 2.0, "completed")
    res = started(table, 3.0, description="restarted?")
    assert res.accepted  # inside the grace window: fields only
    assert res.task is not None and res.task["status"] == "completed" and res.task["terminal"]
    assert res.task["description"] == "restarted?"
    late = started(table, 60.0)
    assert (late.accepted, late.reason) == (False, "late")


# ---------------------------------------------------------------------- task_progress


def test_task_progress_updates_usage_tool_summary_and_description_but_not_status() -> None:
    table = TaskTable()
    started(table, 1.0, description="Explore repo")
    feed(table, 1.5, subtype="task_updated", task_id="t1", patch={"status": "paused"})
    res = feed(
        table,
        2.0,
        subtype="task_progress",
        task_id="t1",
        description="Explore more",
        usage={"total_tokens": 1200, "tool_uses": 3, "duration_ms": 4100},
        last_tool_name="Grep",
        summary="Analyzed 5 files",
    )
    task = res.task
    assert res.accepted and task is not None
    assert task["usage"] == {"total_tokens": 1200, "tool_uses": 3, "duration_ms": 4100}
    assert task["last_tool_name"] == "Grep" and task["summary"] == "Analyzed 5 files"
    assert task["description"] == "Explore more"
    assert task["status"] == "paused"  # the codec's default "running" for progress is not a status change
    feed(table, 3.0, subtype="task_progress", task_id="t1", usage={"total_tokens": 5})
    after = task_of(table, "t1")
    assert after is not None and after["usage"] == {"total_tokens": 5}  # usage is a snapshot too
    assert after["last_tool_name"] == "Grep"  # absent keys keep their value


def test_workflow_progress_is_a_snapshot_that_replaces_the_previous_one() -> None:
    table = TaskTable()
    started(table, 1.0, task_type="local_workflow")
    first = [phase("Gather"), agent("child-1"), agent("child-2", tokens=10)]
    feed(table, 2.0, subtype="task_progress", task_id="t1", workflow_progress=first)
    task = task_of(table, "t1")
    assert task is not None and task["workflow_progress"] == first
    second = [phase("Write"), agent("child-1", state="done", endedAt=1785470001000)]
    feed(table, 3.0, subtype="task_progress", task_id="t1", workflow_progress=second)
    task = task_of(table, "t1")
    assert task is not None and task["workflow_progress"] == second  # never merged
    labels = [e.get("label") for e in task["workflow_progress"] or []]
    assert "child-2" not in labels and all("tokens" not in e for e in task["workflow_progress"] or [])
    feed(table, 4.0, subtype="task_progress", task_id="t1", summary="no timeline in this one")
    task = task_of(table, "t1")
    assert task is not None and task["workflow_progress"] == second  # absent: kept
    feed(table, 5.0, subtype="task_progress", task_id="t1", workflow_progress={"not": "a list"})
    task = task_of(table, "t1")
    assert task is not None and task["workflow_progress"] == second  # malformed: ignored
    feed(table, 6.0, subtype="task_progress", task_id="t1", workflow_progress=[])
    task = task_of(table, "t1")
    assert task is not None and task["workflow_progress"] == []  # an empty snapshot is a snapshot


def test_unknown_timeline_entry_types_are_kept_verbatim() -> None:
    table = TaskTable()
    entries = [{"type": "workflow_future_thing", "x": [1, 2, {"y": None}]}]
    res = feed(table, 1.0, subtype="task_progress", task_id="t1", workflow_progress=entries)
    assert res.task is not None and res.task["workflow_progress"] == entries


# ---------------------------------------------------------------------- task_updated


def test_task_updated_applies_only_the_keys_present_in_the_patch() -> None:
    table = TaskTable()
    started(table, 1.0, description="orig", task_type="local_workflow")
    feed(table, 2.0, subtype="task_updated", task_id="t1", patch={"description": "renamed"})
    task = task_of(table, "t1")
    assert task is not None and task["description"] == "renamed" and task["status"] == "running"
    feed(table, 3.0, subtype="task_updated", task_id="t1", patch={"status": "paused"})
    task = task_of(table, "t1")
    assert task is not None and task["status"] == "paused" and task["description"] == "renamed"
    feed(
        table,
        4.0,
        subtype="task_updated",
        task_id="t1",
        patch={"is_backgrounded": True, "error": "boom", "end_time": 1785470000123, "bogus": 1},
    )
    task = task_of(table, "t1")
    assert task is not None
    assert task["is_backgrounded"] is True and task["error"] == "boom" and task["end_time"] == 1785470000123
    assert task["status"] == "paused" and task["description"] == "renamed" and "bogus" not in task
    assert task["task_type"] == "local_workflow" and task["updated_at"] == 4.0


@pytest.mark.parametrize("status", sorted(LIVE_STATUSES))
def test_every_patch_status_is_live_and_never_terminal(status: str) -> None:
    table = TaskTable()
    started(table, 1.0)
    res = feed(table, 2.0, subtype="task_updated", task_id="t1", patch={"status": status, "end_time": 5})
    assert res.accepted and res.task is not None
    assert res.task["status"] == status and not res.task["terminal"] and res.task["ended_at"] is None
    assert unfinished(table) == ["t1"]
    feed(table, 3.0, subtype="task_updated", task_id="t1", patch={"status": "running"})
    task = task_of(table, "t1")
    assert task is not None and task["status"] == "running"  # live statuses can move freely


def test_unknown_patch_status_and_mistyped_values_are_ignored() -> None:
    table = TaskTable()
    started(table, 1.0, description="d")
    res = feed(
        table,
        2.0,
        subtype="task_updated",
        task_id="t1",
        patch={"status": "exploded", "description": 7, "is_backgrounded": "yes", "end_time": True},
    )
    assert res.accepted and res.task is not None
    assert res.task["status"] == "running" and res.task["description"] == "d"
    assert res.task["is_backgrounded"] is None and res.task["end_time"] is None


def test_patch_also_carries_usage_and_top_level_fields() -> None:
    table = TaskTable()
    res = feed(
        table,
        1.0,
        subtype="task_updated",
        task_id="t1",
        patch={"usage": {"total_tokens": 3}},
        last_tool_name="Read",
        subagent_type="general-purpose",
        parent_task_id="p",
        output_file="/tmp/o",
    )
    task = res.task
    assert task is not None and task["usage"] == {"total_tokens": 3} and task["last_tool_name"] == "Read"
    assert task["subagent_type"] == "general-purpose" and task["parent_task_id"] == "p"
    assert task["output_file"] == "/tmp/o"


def test_data_without_raw_still_applies_the_codec_lifted_patch() -> None:
    table = TaskTable()
    data, _ = decode({"subtype": "task_updated", "task_id": "t1", "patch": {"status": "killed", "description": "x"}})
    res = table.apply(data, None, 1.0)
    assert res.task is not None and res.task["status"] == "killed" and res.task["description"] == "x"
    assert not res.task["terminal"]


def test_raw_keys_win_over_data_keys() -> None:
    table = TaskTable()
    res = table.apply(
        {"event": "task_progress", "task_id": "t1", "summary": "from data"},
        {"subtype": "task_progress", "task_id": "t1", "summary": "from raw"},
        1.0,
    )
    assert res.task is not None and res.task["summary"] == "from raw"


# ---------------------------------------------------------------------- task_notification


@pytest.mark.parametrize(
    ("given_status", "terminal"),
    [
        ("completed", "completed"),
        ("failed", "failed"),
        ("stopped", "stopped"),
        ("killed", "stopped"),
        ("cancelled", "stopped"),
        ("canceled", "stopped"),
        ("waiting", "stopped"),
        ("", "stopped"),
    ],
)
def test_notification_is_the_authoritative_terminal_state(given_status: str, terminal: str) -> None:
    table = TaskTable()
    started(table, 1.0, tool_use_id="toolu_01")
    res = notify(
        table, 2.0, given_status, output_file="/var/tmp/example", summary="Found 3 files", usage={"total_tokens": 2048}
    )
    assert res.accepted and res.reason == "ok" and res.task is not None
    assert res.task["status"] == terminal and terminal in TERMINAL_STATUSES
    assert res.task["terminal"] and res.task["ended_at"] == 2.0
    assert res.task["output_file"] == "/var/tmp/example" and res.task["summary"] == "Found 3 files"
    assert res.task["usage"] == {"total_tokens": 2048}
    assert unfinished(table) == []


def test_notification_without_status_ends_the_task_as_stopped() -> None:
    table = TaskTable()
    res = feed(table, 1.0, subtype="task_notification", task_id="t1")
    assert res.task is not None and res.task["terminal"] and res.task["status"] == "stopped"


def test_a_second_notification_is_a_duplicate_and_is_not_applied() -> None:
    table = TaskTable()
    started(table, 1.0)
    notify(table, 2.0, "completed", summary="done")
    res = notify(table, 2.5, "failed", summary="changed my mind")
    assert (res.accepted, res.reason) == (False, "duplicate")
    assert res.task is not None and res.task["status"] == "completed" and res.task["summary"] == "done"
    assert res.task["ended_at"] == 2.0 and res.task["updated_at"] == 2.0
    assert notify(table, 100.0, "completed").reason == "duplicate"  # after the grace window too


def test_killed_patch_then_stopped_notification_the_interrupt_path() -> None:
    """The interrupt path of a CodeBuddy workflow: patch.status "killed" (not terminal), one
    notification "stopped", then late task_progress flipping sub-agents to "error" inside the
    grace window."""
    table = TaskTable()
    started(table, 100.0, tool_use_id="toolu_wf", task_type="local_workflow", description="deep research")
    feed(table, 101.0, subtype="task_progress", task_id="t1", workflow_progress=[phase("Gather"), agent("c1")])
    killed = feed(
        table, 102.0, subtype="task_updated", task_id="t1", patch={"status": "killed", "end_time": 1785470000000}
    )
    assert killed.task is not None and killed.task["status"] == "killed" and not killed.task["terminal"]
    done = notify(table, 102.2, "stopped", summary="interrupted", output_file="/tmp/wf")
    assert done.task is not None and done.task["status"] == "stopped" and done.task["terminal"]
    aborted = [phase("Gather"), agent("c1", state="error", error="subagent aborted: user cancel")]
    late = feed(table, 103.0, subtype="task_progress", task_id="t1", workflow_progress=aborted)
    assert late.accepted and late.task is not None
    assert late.task["workflow_progress"] == aborted and late.task["status"] == "stopped"
    assert late.task["end_time"] == 1785470000000 and late.task["ended_at"] == 102.2


# ---------------------------------------------------------------------- grace window


def test_late_progress_is_applied_within_the_grace_window_then_refused() -> None:
    table = TaskTable()
    started(table, 0.0)
    notify(table, 10.0, "stopped")
    inside = feed(
        table,
        14.9,
        subtype="task_progress",
        task_id="t1",
        summary="late 1",
        workflow_progress=[agent("c1", state="error")],
    )
    assert (inside.accepted, inside.reason) == (True, "ok")
    assert inside.task is not None and inside.task["summary"] == "late 1"
    assert inside.task["status"] == "stopped" and inside.task["updated_at"] == 14.9
    edge = feed(table, 15.0, subtype="task_progress", task_id="t1", summary="late 2")
    assert edge.accepted  # exactly 5 s after the notification is still inside
    outside = feed(table, 15.01, subtype="task_progress", task_id="t1", summary="too late", workflow_progress=[])
    assert (outside.accepted, outside.reason) == (False, "late")
    task = task_of(table, "t1")
    assert (
        task is not None and task["summary"] == "late 2" and task["workflow_progress"] == [agent("c1", state="error")]
    )
    assert task["updated_at"] == 15.0


def test_the_grace_window_is_measured_from_the_notification_not_the_last_update() -> None:
    table = TaskTable()
    notify(table, 0.0, "completed")
    for now in (1.0, 2.0, 3.0, 4.0, 5.0):
        assert feed(table, now, subtype="task_progress", task_id="t1").accepted
    assert feed(table, 5.5, subtype="task_progress", task_id="t1").reason == "late"


def test_late_task_updated_patches_fields_but_never_the_terminal_status() -> None:
    table = TaskTable()
    started(table, 0.0)
    notify(table, 1.0, "failed")
    res = feed(
        table,
        2.0,
        subtype="task_updated",
        task_id="t1",
        patch={"status": "running", "error": "rate limited", "end_time": 99},
    )
    assert res.accepted and res.task is not None
    assert res.task["status"] == "failed" and res.task["terminal"]
    assert res.task["error"] == "rate limited" and res.task["end_time"] == 99
    res = feed(table, 7.0, subtype="task_updated", task_id="t1", patch={"error": "later"})
    assert res.reason == "late" and res.task is not None and res.task["error"] == "rate limited"


def test_grace_window_is_configurable() -> None:
    table = TaskTable(grace_s=0.0)
    notify(table, 1.0, "completed")
    assert feed(table, 1.0, subtype="task_progress", task_id="t1").accepted
    assert feed(table, 1.001, subtype="task_progress", task_id="t1").reason == "late"


# ---------------------------------------------------------------------- lazy creation & routing


def test_unknown_task_is_created_lazily_from_any_event() -> None:
    table = TaskTable()
    progress = feed(table, 1.0, subtype="task_progress", task_id="p", summary="resumed mid-stream")
    assert progress.accepted and progress.task is not None
    assert progress.task["status"] == "running" and progress.task["started_at"] == 1.0
    updated = feed(table, 2.0, subtype="task_updated", task_id="u", patch={"status": "killed"})
    assert updated.task is not None and updated.task["status"] == "killed" and not updated.task["terminal"]
    paused = feed(table, 2.5, subtype="task_updated", task_id="v", patch={"description": "no status"})
    assert paused.task is not None and paused.task["status"] == "running"
    notified = notify(table, 3.0, "killed", task_id="n")
    assert notified.task is not None and notified.task["status"] == "stopped" and notified.task["terminal"]
    assert ids(table) == ["p", "u", "v", "n"]


def test_events_without_a_usable_task_id_or_kind_are_invalid() -> None:
    table = TaskTable()
    assert table.apply({"event": "task_progress"}, {"subtype": "task_progress"}, 1.0) == (False, "invalid", None)
    assert table.apply({"event": "task_progress", "task_id": ""}, None, 1.0).reason == "invalid"
    assert table.apply({"event": "task_progress", "task_id": 42}, None, 1.0).reason == "invalid"
    assert table.apply({"event": "background_tasks_changed", "task_id": "t"}, None, 1.0).reason == "invalid"
    assert table.apply(None, None, 1.0).reason == "invalid"
    assert table.apply({}, {"subtype": "task_started", "task_id": "t"}, 1.0).accepted  # kind from raw
    assert len(table) == 1


def test_tool_use_id_correlates_and_looks_tasks_up() -> None:
    table = TaskTable()
    started(table, 1.0, task_id="t1", tool_use_id="toolu_01")
    started(table, 2.0, task_id="t2", tool_use_id="toolu_02")
    assert routed_to(table, "toolu_02") == "t2"
    assert routed_to(table, "toolu_nope") is None
    # An event that lost its task_id is routed by the tool_use_id.
    res = table.apply({"event": "task_progress", "tool_use_id": "toolu_01", "summary": "via tool"}, None, 3.0)
    assert res.accepted and res.task is not None and res.task["task_id"] == "t1"
    assert res.task["summary"] == "via tool"
    # The first tool_use_id a task shows is the one kept.
    feed(table, 4.0, subtype="task_progress", task_id="t1", tool_use_id="toolu_other")
    first = task_of(table, "t1")
    assert first is not None and first["tool_use_id"] == "toolu_01"
    assert routed_to(table, "toolu_other") is None


def test_a_lazily_created_task_learns_its_tool_use_id_later() -> None:
    table = TaskTable()
    feed(table, 1.0, subtype="task_updated", task_id="t1", patch={"status": "running"})
    assert routed_to(table, "toolu_01") is None
    feed(table, 2.0, subtype="task_progress", task_id="t1", tool_use_id="toolu_01")
    assert routed_to(table, "toolu_01") == "t1"


# ---------------------------------------------------------------------- untrusted text & caps


def test_every_string_is_capped() -> None:
    table = TaskTable()
    huge = "x" * (MAX_STR * 3)
    res = started(table, 1.0, task_id="t" * (MAX_STR + 10), description=huge, tool_use_id=huge, workflow_name=huge)
    task = res.task
    assert task is not None
    for key in ("task_id", "description", "tool_use_id", "workflow_name"):
        value = dict(task)[key]
        assert isinstance(value, str) and len(value) == MAX_STR and value.endswith("…")
    feed(
        table,
        2.0,
        subtype="task_progress",
        task_id="t" * (MAX_STR + 10),
        summary=huge,
        last_tool_name=huge,
        workflow_progress=[agent(huge, resultPreview=huge, **{huge: huge})],
        usage={"note": huge},
    )
    assert len(table) == 1  # the capped id still names the same task
    [task] = table.snapshot()
    assert len(task["summary"] or "") == MAX_STR and len(task["last_tool_name"] or "") == MAX_STR
    entry = (task["workflow_progress"] or [])[0]
    assert len(entry["label"]) == MAX_STR and len(entry["resultPreview"]) == MAX_STR
    assert all(len(k) <= MAX_STR for k in entry)
    assert len((task["usage"] or {})["note"]) == MAX_STR


def test_max_str_is_configurable() -> None:
    table = TaskTable(max_str=8)
    res = started(table, 1.0, description="0123456789")
    assert res.task is not None and res.task["description"] == "0123456…"


def test_oversized_workflow_progress_keeps_the_leading_entries_and_is_marked_truncated() -> None:
    table = TaskTable()
    entries = [agent(f"child-{i}", resultPreview="p" * 3000) for i in range(200)]  # ~650 KB
    res = feed(table, 1.0, subtype="task_progress", task_id="t1", workflow_progress=entries)
    task = res.task
    assert task is not None and task["workflow_progress_truncated"]
    kept = task["workflow_progress"] or []
    assert 0 < len(kept) < len(entries) and kept == entries[: len(kept)]
    assert len(json.dumps(kept, separators=(",", ":"))) <= MAX_SNAPSHOT_BYTES
    feed(table, 2.0, subtype="task_progress", task_id="t1", workflow_progress=entries[:3])
    task = task_of(table, "t1")
    assert task is not None and not task["workflow_progress_truncated"] and task["workflow_progress"] == entries[:3]


def test_a_single_entry_bigger_than_the_budget_leaves_an_empty_truncated_snapshot() -> None:
    table = TaskTable(max_snapshot_bytes=64)
    res = table.apply({"event": "task_progress", "task_id": "t"}, {"workflow_progress": [{"label": "y" * 100}]}, 1.0)
    assert res.task is not None and res.task["workflow_progress"] == [] and res.task["workflow_progress_truncated"]


def test_untrusted_nested_values_are_bounded_and_json_only() -> None:
    table = TaskTable()
    deep: Any = "bottom"
    for _ in range(100):
        deep = [deep]
    wide = {
        "type": "workflow_agent",
        "many": list(range(5000)),
        "big": 2**80,
        "neg": -(2**80),
        "inf": float("inf"),
        "nan": float("nan"),
        "deep": deep,
        3: "int key",
    }
    res = table.apply({"event": "task_progress", "task_id": "t"}, {"workflow_progress": [wide]}, 1.0)
    assert res.task is not None
    entry = (res.task["workflow_progress"] or [])[0]
    assert len(entry["many"]) == 1000 and entry["big"] is None and entry["neg"] is None
    assert entry["inf"] is None and entry["nan"] is None and entry["3"] == "int key"
    depth, node = 0, entry["deep"]
    while isinstance(node, list):
        depth, node = depth + 1, node[0]
    assert depth < 40 and node is None
    json.dumps(res.task, allow_nan=False)  # always serializable as strict JSON


def test_oversized_usage_is_ignored_and_structured_errors_become_text() -> None:
    table = TaskTable()
    started(table, 1.0)
    feed(table, 2.0, subtype="task_progress", task_id="t1", usage={"total_tokens": 1})
    feed(table, 3.0, subtype="task_progress", task_id="t1", usage={f"k{i}": "v" * 100 for i in range(500)})
    task = task_of(table, "t1")
    assert task is not None and task["usage"] == {"total_tokens": 1}
    res = feed(table, 4.0, subtype="task_updated", task_id="t1", patch={"error": {"message": "boom", "code": 7}})
    assert res.task is not None and json.loads(res.task["error"] or "") == {"message": "boom", "code": 7}


def test_snapshots_are_copies() -> None:
    table = TaskTable()
    res = feed(
        table, 1.0, subtype="task_progress", task_id="t1", workflow_progress=[agent("c")], usage={"total_tokens": 1}
    )
    assert res.task is not None
    (res.task["workflow_progress"] or []).clear()
    (res.task["usage"] or {}).clear()
    res.task["status"] = "hacked"
    task = task_of(table, "t1")
    assert task is not None and task["workflow_progress"] == [agent("c")] and task["usage"] == {"total_tokens": 1}
    assert task["status"] == "running"


# ---------------------------------------------------------------------- listing & capacity


def test_snapshot_is_sorted_by_started_at_ties_in_arrival_order() -> None:
    table = TaskTable()
    started(table, 5.0, task_id="late")
    started(table, 1.0, task_id="early")
    started(table, 3.0, task_id="middle")
    started(table, 3.0, task_id="middle2")
    assert ids(table) == ["early", "middle", "middle2", "late"]
    keys = set(table.snapshot()[0])
    assert {
        "task_id",
        "task_type",
        "status",
        "description",
        "summary",
        "tool_use_id",
        "parent_task_id",
        "workflow_progress",
        "usage",
        "last_tool_name",
        "started_at",
        "updated_at",
        "ended_at",
        "error",
        "output_file",
    } <= keys


def test_terminal_tasks_are_evicted_first_longest_ended_first() -> None:
    table = TaskTable(max_tasks=3)
    started(table, 1.0, task_id="a", tool_use_id="toolu_a")
    started(table, 2.0, task_id="b")
    started(table, 3.0, task_id="c")
    notify(table, 5.0, "completed", task_id="c")
    notify(table, 4.0, "completed", task_id="a")  # ended first, though it sorts first anyway
    started(table, 6.0, task_id="d")
    assert ids(table) == ["b", "c", "d"]
    assert routed_to(table, "toolu_a") is None
    started(table, 7.0, task_id="e")
    assert ids(table) == ["b", "d", "e"]
    # No terminal task left: the oldest-started one goes.
    started(table, 8.0, task_id="f")
    assert ids(table) == ["d", "e", "f"]
    assert len(table) == 3


def test_evicted_terminal_tasks_are_not_resurrected() -> None:
    table = TaskTable(max_tasks=1)
    started(table, 1.0, task_id="a")
    notify(table, 2.0, "completed", task_id="a")
    started(table, 3.0, task_id="b")
    assert "a" not in table
    assert notify(table, 3.1, "completed", task_id="a") == (False, "duplicate", None)
    assert feed(table, 3.2, subtype="task_progress", task_id="a") == (False, "late", None)
    assert "a" not in table and "b" in table


def test_evicting_a_task_hands_its_tool_use_id_to_another_holder() -> None:
    table = TaskTable(max_tasks=2)
    started(table, 1.0, task_id="a", tool_use_id="toolu_shared")
    started(table, 2.0, task_id="b", tool_use_id="toolu_shared")  # b now owns the index entry
    started(table, 2.5, task_id="x")  # evicts a (oldest), index still points to b
    assert routed_to(table, "toolu_shared") == "b"


def test_limits_must_be_sane() -> None:
    with pytest.raises(ValueError):
        TaskTable(max_tasks=0)
    with pytest.raises(ValueError):
        TaskTable(grace_s=float("nan"))
    with pytest.raises(ValueError):
        TaskTable().apply({"event": "task_started", "task_id": "t"}, None, float("nan"))


# ---------------------------------------------------------------------- persistence


def populated() -> TaskTable:
    table = TaskTable(max_tasks=3)
    started(table, 1.0, task_id="gone", tool_use_id="toolu_gone")
    notify(table, 1.5, "completed", task_id="gone")
    started(
        table,
        2.0,
        task_id="wf",
        tool_use_id="toolu_wf",
        task_type="local_workflow",
        workflow_name="deep",
        parent_task_id="root",
        is_backgrounded=False,
    )
    feed(
        table,
        3.0,
        subtype="task_progress",
        task_id="wf",
        usage={"total_tokens": 9, "tool_uses": 1},
        last_tool_name="Grep",
        workflow_progress=[phase("Gather"), agent("c1", tokens=5)],
    )
    feed(
        table,
        4.0,
        subtype="task_updated",
        task_id="wf",
        patch={"status": "killed", "end_time": 1.25e12, "error": "cancel"},
    )
    notify(table, 5.0, "stopped", task_id="wf", output_file="/tmp/out", summary="stopped")
    started(table, 6.0, task_id="bash", subagent_type="Bash", tool_use_id="toolu_bash")
    started(table, 7.0, task_id="big")  # evicts "gone"
    table.apply(
        {"event": "task_progress", "task_id": "big"},
        {"workflow_progress": [{"x": "y" * 5000} for _ in range(100)]},
        8.0,
    )
    return table


def test_json_round_trip_is_exact() -> None:
    table = populated()
    assert "gone" not in table and len(table) == 3
    text = table.to_json()
    back = TaskTable.from_json(text, max_tasks=3)
    assert back.snapshot() == table.snapshot()
    assert back.to_json() == text
    assert TaskTable.from_json(text.encode(), max_tasks=3).snapshot() == table.snapshot()
    for tool_use_id, owner in (("toolu_wf", "wf"), ("toolu_bash", "bash"), ("toolu_gone", None)):
        assert routed_to(back, tool_use_id) == routed_to(table, tool_use_id) == owner
    # The restored table behaves exactly like the original from here on.
    for t in (table, back):
        assert notify(t, 9.0, "completed", task_id="gone").reason == "duplicate"
        assert feed(t, 10.5, subtype="task_progress", task_id="wf").reason == "late"
        assert notify(t, 11.0, "failed", task_id="bash").accepted
        started(t, 12.0, task_id="new")
    assert back.to_json() == table.to_json()


def test_from_json_rejects_what_is_not_a_table_and_skips_malformed_entries() -> None:
    for bad in ("", "[]", "{}", '{"version": 2, "tasks": []}', '{"version": 1, "tasks": {}}', b"\xff"):
        with pytest.raises(ValueError):
            TaskTable.from_json(bad)
    doc = {
        "version": 1,
        "tasks": [
            "nope",
            {"task_id": "no-start"},
            {"task_id": 3, "started_at": 1},
            {"task_id": "ok", "started_at": 2, "status": "nonsense", "usage": [1]},
            {"task_id": "fake-terminal", "started_at": 3, "status": "completed", "terminal": True},
            {"task_id": "ended", "started_at": 4, "status": "weird", "terminal": True, "ended_at": 5},
            {"task_id": "ok", "started_at": 9},
        ],
        "tool_use_ids": {"toolu_x": "ok", "toolu_y": 5},
        "gone": ["ok", 7, "old"],
    }
    table = TaskTable.from_json(json.dumps(doc))
    tasks = {t["task_id"]: t for t in table.snapshot()}
    assert set(tasks) == {"ok", "fake-terminal", "ended"}
    assert tasks["ok"]["status"] == "running" and tasks["ok"]["usage"] is None and tasks["ok"]["started_at"] == 2.0
    assert tasks["fake-terminal"]["status"] == "completed" and not tasks["fake-terminal"]["terminal"]
    assert tasks["ended"]["status"] == "stopped" and tasks["ended"]["terminal"]
    assert routed_to(table, "toolu_x") is None  # "ok" never had that tool_use_id
    assert notify(table, 10.0, "completed", task_id="old").reason == "duplicate"


def test_from_json_reapplies_the_caps() -> None:
    table = populated()
    smaller = TaskTable.from_json(table.to_json(), max_tasks=2)
    assert ids(smaller) == ["bash", "big"]  # the terminal one went
    assert notify(smaller, 20.0, "completed", task_id="wf").reason == "duplicate"


# ---------------------------------------------------------------------- property


json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_value = st.recursive(
    json_leaf,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=12,
)
statuses = (
    st.sampled_from(
        ["pending", "running", "paused", "completed", "failed", "killed", "stopped", "cancelled", "", "weird"]
    )
    | json_value
)

OPTIONAL: dict[str, st.SearchStrategy[Any]] = {  # built once: strategies validate lazily
    "task_id": st.sampled_from(["e", ""]) | json_value,
    "tool_use_id": st.sampled_from(["toolu_1", "toolu_2"]) | json_value,
    "status": statuses,
    "description": st.text(max_size=10) | json_value,
    "summary": st.text(max_size=10),
    "usage": st.dictionaries(st.sampled_from(["total_tokens", "tool_uses", "duration_ms"]), st.integers(0, 10**6))
    | json_value,
    "last_tool_name": st.sampled_from(["Grep", "Read"]),
    "workflow_progress": st.lists(json_value, max_size=4) | json_value,
    "patch": st.fixed_dictionaries(
        {},
        optional={
            "status": statuses,
            "description": json_value,
            "end_time": json_value,
            "error": json_value,
            "is_backgrounded": json_value,
            "other": json_value,
        },
    )
    | json_value,
    "subagent_type": json_value,
    "parent_task_id": json_value,
    "output_file": json_value,
    "is_backgrounded": json_value,
    "error": json_value,
    "task_type": json_value,
}


@st.composite
def task_events(draw: st.DrawFn) -> tuple[dict[str, Any] | None, dict[str, Any] | None, float]:
    obj: dict[str, Any] = {
        "type": "system",
        "subtype": draw(
            st.sampled_from(
                [
                    "task_started",
                    "task_progress",
                    "task_updated",
                    "task_notification",
                    "task_notification",
                    "background_tasks_changed",
                ]
            )
        ),
    }
    if draw(st.integers(0, 9)) < 8:  # mostly a few well-formed ids, so tasks meet again
        obj["task_id"] = draw(st.sampled_from(["a", "b", "c", "d"]))
    for key, strategy in OPTIONAL.items():
        if draw(st.integers(0, 9)) < (1 if key == "task_id" else 4):
            obj[key] = draw(strategy)
    events = CODEC.decode(json.dumps(obj).encode()).events
    data: dict[str, Any] | None = events[0].data if events[0].kind == "task.updated" else {}
    raw: dict[str, Any] | None = obj
    mode = draw(st.sampled_from(["both", "both", "data", "raw"]))
    if mode == "data":
        raw = None
    elif mode == "raw":
        data = None
    step = draw(st.floats(-1.0, 4.0, allow_nan=False))
    return data, raw, step


PROPERTY = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@PROPERTY
@given(events=st.lists(task_events(), max_size=40), max_tasks=st.integers(1, 6))
def test_arbitrary_task_event_sequences_never_raise_and_terminal_states_never_change(
    events: list[tuple[dict[str, Any] | None, dict[str, Any] | None, float]], max_tasks: int
) -> None:
    table = TaskTable(max_tasks=max_tasks)
    now = 1000.0
    terminal: dict[str, tuple[str, float | None]] = {}
    for data, raw, step in events:
        now += step
        res = table.apply(data, raw, now)
        assert res.accepted == (res.reason == "ok")
        assert res.reason in ("ok", "duplicate", "late", "invalid")
        if res.reason == "ok":
            assert res.task is not None
        elif res.reason == "invalid":
            assert res.task is None
        tasks = {t["task_id"]: t for t in table.snapshot()}
        assert len(tasks) == len(table) <= max_tasks
        for task_id, task in tasks.items():
            if task["terminal"]:
                assert task["status"] in TERMINAL_STATUSES and task["ended_at"] is not None
            else:
                assert task["status"] in LIVE_STATUSES and task["ended_at"] is None
            if task_id in terminal:  # once notified, a present task keeps its outcome
                assert task["terminal"] and (task["status"], task["ended_at"]) == terminal[task_id]
        terminal = {k: (t["status"], t["ended_at"]) for k, t in tasks.items() if t["terminal"]}
        starts = [t["started_at"] for t in tasks.values()]
        assert starts == sorted(starts)
    text = table.to_json()
    back = TaskTable.from_json(text, max_tasks=max_tasks)
    assert back.snapshot() == table.snapshot() and back.to_json() == text
