"""ACP ``elicitation/create`` from an agent, on the bridge's client side: pure.

The bridge advertises both modes (form and URL) in ``initialize``; an agent's request is
checked (protocols/elicitation.py) and becomes one ``elicitation.requested`` event that
every client of the thread can answer, or is refused at once with ``-32602`` (invalid
params) and a diagnostic, so a malformed request never waits for a human. The agent's
JSON-RPC id is kept until the answer (:meth:`AcpElicitations.answer`), an interrupt
(:meth:`AcpElicitations.cancel_all`: ``session/cancel`` ends what the turn asked) or the
agent's own ``$/cancel_request`` (:meth:`AcpElicitations.withdrawn`).

``elicitation/complete`` (a URL-mode interaction finished out of band) is recorded as an
``agent.other`` naming the request it completes (:meth:`AcpElicitations.other`).
"""

from __future__ import annotations

from typing import Any

from bridge.protocols import jsonrpc
from bridge.protocols.codec import Decoded
from bridge.protocols.elicitation import MAX_ID, MAX_TEXT, Refused, form_schema, suspicious_host, text, url_target
from bridge.protocols.events import Event
from bridge.protocols.jsonline import dumps
from bridge.protocols.jsonrpc import RpcError

# What the bridge tells an agent it can show (clientCapabilities.elicitation).
CAPABILITY: dict[str, Any] = {"form": {}, "url": {}}
MAX_COMPLETED = 256  # URL elicitations remembered for their completion notification


def request_key(rid: jsonrpc.Id) -> str:
    """The agent's request id as an elicitation ``request_id`` (a string), as permissions
    key theirs: a string as it is, an integer (or a string reading as one) as JSON."""
    if isinstance(rid, str) and not rid.lstrip("-").isdigit():
        return rid
    return dumps(rid)


def request_data(params: dict[str, Any], session_id: str | None) -> dict[str, Any]:
    """The event data of one ``elicitation/create`` (without its ``request_id``); raises
    Refused."""
    mode = params.get("mode")
    if mode not in ("form", "url"):
        raise Refused(f"mode {str(mode)[:64]!r} is not one the client advertised (form, url)")
    data: dict[str, Any] = {"mode": mode, "message": text(params.get("message"), "message", MAX_TEXT)}
    sid = params.get("sessionId")
    if sid is not None:
        if sid != session_id:
            raise Refused("sessionId is not this client's session")
        data["scope"] = "session"
        if isinstance(params.get("toolCallId"), str):
            data["tool_call_id"] = text(params["toolCallId"], "toolCallId", MAX_ID)
    elif "requestId" in params and (params["requestId"] is None or jsonrpc.is_id(params["requestId"])):
        data["scope"] = "request"
    else:
        raise Refused("an elicitation needs sessionId or requestId")
    if mode == "form":
        data["requested_schema"] = form_schema(params.get("requestedSchema"))
    else:
        url, host = url_target(params.get("url"))
        data["elicitation_id"] = text(params.get("elicitationId"), "elicitationId", MAX_ID, empty=False)
        data["url"], data["url_host"] = url, host
        if suspicious_host(host):
            data["url_warning"] = "the address uses characters that can imitate another domain"
    return data


def response(action: str, content: dict[str, Any] | None) -> dict[str, Any]:
    """The ``elicitation/create`` result: content only with ``accept``, when there is some."""
    out: dict[str, Any] = {"action": action}
    if action == "accept" and content is not None:
        out["content"] = content
    return out


class AcpElicitations:
    """The agent's elicitation requests still waiting for an answer, keyed by request_id."""

    def __init__(self) -> None:
        self._pending: dict[str, jsonrpc.Id] = {}
        self._url_ids: dict[str, str] = {}  # elicitationId → request_id, URL mode, bounded

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._pending

    def requested(
        self, rid: jsonrpc.Id, params: dict[str, Any], session_id: str | None, raw: str, out: Decoded
    ) -> None:
        try:
            data = request_data(params, session_id)
        except Refused as exc:
            out.events.append(
                Event("agent", "diagnostic", {"stream": "protocol", "text": f"elicitation refused: {exc}"}, raw)
            )
            out.replies.append(dumps(jsonrpc.error(rid, RpcError.invalid_params(str(exc)))))
            return
        key = request_key(rid)
        self._pending[key] = rid
        if data["mode"] == "url":
            self._url_ids[data["elicitation_id"]] = key
            while len(self._url_ids) > MAX_COMPLETED:
                self._url_ids.pop(next(iter(self._url_ids)))
        out.events.append(Event("agent", "elicitation.requested", {"request_id": key, **data}, raw))

    def answer(self, request_id: str, action: str, content: dict[str, Any] | None) -> str | None:
        rid = self._pending.pop(request_id, None)
        if rid is None:
            return None
        return dumps(jsonrpc.result(rid, response(action, content)))

    def cancel_all(self) -> list[str]:
        """Every pending request answered ``cancel`` (the turn that asked was cancelled)."""
        lines = [dumps(jsonrpc.result(rid, {"action": "cancel"})) for rid in self._pending.values()]
        self._pending.clear()
        return lines

    def withdrawn(self, target: Any, raw: str, out: Decoded) -> bool:
        """The agent's ``$/cancel_request`` for one of its elicitations: resolved as
        cancelled by the agent, and answered -32800 as the specification asks."""
        if not jsonrpc.is_id(target):
            return False
        want = jsonrpc.id_key(target)
        key = next((k for k, v in self._pending.items() if jsonrpc.id_key(v) == want), None)
        if key is None:
            return False
        rid = self._pending.pop(key)
        data = {"request_id": key, "action": "cancel", "by": "agent"}
        out.events.append(Event("agent", "elicitation.resolved", data, raw))
        out.replies.append(dumps(jsonrpc.error(rid, RpcError.cancelled())))
        return True

    def other(self, method: str, params: dict[str, Any], raw: str) -> Event:
        """Any notification but session/update, as ``agent.other``; ``elicitation/complete``
        (a URL elicitation's out-of-band step finished) names the request it completes
        when it is one of ours, and unknown ids are ignored, as the specification asks."""
        data: dict[str, Any] = {"method": method}
        eid = params.get("elicitationId")
        if method == "elicitation/complete" and isinstance(eid, str) and eid in self._url_ids:
            data["elicitation_id"], data["request_id"] = eid, self._url_ids.pop(eid)
        return Event("agent", "agent.other", data, raw)
