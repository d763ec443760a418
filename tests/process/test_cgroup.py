"""Agents' memory cgroups (process/cgroup.py): where they may go, read from /proc/self/cgroup
and a cgroup tree (temporary directories standing in for /sys/fs/cgroup), and, on this
machine's kernel, an agent placed in its cgroup before it runs, its OOM kill told as
``memory_limit``, and its cgroup gone after it. The kernel parts run whichever way the
machine allows (a writable memory cgroup or none): neither is skipped."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_until

from bridge.errors import LaunchRefused
from bridge.process import cgroup as cg
from bridge.process.agent_process import AgentProcess
from bridge.process.launch import LaunchSpec
from tests.support.cgroups import v1_writable

HYBRID = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n"


def tree(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp


def self_cgroup(tmp: Path, text: str) -> Path:
    path = tmp / "self-cgroup"
    path.write_text(text)
    return path


def test_proc_self_cgroup_is_read_for_both_hierarchies() -> None:
    assert cg.parse_self_cgroup(HYBRID) == ("/", "/process_api/abc")
    assert cg.parse_self_cgroup("0::/system.slice/agent-bridge.service\n") == (
        "/system.slice/agent-bridge.service",
        None,
    )
    assert cg.parse_self_cgroup("5:cpu,memory:/a/b\n3:pids:/a\n") == (None, "/a/b")
    assert cg.parse_self_cgroup("") == (None, None)


def test_no_cgroup_file_system_means_sampling_and_says_why(tmp_path: Path) -> None:
    place, why = cg.find(tmp_path / "nothing-here", self_cgroup(tmp_path, HYBRID))
    assert place is None
    assert why[0].startswith("cgroup v2: no unified hierarchy") and why[1].startswith("cgroup v1: no memory hierarchy")
    cgroups = cg.AgentCgroups()
    cgroups.setup(str(tmp_path / "nothing-here"), self_cgroup=self_cgroup(tmp_path, HYBRID))
    assert cgroups.mode == "sampling" and cgroups.create(64) is None
    cgroups.setup("off")
    assert cgroups.mode == "sampling" and "off" in cgroups.why[0]


def test_a_directory_that_is_no_cgroup_file_system_is_refused_and_left_clean(tmp_path: Path) -> None:
    # Laid out like a v1 memory hierarchy, but a plain directory: a child made in it has
    # none of a cgroup's files, so no limit could ever be set there.
    root = tree(tmp_path / "cg", {"memory/process_api/abc/memory.limit_in_bytes": "9223372036854771712\n"})
    place, why = cg.find(root, self_cgroup(tmp_path, HYBRID))
    assert place is None
    assert "is no memory cgroup" in why[1]
    assert list((root / "memory/process_api/abc").iterdir()) == [root / "memory/process_api/abc/memory.limit_in_bytes"]


def test_cgroup_v2_without_the_memory_controller_delegated_is_refused(tmp_path: Path) -> None:
    root = tree(
        tmp_path / "cg",
        {
            "cgroup.controllers": "cpu memory pids\n",
            "svc/cgroup.controllers": "cpu pids\n",
            "svc/cgroup.type": "domain\n",
        },
    )
    place, why = cg.find(root, self_cgroup(tmp_path, "0::/svc\n"))
    assert place is None
    assert "memory controller is not available" in why[0]
    assert not (root / "svc" / "daemon").exists()  # nothing moved


@pytest.mark.parametrize(("seen_as", "moved"), [("/svc", "0"), ("/", "12")])
def test_cgroup_v2_delegation_moves_the_daemon_into_a_leaf_first(tmp_path: Path, seen_as: str, moved: str) -> None:
    """A v2 cgroup with children under a controller may hold no process: the daemon moves
    into ``daemon/`` (only itself, unless the cgroup is its namespace's root, whose every
    process is its own), then enables memory for the children."""
    svc = "svc/" if seen_as != "/" else ""
    files = {
        f"{svc}cgroup.controllers": "memory pids\n",
        f"{svc}cgroup.subtree_control": "",
        f"{svc}cgroup.type": "domain\n",
        f"{svc}cgroup.procs": "11\n12\n",
        f"{svc}daemon/cgroup.procs": "",
    }
    root = tree(tmp_path / "cg", {"cgroup.controllers": "memory pids\n", **files})
    own = root / svc
    assert cg._delegate_v2(own, seen_as) is None
    assert (own / "daemon" / "cgroup.procs").read_text() == moved  # (a plain file keeps the last write)
    assert (own / "cgroup.subtree_control").read_text() == "+memory"


def test_an_agents_oom_kills_count_once_it_reached_its_own_limit(tmp_path: Path) -> None:
    """The kernel counts an OOM kill in the victim's cgroup whichever limit ran out: one the
    agent's own cgroup never reached (the container's, the host's) is no memory_limit."""
    v2 = tree(tmp_path / "a", {"memory.events": "low 0\nhigh 0\nmax 7\noom 1\noom_kill 2\noom_group_kill 1\n"})
    v1 = tree(
        tmp_path / "b",
        {
            "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
            "memory.failcnt": "0\n",
            "memory.limit_in_bytes": "33554432\n",
            "memory.max_usage_in_bytes": "33554432\n",
        },
    )
    assert cg.AgentCgroup(v2, 2).oom_kills() == 2
    assert cg.AgentCgroup(v1, 1).oom_kills() == 1
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 1\noom_group_kill 0\n")
    (v1 / "memory.max_usage_in_bytes").write_text("20000768\n")
    assert cg.AgentCgroup(v2, 2).oom_kills() == 0
    assert cg.AgentCgroup(v1, 1).oom_kills() == 0
    assert cg.AgentCgroup(tmp_path / "gone", 1).oom_kills() == 0


