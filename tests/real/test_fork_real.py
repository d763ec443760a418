"""Forks with the real agents against the loopback fake model (issue #38 item 1, docs/api.md
§4.26): what a forked agent knows is what the fake model is asked. Claude Code forked at
an earlier turn's end (``--resume --fork-session --resume-session-at``) sends the turns
before it and none after; forked at the end, all of them; claude-agent-acp forked at the
end (``session/fork``) likewise, and refuses an earlier point. The source goes on as if
nothing happened: its next request holds none of the forks' prompts."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Daemon, new_thread
from fake_anthropic import block_texts, last_user
from realagents import Real, fake_api, real
from test_claude_agent_acp import acp_profile
from test_claude_code import claude_profile

__all__ = ["fake_api", "real"]  # fixtures used by the tests below

pytestmark = pytest.mark.timeout(240)


def asked(r: Real, prompt: str) -> str:
    """Every text of the model request that asked ``prompt`` (a block of its last user
    message is the prompt itself, not a request that quotes it, as claude-agent-acp's
    title request does): what the agent knew then."""
    for request in reversed(r.fake.model_requests()):
        if prompt in block_texts(last_user(request.body).get("content") or []):
            return "\n".join(t for m in request.messages for t in block_texts(m["content"]))
    raise AssertionError(f"no model request asked {prompt!r}")


async def turn(d: Daemon, tid: str, text: str) -> dict[str, Any]:
    c = await d.ws(tid)
    end = await c.turn(text)
    assert end["data"]["status"] == "success", end
    await c.close()
    return end


async def fork(d: Daemon, tid: str, status: int = 201, **body: Any) -> dict[str, Any]:
    async with d.http() as http:
        r = await http.post(f"/v1/threads/{tid}/fork", json=body)
    assert r.status_code == status, r.text
    return dict(r.json())


async def test_claude_code_forked_at_an_earlier_turn_knows_only_the_turns_before_it(real: Real) -> None:
    d = await real.daemon(real.config(claude_profile(real)))
    src = (await new_thread(d, "claude", cwd=str(real.work)))["id"]
    ends = [await turn(d, src, f"CHAT remember the word {w}") for w in ("ALPHA", "BRAVO", "CHARLIE")]

    early = await fork(d, src, after_seq=ends[1]["seq"] + 1)  # rounded down to the second turn's end
    assert early["forked_from"] == {"thread": src, "seq": ends[1]["seq"]}
    await turn(d, early["id"], "CHAT what do you remember FORKQ")
    knew = asked(real, "CHAT what do you remember FORKQ")
    assert "remember the word ALPHA" in knew and "remember the word BRAVO" in knew
    assert "CHARLIE" not in knew

    whole = await fork(d, src)
    await turn(d, whole["id"], "CHAT and now ENDQ")
    knew = asked(real, "CHAT and now ENDQ")
    assert all(f"remember the word {w}" in knew for w in ("ALPHA", "BRAVO", "CHARLIE")) and "FORKQ" not in knew

    # The source goes on with its own session: all three turns, none of the forks'.
    await turn(d, src, "CHAT still there SRCQ")
    knew = asked(real, "CHAT still there SRCQ")
    assert "remember the word CHARLIE" in knew and "FORKQ" not in knew and "ENDQ" not in knew
    async with d.http() as http:
        rows = {t: (await http.get(f"/v1/threads/{t}")).json() for t in (src, early["id"], whole["id"])}
    sessions = {row["native_session_id"] for row in rows.values()}
    assert len(sessions) == 3 and None not in sessions  # each fork has a session of its own


async def test_claude_agent_acp_forked_at_the_end_knows_every_turn_and_not_later_ones(real: Real) -> None:
    d = await real.daemon(real.config(acp_profile(real)))
    src = (await new_thread(d, "claude-acp", cwd=str(real.work)))["id"]
    first = await turn(d, src, "CHAT remember the word ALPHA")
    await turn(d, src, "CHAT remember the word BRAVO")
    refused = await fork(d, src, 409, after_seq=first["seq"])
    assert refused["error"]["code"] == "fork_not_supported"

    forked = await fork(d, src)
    await turn(d, forked["id"], "CHAT what do you remember FORKQ")
    knew = asked(real, "CHAT what do you remember FORKQ")
    assert "remember the word ALPHA" in knew and "remember the word BRAVO" in knew

    await turn(d, src, "CHAT still there SRCQ")
    knew = asked(real, "CHAT still there SRCQ")
    assert "remember the word BRAVO" in knew and "FORKQ" not in knew
    async with d.http() as http:
        a = (await http.get(f"/v1/threads/{src}")).json()["native_session_id"]
        b = (await http.get(f"/v1/threads/{forked['id']}")).json()["native_session_id"]
    assert a and b and a != b
