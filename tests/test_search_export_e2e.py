"""Search, export and archive on a real daemon with the fake agent (issue #38 item 4,
docs/api.md §4.22-§4.24): ``GET /v1/search`` finds prompts, answers and tool input and
output as their events commit, refuses bad input with 400s, and shows each user only their
own threads (both stores); ``GET /v1/threads/{id}/export`` gives the exact transcript as
JSONL and a readable Markdown document of a thread with tools and a permission; an archived
thread leaves the thread list unless asked for, and comes back when unarchived."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import STEP_TIMEOUT, Daemon, base_config, new_thread, profile_toml
from test_users_e2e import add_user, bearer, transcript_until

pytestmark = pytest.mark.timeout(90)


async def search(http: httpx.AsyncClient, headers: dict[str, str], q: str, **params: Any) -> list[dict[str, Any]]:
    r = await http.get("/v1/search", params={"q": q, **params}, headers=headers)
    assert r.status_code == 200, r.text
    return list(r.json()["hits"])


async def test_search_finds_prompts_answers_and_tools_and_refuses_bad_input(daemon: Daemon) -> None:
    tid = (await new_thread(daemon, "stream-json"))["id"]
    c = await daemon.ws(tid)
    await c.turn("tool")
    end = await c.turn("hello aardvark")
    async with daemon.http() as http:
        hits = await search(http, daemon.headers, "aardvark")
        # the answer (its deltas replaced by the complete message) and the prompt, newest first
        assert [(h["thread"], h["kind"]) for h in hits] == [(tid, "message"), (tid, "message")], hits
        assert hits[0]["seq"] > hits[1]["seq"] and hits[0]["seq"] < end["seq"]
        assert hits[0]["snippet"] == "echo: hello aardvark"
        assert [hits[0]["snippet"][a : a + n] for a, n in hits[0]["marks"]] == ["aardvark"]
        events = (await http.get(f"/v1/threads/{tid}/events", headers=daemon.headers)).json()["events"]
        by_seq = {e["seq"]: e for e in events}
        assert (
            by_seq[hits[1]["seq"]]["source"] == "client" and by_seq[hits[1]["seq"]]["data"]["text"] == "hello aardvark"
        )
        assert hits[1]["ts"] == by_seq[hits[1]["seq"]]["ts"]
        # tool input and output
        assert [h["kind"] for h in await search(http, daemon.headers, '"echo hi"')] == ["tool.call"]
        assert [h["kind"] for h in await search(http, daemon.headers, "hi -echo")] == ["tool.result"]
        # pages
        first = await http.get("/v1/search", params={"q": "aardvark", "limit": 1}, headers=daemon.headers)
        page = first.json()
        assert len(page["hits"]) == 1 and page["next_cursor"]
        r = await http.get(
            "/v1/search", params={"q": "aardvark", "limit": 1, "cursor": page["next_cursor"]}, headers=daemon.headers
        )
        assert r.json()["hits"] == hits[1:] and r.json()["next_cursor"] is None
        # hostile input: FTS5 syntax is words, never an error; bad input is a 400 that says why
        for q in ["NEAR(aardvark", 'aardvark"', "col:aardvark", "aardvark*", "( x", "日本語 ünïcödé"]:
            r = await http.get("/v1/search", params={"q": q}, headers=daemon.headers)
            assert r.status_code == 200, (q, r.text)
        for params, code in (
            ({"q": ""}, "invalid_query"),
            ({"q": "*** ((("}, "invalid_query"),
            ({"q": "a" * 5000}, "invalid_query"),
            ({"q": "x", "limit": 0}, "invalid_request"),
            ({"q": "x", "limit": 101}, "invalid_request"),
            ({"q": "x", "cursor": "bogus"}, "invalid_cursor"),
            ({}, "invalid_request"),
        ):
            r = await http.get("/v1/search", params=params, headers=daemon.headers)
            assert r.status_code == 400 and r.json()["error"]["code"] == code, (params, r.text)
        async with httpx.AsyncClient(base_url=daemon.url, timeout=STEP_TIMEOUT) as anonymous:
            assert (await anonymous.get("/v1/search", params={"q": "x"})).status_code == 401
        # a deleted thread's events are no longer found
        assert (await http.delete(f"/v1/threads/{tid}", headers=daemon.headers)).status_code == 204
        assert await search(http, daemon.headers, "aardvark") == []


@pytest.fixture
def users_url(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if store_kind == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"
    return str(request.getfixturevalue("pg_url"))


async def test_each_user_searches_only_their_own_threads(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str], users_url: str
) -> None:
    tok = {n: await add_user(users_url, n, admin=n == "root") for n in ("alice", "bob", "root")}
    config = base_config(tmp_path, agent_env) + f'\n[auth]\nmode = "users"\n\n[store]\nurl = {json.dumps(users_url)}\n'
    d: Daemon = await daemon_factory(config)
    owned: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        for name in ("alice", "bob"):
            r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=bearer(tok[name]))
            assert r.status_code == 201, r.text
            owned[name] = r.json()["id"]
            text = f"pangolin report by {name}"
            r = await http.post(f"/v1/threads/{owned[name]}/messages", json={"text": text}, headers=bearer(tok[name]))
            assert r.status_code == 202, r.text
            await transcript_until(http, owned[name], tok[name], lambda e: e["kind"] == "turn.ended")
        async with asyncio.timeout(STEP_TIMEOUT):
            for name in ("alice", "bob"):
                hits = await search(http, bearer(tok[name]), "pangolin")
                assert {h["thread"] for h in hits} == {owned[name]}, (name, hits)
                assert await search(http, bearer(tok[name]), "alice" if name == "bob" else "bob") == []
            everyone = await search(http, bearer(tok["root"]), "pangolin")
            assert {h["thread"] for h in everyone} == set(owned.values())
            assert {h["thread"] for h in await search(http, d.headers, "pangolin")} == set(owned.values())


async def test_export_as_jsonl_and_markdown(daemon_factory: Callable[..., Any], agent_env: dict[str, str]) -> None:
    d: Daemon = await daemon_factory(profile_toml("sj", "stream-json", agent_env, permission_prompts=True))
    tid = (await new_thread(d, "sj", title="Export me"))["id"]
    c = await d.ws(tid)
    await c.turn("tool")
    acc = await c.prompt("ask")
    assert acc["kind"] == "client.accepted", acc
    req = await c.kind("permission.requested")
    await c.send(op="permission", request_id=req["data"]["request_id"], decision="allow")
    await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    await c.turn("fences ```` inside")
    async with d.http() as http:
        events = (await http.get(f"/v1/threads/{tid}/events", params={"limit": 1000})).json()["events"]
        r = await http.get(f"/v1/threads/{tid}/export", params={"format": "jsonl"})
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        assert r.headers["content-disposition"] == f'attachment; filename="{tid}.jsonl"'
        assert r.text.endswith("\n") and [json.loads(line) for line in r.text.splitlines()] == events
        r = await http.get(f"/v1/threads/{tid}/export")  # markdown by default
        assert r.status_code == 200 and r.headers["content-type"] == "text/markdown; charset=utf-8", r.text
        md = r.text
        assert md.startswith(f"# Export me\n\nthread `{tid}` · agent `sj`")
        order = [
            "## User",
            "\ntool\n",
            "### Tool: Bash (completed)",
            '"command": "echo hi"',
            "Output:\n\n```\nhi\n```",
            "## Assistant",
            "tool done",
            "*Turn ended: success*",
            "\nask\n",
            "### Permission asked: Bash — allow",
            '"command": "touch x"',
            "permission: allow",
            "echo: fences ```` inside",
        ]
        at = [md.find(s) for s in order]
        assert -1 not in at and at == sorted(at), list(zip(order, at, strict=True))
        assert md.count("*Turn ended: success*") == 3
        for params, status in (({"format": "xml"}, 400), ({}, 404)):
            path = f"/v1/threads/{tid if status == 400 else 'thr_0000000000000000'}/export"
            r = await http.get(path, params=params)
            assert r.status_code == status, r.text


async def test_archive_and_unarchive(daemon: Daemon) -> None:
    kept = (await new_thread(daemon, "stream-json"))["id"]
    old = (await new_thread(daemon, "stream-json", title="old work"))["id"]
    c = await daemon.ws(old)
    await c.turn("ocelot sighting")
    async with daemon.http() as http:

        async def listed(**params: str) -> list[str]:
            r = await http.get("/v1/threads", params=params)
            assert r.status_code == 200, r.text
            return [t["id"] for t in r.json()["threads"]]

        assert (await http.get(f"/v1/threads/{old}")).json()["archived"] is False
        r = await http.patch(f"/v1/threads/{old}", json={"archived": True})
        assert r.status_code == 200 and r.json()["archived"] is True and r.json()["title"] == "old work", r.text
        assert (await http.get(f"/v1/threads/{old}")).json()["archived"] is True
        assert await listed() == [kept]
        assert await listed(archived="1") == [old]
        assert set(await listed(archived="all")) == {kept, old}
        # still searched, and still a thread: it takes a prompt like any other
        assert {h["thread"] for h in await search(http, daemon.headers, "ocelot")} == {old}
        await c.turn("more")
        r = await http.patch(f"/v1/threads/{old}", json={"archived": False, "title": "back"})
        assert r.status_code == 200 and r.json()["archived"] is False and r.json()["title"] == "back", r.text
        assert set(await listed()) == {kept, old} and await listed(archived="1") == []
        for body in ({}, {"archived": "maybe"}, {"archived": True, "other": 1}):
            r = await http.patch(f"/v1/threads/{old}", json=body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", (body, r.text)
        r = await http.get("/v1/threads", params={"archived": "yes"})
        assert r.status_code == 400, r.text
