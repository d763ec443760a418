"""Where agents run and what they call home (issue #32, bridge/userdirs.py), through real
daemons: the data dir is nobody's ``cwd`` (admin and operator included, through a symlink,
or a symlink swapped in after creation), each user's agents get their own HOME, native
sessions are listed and adopted per user, a non-admin's ``cwd`` lies under their
workspace roots, and a non-admin is never shown where the data dir is."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import (
    PYTHON,
    ROOT,
    STEP_TIMEOUT,
    TOKEN,
    Daemon,
    agent_log,
    base_config,
    profile_toml,
)
from test_users_e2e import add_user, bearer, frames_until, marked, sse_until, transcript_until, ws_as

from bridge.protocols.native_sessions import claude_project_dir

pytestmark = pytest.mark.timeout(120)
HOME_AGENT = ROOT / "tests" / "agents" / "home_agent.py"
MARK = "<data-dir>"


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"


def users_cfg(tmp_path: Path, agent_env: dict[str, str], auth: str = "", profiles: str = "") -> str:
    return (
        base_config(tmp_path, agent_env)
        + profiles
        + f'\n[auth]\nmode = "users"\n{auth}\n[store]\nurl = {json.dumps(sqlite_url(tmp_path))}\n'
    )


async def users(tmp_path: Path) -> dict[str, str]:
    url = sqlite_url(tmp_path)
    return {n: await add_user(url, n, admin=n == "root") for n in ("alice", "bob", "root")}


def code_of(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json().get("error", {}).get("code", "") if r.status_code >= 400 else ""


async def answer_of(http: httpx.AsyncClient, tid: str, token: str, seq: int) -> str:
    """The agent's reply to the prompt at ``seq``, once its turn ended."""
    events = await transcript_until(http, tid, token, lambda e: e["seq"] > seq and e["kind"] == "turn.ended")
    return "".join(
        e["data"].get("text", "")
        for e in events
        if e["seq"] > seq and e["kind"] == "message" and e["data"].get("role") == "assistant"
    )


async def turn(http: httpx.AsyncClient, tid: str, token: str, text: str) -> str:
    r = await http.post(f"/v1/threads/{tid}/messages", json={"text": text}, headers=bearer(token))
    assert r.status_code == 202, r.text
    return await answer_of(http, tid, token, r.json()["seq"])


def starts(tmp_path: Path) -> list[dict[str, Any]]:
    return [e for e in agent_log(tmp_path) if e.get("event") == "start"]


# --------------------------------------------------------------------------- B1


