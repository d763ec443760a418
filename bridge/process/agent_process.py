"""One agent OS process: spawn (own process group, no shell), its pipes on the event
loop's own pipe transports by protocol callbacks (issue #22), stdout lines, bounded
stderr, whole stdin writes, and the stop ladder of :mod:`bridge.process.shutdown`."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import subprocess
import threading
from collections.abc import AsyncIterator, Awaitable, Callable

from bridge.errors import LaunchRefused
from bridge.process.agent_io import ExitInfo
from bridge.process.cgroup import AGENT_CGROUPS, AgentCgroup
from bridge.process.launch import LaunchSpec, exec_path, open_executable
from bridge.process.reaper import child_setup, start_time
from bridge.process.sandbox import Confined
from bridge.process.subreaper import TRACKER
from bridge.process.umask import agent_umask
from bridge.protocols.framing import MAX_LINE_BYTES, LineFramer, LineTooLong

# A batch is everything read since the last one: during a burst the pipe's callbacks keep
# filling the buffer while the previous batch is stored and sent, so the next batch (one
# transaction, one socket write per client) is larger (issue #8). Past this many unread
# bytes reading pauses (a batch is at most this plus one read of the loop's, 256 KiB).
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


def _widen_pipe(fd: int) -> None:
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setsize is None:
        return
    with contextlib.suppress(OSError, ValueError):
        fcntl.fcntl(fd, setsize, STDOUT_PIPE_BYTES)


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

    @property
    def paused(self) -> bool:
        return self._paused

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


class _Reader(asyncio.Protocol):
    """An output pipe's transport callbacks, straight into its :class:`_Inbound`."""

    def __init__(self, inbound: _Inbound) -> None:
        self._inbound = inbound

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inbound.attach(transport)

    def data_received(self, data: bytes) -> None:
        self._inbound.feed(data)

    def eof_received(self) -> bool:
        self._inbound.end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._inbound.end()


