"""A gateway client's ``$/cancel_request`` (docs/api.md §11): it gives up one of its own
requests.

What the bridge does depends on the request, as ACP leaves it to each side (a request is
always answered, with a result or -32800):

- a ``session/prompt`` waiting for its turn: the session's turn is cancelled as
  ``session/cancel`` would (ACP's own cancellation of a prompt turn), and the prompt is
  answered when its turn ends, ``stopReason: "cancelled"``;
- anything else (a ``session/load`` replaying, a ``session/new`` starting its agent, a
  mode switch): it runs to its end and is answered as usual. Stopping it half-way would
  leave a thread created or a session half-attached with nobody told; its answer is a
  valid response to a cancelled request.

The other direction, the gateway withdrawing a question it asked a client, is
:func:`withdraw` (used for permission requests answered elsewhere, and for elicitations).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import structlog

from bridge.errors import BridgeError
from bridge.protocols import acp_cancel, jsonrpc
from bridge.sessions.commands import Interrupt

if TYPE_CHECKING:
    from bridge.api.acp_agent import AcpAgent, Outbox
    from bridge.api.acp_attached import Attached

log = structlog.get_logger("bridge.acp_gateway")


def _prompt_session(agent: AcpAgent, rpc_id: jsonrpc.Id) -> Attached | None:
    """The session whose prompts include ``rpc_id``, if any."""
    key = jsonrpc.id_key(rpc_id)
    for att in agent.sessions.values():
        if any(jsonrpc.id_key(i) == key for i in att.prompts()):
            return att
    return None


async def client_cancelled(agent: AcpAgent, params: Any) -> None:
    """The client sent ``$/cancel_request``: see the module's docstring."""
    rpc_id = acp_cancel.target(params)
    if rpc_id is None:
        return
    att = _prompt_session(agent, rpc_id)
    if att is None:
        log.info("acp.cancel_request_left", connection_id=agent.id)  # answered as usual
        return
    with contextlib.suppress(BridgeError):  # no turn running (it ended meanwhile): nothing to stop
        await att.thread.run(Interrupt(actor=agent.user.name))


async def withdraw(out: Outbox, rpc_id: jsonrpc.Id) -> None:
    """Tell the client we no longer need its answer to our request ``rpc_id`` (forget the
    id first: an answer that still comes is then ignored). Raises what ``out.send``
    raises."""
    await out.send(acp_cancel.notice(rpc_id))


__all__ = ["client_cancelled", "withdraw"]
