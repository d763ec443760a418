"""An elicitation answered, or listed, on this replica: the shell side of
sessions/elicitations.py, as local_port.py is for permission answers.

An answer runs under the journal's lock (the core decides, its actions are performed in
order). A request this replica's memory does not know may still have been settled where
another replica closed a lost owner's books: the transcript's tail says so, and the
answer is then ``already_resolved`` rather than unknown. The list of pending requests
comes from memory where the agent runs; on a replica that only follows the thread (a
shared store), from what the transcript's tail leaves open.
"""

from __future__ import annotations

from typing import Any

from bridge.errors import Conflict, NotFound
from bridge.sessions import elicitations as elicit
from bridge.sessions.commands import AnswerElicitation
from bridge.sessions.conversation import Conversation
from bridge.sessions.lease import settled_in_transcript
from bridge.sessions.ownership import TAIL_EVENTS, open_requests


async def answer_here(conv: Conversation, c: AnswerElicitation) -> dict[str, Any]:
    try:
        async with conv.journal.lock:
            data, actions = elicit.answer(conv.core, c.request_id, c.action, c.content, by=c.channel, actor=c.actor)
            await conv.perform(actions)
            return data
    except NotFound as exc:
        if exc.code != "elicitation_not_found":
            raise
        by = await settled_in_transcript(conv.store, conv.id, c.request_id)
        if by is None:
            raise
        raise Conflict(f"elicitation {c.request_id} was already resolved (by {by})", code="already_resolved") from None


async def waiting(conv: Conversation) -> list[dict[str, Any]]:
    """The elicitations that wait for an answer, wherever the agent that asked runs."""
    if conv.running or not conv.store.shared:
        return conv.core.elicitations.views()
    row = await conv.store.get_thread(conv.id)
    if row is None or row.get("state") not in ("starting", "running"):
        return []
    last = row.get("last_seq", 0)
    records = await conv.store.read_events(conv.id, max(0, last - TAIL_EVENTS), TAIL_EVENTS, with_raw=False)
    open_ids = {rid for kind, rid in open_requests(records) if kind == elicit.REQUESTED}
    return [
        elicit.view_of(rec.data, rec.seq, rec.ts)
        for rec in records
        if rec.kind == elicit.REQUESTED and rec.data.get("request_id") in open_ids
    ]
