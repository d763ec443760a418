"""The file executed is the file checked (issue #15 item 8): with the executable's path
flipped between a regular file and a symlink while agents are spawned, only the checked
regular file ever runs, and every refusal is a LaunchRefused (never an OSError)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from bridge.errors import LaunchRefused
from bridge.process.agent_process import AgentProcess
from bridge.process.launch import LaunchSpec, executable_problem, open_executable

SPAWNS = 200
DEADLINE_S = 60.0


def script(path: Path, word: str, log: Path) -> Path:
    path.write_text(f"#!/bin/sh\necho {word} >> {log}\n")
    path.chmod(0o755)
    return path


def flipper(path: Path, good: Path, evil: Path, stop: threading.Event) -> threading.Thread:
    """Swap ``path`` atomically between a hard link of ``good`` (a regular file) and a
    symlink to ``evil``, as fast as it can, until ``stop``."""

    def run() -> None:
        i = 0
        while not stop.is_set():
            staged = path.with_name(f"staged{i % 2}")
            staged.unlink(missing_ok=True)
            if i % 2:
                os.symlink(evil, staged)
            else:
                os.link(good, staged)
            os.replace(staged, path)
            i += 1

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


async def test_only_the_checked_file_runs_while_the_path_flips(tmp_path: Path) -> None:
    ran = tmp_path / "ran.log"
    good = script(tmp_path / "good", "good", ran)
    evil = script(tmp_path / "evil", "evil", ran)
    path = tmp_path / "agent"
    os.link(good, path)
    spec = LaunchSpec((str(path),), {"PATH": "/usr/bin:/bin"}, str(tmp_path))
    stop = threading.Event()
    t = flipper(path, good, evil, stop)
    spawned = refused = 0
    other: list[BaseException] = []

    async def spawns() -> None:
        nonlocal spawned, refused
        for _ in range(SPAWNS):
            try:
                proc = await AgentProcess.spawn(spec)
            except LaunchRefused as exc:
                assert exc.code in ("executable_unusable", "spawn_failed"), exc.code
                refused += 1
                continue
            except Exception as exc:  # what must never happen
                other.append(exc)
                continue
            info = await proc.wait()
            proc.release()
            assert info.code == 0, info
            spawned += 1

    try:
        await asyncio.wait_for(spawns(), DEADLINE_S)
    finally:
        stop.set()
        t.join(5)
    assert not other, other
    lines = ran.read_text().split() if ran.exists() else []
    assert "evil" not in lines, f"the symlink's target ran {lines.count('evil')} times in {SPAWNS} spawns"
    assert lines.count("good") == spawned
    assert spawned > 0 and refused > 0, (spawned, refused)  # the race was really run both ways


def test_a_symlink_swapped_in_after_the_check_is_refused_at_open(tmp_path: Path) -> None:
    good = script(tmp_path / "good", "good", tmp_path / "ran.log")
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(LaunchRefused) as exc:
        open_executable(str(link))
    assert exc.value.code == "executable_unusable" and "symlink" in exc.value.message
    fd = open_executable(str(good))
    assert fd is not None
    try:
        assert os.readlink(f"/proc/self/fd/{fd}") == str(good)
    finally:
        os.close(fd)


@pytest.mark.parametrize("path", ["/usr/bin/py\x00thon", "/" + "x" * 5000, "/proc/self/fd/999999/x"])
def test_odd_paths_are_problems_never_exceptions(path: str) -> None:
    assert executable_problem(path)
    with pytest.raises(LaunchRefused):
        open_executable(path)


async def test_spawn_turns_every_error_into_launch_refused(tmp_path: Path) -> None:
    with pytest.raises(LaunchRefused):
        await AgentProcess.spawn(LaunchSpec(("/usr/bin/py\x00thon",), {}, str(tmp_path)))
    good = script(tmp_path / "good", "good", tmp_path / "ran.log")
    with pytest.raises(LaunchRefused) as exc:  # a cwd that is not there: the exec fails in the child
        await AgentProcess.spawn(LaunchSpec((str(good),), {}, str(tmp_path / "missing")))
    assert exc.value.code == "spawn_failed"


def test_the_check_itself_never_raises_while_the_path_flips(tmp_path: Path) -> None:
    # The race that made os.path.realpath raise (the symlink gone between lstat and
    # readlink): every answer is None or a problem string, for a bounded number of calls.
    good = script(tmp_path / "good", "good", tmp_path / "ran.log")
    evil = script(tmp_path / "evil", "evil", tmp_path / "ran.log")
    path = tmp_path / "agent"
    os.link(good, path)
    stop = threading.Event()
    t = flipper(path, good, evil, stop)
    answers: set[str] = set()
    try:
        for _ in range(CHECKS):
            problem = executable_problem(str(path))
            answers.add("ok" if problem is None else problem.split(":")[0])
    finally:
        stop.set()
        t.join(5)
    assert "ok" in answers and len(answers) > 1, answers  # both states were seen


CHECKS = 50_000
