"""A switch the bridge asks of the agent (a mode, a config option): :func:`ask_agent` starts
the agent when it is not running, waits for its session, writes the request and waits for
the answer the codec routes back. One it stopped waiting for is withdrawn from the agent
where its dialect can (ACP's ``$/cancel_request``, protocols/acp_cancel.py), so an agent
that honours it stops working on it. Best effort: the caller's timeout is what the client
is told either way."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from bridge.errors import BridgeError
from bridge.sessions.actions import Action
from bridge.sessions.conversation import Conversation

LOCK_WAIT_S = 5.0  # the journal may be busy with the very thing that made the switch late


async def give_up(conv: Conversation, route: str) -> None:
    """Withdraw the request whose answer was routed to ``route``; errors are swallowed
    (the agent gone, the store refusing): nothing waits on this."""
    with contextlib.suppress(BridgeError, OSError, TimeoutError):
        async with asyncio.timeout(LOCK_WAIT_S), conv.journal.lock:
            await conv.perform(conv.core.give_up(route))


async def ask_agent(
    conv: Conversation,
    request: Callable[[str], list[Action]],
    *,
    method: str,
    timeout_s: float,
    timeout_error: type[BridgeError],
) -> str:
    """The agent's answer (the line routed back) to what ``request(route)`` writes, made
    under the journal's lock once the agent's session is ready; raises ``timeout_error``
    after ``timeout_s``, the request withdrawn."""
    conv.require_writable()
    await conv.ensure_started()
    route = f"{method}-{id(conv)}-{time.monotonic_ns()}"
    try:
        async with asyncio.timeout(timeout_s):
            await conv.until_ready()
            async with conv.journal.lock:
                actions = request(route)
                reply = conv.routes.expect(route)
                await conv.perform(actions)
            return await reply
    except TimeoutError:
        await give_up(conv, route)
        raise timeout_error(f"the agent did not answer {method} within {timeout_s:g} s") from None
    finally:
        conv.routes.forget(route)


__all__ = ["ask_agent", "give_up"]