ALLOC = "import sys; print(open('/proc/self/cgroup').read(), flush=True); sys.stdin.readline(); b = b'x' * (256 << 20)"


async def test_on_this_kernel_an_agent_runs_in_its_cgroup_and_its_oom_kill_is_memory_limit(tmp_path: Path) -> None:
    """The real kernel, in-process: where a v1 memory cgroup can be made here, an agent with
    a 32 MiB limit is inside its own from its first instruction, the kernel kills it as it
    takes 256 MiB, the exit says memory_limit, and its cgroup is removed; where none can be
    made, it runs with no cgroup and its exit is its own."""
    cgroups = cg.AGENT_CGROUPS
    saved = cgroups.place, cgroups.mode
    writable = v1_writable()
    if writable:
        own = (
            Path("/sys/fs/cgroup/memory") / (cg.parse_self_cgroup(Path("/proc/self/cgroup").read_text())[1] or "/")[1:]
        )
        cgroups.place = cg.Place(1, own)
    else:
        cgroups.place = None
    try:
        spec = LaunchSpec((os.path.realpath(sys.executable), "-I", "-c", ALLOC), {}, str(tmp_path), memory_limit_mb=32)
        agent = await AgentProcess.spawn(spec)
        first = await anext(aiter(agent.stdout_batches()))
        inside = agent.cgroup
        assert (inside is not None) == writable
        if inside is not None:
            assert f"memory:/{inside.path.relative_to('/sys/fs/cgroup/memory')}".encode() in b"\n".join(first)
        kills_before = cgroups.oom_lives
        await agent.write_line("go")
        async with asyncio.timeout(15):
            info = await agent.wait()
        agent.release()
        if inside is not None:
            assert info.signal == 9 and info.reason == "memory_limit"
            assert cgroups.oom_lives == kills_before + 1
            await wait_until(lambda: not inside.path.exists(), what="the agent's cgroup to be removed")
        else:
            assert info.reason is None
    finally:
        cgroups.place, cgroups.mode = saved


