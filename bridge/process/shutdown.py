"""Stopping an agent (docs/api.md §2.7): [shutdown line] → close stdin → grace → SIGTERM to the
process group → grace → SIGKILL. The leader is always reaped; anything it left in its
group is killed too, so no zombie and no orphan survive a stop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.process.agent_io import ExitInfo
    from bridge.process.agent_process import AgentProcess

# After SIGTERM the agent gets this long (capped by the configured grace) before SIGKILL.
TERM_GRACE_S = 3.0


async def stop_process(proc: AgentProcess, grace_s: float, *, shutdown_line: str | None = None) -> ExitInfo:
    if proc.returncode is None:
        if shutdown_line is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.write_line(shutdown_line), timeout=1.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.close_stdin(), timeout=1.0)
        if not await _exited_within(proc, grace_s):
            proc.signal_group(signal.SIGTERM)
            if not await _exited_within(proc, min(grace_s, TERM_GRACE_S) or 0.5):
                proc.signal_group(signal.SIGKILL)
    info = await proc.wait()
    # The leader is gone; whatever it forked into its group goes with it.
    proc.signal_group(signal.SIGKILL)
    return info


async def _exited_within(proc: AgentProcess, seconds: float) -> bool:
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), timeout=max(seconds, 0.0))
    except TimeoutError:
        return False
    return True
