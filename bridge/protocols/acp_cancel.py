"""ACP's request cancellation, ``$/cancel_request`` (docs/api.md §7.3, §11): either side
asks the other to give up one of its outstanding requests by id; the request is still
answered, with a result or the error -32800 (request cancelled).

Pure: the notification's two forms. Where each side acts on it: the gateway
(api/acp_request_cancel.py: a client's prompt; api/acp_attached.py: a permission request
answered elsewhere) and the dialect (protocols/acp.py: the agent withdrawing a permission
request; the bridge withdrawing a mode or config switch nobody waits for any more,
:class:`~bridge.protocols.codec.RoutedCancel`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.protocols import jsonrpc
from bridge.protocols.jsonline import dumps

METHOD = "$/cancel_request"


def target(params: Any) -> jsonrpc.Id | None:
    """The id a ``$/cancel_request`` names, or None when its params name none (a
    notification is never answered, so a malformed one is simply ignored)."""
    if not isinstance(params, Mapping):
        return None
    rid = params.get("requestId")
    return rid if jsonrpc.is_id(rid) else None


def notice(rpc_id: jsonrpc.Id) -> dict[str, Any]:
    """The notification withdrawing our request ``rpc_id`` (what the gateway sends a client
    for a question it no longer needs answered: a permission or elicitation request
    resolved elsewhere)."""
    return jsonrpc.notification(METHOD, {"requestId": rpc_id})


def cancelled_error(rpc_id: jsonrpc.Id | None) -> dict[str, Any]:
    """The answer to a request given up on: the error -32800."""
    return jsonrpc.error(rpc_id, jsonrpc.RpcError.cancelled())


def routed_cancel_line(pending: jsonrpc.Pending[tuple[str, dict[str, Any]]], route: str) -> str | None:
    """For a dialect whose pending requests carry their answer's ``route`` in their
    context: the ``$/cancel_request`` line for the one routed to ``route``."""
    rid = pending.find(lambda entry: entry[1].get("route") == route)
    return None if rid is None else dumps(notice(rid))


__all__ = ["METHOD", "cancelled_error", "notice", "routed_cancel_line", "target"]
