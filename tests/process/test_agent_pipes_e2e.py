"""The agent's pipes by protocol callbacks (issue #22), with real child processes: a slow
reader holds the agent back, the line cap stops reading, stdout's end is not the agent's
end, a last line without a newline is a line, a closed stdin is a BrokenPipeError, and a
writer waits while the agent does not read."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import STEP_TIMEOUT, alive, wait_until

from bridge.process.agent_process import READ_CHUNK, STDOUT_PIPE_BYTES, AgentProcess, LineTooLong
from bridge.process.launch import LaunchSpec

PYTHON = os.path.realpath(sys.executable)


async def spawn(tmp_path: Path, code: str, **kw: int) -> AgentProcess:
    spec = LaunchSpec((PYTHON, "-I", "-c", textwrap.dedent(code)), {}, str(tmp_path))
    return await AgentProcess.spawn(spec, **kw)


async def lines_of(proc: AgentProcess) -> AsyncIterator[bytes]:
    async for batch in proc.stdout_batches():
        for line in batch:
            yield line


async def finish(proc: AgentProcess) -> None:
    if proc.returncode is None:
        proc.signal_group(signal.SIGKILL)
    await asyncio.wait_for(proc.wait(), STEP_TIMEOUT)
    proc.release()


TOTAL = 16 * 1024 * 1024
WRITER = f"""
    import os, sys
    line = b"x" * 1023 + b"\\n"
    chunk = line * 64
    done = 0
    progress = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
    while done < {TOTAL}:
        os.write(1, chunk)
        done += len(chunk)
        os.pwrite(progress, b"%012d" % done, 0)
