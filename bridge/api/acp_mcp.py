"""The ``mcpServers`` a gateway client gives ``session/new`` (docs/api.md §11): checked
(protocols/mcp_servers.py) and made the new thread's ``mcp_servers`` option, which its
agent gets at every start. ``session/load`` and ``session/resume`` carry a list as well;
the thread keeps the servers it was made with, so theirs are checked and not stored (a
session's servers changing under a running agent would need it restarted)."""

from __future__ import annotations

from typing import Any

from bridge.protocols import mcp_servers
from bridge.protocols.jsonrpc import RpcError


def servers(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's ``mcpServers`` (absent: none), checked; -32602 when malformed."""
    try:
        return mcp_servers.parse(params.get("mcpServers", []))
    except mcp_servers.McpServersInvalid as exc:
        raise RpcError.invalid_params(str(exc), {"code": "invalid_option"}) from None


def create_options(params: dict[str, Any]) -> dict[str, Any]:
    """``threads.create``'s keyword arguments for the servers: none when there are none
    (a thread without MCP servers has no such option, as one made over REST)."""
    given = servers(params)
    return {"options": {"mcp_servers": given}} if given else {}


__all__ = ["create_options", "servers"]
