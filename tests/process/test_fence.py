"""The fence watchdog (bridge/process/fence.py, fence_watchdog.py) with real processes: an
agent registered with a kill time is SIGKILLed (group and escaped descendants) once that
time passes with no extension, never before, never when forgotten, never when its pid
now belongs to another process; the daemon's end of file kills what is still registered;
a watchdog that dies is started again and told everything."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from conftest import alive, wait_until

from bridge.process.fence import Fence
from bridge.process.fence_watchdog import parse
from bridge.process.reaper import start_time

pytestmark = pytest.mark.timeout(30)

# A leader that starts a child which leaves its group (setsid), then waits.
ESCAPER = (
    "import os, subprocess, sys, time\n"
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
    "print(p.pid, flush=True)\n"
    "time.sleep(60)\n"
)


@dataclass
class Agent:
    pid: int
    pgid: int
    start_time: int | None


def leader(code: str = "import time; time.sleep(60)") -> tuple[subprocess.Popen[bytes], Agent]:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    return proc, Agent(proc.pid, proc.pid, start_time(proc.pid))


@pytest.fixture
async def fence() -> AsyncIterator[Fence]:
    f = Fence()
    f.start()
    try:
        yield f
    finally:
        await f.close()


def finish(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def dead(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is not None


async def test_a_deadline_that_passes_kills_the_group_and_its_escaped_descendants(fence: Fence) -> None:
    proc, agent = leader(ESCAPER)
    try:
        assert proc.stdout is not None
        child = int(await asyncio.to_thread(proc.stdout.readline))
        assert os.getpgid(child) != agent.pgid  # it left the group: killpg alone would miss it
        armed = time.monotonic()
        fence.arm("thr_a", agent, armed + 0.4)
        await asyncio.sleep(0.2)
        assert not dead(proc)  # not before its time
        await wait_until(lambda: dead(proc), timeout=5, what="the leader to be killed")
        took = time.monotonic() - armed
        assert proc.returncode == -signal.SIGKILL and 0.35 <= took < 3
        await wait_until(lambda: not alive(child), timeout=5, what="the escaped child to be killed")
    finally:
        finish(proc)


async def test_extend_moves_the_deadline_and_forget_disarms(fence: Fence) -> None:
    proc, agent = leader()
    other, agent2 = leader()
    try:
        fence.arm("thr_a", agent, time.monotonic() + 0.3)
        fence.arm("thr_b", agent2, time.monotonic() + 0.3)
        fence.forget("thr_b", agent2)
        for _ in range(4):  # renewals keep it alive well past the first deadline
            await asyncio.sleep(0.15)
            fence.extend("thr_a", time.monotonic() + 0.3)
        assert not dead(proc)
        await wait_until(lambda: dead(proc), timeout=5, what="the leader to be killed once not extended")
        await asyncio.sleep(0.5)
        assert not dead(other)  # forgotten: never killed
        fence.forget("thr_b", agent)  # another life's agent: not this thread's entry, ignored
    finally:
        for p in (proc, other):
            finish(p)


async def test_a_recycled_pid_is_never_killed(fence: Fence) -> None:
    proc, agent = leader()
    try:
        # the same pid recorded with another start time: not the process that was registered
        fence.arm("thr_a", Agent(agent.pid, agent.pgid, (agent.start_time or 0) + 1), time.monotonic())
        await asyncio.sleep(0.5)
        assert not dead(proc)
    finally:
        finish(proc)


async def test_end_of_file_kills_what_is_still_registered_and_the_watchdog_exits() -> None:
    fence = Fence()
    fence.start()
    proc, agent = leader()
    try:
        fence.arm("thr_a", agent, time.monotonic() + 600)
        watchdog = fence.pid
        assert watchdog is not None and alive(watchdog)
        assert os.getsid(watchdog) == watchdog  # a session of its own: not stopped with the daemon's group
        await fence.close()
        assert not alive(watchdog)
        await wait_until(lambda: dead(proc), timeout=5, what="the registered agent to be killed")
    finally:
        finish(proc)


async def test_a_watchdog_that_dies_is_started_again_and_told_everything(fence: Fence) -> None:
    proc, agent = leader()
    try:
        fence.arm("thr_a", agent, time.monotonic() + 1.5)
        first = fence.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await wait_until(lambda: fence.pid not in (None, first), timeout=5, what="a new watchdog")
        await wait_until(lambda: dead(proc), timeout=5, what="the agent to be killed by the new watchdog")
    finally:
        finish(proc)


def test_malformed_lines_arm_nothing() -> None:
    for line in (
        b"",
        b"nope",
        b"[]",
        b'{"pgid": 5}',
        b'{"t": "x", "pgid": 1, "start": 1, "kill_at": 0}',  # init's group: never
        b'{"t": "x", "pgid": true, "start": 1, "kill_at": 0}',
        b'{"t": "x", "pgid": 500, "start": -1, "kill_at": 0}',
        b'{"t": "x", "pgid": 500, "start": 1, "kill_at": "soon"}',
    ):
        assert parse(line) is None, line
    assert parse(b'{"t": "x"}') == ("x", None)
    got = parse(b'{"t": "x", "pgid": 500, "start": 7, "kill_at": 1.5, "escaped": [[600, 8], ["a", 1], [1, 2]]}')
    assert got is not None and got[1] is not None and got[1].escaped == [(600, 8)]
