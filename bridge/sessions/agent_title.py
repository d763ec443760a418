"""A thread's title when nobody named it (docs/api.md §4.3). Pure.

Two sources name a thread the user has not named, and this module decides, when the fields
of an Emit are about to be written, against the row as it is then (under the journal's
lock, as a ``PATCH`` of the title is):

* the prompt being recorded: a thread whose title is ``""`` takes its first line
  (:func:`prompt_title`). An ACP thread remembers that title in
  ``agent_info.prompt_title``, so the agent's title can still replace it later, after a
  restart too. While the thread has no ``agent_info`` yet (the agent is not initialized),
  the caller keeps it (``unmarked``) until the Emit that brings one.
* its ACP agent (``session_info_update``): the dialect keeps what the agent last said of
  its session in ``agent_info.session_info`` (``{title, updatedAt}``). The agent's title
  replaces the thread's while the user has not named the thread: its title is ``""``, the
  agent's previous title or the one its prompt gave. A title set at creation or by
  ``PATCH /v1/threads/{id}`` to anything else is the user's, and stays; a ``PATCH`` to
  ``""`` gives the naming back (to the agent, or to the next prompt). A user title equal,
  letter for letter, to one of those cannot be told from it, and is taken as not the user's.
  A title the agent clears (null) clears the thread's, on the same condition.
* ``session_info`` and ``prompt_title`` outlive the agent process: a restarted agent's
  ``agent_info`` says nothing of them, so the stored ones are carried over.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bridge.protocols.events import Event

MAX_PROMPT_TITLE = 80  # characters of a title taken from a prompt, the ellipsis included
PROMPT_TITLE = "prompt_title"  # the key in agent_info
_KEPT = ("session_info", PROMPT_TITLE)  # what a new agent_info carries over from the stored one
_KINDS = {"image": "Image", "document": "Document"}


def _storable(text: str) -> str:
    """``text`` with any lone surrogate (JSON may carry ``"\\ud800"``, UTF-8 cannot) as U+FFFD:
    a title is a column of its own, which no store can hold one in."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _shortened(line: str) -> str:
    """``line`` cut at a word boundary to fit :data:`MAX_PROMPT_TITLE` with its ellipsis;
    one long word is cut inside."""
    if len(line) <= MAX_PROMPT_TITLE:
        return line
    head = line[: MAX_PROMPT_TITLE - 1]
    cut = head.rfind(" ")
    if cut >= MAX_PROMPT_TITLE // 2:  # a word boundary that keeps most of the room
        head = head[:cut]
    return head.rstrip(" .,;:-") + "…"


def _attachments(content: Any) -> str | None:
    """A prompt with no text: what it carried, as ``Image`` or ``2 attachments``."""
    blocks = (
        [b for b in content if isinstance(b, dict) and b.get("type") != "text"] if isinstance(content, list) else []
    )
    if not blocks:
        return None
    if len(blocks) > 1:
        return f"{len(blocks)} attachments"
    kind = _KINDS.get(str(blocks[0].get("type")), "Attachment")
    media = blocks[0].get("media_type")
    return _storable(f"{kind} ({media})") if isinstance(media, str) and media else kind


def prompt_title(data: Mapping[str, Any]) -> str | None:
    """The title a user prompt (its ``message`` event's data) gives a thread: its first
    line that has text, spaces collapsed, at most :data:`MAX_PROMPT_TITLE` characters ending
    on a word with ``…``; for a prompt of attachments only, what they are."""
    text = data.get("text")
    lines = text.splitlines() if isinstance(text, str) else []
    line = next((" ".join(s.split()) for s in lines if s.strip()), "")
    return _storable(_shortened(line)) if line else _attachments(data.get("content"))


def _prompt_of(events: Sequence[Event]) -> str | None:
    for ev in events:
        if ev.source == "client" and ev.kind == "message" and ev.data.get("role") == "user":
            return prompt_title(ev.data)
    return None


def _info(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _agent_title(info: Any) -> str | None:
    session = info.get("session_info") if isinstance(info, dict) else None
    title = session.get("title") if isinstance(session, dict) else None
    return _storable(title) if isinstance(title, str) else None


def _carried(thread: Mapping[str, Any], fields: dict[str, Any], unmarked: str | None) -> dict[str, Any]:
    """A new agent_info with what the stored one (or the caller, ``unmarked``) knew that
    the agent does not say again."""
    info = _info(fields.get("agent_info"))
    if info is None:
        return fields
    stored = _info(thread.get("agent_info")) or {}
    kept = {k: stored[k] for k in _KEPT if k not in info and k in stored}
    if unmarked is not None and PROMPT_TITLE not in info and PROMPT_TITLE not in kept:
        kept[PROMPT_TITLE] = unmarked
    return {**fields, "agent_info": {**info, **kept}} if kept else fields


def _with_prompt_title(
    thread: Mapping[str, Any], fields: dict[str, Any], events: Sequence[Event]
) -> tuple[dict[str, Any], str | None]:
    """The fields with the title the prompt among ``events`` gives an untitled thread, and
    that title when it could not be marked as the prompt's (no agent_info yet)."""
    if "title" in fields or (thread.get("title") or ""):
        return fields, None
    title = _prompt_of(events)
    if title is None:
        return fields, None
    fields = {**fields, "title": title}
    # Only an agent that has an agent_info (ACP) names its session; another's never gets
    # one, and its unmarked title is then never asked for.
    info = _info(fields.get("agent_info")) or _info(thread.get("agent_info"))
    if info is None:
        return fields, title
    return {**fields, "agent_info": {**info, PROMPT_TITLE: title}}, None


def _with_agent_title(thread: Mapping[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """A new agent title becomes the thread's when the rule above says so."""
    info = _info(fields.get("agent_info"))
    if info is None or "session_info" not in info:
        return fields
    stored = thread.get("agent_info")
    new, old = _agent_title(info), _agent_title(stored)
    if new == old or "title" in fields:
        return fields
    current = thread.get("title") or ""
    if current and current not in (old, info.get(PROMPT_TITLE)):
        return fields  # the user's own title
    return {**fields, "title": new or ""}


def with_titles(
    thread: Mapping[str, Any], fields: dict[str, Any], events: Sequence[Event] = (), unmarked: str | None = None
) -> tuple[dict[str, Any], str | None]:
    """``fields`` as they should be written over ``thread`` with ``events``: an
    ``agent_info`` keeps the stored ``session_info`` and ``prompt_title`` it lacks (or takes
    ``unmarked``), an untitled thread takes its prompt's title, and a new agent title the
    thread's when the rule above says so. Also returns the prompt title still to be marked
    in the thread's first ``agent_info`` (``unmarked`` until then, None once it is)."""
    carried = _carried(thread, fields, unmarked)
    if carried is not fields or _info(fields.get("agent_info")) is not None:
        unmarked = None
    fields, pending = _with_prompt_title(thread, carried, events)
    return _with_agent_title(thread, fields), pending or unmarked


def with_agent_title(thread: Mapping[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """:func:`with_titles` for fields alone (no prompt among the events)."""
    return with_titles(thread, fields)[0]
