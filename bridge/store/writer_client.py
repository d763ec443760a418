"""The daemon's side of the SQLite writer process (bridge/store/writer.py).

Started with ``os.posix_spawn`` of ``python -m bridge.store.writer`` — not multiprocessing:
one exec and nothing else (no resource tracker, no re-import of the daemon's main module,
no fork of the daemon's memory), and the writer imports only the SQL it runs (about 40 ms).
Requests go out in order through one send buffer; answers come back on the event loop
(``add_reader``), each resolving the future of its request id. The writer's exit is seen
twice over, by end of file on the pipe and by its pidfd: every request without an answer
fails with StoreError (code ``store_unavailable``), the process is reaped, and ``on_lost``
tells the store, which starts another (SqliteStore._writer_lost).

``SPAWN_WATCH`` (set by ``serve``: the agent tracker, bridge/process/subreaper.py) is told
about the writer's pid so that the orphan sweep never takes it for an agent's descendant.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import structlog

import bridge
from bridge.errors import StoreError
from bridge.store.wire import FrameReader, Reply, WireError, parse_reply, request_parts

log = structlog.get_logger("bridge.store")

START_TIMEOUT_S = 30.0


class SpawnWatch(Protocol):
    def spawn_started(self) -> None: ...
    def spared(self, pid: int | None) -> None: ...
    def unspared(self, pid: int) -> None: ...


SPAWN_WATCH: SpawnWatch | None = None


def unavailable(why: str) -> StoreError:
    return StoreError(f"the store's writer process {why}", code="store_unavailable")


# What the writer's environment keeps of the daemon's: no token, no store password.
_ENV_KEPT = ("PATH", "TMPDIR", "SQLITE_TMPDIR", "LD_LIBRARY_PATH", "PYTHONHOME", "LANG", "LC_ALL")


def _spawn(child: socket.socket, path: Path, busy_timeout_ms: int) -> int:
    env = {k: os.environ[k] for k in _ENV_KEPT if k in os.environ}
    root = str(Path(bridge.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "bridge.store.writer", "3", str(path), str(int(busy_timeout_ms))]
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, 2, 1),  # the daemon's stdout is parsed by scripts: never the writer's
        (os.POSIX_SPAWN_DUP2, child.fileno(), 3),
    ]
    return os.posix_spawn(sys.executable, argv, env, file_actions=actions)


# A batch of a flooded thread's appends is a few hundred KiB: the socket pair's buffers are
# widened so that one send takes it whole (the kernel caps this at net.core.wmem_max; a
# refusal leaves the default), never left to the event loop's next turn.
PIPE_BUFFER_BYTES = 4 * 1024 * 1024


def _widen(ours: socket.socket, child: socket.socket) -> None:
    with contextlib.suppress(OSError):
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIPE_BUFFER_BYTES)
    with contextlib.suppress(OSError):
        child.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PIPE_BUFFER_BYTES)


async def _answered(sent: asyncio.Future[Reply]) -> Reply:
    """A request's answer; StoreError when the writer answered with an error."""
    rep = await sent
    if rep.error is not None:
        raise StoreError(rep.error)
    return rep