class _Stdin(asyncio.BaseProtocol):
    """stdin's flow control: writers wait on futures while the transport's buffer is past
    its high-water mark; all are released when it drains or the pipe is gone."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.lost = False
        self.paused = False
        self._waiters: list[asyncio.Future[None]] = []
        self._gone: asyncio.Future[None] = loop.create_future()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._release()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._release()
        if not self._gone.done():
            self._gone.set_result(None)

    def _release(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def drained(self) -> None:
        """Return once the buffer is below its high-water mark again, or stdin is gone."""
        if not self.paused or self.lost:
            return
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        await waiter

    async def gone(self) -> None:
        await asyncio.shield(self._gone)


class _Exit:
    """The child's exit, noticed as soon as it can be reaped (a pidfd in the event loop;
    a thread blocked in ``waitpid`` where there is none), not once its pipes are closed: a
    grandchild holding stdout open, or a reader that stopped at the line cap, could delay
    that forever."""

    def __init__(self, loop: asyncio.AbstractEventLoop, popen: subprocess.Popen[bytes]) -> None:
        self._loop = loop
        self._popen = popen
        self.done = asyncio.Event()
        self.returncode: int | None = None
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            threading.Thread(target=self._wait_blocking, name=f"agent-wait-{popen.pid}", daemon=True).start()
            return
        loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self._popen.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else: its status is lost
            pid, status = self._popen.pid, 255 << 8
        if pid == 0:
            return
        self._close_pidfd()
        self._exited(os.waitstatus_to_exitcode(status))

    def _wait_blocking(self) -> None:
        try:
            _, status = os.waitpid(self._popen.pid, 0)
            rc = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            rc = 255
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._exited, rc)

    def _exited(self, rc: int) -> None:
        self.returncode = self._popen.returncode = rc
        self.done.set()

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def close(self) -> None:
        self._close_pidfd()


class AgentProcess:
    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        pipes: tuple[asyncio.WriteTransport, asyncio.ReadTransport, asyncio.ReadTransport],
        stdin: _Stdin,
        out: tuple[_Inbound, _Inbound],
        spec: LaunchSpec,
        max_line: int,
    ) -> None:
        self._popen = popen
        self._stdin, self._stdout_pipe, self._stderr_pipe = pipes
        self._stdin_flow = stdin
        self._stdout, self._stderr = out
        self._exit = _Exit(asyncio.get_running_loop(), popen)
        self.spec = spec
        self.pid = popen.pid
        self.pgid = popen.pid  # start_new_session=True: the child leads its own group
        self.start_time = start_time(popen.pid)
        self.confined: Confined | None = None
        self.cgroup: AgentCgroup | None = None  # its own, with its memory limit (process/cgroup.py)
        self._exit_reason: str | None = None
        self._max_line = max_line
        self._stdin_closed = False

    @classmethod
    async def spawn(cls, spec: LaunchSpec, *, max_line: int = MAX_LINE_BYTES) -> AgentProcess:
        # Checked again right before the spawn (the file may have changed since load), and
        # opened once: what runs is /proc/self/fd/N, the very file that was checked.
        fd = open_executable(spec.argv[0])
        confined: Confined | None = None
        # Its memory cgroup too, limit set, before the fork: the child only joins it.
        cgroup = AGENT_CGROUPS.create(spec.memory_limit_mb)
        TRACKER.spawn_started()
        try:
            # The sandbox's rules are made here, in the daemon; the child only applies them.
            confined = Confined(spec.sandbox) if spec.sandbox is not None else None
            popen = _popen(spec, fd, confined, cgroup)
        except BaseException as exc:
            TRACKER.spawn_ended(None)
            _undo(confined, cgroup)
            if isinstance(exc, (OSError, ValueError, subprocess.SubprocessError)):
                detail = getattr(exc, "strerror", None) or exc
                raise LaunchRefused(f"cannot start agent: {detail}", code="spawn_failed") from exc
            raise
        finally:
            if fd is not None:
                os.close(fd)
            if confined is not None:
                confined.close()
            if cgroup is not None:
                cgroup.close_fd()
        try:
            agent = await cls._connect(popen, spec, max_line)
        except BaseException:
            TRACKER.spawn_ended(None)
            _abandon(popen)
            _undo(confined, cgroup)
            raise
        agent.confined = confined
        if cgroup is not None:
            agent.cgroup = cgroup
            AGENT_CGROUPS.attach(agent.pid, cgroup)
        TRACKER.spawn_ended(agent)
        return agent

    @classmethod
    async def _connect(cls, popen: subprocess.Popen[bytes], spec: LaunchSpec, max_line: int) -> AgentProcess:
        """The event loop's own pipe transports on the child's three pipes: no subprocess
        transport in between, so a read reaches its buffer in the same callback."""
        assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
        loop = asyncio.get_running_loop()
        _widen_pipe(popen.stdout.fileno())
        flow = _Stdin(loop)
        out, err = _Inbound(loop, READ_CHUNK), _Inbound(loop, READ_CHUNK)
        made: list[asyncio.BaseTransport] = []
        try:
            made.append((await loop.connect_write_pipe(lambda: flow, popen.stdin))[0])
            made.append((await loop.connect_read_pipe(lambda: _Reader(out), popen.stdout))[0])
            made.append((await loop.connect_read_pipe(lambda: _Reader(err), popen.stderr))[0])
        except BaseException:
            for pipe in made:
                pipe.close()
            raise
        stdin, stdout, stderr = made
        assert isinstance(stdin, asyncio.WriteTransport)
        assert isinstance(stdout, asyncio.ReadTransport) and isinstance(stderr, asyncio.ReadTransport)
        return cls(popen, (stdin, stdout, stderr), flow, (out, err), spec, max_line)

    @property
    def returncode(self) -> int | None:
        return self._exit.returncode

    @property
    def stdout_paused(self) -> bool:
        """Reading stdout is paused: unread output reached its bound (or the line cap)."""
        return self._stdout.paused

    @property
    def stdin_paused(self) -> bool:
        """Writers wait: stdin's buffer is past its high-water mark (the agent is not reading)."""
        return self._stdin_flow.paused

    async def write_line(self, line: str) -> None:
        """One write per message, whole: the pipe transport buffers what the pipe does not
        take at once, so the bytes of several tasks (prompts, interrupts, permission
        answers) sharing stdin never interleave; a writer waits only while the buffer is
        past its high-water mark (the agent is not reading)."""
        stdin, flow = self._stdin, self._stdin_flow
        if self._stdin_closed or flow.lost or stdin.is_closing():
            raise BrokenPipeError("agent stdin is closed")
        stdin.write(line.encode("utf-8") + b"\n")
        if stdin.is_closing():  # the write found the pipe broken (the agent closed its end)
            raise BrokenPipeError("agent stdin is closed")
        if flow.paused:
            await flow.drained()
            if flow.lost:
                raise BrokenPipeError("agent stdin is closed")

    async def close_stdin(self) -> None:
        """Close stdin once what was written has reached the pipe."""
        self._stdin_closed = True
        if not self._stdin.is_closing():
            self._stdin.close()
        await self._stdin_flow.gone()

    async def stdout_batches(self) -> AsyncIterator[list[bytes]]:
        """Stdout lines, as many as the pipe brought since the last batch (so they can be
        stored together); raises LineTooLong when the cap is crossed, after yielding the
        lines before it (and stops reading: the agent blocks on its full pipe)."""
        out = self._stdout
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
        err = self._stderr
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
        await self._exit.done.wait()
        rc = self._exit.returncode
        assert rc is not None
        if self.cgroup is not None and self._exit_reason is None:  # read once, before its removal
            self._exit_reason = AGENT_CGROUPS.exit_reason(self.cgroup) or ""
        info = exit_info(rc)
        info.reason = self._exit_reason or None
        return info

    def release(self) -> None:
        """Close our ends of the pipes once the process is gone and its output drained."""
        for pipe in (self._stdin, self._stdout_pipe, self._stderr_pipe):
            pipe.close()
        if self._exit.returncode is None:  # still running (never the case after stop()):
            self.signal_group(signal.SIGKILL)  # killed, and reaped when it is gone
        else:
            self._exit.close()
        TRACKER.unregister(self)
        if self.confined is not None:  # its private temp dir goes with it
            self.confined.cleanup()
            self.confined = None
        if self.cgroup is not None:  # what is left inside is killed, and the cgroup removed
            AGENT_CGROUPS.discard(self.cgroup)
            self.cgroup = None

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


