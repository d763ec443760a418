"""Elicitations through the ACP gateway (docs/api.md §11.4): a thread's pending
``elicitation.requested`` is asked of every attached ACP client that advertised its mode
(``clientCapabilities.elicitation.form`` / ``.url``) as ``elicitation/create``; a client's
answer runs as :class:`~bridge.sessions.commands.AnswerElicitation` (``by: "acp"``), the
first answer from anywhere winning. Settled elsewhere (another client, the page, REST, a
timeout, an interrupt), the question still open on a client is withdrawn with
``$/cancel_request``. The agent's ``elicitation/complete`` for a URL request is passed on
to the clients that were sent it.

A client's error answer, or content its form refuses, settles nothing: the question stays
open for the others (and the thread's timeout), and the refusal is logged.

The gateway's requests to a client share one id space and one table (api/acp_agent.py);
an elicitation's entry is told apart by the prefix of the request id it carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from bridge.errors import BridgeError
from bridge.protocols import jsonrpc
from bridge.protocols.elicitation import ACTIONS
from bridge.protocols.jsonrpc import RpcError
from bridge.sessions.commands import AnswerElicitation

if TYPE_CHECKING:
    from bridge.api.acp_attached import Attached
    from bridge.protocols.events import Record

log = structlog.get_logger("bridge.acp_gateway")

PREFIX = "elicitation:"  # on our own table's entries: an elicitation, not a permission request
REQUESTED = "elicitation.requested"
RESOLVED = "elicitation.resolved"
KINDS = frozenset({REQUESTED, RESOLVED, "agent.other"})


def modes(caps: Any) -> frozenset[str]:
    """The modes a client advertised: ``form`` / ``url`` present as objects (ACP: an
    omitted or null mode is not supported, and ``{}`` supports none)."""
    el = caps.get("elicitation") if isinstance(caps, dict) else None
    if not isinstance(el, dict):
        return frozenset()
    return frozenset(m for m in ("form", "url") if isinstance(el.get(m), dict))


def create_params(session_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """``elicitation/create`` params for an ``elicitation.requested`` event's data."""
    params: dict[str, Any] = {"sessionId": session_id, "mode": data["mode"], "message": data.get("message", "")}
    if isinstance(data.get("tool_call_id"), str):
        params["toolCallId"] = data["tool_call_id"]
    if data["mode"] == "form":
        params["requestedSchema"] = data.get("requested_schema") or {"type": "object", "properties": {}}
    else:
        params["url"], params["elicitationId"] = data.get("url"), data.get("elicitation_id")
    return params


@dataclass
class Asked:
    """One attachment's elicitations: request_id → our rpc id, while unanswered; the ones
    ever sent (never asked twice); elicitationId → request_id of URL ones sent."""

    open: dict[str, jsonrpc.Id] = field(default_factory=dict)
    sent: set[str] = field(default_factory=set)
    urls: dict[str, str] = field(default_factory=dict)


def pending(att: Attached) -> list[dict[str, Any]]:
    """The thread's pending elicitations, as ``GET …/elicitations`` lists them (empty for
    a thread object that keeps none, such as a test's)."""
    views = getattr(att.thread, "pending_elicitations", None)
    return list(views()) if callable(views) else []


async def on_record(att: Attached, rec: Record) -> None:
    data = rec.data
    if rec.kind == REQUESTED:
        await ask(att, data)
    elif rec.kind == RESOLVED:
        await _resolved(att, data)
    elif data.get("method") == "elicitation/complete" and isinstance(data.get("elicitation_id"), str):
        if att.elicits.urls.pop(data["elicitation_id"], None) is not None:
            await att.agent.notify("elicitation/complete", {"elicitationId": data["elicitation_id"]})


async def ask(att: Attached, data: dict[str, Any]) -> None:
    """``elicitation/create`` for a request still pending, once, if the client shows its mode."""
    rid = data.get("request_id")
    asked = att.elicits
    if not isinstance(rid, str) or rid in asked.sent or data.get("mode") not in att.agent.elicitation:
        return
    if not any(view.get("request_id") == rid for view in pending(att)):
        return
    asked.sent.add(rid)
    rpc_id = await att.agent.request(
        "elicitation/create", create_params(att.thread.id, data), (att, PREFIX + rid, data)
    )
    if rpc_id is not None:
        asked.open[rid] = rpc_id
        if data.get("mode") == "url" and isinstance(data.get("elicitation_id"), str):
            asked.urls[data["elicitation_id"]] = rid


async def ask_pending(att: Attached) -> None:
    for view in pending(att):
        await ask(att, view)


async def _resolved(att: Attached, data: dict[str, Any]) -> None:
    """Settled (here or elsewhere): the question this client may still show is withdrawn."""
    rid = data.get("request_id")
    if not isinstance(rid, str):
        return
    att.elicits.sent.add(rid)  # never pending again, so never asked again
    rpc_id = att.elicits.open.pop(rid, None)
    if rpc_id is not None:
        att.agent.forget(rpc_id)
        await att.agent.notify("$/cancel_request", {"requestId": rpc_id})


async def withdraw_all(att: Attached) -> None:
    """The session left the connection: every open question is withdrawn."""
    for rid, rpc_id in list(att.elicits.open.items()):
        att.elicits.open.pop(rid, None)
        att.agent.forget(rpc_id)
        await att.agent.notify("$/cancel_request", {"requestId": rpc_id})


def ours(key: str) -> bool:
    return key.startswith(PREFIX)


async def answered(att: Attached, key: str, data: dict[str, Any], result: Any, error: RpcError | None) -> None:
    """The client's answer to our ``elicitation/create`` (``data``: the request's event data)."""
    rid = key.removeprefix(PREFIX)
    att.elicits.open.pop(rid, None)
    action = result.get("action") if isinstance(result, dict) else None
    content = result.get("content") if isinstance(result, dict) else None
    if error is not None or action not in ACTIONS or not (content is None or isinstance(content, dict)):
        log.info("acp.elicitation_answer_ignored", thread_id=att.thread.id, request_id=rid)
        return
    command = AnswerElicitation(
        request_id=rid,
        action=str(action),
        content=content if action == "accept" and data.get("mode") == "form" else None,
        channel="acp",
        actor=att.agent.user.name,
    )
    try:
        await att.thread.run(command)
    except BridgeError as exc:
        log.info("acp.elicitation_answer_refused", thread_id=att.thread.id, request_id=rid, code=exc.code)
