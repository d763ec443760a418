"""Titles and the models route on a real daemon (issue #38 items 6 and 2, docs/api.md §4.3,
§4.4): a thread nobody named takes its first prompt's first line when the prompt is
recorded, told on the change stream; a title the user gave stays; an ACP agent's own title
replaces the prompt's (tests/agents/fake_acp_agent.py ``title``); a restart keeps the title,
on both stores. ``GET /v1/agents/{name}/models`` lists a profile's ``models`` and what an
ACP agent advertised."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import new_thread, profile_toml
from test_acp_e2e import acp_profile
from test_events_e2e import get_thread, ws_changes

pytestmark = pytest.mark.timeout(120)

LONG = "please look at the session registry and tell me why every thread is loaded eagerly at startup"


def config(env: dict[str, str], store: str = "") -> str:
    return (
        "[server]\nstop_grace_s = 1\n\n"
        + profile_toml("sj", "stream-json", env, model="big", models=["small", "big"])
        + acp_profile("acp", env, "--config-options")
        + acp_profile("plain", env)
        + (f"\n[store]\nurl = {json.dumps(store)}\n" if store else "")
    )


async def test_a_thread_is_named_by_its_first_prompt_and_keeps_a_users_title_across_a_restart(
    daemon_factory: Any, agent_env: dict[str, str], daemon_store: str
) -> None:
    d = await daemon_factory(config(agent_env, daemon_store))
    tid = (await new_thread(d, "sj"))["id"]
    async with ws_changes(d) as changes, d.http() as http:
        r = await http.post(f"/v1/threads/{tid}/messages", json={"text": f"\n  {LONG}\nsecond line"})
        assert r.status_code == 202, r.text
        # Told on the change stream as the prompt is recorded: every client's list follows.
        frame = await changes.next(lambda f: f.get("thread", {}).get("id") == tid and f["thread"].get("title"))
    title = frame["thread"]["title"]
    assert title.endswith("…") and len(title) <= 80 and LONG.startswith(title[:-1])
    assert LONG[len(title) - 1] == " "  # cut between words
    c = await d.ws(tid)
    await c.turn("a second prompt names nothing")
    assert (await get_thread(d, tid))["title"] == title
    # A title the user set stays, through later prompts and a restart.
    named = (await new_thread(d, "sj", title="Given"))["id"]
    c2 = await d.ws(named)
    await c2.turn("hello")
    async with d.http() as http:
        assert (await http.patch(f"/v1/threads/{tid}", json={"title": "Mine"})).status_code == 200
    await c.turn("and another")
    await c.close()
    await c2.close()
    assert await d.stop() == 0
    d2 = await daemon_factory(config(agent_env, daemon_store))
    assert (await get_thread(d2, tid))["title"] == "Mine"
    assert (await get_thread(d2, named))["title"] == "Given"
    # An attachment alone names a thread by what it is.
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    pic = (await new_thread(d2, "sj"))["id"]
    async with d2.http() as http:
        r = await http.post(f"/v1/threads/{pic}/messages", json={"content": [image]})
        assert r.status_code == 202, r.text
        assert (await http.get(f"/v1/threads/{pic}")).json()["title"] == "Image (image/png)"


async def test_an_acp_agents_title_replaces_the_prompts_and_survives_a_restart(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    tid = (await new_thread(d, "plain"))["id"]
    c = await d.ws(tid)
    await c.turn("hello there")
    t = await get_thread(d, tid)
    assert t["title"] == "hello there" and t["agent_info"]["prompt_title"] == "hello there"
    await c.turn("title Greeting")
    assert (await get_thread(d, tid))["title"] == "Greeting"
    await c.close()
    assert await d.stop() == 0
    # After a restart the agent's title stays; a PATCH to "" hands the naming back, and the
    # next prompt names the thread until the agent does again.
    d2 = await daemon_factory(config(agent_env))
    assert (await get_thread(d2, tid))["title"] == "Greeting"
    async with d2.http() as http:
        assert (await http.patch(f"/v1/threads/{tid}", json={"title": ""})).status_code == 200
    c = await d2.ws(tid)
    await c.turn("a fresh start")
    assert (await get_thread(d2, tid))["title"] == "a fresh start"
    await c.turn("title Fresh")
    assert (await get_thread(d2, tid))["title"] == "Fresh"
    await c.close()


async def test_the_models_route_lists_the_profiles_and_the_agents_models(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(agent_env))
    async with d.http() as http:
        r = await http.get("/v1/agents/sj/models")
        assert r.status_code == 200, r.text
        assert r.json() == {"models": [{"id": "big"}, {"id": "small"}], "current": "big"}
        # An ACP agent none of whose threads has run: the profile's list alone (none here).
        assert (await http.get("/v1/agents/acp/models")).json() == {"models": []}
        missing = await http.get("/v1/agents/nope/models")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "agent_not_found"
        assert (await http.get("/v1/agents/sj/models", headers={"Authorization": "Bearer wrong"})).status_code == 401
    tid = (await new_thread(d, "acp"))["id"]
    c = await d.ws(tid)
    await c.turn("hello")
    await c.close()
    async with d.http() as http:
        r = await http.get("/v1/agents/acp/models")
    assert r.json() == {"models": [{"id": "fast", "name": "Fast"}, {"id": "deep", "name": "Deep"}]}