def test_on_this_kernel_cgroup_v2_places_kills_and_removes(tmp_path: Path) -> None:
    """cgroup v2's own steps on the unified hierarchy here, whatever controllers it has:
    a child joins a cgroup by writing "0" to its cgroup.procs between fork and exec, and
    removal kills what is left (cgroup.kill) before the directory goes. Where this
    process's v2 cgroup is not writable, an agent's cgroup cannot be made there and the
    agent gets none."""
    unified, _ = cg.parse_self_cgroup(Path("/proc/self/cgroup").read_text())
    mount = cg.CGROUP_ROOT if (cg.CGROUP_ROOT / "cgroup.controllers").exists() else cg.CGROUP_ROOT / "unified"
    own = mount / (unified or "/").lstrip("/")
    path = own / f"agent-tests-{os.getpid()}"
    try:
        path.mkdir()
    except OSError:
        cgroups = cg.AgentCgroups()
        cgroups.place = cg.Place(2, own)
        assert cgroups.create(64) is None
        return
    box = cg.AgentCgroup(path, 2, os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
    try:
        child = subprocess.Popen(["sleep", "60"], preexec_fn=box.joining(None))
        box.close_fd()
        assert Path(f"/proc/{child.pid}/cgroup").read_text().endswith(f"0::/{path.relative_to(mount)}\n")
        box.kill_rest()  # cgroup.kill: the sleeper dies
        assert child.wait(timeout=10) == -9
        deadline = time.monotonic() + 10
        while not box.remove():  # the directory goes once nothing is inside
            assert time.monotonic() < deadline, "the cgroup was never removable"
            time.sleep(0.01)
        assert not path.exists()
    finally:
        if path.exists():
            box.kill_rest()
            path.rmdir()


def test_on_this_kernel_a_v1_agent_cgroup_is_made_joined_and_emptied_on_removal() -> None:
    """cgroup v1 has no cgroup.kill: removal kills each process still listed (checked to be
    inside through a pidfd), then the directory goes. Where no v1 memory cgroup can be made
    here, an agent's cgroup is not made either."""
    cgroups = cg.AgentCgroups()
    memory = cg.parse_self_cgroup(Path("/proc/self/cgroup").read_text())[1] or "/"
    cgroups.place = cg.Place(1, cg.CGROUP_ROOT / "memory" / memory.lstrip("/"))
    box = cgroups.create(64)
    assert (box is not None) == v1_writable()
    if box is None:
        return
    try:
        assert (box.path / "memory.limit_in_bytes").read_text().strip() == str(64 << 20)
        child = subprocess.Popen(["sleep", "60"], preexec_fn=box.joining(None))
        box.close_fd()
        assert f"{memory.rstrip('/')}/{box.path.name}\n" in Path(f"/proc/{child.pid}/cgroup").read_text()
        box.kill_rest()
        assert child.wait(timeout=10) == -9
        deadline = time.monotonic() + 10
        while not box.remove():
            assert time.monotonic() < deadline, "the cgroup was never removable"
            time.sleep(0.01)
    finally:
        if box.path.exists():
            box.kill_rest()
            box.path.rmdir()


async def test_a_spawn_that_fails_leaves_no_cgroup(tmp_path: Path) -> None:
    cgroups = cg.AGENT_CGROUPS
    saved = cgroups.place
    memory = cg.parse_self_cgroup(Path("/proc/self/cgroup").read_text())[1] or "/"
    parent = cg.CGROUP_ROOT / "memory" / memory.lstrip("/")
    cgroups.place = cg.Place(1, parent) if v1_writable() else None
    try:
        spec = LaunchSpec(
            (os.path.realpath(sys.executable), "-c", "pass"), {}, str(tmp_path / "gone"), memory_limit_mb=64
        )
        with pytest.raises(LaunchRefused):
            await AgentProcess.spawn(spec)
        assert not list(parent.glob(f"agent-{os.getpid()}-*"))
    finally:
        cgroups.place = saved
