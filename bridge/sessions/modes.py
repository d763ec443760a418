"""A thread's session modes (ACP ``session/set_mode``, docs/api.md §4.2 and §11.2): what
the agent last reported, and its answer to a switch. Pure: no I/O.

The modes live in the thread's ``agent_info`` (``{"modes": {currentModeId,
availableModes}}``), which the ACP codec keeps up to date — from the agent's
``session/new``/``load``/``resume`` answer, every ``current_mode_update``, and every
``session/set_mode`` it accepted — and which is stored with the thread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bridge.errors import BridgeError, InvalidRequest
from bridge.protocols.jsonrpc import INTERNAL_ERROR
from bridge.sessions.commands import BOUNDS

# A switch waits this long for the agent: its start and handshake when it was not running
# (a prompt would start it too), then its answer.
MODE_TIMEOUT_S = 30.0
MAX_MODE_ID = BOUNDS.mode_id
MAX_TEXT = 4096  # characters of the agent's refusal passed on


class AgentRefused(BridgeError):
    """The agent answered a switch with an error; ``rpc`` is its JSON-RPC error as it gave
    it, for an ACP client."""

    status = 400

    def __init__(self, message: str, rpc: dict[str, Any]) -> None:
        super().__init__(message)
        self.rpc = rpc


class ModeRefused(AgentRefused):
    """The agent refused ``session/set_mode`` (an unknown mode id, say)."""

    code = "mode_refused"


class ModeTimeout(BridgeError):
    code = "agent_timeout"
    status = 504


def modes_of(thread: Mapping[str, Any]) -> dict[str, Any] | None:
    """The thread's modes as its agent last reported them, or None (none reported, or the
    agent has not run yet)."""
    info = thread.get("agent_info")
    modes = info.get("modes") if isinstance(info, dict) else None
    return modes if isinstance(modes, dict) else None


def check_mode_id(mode_id: Any) -> str:
    if not isinstance(mode_id, str) or not 0 < len(mode_id) <= MAX_MODE_ID:
        raise InvalidRequest(f"mode_id must be a non-empty string of at most {MAX_MODE_ID} characters")
    return mode_id


def mode_answer(text: str, mode_id: str) -> dict[str, Any]:
    """The answer to a switch, from the agent's JSON-RPC response (routed back to the
    conversation); raises :class:`ModeRefused` with the agent's error."""
    try:
        reply = json.loads(text)
    except ValueError:
        reply = None
    error = reply.get("error") if isinstance(reply, dict) else {"message": "the agent's answer is not JSON"}
    if error is None:
        return {"mode_id": mode_id}
    rpc = refusal(error)
    raise ModeRefused(f"the agent refused mode {mode_id!r}: {rpc['message']} ({rpc['code']})", rpc)


def refusal(error: Any) -> dict[str, Any]:
    """An agent's JSON-RPC error answer to a switch, bounded, as an ACP client is given it."""
    err = error if isinstance(error, dict) else {}
    code = err["code"] if isinstance(err.get("code"), int) and not isinstance(err["code"], bool) else INTERNAL_ERROR
    message = err["message"][:MAX_TEXT] if isinstance(err.get("message"), str) else "error"
    rpc: dict[str, Any] = {"code": code, "message": message}
    if err.get("data") is not None and len(json.dumps(err["data"])) <= MAX_TEXT:
        rpc["data"] = err["data"]  # the agent's own detail, when it is small
    return rpc