"""


async def test_a_reader_that_does_not_read_holds_the_agent_back(tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    spec = LaunchSpec((PYTHON, "-I", "-c", textwrap.dedent(WRITER), str(progress)), {}, str(tmp_path))
    proc = await AgentProcess.spawn(spec)
    try:
        await wait_until(lambda: proc.stdout_paused, what="stdout paused")
        written = int(progress.read_bytes() or b"0")
        # Nothing was taken: what the agent could write is what the pipe holds plus the
        # daemon's bound (one read past READ_CHUNK), far from the 16 MiB it wants to write.
        assert written <= STDOUT_PIPE_BYTES + 2 * READ_CHUNK + 64 * 1024, written
        assert alive(proc.pid) and proc.returncode is None
        got = 0
        async for line in lines_of(proc):
            assert line == b"x" * 1023
            got += 1024
        assert got == TOTAL
        info = await asyncio.wait_for(proc.wait(), STEP_TIMEOUT)
        assert info.code == 0
    finally:
        await finish(proc)


async def test_the_line_cap_raises_after_the_lines_before_it_and_stops_reading(tmp_path: Path) -> None:
    proc = await spawn(
        tmp_path,
        """
        import os, sys
        os.write(1, b"one\\ntwo\\n" + b"y" * 5000)
        while True:
            os.write(1, b"z" * 65536)  # blocks once the daemon stops reading
        """,
        max_line=1024,
    )
    seen: list[bytes] = []
    try:
        with pytest.raises(LineTooLong):
            async for batch in proc.stdout_batches():
                seen.extend(batch)
        assert seen == [b"one", b"two"]
        assert proc.stdout_paused  # the agent blocks on its full pipe, nothing more is kept
        assert proc.returncode is None
        info = await asyncio.wait_for(proc.stop(0.2), STEP_TIMEOUT)
        assert info.signal in (signal.SIGTERM, signal.SIGKILL)
    finally:
        await finish(proc)


async def test_an_agent_that_closes_stdout_keeps_running_and_takes_input(tmp_path: Path) -> None:
    proc = await spawn(
        tmp_path,
        """
        import os, sys
        os.write(1, b"bye\\n")
        os.close(1)
        data = sys.stdin.buffer.read()
        sys.exit(0 if data == b"still here\\n" else 3)
        """,
    )
    try:
        assert [line async for line in lines_of(proc)] == [b"bye"]
        assert proc.returncode is None and alive(proc.pid)
        await proc.write_line("still here")
        await asyncio.wait_for(proc.close_stdin(), STEP_TIMEOUT)
        info = await asyncio.wait_for(proc.wait(), STEP_TIMEOUT)
        assert info.code == 0
    finally:
        await finish(proc)


async def test_a_last_line_without_a_newline_is_a_line(tmp_path: Path) -> None:
    proc = await spawn(tmp_path, 'import os; os.write(1, b"a\\nb\\r\\npartial")')
    try:
        assert [line async for line in lines_of(proc)] == [b"a", b"b\r", b"partial"]
        assert (await asyncio.wait_for(proc.wait(), STEP_TIMEOUT)).code == 0
    finally:
        await finish(proc)


async def test_writing_to_an_agent_that_closed_stdin_is_a_broken_pipe(tmp_path: Path) -> None:
    proc = await spawn(
        tmp_path,
        """
        import os, signal
        os.close(0)
        os.write(1, b"closed\\n")
        signal.pause()
        """,
    )
    try:
        out = lines_of(proc)
        assert await asyncio.wait_for(anext(out), STEP_TIMEOUT) == b"closed"
        with pytest.raises(BrokenPipeError):
            await proc.write_line("anyone?")
        with pytest.raises(BrokenPipeError):  # and every write after it
            await proc.write_line("anyone?")
    finally:
        await finish(proc)


async def test_a_writer_waits_while_the_agent_does_not_read_stdin(tmp_path: Path) -> None:
    proc = await spawn(
        tmp_path,
        """
        import os, signal, sys
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        os.write(1, b"ready\\n")
        signal.sigwait({signal.SIGUSR1})
        n = len(sys.stdin.buffer.read())
        os.write(1, b"%d\\n" % n)
        """,
    )
    lines, size = 600, 4096
    try:
        out = lines_of(proc)
        assert await asyncio.wait_for(anext(out), STEP_TIMEOUT) == b"ready"

        async def write_all() -> None:
            for _ in range(lines):
                await proc.write_line("w" * (size - 1))

        writer = asyncio.create_task(write_all())
        await wait_until(lambda: proc.stdin_paused, what="stdin paused")
        assert not writer.done()
        os.kill(proc.pid, signal.SIGUSR1)
        await asyncio.wait_for(writer, STEP_TIMEOUT)
        await asyncio.wait_for(proc.close_stdin(), STEP_TIMEOUT)
        assert [line async for line in out] == [b"%d" % (lines * size)]
    finally:
        await finish(proc)


async def test_the_exit_is_seen_while_a_grandchild_holds_stdout_open(tmp_path: Path) -> None:
    proc = await spawn(
        tmp_path,
        """
        import subprocess, sys
        subprocess.Popen(["/bin/sleep", "60"])  # inherits stdout, stays in the group
        sys.exit(7)
        """,
    )
    try:
        info = await asyncio.wait_for(proc.wait(), STEP_TIMEOUT)
        assert info.code == 7 and proc.returncode == 7
    finally:
        proc.signal_group(signal.SIGKILL)  # the grandchild
        out = lines_of(proc)
        with pytest.raises(StopAsyncIteration):  # its end of stdout is closed with it
            await asyncio.wait_for(anext(out), STEP_TIMEOUT)
        proc.release()


async def test_released_while_running_the_agent_is_killed_and_reaped(tmp_path: Path) -> None:
    proc = await spawn(tmp_path, "import signal; signal.pause()")
    pid = proc.pid
    proc.release()
    info = await asyncio.wait_for(proc.wait(), STEP_TIMEOUT)
    assert info.signal == signal.SIGKILL
    assert not Path(f"/proc/{pid}").exists()  # reaped, not a zombie
