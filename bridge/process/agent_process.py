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


class _Inbound:
    """One of the agent's output pipes, filled by the transport's callbacks: what it read waits
    here, as the chunks it came in, until the reader takes all of it. Past ``limit`` unread
    bytes the pipe is paused (the agent then blocks on its full pipe) until the reader has
    taken them: a slow consumer holds the agent back."""

    __slots__ = ("_chunks", "_limit", "_loop", "_paused", "_pipe", "_size", "_stopped", "_waiter", "eof")

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._loop = loop
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self._pipe: asyncio.ReadTransport | None = None
        self._paused = False
        self._stopped = False  # read no more (a line too long): paused for good
        self._waiter: asyncio.Future[None] | None = None
        self.eof = False

    def attach(self, pipe: asyncio.BaseTransport | None) -> None:
        self._pipe = pipe if isinstance(pipe, asyncio.ReadTransport) else None
        if self._pipe is None:
            self.eof = True

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size >= self._limit:
            self._pause()
        self._wake()

    def end(self) -> None:
        self.eof = True
        self._wake()

    def stop(self) -> None:
        """The reader gives up (the line cap): the pipe stays paused, nothing more is kept."""
        self._stopped = True
        self._chunks.clear()
        self._size = 0
        self._pause()

    def _pause(self) -> None:
        if not self._paused and self._pipe is not None and not self._pipe.is_closing():
            self._paused = True
            self._pipe.pause_reading()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read(self) -> bytes:
        """Everything read so far and not yet taken; ``b""`` once the pipe is at its end."""
        while not self._chunks:
            if self.eof or self._stopped:
                return b""
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._size = 0
        if self._paused and self._pipe is not None:
            self._paused = False
            if not self._pipe.is_closing():
                self._pipe.resume_reading()
        return data


class _Pipes(asyncio.SubprocessProtocol):
    """The agent's three pipes by protocol callbacks (no asyncio streams): stdout and stderr
    into :class:`_Inbound` buffers, stdin's flow control as futures to wait on, and the
    child's exit signalled as soon as it is reaped (``Process.wait()`` would only return
    once every pipe is closed too, which a grandchild holding stdout open, or a reader that
    stopped at the line cap, can delay forever)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.stdout = _Inbound(loop, READ_CHUNK)
        self.stderr = _Inbound(loop, READ_CHUNK)
        self.exited = asyncio.Event()
        self.stdin_lost = False
        self.write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._stdin_gone: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self.stdout.attach(transport.get_pipe_transport(1))
        self.stderr.attach(transport.get_pipe_transport(2))

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        (self.stdout if fd == 1 else self.stderr).feed(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 0:
            self.stdin_lost = True
            self._release_writers()
            if not self._stdin_gone.done():
                self._stdin_gone.set_result(None)
        else:
            (self.stdout if fd == 1 else self.stderr).end()

    def process_exited(self) -> None:
        self.exited.set()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._release_writers()

    def _release_writers(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def drained(self) -> None:
        """Return once stdin's buffer is below its high-water mark again, or stdin is gone."""
        if not self.write_paused or self.stdin_lost:
            return
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter

    async def stdin_gone(self) -> None:
        await asyncio.shield(self._stdin_gone)


class AgentProcess:
    def __init__(self, transport: asyncio.SubprocessTransport, pipes: _Pipes, spec: LaunchSpec, max_line: int) -> None:
        self._transport = transport
        self._pipes = pipes
        stdin = transport.get_pipe_transport(0)
        assert isinstance(stdin, asyncio.WriteTransport)
        self._stdin = stdin
        self.spec = spec
        self.pid = transport.get_pid()
        self.pgid = self.pid  # start_new_session=True: the child leads its own group
        self.start_time = start_time(self.pid)
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
            transport, pipes = await loop.subprocess_exec(
                lambda: _Pipes(loop),
                *spec.argv,
                executable=spec.argv[0] if fd is None else exec_path(fd),
                pass_fds=() if fd is None else (fd,),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
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
            agent = cls(transport, pipes, spec, max_line)
        except BaseException:
            TRACKER.spawn_ended(None)
            transport.close()
            raise
        TRACKER.spawn_ended(agent)
        return agent

    @property
    def returncode(self) -> int | None:
        return self._transport.get_returncode()

    async def write_line(self, line: str) -> None:
        """One write per message, whole: the pipe transport buffers what the pipe does not
        take at once, so the bytes of several tasks (prompts, interrupts, permission
        answers) sharing stdin never interleave; a writer waits only while the buffer is
        past its high-water mark (the agent is not reading)."""
        stdin, pipes = self._stdin, self._pipes
        if self._stdin_closed or pipes.stdin_lost or stdin.is_closing():
            raise BrokenPipeError("agent stdin is closed")
        stdin.write(line.encode("utf-8") + b"\n")
        if stdin.is_closing():  # the write found the pipe broken (the agent closed its end)
            raise BrokenPipeError("agent stdin is closed")
        if pipes.write_paused:
            await pipes.drained()
            if pipes.stdin_lost:
                raise BrokenPipeError("agent stdin is closed")

    async def close_stdin(self) -> None:
        """Close stdin once what was written has reached the pipe."""
        self._stdin_closed = True
        if not self._stdin.is_closing():
            self._stdin.close()
        await self._pipes.stdin_gone()

    async def stdout_batches(self) -> AsyncIterator[list[bytes]]:
        """Stdout lines, as many as the pipe brought since the last batch (so they can be
        stored together); raises LineTooLong when the cap is crossed, after yielding the
        lines before it (and stops reading: the agent blocks on its full pipe)."""
        out = self._pipes.stdout
        framer = LineFramer(self._max_line)
        while True:
            chunk = await out.read()
            if not chunk:
                tail = framer.close()
                if tail is not None:
                    yield [tail]
                return
            try:
                lines = framer.feed(chunk)
            except LineTooLong as exc:
                out.stop()
                if exc.lines:
                    yield exc.lines
                raise
            if lines:
                yield lines

    async def pump_stderr(self, emit: Callable[[str], Awaitable[None]]) -> None:
        """Relay stderr lines, each cut to STDERR_LINE_BYTES, at most STDERR_LINES_PER_S."""
        err = self._pipes.stderr
        loop = asyncio.get_running_loop()
        lines, limit = StderrLines(), StderrRate(STDERR_LINES_PER_S)
        while True:
            chunk = await err.read()
            for line in lines.feed(chunk):
                for text in limit.admit(line, loop.time()):
                    await emit(text)
            if not chunk:
                if (tail := limit.finish()) is not None:
                    await emit(tail)
                return

    async def wait(self) -> ExitInfo:
        await self._pipes.exited.wait()
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