@pytest.mark.parametrize("mode", ["token", "users"])
async def test_the_data_dir_is_nobodys_working_directory(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str], mode: str
) -> None:
    tok = await users(tmp_path) if mode == "users" else {}
    cfg = users_cfg(tmp_path, agent_env) if mode == "users" else base_config(tmp_path, agent_env)
    d: Daemon = await daemon_factory(cfg)
    data = d.data_dir
    (tmp_path / "innocent").symlink_to(data)  # a path that does not look like it
    (data / "workspaces").mkdir(exist_ok=True)
    callers = {"operator": {"Authorization": f"Bearer {TOKEN}"}} | {
        n: bearer(t) for n, t in tok.items() if n in ("root", "alice")
    }
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        for who, headers in callers.items():
            for cwd in (data, data / "workspaces", tmp_path / "innocent", tmp_path / "innocent" / "workspaces"):
                r = await http.post("/v1/threads", json={"agent": "stream-json", "cwd": str(cwd)}, headers=headers)
                assert code_of(r) == (403, "cwd_not_allowed"), (who, cwd, r.text)
                # Nor is an agent started there to list its sessions.
                r = await http.get("/v1/agents/stream-json/sessions", params={"cwd": str(cwd)}, headers=headers)
                assert code_of(r) == (403, "cwd_not_allowed"), (who, cwd, r.text)
        r = await http.get("/v1/threads", headers=d.headers)
        assert r.json()["threads"] == []  # nothing was created

        # A thread workspace in it is its owner's to use again, and nobody else's.
        owner = callers["alice"] if mode == "users" else d.headers
        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=owner)
        assert r.status_code == 201, r.text
        workspace = data / "workspaces" / r.json()["id"]
        (workspace / "sub").mkdir()
        for cwd in (workspace, workspace / "sub"):
            r = await http.post("/v1/threads", json={"agent": "stream-json", "cwd": str(cwd)}, headers=owner)
            assert r.status_code == 201, r.text
            assert r.json()["cwd"] == (f"{MARK}{str(cwd)[len(str(data)) :]}" if mode == "users" else str(cwd))
        if mode == "users":
            for who in ("root", "operator"):  # an admin may see it, not run an agent in it
                r = await http.post(
                    "/v1/threads", json={"agent": "stream-json", "cwd": str(workspace)}, headers=callers[who]
                )
                assert code_of(r) == (403, "cwd_not_allowed"), (who, r.text)

        # A directory swapped, after the thread was created, for a symlink into another's
        # home in the data dir (a place the sandbox lets an agent own, as it must for that
        # user's agents): refused right before the spawn, and nothing is spawned.
        if mode == "users":
            r = await http.get("/v1/workspace/dirs", headers=owner)  # makes Alice's root
            assert r.json()["dirs"] == [
                {"name": f"{MARK}/workspaces/users/alice", "path": f"{MARK}/workspaces/users/alice"}
            ]
            proj = data / "workspaces" / "users" / "alice" / "proj"
        else:
            proj = tmp_path / "proj"
        proj.mkdir()
        r = await http.post("/v1/threads", json={"agent": "stream-json", "cwd": str(proj)}, headers=owner)
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        proj.rename(proj.with_name("proj-was"))
        bobs = data / "homes" / "bob"
        bobs.mkdir(parents=True)
        proj.symlink_to(bobs)
        r = await http.post(f"/v1/threads/{tid}/messages", json={"text": "read token"}, headers=owner)
        assert code_of(r) == (422, "cwd_not_allowed"), r.text
        assert starts(tmp_path) == []  # no agent ever started in this test


# --------------------------------------------------------------------------- homes


async def test_each_users_agents_get_their_own_home(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    tok = await users(tmp_path)
    d: Daemon = await daemon_factory(users_cfg(tmp_path, agent_env))
    data = os.path.realpath(d.data_dir)
    homes: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        for name, token in [("alice", tok["alice"]), ("bob", tok["bob"]), ("root", tok["root"]), ("operator", TOKEN)]:
            r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=bearer(token))
            tid = r.json()["id"]
            await turn(http, tid, token, "hello")
            [start] = [s for s in starts(tmp_path) if s["cwd"] == os.path.join(data, "workspaces", tid)]
            homes[name] = start["env"]["HOME"]
    for name in ("alice", "bob", "root"):
        assert homes[name] == os.path.join(data, "homes", name), homes
        assert stat.S_IMODE(os.stat(homes[name]).st_mode) == 0o700
    # The operator is nobody's user: its agents keep the daemon's own HOME.
    assert homes["operator"] == os.environ["HOME"]


