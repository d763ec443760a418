"""One agent OS process: spawn (own process group, no shell), stdout lines, bounded
stderr, serialized stdin writes, and the stop ladder of :mod:`bridge.process.shutdown`."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable

from bridge.errors import LaunchRefused
from bridge.process.agent_io import ExitInfo
from bridge.process.launch import LaunchSpec, exec_path, open_executable
from bridge.process.reaper import child_setup, start_time
from bridge.process.subreaper import TRACKER
from bridge.process.umask import agent_umask
from bridge.protocols.framing import MAX_LINE_BYTES, LineFramer, LineTooLong

# One read takes whatever the pipe transport has buffered, up to this: during a burst the
# transport keeps filling its buffer while the previous batch is stored and sent, so the
# next batch (one transaction, one socket write per client) is larger (issue #8).
READ_CHUNK = 256 * 1024
# stderr is free-form diagnostics (docs/api.md §6.7): relay it, but bounded — a line is
# cut at this many bytes and at most this many lines per second reach the transcript.
STDERR_LINE_BYTES = 4096
STDERR_LINES_PER_S = 50


# The agent's stdout pipe holds this much (Linux F_SETPIPE_SZ; 64 KiB by default), so
# during a burst the agent keeps writing while a batch is stored and sent, and one read takes
# up to READ_CHUNK at a time (issue #8). Capped by /proc/sys/fs/pipe-max-size (1 MiB by
# default); a refusal leaves the default.
STDOUT_PIPE_BYTES = 1024 * 1024


def _widen_pipe(pipe: asyncio.BaseTransport | None) -> None:
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
    if pipe is None or setsize is None:
        return
    raw = pipe.get_extra_info("pipe")
    with contextlib.suppress(OSError, ValueError, AttributeError):
        fcntl.fcntl(raw.fileno(), setsize, STDOUT_PIPE_BYTES)


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Signals the child's exit as soon as it is reaped. ``Process.wait()`` only returns
    once every pipe is closed too, which a grandchild holding stdout open, or a reader we
    stopped (line too long), can delay forever."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


class AgentProcess:
    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        protocol: _Protocol,
        transport: asyncio.SubprocessTransport,
        spec: LaunchSpec,
        max_line: int,
    ) -> None:
        self._proc = proc
        self._protocol = protocol
        self._transport = transport
        self.spec = spec
        self.pid = proc.pid
        self.pgid = proc.pid  # start_new_session=True: the child leads its own group
        self.start_time = start_time(proc.pid)
        self._write_lock = asyncio.Lock()
        self._max_line = max_line
        self._stdin_closed = False

    @classmethod
    async def spawn(cls, spec: LaunchSpec, *, max_line: int = MAX_LINE_BYTES) -> AgentProcess:
        # Checked again right before the spawn (the file may have changed since load), and
        # opened once: what runs is /proc/self/fd/N, the very file that was checked.
        fd = open_executable(spec.argv[0])
        loop = asyncio.get_running_loop()
        TRACKER.spawn_started()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _Protocol(256 * 1024, loop),  # the transport pauses at twice this
                *spec.argv,
                executable=spec.argv[0] if fd is None else exec_path(fd),
                pass_fds=() if fd is None else (fd,),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(spec.env),
                cwd=spec.cwd,
                start_new_session=True,
                close_fds=True,
                umask=agent_umask(),
                preexec_fn=child_setup(),
            )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            TRACKER.spawn_ended(None)
            detail = getattr(exc, "strerror", None) or exc
            raise LaunchRefused(f"cannot start agent: {detail}", code="spawn_failed") from exc
        except BaseException:
            TRACKER.spawn_ended(None)
            raise
        finally:
            if fd is not None:
                os.close(fd)
        try:
            _widen_pipe(transport.get_pipe_transport(1))
            proc = asyncio.subprocess.Process(transport, protocol, loop)
            agent = cls(proc, protocol, transport, spec, max_line)
        except BaseException:
            TRACKER.spawn_ended(None)
            raise
        TRACKER.spawn_ended(agent)
        return agent

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def write_line(self, line: str) -> None:
        """One locked write per message: several tasks (prompts, interrupts, permission
        answers) share stdin and their bytes must never interleave."""
        data = line.encode("utf-8") + b"\n"
        async with self._write_lock:
            stdin = self._proc.stdin
            if stdin is None or self._stdin_closed or stdin.is_closing():
                raise BrokenPipeError("agent stdin is closed")
            stdin.write(data)
            await stdin.drain()

    async def close_stdin(self) -> None:
        async with self._write_lock:
            self._stdin_closed = True
            stdin = self._proc.stdin
            if stdin is not None and not stdin.is_closing():
                stdin.close()
                with contextlib.suppress(Exception):
                    await stdin.wait_closed()

    async def stdout_batches(self) -> AsyncIterator[list[bytes]]:
        """Stdout lines, as many as one read brought (so they can be stored together);
        raises LineTooLong when the cap is crossed, after yielding the lines before it."""
        stream = self._proc.stdout
        assert stream is not None
        framer = LineFramer(self._max_line)
        while True:
            chunk = await stream.read(READ_CHUNK)
            if not chunk:
                tail = framer.close()
                if tail is not None:
                    yield [tail]
                return
            try:
                lines = framer.feed(chunk)
            except LineTooLong as exc:
                if exc.lines:
                    yield exc.lines
                raise
            if lines:
                yield lines

    async def pump_stderr(self, emit: Callable[[str], Awaitable[None]]) -> None:
        """Relay stderr lines, each cut to STDERR_LINE_BYTES, at most STDERR_LINES_PER_S."""
        stream = self._proc.stderr
        assert stream is not None
        loop = asyncio.get_running_loop()
        lines, limit = StderrLines(), StderrRate(STDERR_LINES_PER_S)
        while True:
            chunk = await stream.read(READ_CHUNK)
            for line in lines.feed(chunk):
                for text in limit.admit(line, loop.time()):
                    await emit(text)
            if not chunk:
                if (tail := limit.finish()) is not None:
                    await emit(tail)
                return

    async def wait(self) -> ExitInfo:
        await self._protocol.exited.wait()
        rc = self._transport.get_returncode()
        assert rc is not None
        return exit_info(rc)

    def release(self) -> None:
        """Close our ends of the pipes once the process is gone and its output drained."""
        self._transport.close()
        TRACKER.unregister(self)

    def signal_group(self, sig: int) -> bool:
        """Signal the whole process group, and every descendant that left it (setsid:
        process/subreaper.py); False when nothing is left of the group."""
        TRACKER.signal_escaped(self, sig)
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False
        return True

    async def stop(self, grace_s: float, *, shutdown_line: str | None = None) -> ExitInfo:
        from bridge.process.shutdown import stop_process

        return await stop_process(self, grace_s, shutdown_line=shutdown_line)


def exit_info(rc: int) -> ExitInfo:
    if rc < 0:
        return ExitInfo(code=None, signal=-rc)
    return ExitInfo(code=rc, signal=None)


__all__ = ["AgentProcess", "ExitInfo", "LineTooLong", "signal"]


class StderrLines:
    """stderr bytes → lines, each cut at STDERR_LINE_BYTES (the rest of an over-long line
    is discarded, its head relayed once). ``feed(b"")`` is the end of the stream."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._discarding = False  # inside an over-long line whose head was already relayed

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf
        buf += chunk
        lines: list[bytes] = []
        while (nl := buf.find(b"\n")) != -1:
            if not self._discarding:
                lines.append(bytes(buf[:nl]))
            del buf[: nl + 1]
            self._discarding = False
        if len(buf) > STDERR_LINE_BYTES or (not chunk and buf):
            if not self._discarding:
                lines.append(bytes(buf))
            self._discarding = bool(chunk)
            buf.clear()
        return lines


class StderrRate:
    """At most ``per_s`` lines a second reach the transcript. When dropping starts it says
    so at once; how many were dropped is said at the next second that has a line, and at
    the end."""

    def __init__(self, per_s: int) -> None:
        self.per_s = per_s
        self._window: float | None = None
        self._in_window = 0
        self._dropped = 0

    def admit(self, line: bytes, now: float) -> list[str]:
        out: list[str] = []
        if self._window is None or now - self._window >= 1.0:
            if self._dropped:
                out.append(f"[{self._dropped} stderr lines dropped: rate limit]")
            self._window, self._in_window, self._dropped = now, 0, 0
        if self._in_window >= self.per_s:
            if not self._dropped:
                out.append(f"[stderr rate limit of {self.per_s} lines/s reached: dropping lines]")
            self._dropped += 1
            return out
        self._in_window += 1
        text = line[:STDERR_LINE_BYTES].decode("utf-8", "replace").rstrip("\r")
        out.append(text + " …[cut]" if len(line) > STDERR_LINE_BYTES else text)
        return out

    def finish(self) -> str | None:
        return f"[{self._dropped} stderr lines dropped: rate limit]" if self._dropped else None