def _popen(
    spec: LaunchSpec, fd: int | None, confined: Confined | None = None, cgroup: AgentCgroup | None = None
) -> subprocess.Popen[bytes]:
    """fork + exec in the event loop's thread, as asyncio's own subprocess support does:
    the exact argv, no shell, the environment given, every other descriptor closed, the
    agent's umask, its own session and process group, its memory cgroup joined first (before
    a sandbox could forbid the write; bubblewrap then runs inside it), the reaper's child
    set-up, and the sandbox (process/sandbox.py) applied last before exec."""
    env = dict(spec.env)
    preexec = child_setup()
    if cgroup is not None:
        preexec = cgroup.joining(preexec)
    argv, executable = list(spec.argv), spec.argv[0] if fd is None else exec_path(fd)
    if confined is not None:
        env.update(confined.env)
        preexec = confined.preexec(preexec)
        # bubblewrap: bwrap runs, and execs the checked file (still open on fd) inside.
        wrapped = confined.command([executable, *spec.argv[1:]], spec.cwd)
        if wrapped is not None:
            executable, argv = wrapped
    return subprocess.Popen(
        argv,
        executable=executable,
        pass_fds=() if fd is None else (fd,),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        env=env,
        cwd=spec.cwd,
        start_new_session=True,
        close_fds=True,
        umask=agent_umask(),
        preexec_fn=preexec,
    )


def _undo(confined: Confined | None, cgroup: AgentCgroup | None) -> None:
    """A spawn that failed: its sandbox's temp dir and its cgroup go."""
    if confined is not None:
        confined.cleanup()
    if cgroup is not None:
        AGENT_CGROUPS.discard(cgroup)


def _abandon(popen: subprocess.Popen[bytes]) -> None:
    """A child whose pipes could not be connected (cancelled mid-spawn): killed with its
    group, reaped, its pipes closed."""
    with contextlib.suppress(OSError):
        os.killpg(popen.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        popen.wait()
    for f in (popen.stdin, popen.stdout, popen.stderr):
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()


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
