"""An ACP agent's own session list (issue #17 item 4): the client side of ``initialize`` →
[``authenticate``] → ``session/list``, PURE (lines in, lines and one outcome out).

sessions/native.py spawns the agent, writes :meth:`AcpLister.start`'s lines, feeds every
stdout line to :meth:`AcpLister.feed` until it returns an outcome, then stops the agent.
An agent that does not advertise ``agentCapabilities.sessionCapabilities.list`` is never
asked (outcome reason ``not_advertised``). Requests the agent makes of us are answered
"method not found": listing serves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bridge.protocols.acp import METHOD_NOT_FOUND, initialize_params
from bridge.protocols.jsonline import dumps, parse_object

MAX_ERROR = 300


def _d(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(slots=True)
class Listed:
    """The outcome: the agent's sessions (raw objects, checked by the caller) and its next
    cursor, or a ``reason`` (and ``detail``) why there are none."""

    sessions: list[dict[str, Any]] = field(default_factory=list)
    next_cursor: str | None = None
    reason: str | None = None
    detail: str | None = None


class AcpLister:
    def __init__(self, *, cwd: str, cursor: str | None, auth_method: str | None, client_version: str = "0") -> None:
        self.cwd = cwd
        self.cursor = cursor
        self.auth_method = auth_method
        self.client_info = {"name": "agent-bridge", "title": "agent-bridge", "version": client_version}
        self._pending: dict[int, str] = {}
        self._next = 0

    def _request(self, method: str, params: dict[str, Any]) -> str:
        rid = self._next
        self._next += 1
        self._pending[rid] = method
        return dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})

    def start(self) -> list[str]:
        return [self._request("initialize", initialize_params(self.client_info))]

    def _list(self) -> str:
        params: dict[str, Any] = {"cwd": self.cwd}
        if self.cursor is not None:
            params["cursor"] = self.cursor
        return self._request("session/list", params)

    def feed(self, line: bytes) -> tuple[list[str], Listed | None]:
        """One stdout line: the lines to write back, and the outcome once there is one."""
        parsed, _, _ = parse_object(line)
        if parsed is None:
            return [], None  # noise on stdout is not our business here
        obj: dict[str, Any] = parsed
        if "method" in obj:
            if "id" in obj:  # a request to us
                err = {"code": METHOD_NOT_FOUND, "message": "agent-bridge is only listing sessions"}
                return [dumps({"jsonrpc": "2.0", "id": obj["id"], "error": err})], None
            return [], None
        rid = obj.get("id")
        method = self._pending.pop(rid, None) if isinstance(rid, int) else None
        if method is None:
            return [], None
        if "error" in obj or not isinstance(obj.get("result"), dict):
            message = _d(obj.get("error")).get("message")
            detail = f"{method}: {message if isinstance(message, str) else 'no result'}"[:MAX_ERROR]
            return [], Listed(reason="agent_error", detail=detail)
        return self._result(method, obj["result"])

    def _result(self, method: str, result: dict[str, Any]) -> tuple[list[str], Listed | None]:
        if method == "initialize":
            caps = _d(_d(result.get("agentCapabilities")).get("sessionCapabilities"))
            if not isinstance(caps.get("list"), dict):
                return [], Listed(reason="not_advertised")
            if self.auth_method:
                return [self._request("authenticate", {"methodId": self.auth_method})], None
            return [self._list()], None
        if method == "authenticate":
            return [self._list()], None
        sessions, nxt = result.get("sessions"), result.get("nextCursor")
        return [], Listed(
            sessions=[s for s in sessions if isinstance(s, dict)] if isinstance(sessions, list) else [],
            next_cursor=nxt if isinstance(nxt, str) and nxt else None,
        )


__all__ = ["AcpLister", "Listed"]