async def test_a_user_lists_and_adopts_only_the_native_sessions_in_their_own_home(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    shared = tmp_path / "shared"  # one root for everyone: only the homes tell users apart
    shared.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    claude = bin_dir / "claude"  # recognised as Claude Code: its session files are listed
    claude.write_text("#!/bin/sh\nexit 1\n")
    claude.chmod(0o755)
    profiles = f'[agents.claude]\nprotocol = "stream-json"\nexecutable = {json.dumps(str(claude))}\n\n' + profile_toml(
        "home", "stream-json", agent_env
    ).replace(json.dumps(str(ROOT / "tests" / "agents" / "fake_agent.py")), json.dumps(str(HOME_AGENT)))
    assert str(HOME_AGENT) in profiles and PYTHON in profiles
    tok = await users(tmp_path)
    d: Daemon = await daemon_factory(
        users_cfg(tmp_path, agent_env, f"user_workspace_roots = [{json.dumps(str(shared))}]\n", profiles)
    )
    ids = {"alice": "aaaaaaaa-1111-4111-8111-aaaaaaaaaaaa", "bob": "bbbbbbbb-2222-4222-8222-bbbbbbbbbbbb"}
    for name, sid in ids.items():
        store = d.data_dir / "homes" / name / ".claude" / "projects" / claude_project_dir(str(shared))
        store.mkdir(parents=True)
        line = {"type": "user", "message": {"role": "user", "content": f"{name}'s plan"}}
        (store / f"{sid}.jsonl").write_text(json.dumps(line) + "\n")
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        for name, sid in ids.items():
            r = await http.get("/v1/agents/claude/sessions", params={"cwd": str(shared)}, headers=bearer(tok[name]))
            assert r.status_code == 200, r.text
            assert [(s["id"], s["title"]) for s in r.json()["sessions"]] == [(sid, f"{name}'s plan")], r.text

        # Alice's agent keeps a session in her home; Bob may adopt its id, but his agent,
        # with his HOME, finds nothing of it. Alice adopts it and her agent resumes it.
        r = await http.post("/v1/threads", json={"agent": "home", "cwd": str(shared)}, headers=bearer(tok["alice"]))
        assert r.status_code == 201, r.text
        first = r.json()["id"]
        await turn(http, first, tok["alice"], "remember the word KIWI")
        native = (await http.get(f"/v1/threads/{first}", headers=bearer(tok["alice"]))).json()["native_session_id"]
        assert native
        recalled = {}
        for name in ("bob", "alice"):
            body = {"agent": "home", "cwd": str(shared), "native_session_id": native}
            r = await http.post("/v1/threads", json=body, headers=bearer(tok[name]))
            assert r.status_code == 201, r.text
            recalled[name] = await turn(http, r.json()["id"], tok[name], "recall")
        assert "KIWI" in recalled["alice"] and "KIWI" not in recalled["bob"], recalled
    assert os.path.isdir(d.data_dir / "homes" / "alice" / ".fake-agent" / "sessions")


# --------------------------------------------------------------------------- roots


async def test_a_users_cwd_lies_under_their_workspace_roots(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    tok = await users(tmp_path)
    d: Daemon = await daemon_factory(users_cfg(tmp_path, agent_env))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        for name in ("alice", "bob"):  # each root made on first need, 0700
            r = await http.get("/v1/workspace/dirs", headers=bearer(tok[name]))
            root = f"{MARK}/workspaces/users/{name}"
            assert r.json() == {
                "path": None,
                "parent": None,
                "dirs": [{"name": root, "path": root}],
                "truncated": False,
            }
        alice_root = d.data_dir / "workspaces" / "users" / "alice"
        assert stat.S_IMODE(alice_root.stat().st_mode) == 0o700
        (alice_root / "app").mkdir()
        (alice_root / "out").symlink_to(elsewhere)

        def create(token: str, cwd: str | None) -> Any:
            body = {"agent": "stream-json"} | ({"cwd": cwd} if cwd else {})
            return http.post("/v1/threads", json=body, headers=bearer(token))

        # The picker's own paths are good input.
        r = await http.get(
            "/v1/workspace/dirs", params={"path": f"{MARK}/workspaces/users/alice"}, headers=bearer(tok["alice"])
        )
        assert r.status_code == 200 and [x["path"] for x in r.json()["dirs"]] == [f"{MARK}/workspaces/users/alice/app"]
        r = await create(tok["alice"], f"{MARK}/workspaces/users/alice/app")
        assert r.status_code == 201 and r.json()["cwd"] == f"{MARK}/workspaces/users/alice/app", r.text
        r = await create(tok["alice"], str(alice_root / "app"))
        assert r.status_code == 201, r.text
        r = await create(tok["alice"], None)  # a fresh workspace of her own
        assert r.status_code == 201 and r.json()["cwd"].startswith(f"{MARK}/workspaces/thr_"), r.text
        for cwd in (str(elsewhere), str(alice_root / "out"), str(d.data_dir / "workspaces" / "users" / "bob"), "/"):
            r = await create(tok["alice"], cwd)
            assert code_of(r) == (403, "cwd_not_allowed"), (cwd, r.text)
        r = await create(tok["root"], str(elsewhere))  # an admin is not held to roots,
        assert r.status_code == 201 and r.json()["cwd"] == str(elsewhere), r.text
        r = await create(tok["root"], str(alice_root / "app"))  # and Alice's are hers
        assert code_of(r) == (403, "cwd_not_allowed"), r.text
        r = await http.get(
            "/v1/workspace/dirs",
            params={"path": str(d.data_dir / "workspaces" / "users" / "bob")},
            headers=bearer(tok["alice"]),
        )
        assert code_of(r) == (403, "path_outside_roots")


# --------------------------------------------------------------------------- paths shown


async def test_a_non_admin_is_never_shown_the_data_dirs_path(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    tok = await users(tmp_path)
    d: Daemon = await daemon_factory(users_cfg(tmp_path, agent_env))
    data = str(d.data_dir)
    real = os.path.realpath(data)
    alice = bearer(tok["alice"])
    seen: list[str] = []
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        changes = await ws_as(d, "/v1/ws", tok["alice"])
        assert json.loads(await changes.recv())["kind"] == "ready"
        connected = asyncio.Event()
        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=alice)
        tid = r.json()["id"]
        sse = asyncio.create_task(sse_until(d, "/v1/events", tok["alice"], marked(tid), connected))
        await asyncio.wait_for(connected.wait(), STEP_TIMEOUT)
        seen.append(r.text)
        r = await http.patch(f"/v1/threads/{tid}", json={"title": "marker"}, headers=alice)
        seen.append(r.text)
        seen += [json.dumps(f) for f in await frames_until(changes, marked(tid))]
        seen += [json.dumps(f) for f in await asyncio.wait_for(sse, STEP_TIMEOUT)]
        await changes.close()
        gone = d.data_dir / "workspaces" / "users" / "alice" / "gone"
        for path in ("/v1/me", "/v1/agents", "/v1/workspace/dirs", f"/v1/threads/{tid}", "/v1/threads"):
            seen.append((await http.get(path, headers=alice)).text)
        gone.mkdir()
        r = await http.get("/v1/workspace/dirs", params={"path": f"{MARK}/workspaces/users/alice"}, headers=alice)
        seen.append(r.text)
        assert "gone" in r.text
        r = await http.get("/v1/agents/stream-json/sessions", params={"cwd": str(gone)}, headers=alice)
        assert r.status_code == 200, r.text
        seen.append(r.text)
        # A thread whose directory is gone: the refusal names it, not where it is.
        r = await http.post("/v1/threads", json={"agent": "stream-json", "cwd": str(gone)}, headers=alice)
        seen.append(r.text)
        gone_tid = r.json()["id"]
        gone.rmdir()
        r = await http.post(f"/v1/threads/{gone_tid}/messages", json={"text": "hi"}, headers=alice)
        assert code_of(r) == (422, "bad_cwd"), r.text
        seen.append(r.text)
        conn = await ws_as(d, f"/v1/threads/{gone_tid}/ws", tok["alice"])
        await conn.send(json.dumps({"op": "prompt", "text": "hi"}))
        frames = await frames_until(conn, lambda f: f.get("kind") == "client.rejected")
        await conn.close()
        assert frames[-1]["data"]["code"] == "bad_cwd"
        seen += [json.dumps(f) for f in frames]
        r = await http.post("/v1/threads", json={"agent": "stream-json", "cwd": data + "/nope"}, headers=alice)
        assert code_of(r) == (400, "bad_cwd")

        # An admin sees where things are.
        r = await http.get(f"/v1/threads/{tid}", headers=bearer(tok["root"]))
        assert r.json()["cwd"] == os.path.join(real, "workspaces", tid)
    for text in seen:
        assert data not in text and real not in text, text
    assert any(f"{MARK}/workspaces/{tid}" in text for text in seen)
