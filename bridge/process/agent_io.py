"""What a conversation needs from an agent process: the seam between sessions/ and
process/. :class:`~bridge.process.agent_process.AgentProcess` implements it for real OS
processes; tests/support/memory_agent.py implements it in memory, so the conversation's
logic runs in milliseconds with no process at all."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from bridge.process.launch import LaunchSpec


@dataclass(slots=True)
class ExitInfo:
    code: int | None
    signal: int | None
    # Why, where the process itself tells (a kernel OOM kill in the agent's cgroup:
    # "memory_limit", process/cgroup.py); None: the daemon's own reason, or its code.
    reason: str | None = None


class AgentIO(Protocol):
    pid: int
    start_time: int | None

    async def write_line(self, line: str) -> None:
        """One message, written whole (never interleaved with another). Raises
        BrokenPipeError / ConnectionResetError once stdin is closed."""
        ...

    def stdout_batches(self) -> AsyncIterator[list[bytes]]:
        """Stdout lines, as many as one read brought; ends at EOF; raises
        :class:`~bridge.protocols.framing.LineTooLong` past the line cap."""
        ...

    async def pump_stderr(self, emit: Callable[[str], Awaitable[None]]) -> None:
        """Relay stderr lines (bounded) until EOF."""
        ...

    async def wait(self) -> ExitInfo:
        """Return once the process has exited (not waiting for its pipes to close)."""
        ...

    def signal_group(self, sig: int) -> bool: ...

    def release(self) -> None:
        """Close our ends of the pipes once the process is gone and drained."""
        ...

    async def stop(self, grace_s: float, *, shutdown_line: str | None = None) -> ExitInfo:
        """Ask politely (shutdown line, close stdin), wait ``grace_s``, then signal."""
        ...


Spawn = Callable[[LaunchSpec], Awaitable[AgentIO]]
