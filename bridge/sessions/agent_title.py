"""A thread's title from its agent (ACP ``session_info_update``, docs/api.md §4.3). Pure.

The agent's dialect keeps what the agent last said of its session in the thread's
``agent_info.session_info`` (``{title, updatedAt}``). Whether that title becomes the
thread's is decided here, when the fields of an Emit are about to be written, against the
row as it is then (under the journal's lock, as a ``PATCH`` of the title is):

* the agent's title replaces the thread's while the user has not named the thread: its
  title is ``""`` or still the agent's previous title. A title set at creation or by
  ``PATCH /v1/threads/{id}`` to anything else is the user's, and stays; a ``PATCH`` to
  ``""`` gives the naming back to the agent. (A user title equal, letter for letter, to the
  agent's previous one cannot be told from it, and is taken as the agent's.)
* a title the agent clears (null) clears the thread's, on the same condition.
* ``session_info`` outlives the agent process: a restarted agent says nothing of it until
  it sends an update, so the stored one is carried over, and the rule above still knows
  which title was the agent's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _agent_title(info: Any) -> str | None:
    session = info.get("session_info") if isinstance(info, dict) else None
    title = session.get("title") if isinstance(session, dict) else None
    return title if isinstance(title, str) else None


def with_agent_title(thread: Mapping[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` as they should be written over ``thread``: an ``agent_info`` without
    ``session_info`` keeps the stored one, and a new agent title becomes the thread's
    title when the rule above says so."""
    info = fields.get("agent_info")
    if not isinstance(info, dict):
        return fields
    stored = thread.get("agent_info")
    if "session_info" not in info:
        kept = stored.get("session_info") if isinstance(stored, dict) else None
        return fields if kept is None else {**fields, "agent_info": {**info, "session_info": kept}}
    new, old = _agent_title(info), _agent_title(stored)
    if new == old or "title" in fields:
        return fields
    current = thread.get("title") or ""
    if current and current != old:
        return fields  # the user's own title
    return {**fields, "title": new or ""}
