"""Issue #38 item 6: a thread nobody named takes its first prompt's first line, and its ACP
agent's own title replaces that one but never the user's (sessions/agent_title.py). Pure."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.protocols.events import Event
from bridge.sessions.agent_title import MAX_PROMPT_TITLE, prompt_title, with_titles
from bridge.sessions.core import prompt_event_data


def prompt(text: str, *others: dict[str, Any]) -> Event:
    content = ([{"type": "text", "text": text}] if text else []) + list(others)
    return Event("client", "message", prompt_event_data(content, "turn_1", None))


def said(title: str | None, **more: Any) -> dict[str, Any]:
    return {"info": {"name": "fake"}, "session_info": {"title": title}, **more}


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("fix the login bug", "fix the login bug"),
        ("\n\n   fix   the\tlogin bug  \nand then the tests", "fix the login bug"),
        ("x" * 200, "x" * (MAX_PROMPT_TITLE - 1) + "…"),  # one long word: cut inside
    ],
)
def test_a_prompts_title_is_its_first_line_with_text(text: str, title: str) -> None:
    assert prompt_title(prompt(text).data) == title


def test_a_long_first_line_ends_on_a_word_with_an_ellipsis() -> None:
    line = "please refactor the session registry so that every thread is loaded lazily, and then " * 3
    title = prompt_title(prompt(line).data)
    assert title is not None and len(title) <= MAX_PROMPT_TITLE and title.endswith("…")
    assert line.startswith(title[:-1]) and line[len(title) - 1] in " ,"  # whole words only


def test_a_prompt_of_attachments_only_is_named_by_what_it_carried() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "AA=="}}
    assert prompt_title(prompt("", image).data) == "Image (image/png)"
    assert prompt_title(prompt("", image, pdf).data) == "2 attachments"
    assert prompt_title(prompt(" \n ").data) is None


def test_an_untitled_thread_takes_its_prompts_title_and_a_named_one_keeps_its_own() -> None:
    events = [prompt("fix the login bug"), Event("bridge", "turn.started", {})]
    thread = {"protocol": "stream-json", "title": "", "agent_info": None}
    fields, _ = with_titles(thread, {"turn_active": True}, events)
    assert fields == {"turn_active": True, "title": "fix the login bug"}
    assert with_titles({**thread, "title": "Mine"}, {}, events) == ({}, None)
    assert with_titles(thread, {}, [Event("bridge", "turn.started", {})]) == ({}, None)


def test_the_agents_title_replaces_the_prompts_but_not_the_users() -> None:
    # An ACP thread whose agent runs: the prompt's title is marked in agent_info.
    thread: dict[str, Any] = {"protocol": "acp", "title": "", "agent_info": {"info": {}}}
    fields, unmarked = with_titles(thread, {}, [prompt("fix the login bug")])
    assert fields == {"title": "fix the login bug", "agent_info": {"info": {}, "prompt_title": "fix the login bug"}}
    assert unmarked is None
    thread.update(fields)
    fields, _ = with_titles(thread, {"agent_info": said("Login bug")})
    assert fields["title"] == "Login bug"
    assert fields["agent_info"]["prompt_title"] == "fix the login bug"  # carried over
    # The user renamed it: the agent's title does not replace that.
    fields, _ = with_titles({**thread, "title": "Mine"}, {"agent_info": said("Login bug")})
    assert "title" not in fields


def test_a_prompt_title_before_the_agents_first_agent_info_is_marked_by_that_one() -> None:
    thread: dict[str, Any] = {"protocol": "acp", "title": "", "agent_info": None}
    fields, unmarked = with_titles(thread, {}, [prompt("fix the login bug")])
    assert fields == {"title": "fix the login bug"} and unmarked == "fix the login bug"
    thread.update(fields)
    fields, unmarked = with_titles(thread, {"turn_active": True}, [], unmarked)  # no agent_info: still waiting
    assert unmarked == "fix the login bug"
    fields, unmarked = with_titles(thread, {"agent_info": {"info": {}}}, [], unmarked)
    assert fields == {"agent_info": {"info": {}, "prompt_title": "fix the login bug"}} and unmarked is None
    thread.update(fields)
    fields, _ = with_titles(thread, {"agent_info": said("Login bug")})
    assert fields["title"] == "Login bug"


def test_a_title_handed_back_is_taken_by_the_next_prompt() -> None:
    thread = {"protocol": "acp", "title": "", "agent_info": said("Old", prompt_title="first")}
    fields, _ = with_titles(thread, {}, [prompt("second prompt")])
    assert fields["title"] == "second prompt" and fields["agent_info"]["prompt_title"] == "second prompt"


def test_a_lone_surrogate_in_a_prompt_or_an_agents_title_is_stored_as_a_replacement_character() -> None:
    # JSON may carry "\ud800"; no store can hold it in the title column (the prompt itself
    # is stored as escaped JSON and keeps it).
    assert prompt_title({"text": "\ud800 fix it"}) == "\ufffd fix it"
    assert prompt_title({"text": "", "content": [{"type": "image", "media_type": "a\udfff"}]}) == "Image (a\ufffd)"
