"""A switch the bridge asked of the agent (a mode, a config option) and stopped waiting
for: withdrawn from the agent where its dialect can (ACP's ``$/cancel_request``,
protocols/acp_cancel.py), so an agent that honours it stops working on it. Best effort:
the caller's timeout is what the client is told either way."""

from __future__ import annotations

import asyncio
import contextlib

from bridge.errors import BridgeError
from bridge.sessions.conversation import Conversation

LOCK_WAIT_S = 5.0  # the journal may be busy with the very thing that made the switch late


async def give_up(conv: Conversation, route: str) -> None:
    """Withdraw the request whose answer was routed to ``route``; errors are swallowed
    (the agent gone, the store refusing): nothing waits on this."""
    with contextlib.suppress(BridgeError, OSError, TimeoutError):
        async with asyncio.timeout(LOCK_WAIT_S), conv.journal.lock:
            await conv.perform(conv.core.give_up(route))


__all__ = ["give_up"]
