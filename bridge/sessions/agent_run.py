"""One life of a thread's agent process, from its spawn to its exit: the stdout reader
(with the pipelined submit of bursts, issue #22), the stderr pump and the watcher that
reaps the process and reports its exit.

The conversation (sessions/conversation.py) decides when a process starts and stops and
what its exit means; an :class:`AgentRun` only moves the process's output into the core
and the journal while it lives. It sees its conversation through :class:`Shell`, the few
things a run needs of it, so this module does not import the conversation.

The reader is the daemon's hot path: a read of stdout is scrubbed, decoded (a secret split
across two deltas redacted whole, sessions/delta_scrub.py) and fed to the
core under the journal's bare lock (``Ordered.undrained``); output alone in a burst is
handed to :meth:`~bridge.sessions.journal.Journal.submit` without waiting for its commit,
anything else waits for the pipeline to drain and is performed by the conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Sequence
from typing import Any, Protocol, cast

import structlog

from bridge.process.agent_io import AgentIO, ExitInfo
from bridge.protocols.codec import Decoded
from bridge.protocols.events import Event, Record
from bridge.protocols.framing import LineTooLong
from bridge.sessions.actions import Action, Emit
from bridge.sessions.core import ConversationCore
from bridge.sessions.delta_scrub import DeltaScrub
from bridge.sessions.journal import PIPELINE_MIN_LINES, Journal
from bridge.sessions.lease import ThreadLease
from bridge.sessions.scrub import Scrubber

log = structlog.get_logger("bridge.conversation")

# After the process exits, its pipes get this long to drain before they are abandoned
# (a grandchild may hold them open).
DRAIN_TIMEOUT_S = 2.0


class Shell(Protocol):
    """What a run needs of its conversation."""

    id: str
    core: ConversationCore
    journal: Journal
    lease: ThreadLease

    def emit_fields(self, action: Emit) -> dict[str, Any]: ...

    async def perform(self, actions: Sequence[Action]) -> list[Record]: ...

    async def step(self, actions: Sequence[Action]) -> list[Record]: ...

    async def emit(self, events: Sequence[Event], *, fields: dict[str, Any] | None = None) -> list[Record]: ...

    async def exited(self, run: AgentRun, info: ExitInfo) -> None: ...

    def transcript_full(self) -> list[Action]: ...


class AgentRun:
    def __init__(self, proc: AgentIO, shell: Shell, scrub: Scrubber, *, grace_s: float) -> None:
        """Starts reading the process at once. ``scrub``: this life's secrets, kept out of
        everything it writes; ``grace_s``: how long an agent that closed its stdout may
        keep running before it is stopped."""
        self.proc = proc
        self.pid = proc.pid
        self._shell = shell
        self._journal, self._lease = shell.journal, shell.lease  # (a conversation's, for good)
        self._scrub = scrub
        self._grace_s = grace_s
        self._full = False  # the transcript reached its cap: nothing more of the agent's is stored
        reader = asyncio.create_task(self._read_stdout(), name=f"stdout-{shell.id}")
        errs = asyncio.create_task(proc.pump_stderr(self._on_stderr), name=f"stderr-{shell.id}")
        self.watcher = asyncio.create_task(self._watch(reader, errs), name=f"watch-{shell.id}")

    def kill(self) -> None:
        """SIGKILL to the process's whole group, now."""
        self.proc.signal_group(signal.SIGKILL)

    async def stop(self, grace_s: float, shutdown_line: str | None) -> None:
        """Ask the process to end (``shutdown_line`` when its dialect has one, its stdin
        closed), and signal it once ``grace_s`` has passed."""
        await self.proc.stop(grace_s, shutdown_line=shutdown_line)

    async def recorded(self, wait_s: float | None) -> None:
        """Until the exit is recorded (the watcher is done); at most ``wait_s`` when given."""
        if wait_s is None:
            await self.watcher
        else:
            await asyncio.wait({self.watcher}, timeout=wait_s)

    async def _on_stderr(self, text: str) -> None:
        if self._journal.full:  # what follows the cap is dropped, and the agent stopped
            await self._stop_full()
            return
        text = self._scrub.text(text)
        await self._shell.emit([Event("agent", "diagnostic", {"stream": "stderr", "text": text})])

    async def _stop_full(self) -> None:
        """The transcript reached [capacity] max_transcript_mb (issue #36): the agent is
        stopped at once, once; the output that crossed the cap is stored, none after it."""
        if not self._full:
            self._full = True
            await self._shell.step(self._shell.transcript_full())

    async def _read_stdout(self) -> None:
        shell, proc, journal, deltas = self._shell, self.proc, self._journal, DeltaScrub(self._scrub)
        lock = journal.lock.undrained
        journal.clear_failure()  # (a previous life's reader may have been cancelled before it saw one)
        try:
            async for lines in proc.stdout_batches():
                # Everything one read brought is decoded, stored and published together:
                # one transaction for a burst of deltas instead of one per line.
                lines = self._scrub.lines(lines)
                async with lock:
                    core = shell.core
                    codec = core.codec
                    if codec is None:
                        return
                    decoded = codec.decode_many(lines)
                    if deltas.active:  # (only a life with secrets pays for this)
                        decoded = deltas.decoded(decoded)
                    actions = core.agent_output(decoded)
                    if self._pipelined(actions, len(lines)):
                        emit = cast(Emit, actions[0])
                        await journal.submit(emit.events, shell.emit_fields(emit))
                    else:
                        await journal.drain_reader()
                        await shell.perform(actions)
                if journal.full:  # once a read is numbered: none is taken after the one that crossed it
                    await self._stop_full()
                    return
            async with lock:
                await journal.drain_reader()
                # The end of a stream that might have begun a secret, held until now.
                if (held := deltas.flush()) and shell.core.codec is not None:
                    await shell.perform(shell.core.agent_output([Decoded(events=held)]))
        except LineTooLong as exc:
            log.warning("agent.line_too_long", thread_id=shell.id, pid=proc.pid)
            await shell.step(shell.core.line_too_long(str(exc)))
            return
        # stdout is closed: the protocol is over. An agent that exits does so now; one that
        # keeps running is stopped after the grace period (its turn ends naming the cause).
        try:
            async with asyncio.timeout(self._grace_s):
                await proc.wait()
        except TimeoutError:
            log.warning("agent.stdout_closed", thread_id=shell.id, pid=proc.pid)
            await shell.step(shell.core.stdout_closed())

    def _pipelined(self, actions: list[Action], lines: int) -> bool:
        """Output alone (nothing to write, arm or serve after its commit), in a burst, with
        this replica's lease already held (a first hold may take the thread over, which
        appends before)."""
        return (
            len(actions) == 1
            and isinstance(action := actions[0], Emit)
            and action.committed is None
            and (lines >= PIPELINE_MIN_LINES or self._journal.in_flight > 0)
            and self._lease.held
        )

    async def _watch(self, reader: asyncio.Task[None], errs: asyncio.Task[None]) -> None:
        proc = self.proc
        info = await proc.wait()
        _done, pending = await asyncio.wait({reader, errs}, timeout=DRAIN_TIMEOUT_S)
        for t in pending:
            t.cancel()
        for t in (reader, errs):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        proc.signal_group(signal.SIGKILL)  # anything the agent left in its group
        proc.release()
        await self._shell.exited(self, info)
