"""Forking a thread on a real daemon with the fake agents (issue #38 item 1, docs/api.md
§4.26): at the end and at an earlier seq (rounded down to a turn's end), the fork's
transcript the source's up to there under the same seqs, its agent knowing those turns and
nothing later (the fake stream-json agent's ``--resume --fork-session
--resume-session-at``, the fake ACP agent's ``session/fork``; ``recall`` says what a
session holds), the source unaffected; usage counted once; search finding the copy under
the fork; the refusals (409 turn_active / fork_not_supported, 400 for a bad after_seq,
404 for a thread the caller may not see, 422 when the agent's profile is gone)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import STEP_TIMEOUT, Daemon, agent_log, new_thread, profile_toml
from test_acp_e2e import acp_profile
from test_users_e2e import add_user, bearer

pytestmark = pytest.mark.timeout(150)


def config(env: dict[str, str], store: str = "", *, sj: bool = True) -> str:
    return (
        "[server]\nstop_grace_s = 1\n\n"
        + (profile_toml("sj", "stream-json", env) if sj else "")
        + profile_toml("awp", "awp-jsonl", env)
        + acp_profile("acp", env, "--fork-cap")
        + acp_profile("acpold", env)
        + (f"\n[store]\nurl = {json.dumps(store)}\n" if store else "")
    )


async def fork(d: Daemon, tid: str, status: int = 201, **body: Any) -> dict[str, Any]:
    async with d.http() as http:
        r = await http.post(f"/v1/threads/{tid}/fork", json=body)
    assert r.status_code == status, r.text
    return dict(r.json())


async def events(d: Daemon, tid: str) -> list[dict[str, Any]]:
    async with d.http() as http:
        r = await http.get(f"/v1/threads/{tid}/events", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return list(r.json()["events"])


def said(frame: dict[str, Any]) -> str:
    return str(frame["data"].get("text", ""))


async def recall(d: Daemon, tid: str) -> str:
    """What the thread's agent session holds: the fake's ``recall`` answer (its streamed
    text, as every dialect streams it)."""
    c = await d.ws(tid)
    acc = await c.prompt("recall")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    text = "".join(
        said(f)
        for f in c.frames
        if f.get("kind") == "message.delta"
        and f["data"].get("channel", "text") == "text"
        and f["seq"] < end["seq"]
        and f["seq"] > acc["data"]["seq"]
    )
    await c.close()
    return text


async def test_a_fork_at_the_end_and_at_an_earlier_seq_knows_only_the_turns_before_it(
    daemon_factory: Any, agent_env: dict[str, str], daemon_store: str
) -> None:
    d = await daemon_factory(config(agent_env, daemon_store))
    src = (await new_thread(d, "sj", title="Source"))["id"]
    c = await d.ws(src)
    ends = [await c.turn(w) for w in ("alpha", "bravo", "charlie")]
    await c.close()
    source_events = await events(d, src)
    mid_second = next(
        e["seq"] for e in source_events if e["kind"] == "message" and e["source"] == "agent" and "bravo" in said(e)
    )

    at_end = await fork(d, src)
    assert at_end["forked_from"] == {"thread": src, "seq": ends[2]["seq"]}
    assert at_end["title"] == "Source" and at_end["agent"] == "sj" and at_end["id"] != src
    assert at_end["last_seq"] == ends[2]["seq"]
    # the copy: the source's events up to the fork point, same seqs, same content
    copied = await events(d, at_end["id"])
    assert [(e["seq"], e["kind"], e["data"]) for e in copied] == [
        (e["seq"], e["kind"], e["data"]) for e in source_events if e["seq"] <= ends[2]["seq"]
    ]
    # an earlier seq is rounded down to the end of the last turn that ended by then
    earlier = await fork(d, src, after_seq=mid_second, title="Mine")
    assert earlier["forked_from"] == {"thread": src, "seq": ends[0]["seq"]} and earlier["title"] == "Mine"
    assert [e["seq"] for e in await events(d, earlier["id"])] == list(range(1, ends[0]["seq"] + 1))
    second = await fork(d, src, after_seq=ends[1]["seq"])
    assert second["forked_from"]["seq"] == ends[1]["seq"]

    # What each agent knows: the fake's own session store says it.
    assert await recall(d, earlier["id"]) == "history: alpha"
    assert await recall(d, second["id"]) == "history: alpha | bravo"
    assert await recall(d, at_end["id"]) == "history: alpha | bravo | charlie"
    # The source is unaffected: its session holds neither the forks' prompts nor a cut.
    assert await recall(d, src) == "history: alpha | bravo | charlie"
    starts = [e for e in agent_log(d.tmp) if e.get("event") == "start" and "--fork-session" in e["argv"]]
    assert len(starts) == 3 and sum(any(a.startswith("--resume-session-at=") for a in e["argv"]) for e in starts) == 3
    # Once it reported its own session, a fork resumes that one: no second copy.
    assert await recall(d, earlier["id"]) == "history: alpha | recall"
    assert len([e for e in agent_log(d.tmp) if e.get("event") == "forked"]) == 3

    async with d.http() as http:
        # Usage: every real turn once. A fork's totals are its own turns only.
        r = await http.get("/v1/usage", params={"group_by": "thread"})
        assert r.status_code == 200, r.text
        turns = {g["key"]: g["usage"]["turns"] for g in r.json()["groups"]}
        assert turns == {src: 4, at_end["id"]: 1, earlier["id"]: 2, second["id"]: 1}
        assert r.json()["total"]["turns"] == 8
        thread = (await http.get(f"/v1/threads/{earlier['id']}")).json()
        assert thread["usage"]["turns"] == 2 and thread["forked_from"] == {"thread": src, "seq": ends[0]["seq"]}
        # Search finds the copy under the fork too: it is the caller's thread.
        r = await http.get("/v1/search", params={"q": "charlie"})
        assert r.status_code == 200, r.text
        assert {h["thread"] for h in r.json()["hits"]} == {src, at_end["id"]}


async def test_refusals_409_400_and_a_fork_of_nothing(
    daemon_factory: Any, agent_env: dict[str, str], tmp_path: Path
) -> None:
    d = await daemon_factory(config(agent_env))
    src = (await new_thread(d, "sj"))["id"]
    empty = await fork(d, src)  # nothing said yet: a fork of nothing, a fresh session
    assert empty["forked_from"] == {"thread": src, "seq": 0} and empty["last_seq"] == 0
    c = await d.ws(src)
    first = await c.turn("first")
    acc = await c.prompt("slow")  # a running turn
    tick = await c.kind("message.delta")
    body = await fork(d, src, 409)
    assert body["error"]["code"] == "turn_active"
    during = await fork(d, src, after_seq=tick["seq"])  # the running turn is not taken
    assert during["forked_from"]["seq"] == first["seq"]
    await c.send(op="interrupt")
    await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    await c.close()
    last = (await events(d, src))[-1]["seq"]
    async with d.http() as http:
        for bad in (-1, "3", 1.5, True, 2**60, [1]):
            r = await http.post(f"/v1/threads/{src}/fork", json={"after_seq": bad})
            assert r.status_code == 400, (bad, r.text)
            assert r.json()["error"]["code"] == "invalid_request"
        r = await http.post(f"/v1/threads/{src}/fork", json={"after_seq": last + 1})
        assert r.status_code == 400 and "beyond" in r.json()["error"]["message"], r.text
        r = await http.post(f"/v1/threads/{src}/fork", json={"at": 1})
        assert r.status_code == 400, r.text
        r = await http.post("/v1/threads/thr_nope/fork", json={})
        assert r.status_code == 404 and r.json()["error"]["code"] == "thread_not_found", r.text

    # awp-jsonl's contract has no fork: refused once there is something to know.
    awp = (await new_thread(d, "awp"))["id"]
    a = await d.ws(awp)
    await a.turn("hello")
    await a.close()
    assert (await fork(d, awp, 409))["error"]["code"] == "fork_not_supported"
    assert (await fork(d, awp, after_seq=0))["forked_from"]["seq"] == 0

    # An ACP agent that offers session/fork: the end only; one that does not: refused.
    acp = (await new_thread(d, "acp"))["id"]
    p = await d.ws(acp)
    one = await p.turn("one")
    await p.turn("two")
    await p.close()
    assert (await fork(d, acp, 409, after_seq=one["seq"]))["error"]["code"] == "fork_not_supported"
    acp_fork = await fork(d, acp)
    assert await recall(d, acp_fork["id"]) == "history: one | two"
    assert await recall(d, acp) == "history: one | two"
    forks = [e for e in agent_log(d.tmp) if e.get("event") == "session_fork"]
    assert len(forks) == 1 and forks[0]["copied"] == 4
    old = (await new_thread(d, "acpold"))["id"]
    o = await d.ws(old)
    await o.turn("one")
    await o.close()
    assert (await fork(d, old, 409))["error"]["code"] == "fork_not_supported"

    # The source's agent profile gone (the daemon restarted without it): as its prompts are.
    assert await d.stop() == 0
    d2 = await daemon_factory(config(agent_env, sj=False))
    gone = await fork(d2, src, 422)
    assert gone["error"]["code"] == "agent_not_found"


async def test_users_mode_forks_only_what_you_may_see_and_the_fork_is_yours(
    daemon_factory: Any, agent_env: dict[str, str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"
    tok = {n: await add_user(url, n, admin=n == "root") for n in ("alice", "bob", "root")}
    cfg = config(agent_env) + f'\n[auth]\nmode = "users"\n\n[store]\nurl = {json.dumps(url)}\n'
    d: Daemon = await daemon_factory(cfg)
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        r = await http.post("/v1/threads", json={"agent": "sj"}, headers=bearer(tok["alice"]))
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        r = await http.post(f"/v1/threads/{tid}/fork", json={}, headers=bearer(tok["bob"]))
        assert r.status_code == 404 and r.json()["error"]["code"] == "thread_not_found", r.text
        r = await http.post(f"/v1/threads/{tid}/fork", json={}, headers=bearer(tok["alice"]))
        assert r.status_code == 201 and r.json()["owner"] == "alice", r.text
        # An admin may see it, but the fork would run in alice's workspace, which is hers
        # alone (the cwd rule of a thread's creation holds for a fork too).
        r = await http.post(f"/v1/threads/{tid}/fork", json={}, headers=bearer(tok["root"]))
        assert r.status_code == 403 and r.json()["error"]["code"] == "cwd_not_allowed", r.text
        mine = await http.get("/v1/threads", headers=bearer(tok["bob"]))
        assert mine.json()["threads"] == []
