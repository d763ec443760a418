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

from bridge.protocols import jsonrpc
from bridge.protocols.acp_updates import initialize_params
from bridge.protocols.jsonline import dumps, parse_object
from bridge.protocols.jsonrpc import Invalid, Request, Response, RpcError

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
        self._pending: jsonrpc.Pending[str] = jsonrpc.Pending()  # id → the method asked

    def _request(self, method: str, params: dict[str, Any]) -> str:
        return dumps(jsonrpc.request(self._pending.add(method), method, params))

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
        msg = jsonrpc.classify(parsed)
        if isinstance(msg, Request):
            err = RpcError.method_not_found("agent-bridge is only listing sessions")
            return [dumps(jsonrpc.error(msg.id, err))], None
        if isinstance(msg, Invalid) and msg.reply_to is not None:
            msg = Response(msg.reply_to, error=msg.error())  # a broken answer fails its request
        method = self._pending.take(msg.id) if isinstance(msg, Response) else None
        if method is None or not isinstance(msg, Response):
            return [], None  # a notification, or an answer to nothing we asked
        result, error = msg.result, msg.error
        if error is not None or not isinstance(result, dict):
            detail = f"{method}: {error.message if error is not None else 'no result'}"[:MAX_ERROR]
            return [], Listed(reason="agent_error", detail=detail)
        return self._result(method, result)

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