class WriterProcess:
    def __init__(self, path: Path, busy_timeout_ms: int, on_lost: Callable[[str], None]) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.on_lost = on_lost
        self.pid: int | None = None
        self.alive = False
        self._closing = False
        self._sock: socket.socket | None = None
        self._pidfd: int | None = None
        self._frames = FrameReader()
        self._out = bytearray()
        self._flushed = asyncio.Event()  # set whenever _out is empty
        self._next_id = 1
        self._waiting: dict[int, asyncio.Future[Reply]] = {}
        self._exited: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        """Spawned, and its database open (migrated, repaired): StoreError otherwise."""
        loop = asyncio.get_running_loop()
        ours, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        _widen(ours, child)
        if child.fileno() == 3:  # dup2(3, 3) would keep close-on-exec
            child2 = child.dup()
            child.close()
            child = child2
        watch = SPAWN_WATCH
        if watch is not None:
            watch.spawn_started()
        pid: int | None = None
        try:
            pid = _spawn(child, self.path, self.busy_timeout_ms)
        except OSError as exc:
            ours.close()
            raise unavailable(f"could not be started: {exc}") from exc
        finally:
            child.close()
            if watch is not None:
                watch.spared(pid)
        self.pid, self.alive, self._sock = pid, True, ours
        self._exited = loop.create_future()
        ours.setblocking(False)
        self._waiting[0] = loop.create_future()
        loop.add_reader(ours.fileno(), self._readable)
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(pid)
            loop.add_reader(self._pidfd, self._reap)
        try:
            ready = await asyncio.wait_for(asyncio.shield(self._waiting[0]), START_TIMEOUT_S)
        except TimeoutError:
            self._give_up("did not start in time")
            raise unavailable("did not start in time") from None
        except BaseException:
            self._give_up("was not started")
            raise
        if ready.error is not None:
            self._give_up("could not open the database")
            await self.wait_exit(5.0)
            if ready.code == "schema_too_new":
                raise StoreError(ready.error, code="schema_too_new")
            raise StoreError(ready.error)

    async def close(self, timeout: float = 10.0) -> None:
        """Pipe closed for writing: the writer answers what it was sent and exits; killed
        if it has not within ``timeout``."""
        self._closing = True
        sock = self._sock
        if sock is not None and self.alive:
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(self._drain_out(), timeout)
                sock.shutdown(socket.SHUT_WR)
        await self.wait_exit(timeout)
        self._lost("closed")

    async def wait_exit(self, timeout: float) -> bool:
        if self._exited is None:
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self._exited), timeout)
            return True
        except TimeoutError:
            self.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exited), 5.0)
            return False

    def _give_up(self, why: str) -> None:
        """A start that failed: raised to the caller, not reported as a loss."""
        self._closing = True
        self.kill()
        self._lost(why)

    def kill(self) -> None:
        if self.pid is not None and self._exited is not None and not self._exited.done():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _reap(self) -> None:
        """The pidfd is readable: the writer has exited."""
        pid = self.pid
        if pid is None:
            return
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere
            done, status = pid, 0
        if done == 0:
            return
        self._reaped(pid)
        while self.alive and self._readable():  # answers it sent before it exited still count
            pass
        if self.alive:
            code = os.waitstatus_to_exitcode(status)
            self._lost(f"exited (status {code})")

    def _reaped(self, pid: int) -> None:
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if SPAWN_WATCH is not None:
            SPAWN_WATCH.unspared(pid)
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(None)

    def _lost(self, why: str) -> None:
        """No more answers: every waiting request fails, the pipe is closed."""
        was_alive = self.alive
        self.alive = False
        sock, self._sock = self._sock, None
        if sock is not None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(sock.fileno())
            loop.remove_writer(sock.fileno())
            sock.close()
        self._out.clear()
        self._flushed.set()
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(unavailable(why))
        if self._pidfd is None and self.pid is not None:  # no pidfd: reap now if we can
            self.kill()
            self._reap_blocking()
        if was_alive and not self._closing:
            self.on_lost(why)

    def _reap_blocking(self) -> None:
        pid = self.pid
        if pid is None or self._exited is None or self._exited.done():
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        self._exited.set_result(None)

    # ------------------------------------------------------------------ requests

    def _send(self, msg: tuple[Any, ...]) -> asyncio.Future[Reply]:
        if not self.alive or self._sock is None:
            raise unavailable("is not running")
        rid = self._next_id
        self._next_id += 1
        parts = request_parts((msg[0], rid, *msg[1:]))
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        if self._out:
            self._out += b"".join(parts)
            return fut
        try:
            sent = self._sock.sendmsg(parts)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._lost(f"pipe failed: {exc}")
            return fut
        if sent < sum(map(len, parts)):
            self._out += memoryview(b"".join(parts))[sent:]
            asyncio.get_running_loop().add_writer(self._sock.fileno(), self._writable)
        return fut

    def _writable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            sent = sock.send(self._out)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lost(f"pipe failed: {exc}")
            return
        del self._out[:sent]
        if not self._out:
            asyncio.get_running_loop().remove_writer(sock.fileno())
            self._flushed.set()

    async def _drain_out(self) -> None:
        if self._out:
            self._flushed.clear()
            await self._flushed.wait()

    def _readable(self) -> bool:
        """Answers read and their futures resolved; False once nothing more is there."""
        sock = self._sock
        if sock is None:
            return False
        try:
            data = sock.recv(1 << 18)
        except BlockingIOError:
            return False
        except OSError as exc:
            self._lost(f"pipe failed: {exc}")
            return False
        if not data:
            self._lost("exited" if not self._frames.buffered else "exited in the middle of an answer")
            return False
        self._answers(data)
        return True

    def _answers(self, data: bytes) -> None:
        try:
            replies = [parse_reply(f) for f in self._frames.feed(data)]
        except WireError as exc:
            log.error("store.writer_garbled", error=str(exc), pid=self.pid)
            self.kill()
            self._lost("sent a garbled answer")
            return
        for rep in replies:
            fut = self._waiting.pop(rep.id, None)
            if fut is not None and not fut.done():
                fut.set_result(rep)

    async def _ask(self, msg: tuple[Any, ...]) -> Reply:
        return await _answered(self._send(msg))

    async def call(self, op: str, args: tuple[Any, ...]) -> Any:
        return (await self._ask(("c", op, args))).result

    def batch(self, items: list[tuple[Any, ...]], again: bool, generation: int = 0) -> Awaitable[dict[int, str]]:
        """Sent now, in order behind every request sent before it (StoreError if the process
        is not running); the awaitable gives what the commit refused, or raises StoreError.
        Refused unwritten when a batch of the same ``generation`` sent before it failed
        (writer.py)."""
        return self._refused(self._send(("b", again, items, generation)))

    async def _refused(self, sent: asyncio.Future[Reply]) -> dict[int, str]:
        return (await _answered(sent)).refused

    async def stats(self) -> Any:
        return (await self._ask(("s",))).result
