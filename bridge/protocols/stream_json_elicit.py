"""Claude Code's elicitations (stream-json ``control_request`` subtype ``elicitation``): an
MCP server of the agent asks the user something, and the CLI asks its host. Pure.

The request maps onto the same ``elicitation.requested`` as an ACP agent's (ACP took its
model from MCP): ``message``, ``mode`` (MCP's default is ``form`` when it is left out),
``requested_schema`` checked as protocols/elicitation.py checks any form, or ``url`` and
``elicitation_id``; ``mcp_server_name`` is kept as ``server``. The answer is a
``control_response`` whose response is MCP's result, ``{action, content?}``.

Whether anyone is asked is the conversation's decision, as for permission prompts: a
profile without ``permission_prompts`` has no client to ask, so the core declines at once
(sessions/elicitations.py). A request the bridge cannot show (a schema outside the
restricted form, a bad URL) is declined here at once, with a diagnostic, so the agent
never waits for a question nobody can see. The CLI withdraws a request itself
(``control_cancel_request``), which the core treats as for permission prompts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge.protocols.codec import Decoded
from bridge.protocols.elicitation import MAX_ID, MAX_TEXT, Refused, form_schema, suspicious_host, text, url_target
from bridge.protocols.events import Event
from bridge.protocols.jsonline import dumps

Handler = Callable[[Any, dict[str, Any], str, Decoded], list[Event]]


def request_data(req: dict[str, Any]) -> dict[str, Any]:
    """The event data of one elicitation control request (without its request_id);
    raises Refused."""
    mode = req.get("mode") or "form"
    if mode not in ("form", "url"):
        raise Refused(f"mode {str(mode)[:64]!r} is not form or url")
    data: dict[str, Any] = {"mode": mode, "message": text(req.get("message"), "message", MAX_TEXT), "scope": "session"}
    if isinstance(req.get("mcp_server_name"), str):
        data["server"] = text(req["mcp_server_name"], "mcp_server_name", MAX_ID)
    if mode == "form":
        data["requested_schema"] = form_schema(req.get("requested_schema") or {"type": "object", "properties": {}})
    else:
        data["url"], data["url_host"] = url_target(req.get("url"))
        data["elicitation_id"] = text(req.get("elicitation_id"), "elicitation_id", MAX_ID, empty=False)
        if suspicious_host(data["url_host"]):
            data["url_warning"] = "the address uses characters that can imitate another domain"
    return data


def answer_line(request_id: str, action: str, content: dict[str, Any] | None) -> str:
    result: dict[str, Any] = {"action": action}
    if action == "accept" and content is not None:
        result["content"] = content
    return dumps(
        {"type": "control_response", "response": {"subtype": "success", "request_id": request_id, "response": result}}
    )


def with_elicitation(handler: Handler) -> Handler:
    """The codec's ``control_request`` handler, with elicitations taken first."""

    def control_request(codec: Any, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
        req = obj.get("request")
        rid = obj.get("request_id")
        if not (isinstance(req, dict) and req.get("subtype") == "elicitation" and isinstance(rid, str)):
            return handler(codec, obj, raw, out)
        try:
            data = request_data(req)
        except Refused as exc:
            out.replies.append(answer_line(rid, "decline", None))
            text_ = f"declined elicitation {rid}: {exc}"
            return [Event("agent", "diagnostic", {"stream": "protocol", "text": text_, "control": "elicitation"}, raw)]
        return [Event("agent", "elicitation.requested", {"request_id": rid, **data}, raw)]

    return control_request


class ElicitationAnswers:
    """The codec's side of :class:`~bridge.protocols.elicitation.Elicitor` (a base class
    of the stream-json codec): the line that answers one request."""

    def answer_elicitation(self, request_id: str, action: str, content: dict[str, Any] | None) -> str | None:
        return answer_line(request_id, action, content)
