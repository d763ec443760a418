"""Sub-agent and workflow tasks through a real daemon (issue #5 item 4)."""

from __future__ import annotations

from typing import Any

from conftest import new_thread


async def test_task_events_build_the_task_table(daemon: Any) -> None:
    thread = await new_thread(daemon, "stream-json")
    c = await daemon.ws(thread["id"])
    end = await c.turn("tasks")
    assert end["data"]["status"] == "success"
    updates = c.seen("task.updated")
    assert [u["data"]["event"] for u in updates] == [
        "task_started",
        "task_progress",
        "task_progress",
        "task_updated",
        "task_notification",
    ]
    assert updates[-1]["data"]["status"] == "completed"
    dup = [f for f in c.seen("agent.other") if f["data"].get("task_event_ignored")]
    assert len(dup) == 1 and dup[0]["data"]["task_event_ignored"] == "duplicate"
    async with daemon.http() as http:
        tasks = (await http.get(f"/v1/threads/{thread['id']}/tasks")).json()["tasks"]
    assert len(tasks) == 1
    task = tasks[0]
    assert task["task_id"] == "t1" and task["tool_use_id"] == "toolu_task"
    assert task["status"] == "completed" and task["description"] == "Explore the repo"
    # The second snapshot replaced the first: never merged.
    assert task["workflow_progress"] == [{"step": "c", "state": "running"}]
    assert task["summary"] == "Found 3 files"


async def test_task_table_survives_a_daemon_restart(
    daemon_factory: Any, tmp_path: Any, agent_env: dict[str, str]
) -> None:
    from conftest import base_config

    cfg = base_config(tmp_path, agent_env)
    d1 = await daemon_factory(cfg)
    thread = await new_thread(d1, "stream-json")
    c = await d1.ws(thread["id"])
    await c.turn("tasks")
    assert await d1.stop() == 0
    d2 = await daemon_factory(cfg)
    async with d2.http() as http:
        tasks = (await http.get(f"/v1/threads/{thread['id']}/tasks")).json()["tasks"]
    assert [(t["task_id"], t["status"]) for t in tasks] == [("t1", "completed")]
