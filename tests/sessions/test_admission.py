"""Admission by a memory budget, the arithmetic (sessions/admission.py) and the budget
"auto" reads from the host and its cgroup (process/memory.py): in-process, no agents."""

from __future__ import annotations

import os
from pathlib import Path

from bridge.errors import Capacity
from bridge.process.memory import budget_mb, cgroup_limit_mb, own_cgroup, tree_rss
from bridge.sessions.admission import DEFAULT_ESTIMATE_MB, Estimates, Running, plan, user_share_mb
from bridge.sessions.remote import refusal, refused


def agent(key: str, mb: float, *, idle: bool = True, at: float = 0.0, user: str | None = None) -> Running:
    return Running(key, user, mb, idle, at)


def test_it_fits_without_stopping_anyone() -> None:
    assert plan(100, 30, [agent("a", 40), agent("b", 30)]) == []
    assert plan(100, 30, []) == []


def test_the_least_recently_active_idle_agents_go_first_and_only_as_many_as_needed() -> None:
    running = [agent("new", 30, at=9), agent("old", 30, at=1), agent("busy", 30, idle=False, at=0)]
    assert plan(100, 20, running) == ["old"]
    assert plan(100, 50, running) == ["old", "new"]


def test_no_room_even_after_every_idle_stop_refuses_and_stops_nobody() -> None:
    running = [agent("idle", 20, at=1), agent("busy", 70, idle=False)]
    assert plan(100, 40, running) is None


def test_an_agent_alone_always_starts() -> None:
    assert plan(100, 500, []) == []
    assert plan(100, 500, [agent("a", 10), agent("b", 10)]) == ["a", "b"]  # alone once they stop
    assert plan(100, 500, [agent("a", 10, idle=False)]) is None


def test_a_users_share_is_taken_from_their_own_idle_agents_first() -> None:
    running = [agent("mine", 20, user="u", at=5), agent("theirs", 20, user="v", at=1)]
    # u's share is 30: u's own idle agent goes, never v's for it
    assert plan(100, 20, running, user="u", share_mb=30) == ["mine"]
    busy_mine = [agent("mine", 20, user="u", idle=False), agent("theirs", 20, user="v", at=1)]
    assert plan(100, 20, busy_mine, user="u", share_mb=30) is None
    # within the share, the whole budget still decides (and may stop v's idle agent)
    assert plan(60, 30, running, user="u", share_mb=80) == ["theirs"]


def test_user_share() -> None:
    assert user_share_mb(1000, None, 64) is None
    assert user_share_mb(1000, 64, 64) is None
    assert user_share_mb(1000, 8, 64) == 125


def test_the_estimate_is_the_median_of_recent_peaks_else_the_profiles_else_the_default() -> None:
    est = Estimates(keep=3)
    assert est.of("p", None) == DEFAULT_ESTIMATE_MB
    assert est.of("p", 300) == 300
    for peak in (100, 900, 200):
        est.record("p", peak)
    assert est.of("p", 300) == 200
    est.record("p", 50)  # keeps the last three: 900, 200, 50
    assert est.of("p", 300) == 200
    est.record("p", 0)  # a run never sampled teaches nothing
    assert est.of("p", 300) == 200
    assert est.of("q", None) == DEFAULT_ESTIMATE_MB


def meminfo(tmp_path: Path, kib: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {kib} kB\nMemFree:        1024 kB\n")
    return path


def cgroup_tree(tmp_path: Path, limits: dict[str, str]) -> tuple[Path, Path]:
    """A fake /sys/fs/cgroup with ``limits`` (relative path → memory.max) and a
    /proc/self/cgroup naming the deepest one."""
    root = tmp_path / "cg"
    for rel, value in {"": "max", **limits}.items():
        d = root / rel
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.controllers").write_text("cpu memory pids\n")
        if rel:
            (d / "memory.max").write_text(value + "\n")
    deepest = max(limits, key=len)
    self_cg = tmp_path / "self-cgroup"
    self_cg.write_text(f"0::/{deepest}\n")
    return root, self_cg


def test_auto_is_80_percent_of_the_host_without_a_cgroup_limit(tmp_path: Path) -> None:
    info = meminfo(tmp_path, 10 * 1024 * 1024)  # 10 GiB
    v1 = tmp_path / "v1"
    v1.write_text("4:memory:/some/group\n")  # cgroup v1: no unified line
    assert budget_mb("auto", meminfo=info, self_cgroup=v1, cgroup_root=tmp_path / "none") == 8192
    root, self_cg = cgroup_tree(tmp_path, {"a": "max", "a/b": "max"})
    assert budget_mb("auto", meminfo=info, self_cgroup=self_cg, cgroup_root=root) == 8192


def test_auto_takes_the_lowest_memory_max_up_the_cgroup_tree(tmp_path: Path) -> None:
    info = meminfo(tmp_path, 10 * 1024 * 1024)
    root, self_cg = cgroup_tree(tmp_path, {"a": str(1024 * 1024 * 1024), "a/b": "max"})
    assert own_cgroup(self_cg, root) == root / "a" / "b"
    assert cgroup_limit_mb(root / "a" / "b") == 1024
    assert budget_mb("auto", meminfo=info, self_cgroup=self_cg, cgroup_root=root) == 819


def test_a_container_without_a_cgroup_namespace_has_its_limit_at_the_root(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("memory\n")
    (root / "memory.max").write_text(str(512 * 1024 * 1024) + "\n")
    self_cg = tmp_path / "self-cgroup"
    self_cg.write_text("0::/system.slice/docker-0123.scope\n")  # the host's path, not mounted here
    info = meminfo(tmp_path, 10 * 1024 * 1024)
    assert budget_mb("auto", meminfo=info, self_cgroup=self_cg, cgroup_root=root) == 409


def test_a_number_is_taken_as_it_is_and_0_is_off(tmp_path: Path) -> None:
    assert budget_mb(300) == 300
    assert budget_mb(0) is None
    nothing = tmp_path / "absent"
    assert budget_mb("auto", meminfo=nothing, self_cgroup=nothing, cgroup_root=nothing) is None


def test_tree_rss_reads_live_processes_and_ignores_gone_ones() -> None:
    assert tree_rss([os.getpid()]) > 1024 * 1024
    assert tree_rss([2**22 + 12345]) == 0  # above the kernel's pid_max: never a process


def test_a_refusal_from_the_replica_running_the_thread_keeps_its_retry_after() -> None:
    exc = Capacity("no room", code="memory_budget", retry_after_s=5)
    err = refusal(refused(exc).body)
    assert (err.code, err.status, err.retry_after_s) == ("memory_budget", 503, 5)
    assert refusal({"code": "busy", "status": 429, "retry_after_s": True}).retry_after_s is None
