"""Elicitations over REST and the WebSocket (docs/api.md §4, §5.3): list a thread's
pending ones, answer one. Thin, as the permission routes are: the body becomes an
:class:`~bridge.sessions.commands.AnswerElicitation`, run where the thread runs.

``POST /v1/threads/{id}/elicitations/{request_id}`` ``{"action", "content"?}``; the frame
``{"op": "elicitation", "request_id", "action", "content"?}``. How the answer came
(``rest``, or the frame's ``client_id``, else ``websocket``) is ``elicitation.resolved``'s
``by``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import Field

from bridge.api.auth import require_auth
from bridge.api.schema import _In
from bridge.api.threads import _actor, _conv, _run
from bridge.sessions.commands import BOUNDS, AnswerElicitation
from bridge.sessions.elicit_port import waiting

router = APIRouter(prefix="/v1", dependencies=[Depends(require_auth)])


class ElicitationIn(_In):
    action: str = Field(..., max_length=BOUNDS.decision)  # accept | decline | cancel, checked by the core
    content: dict[str, Any] | None = None

    def command(self, request_id: str, actor: str, channel: str) -> AnswerElicitation:
        return AnswerElicitation(
            request_id=request_id, action=self.action, content=self.content, channel=channel, actor=actor
        )


class ElicitationFrame(ElicitationIn):
    request_id: str = Field(..., min_length=1, max_length=BOUNDS.request_id)


def frame_command(frame: dict[str, Any], actor: str, channel: str) -> AnswerElicitation:
    """The ``elicitation`` frame's command (a ValidationError is the frame's error)."""
    body: ElicitationFrame = ElicitationFrame.from_frame(frame)
    return body.command(body.request_id, actor, channel)


@router.get("/threads/{thread_id}/elicitations")
async def list_elicitations(thread_id: str, request: Request) -> dict[str, Any]:
    conv = await _conv(request, thread_id)
    return {"elicitations": await waiting(conv)}


@router.post("/threads/{thread_id}/elicitations/{request_id}")
async def answer_elicitation(thread_id: str, request_id: str, body: ElicitationIn, request: Request) -> dict[str, Any]:
    conv = await _conv(request, thread_id)
    return await _run(request, conv, body.command(request_id, _actor(request), channel="rest"))
