"""Users mode end to end (issue #20): real daemons in ``[auth] mode = "users"`` on both
stores, users added and revoked with the real ``agent-bridge users`` command, two users and
an admin on every thread route (REST, long-poll, SSE, WebSocket, permissions, tasks,
``/v1/events``, ``/v1/ws``), a spoofed proxy header from an untrusted peer, per-user caps,
revocation across two replicas (PostgreSQL), and no token in clear in the logs or the data
dir after a whole session."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
import websockets.exceptions
from conftest import STEP_TIMEOUT, Client, Daemon, base_config

pytestmark = pytest.mark.timeout(90)
GHOST = "thr_0000000000000000"
UNTRUSTED_PROXY_CFG = """
[auth]
mode = "users"
proxy_user_header = "X-Forwarded-User"
proxy_trusted = ["10.255.255.1/32"]
max_conversations_per_user = 1
"""


@pytest.fixture
def users_url(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if store_kind == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"  # the daemon's own data dir
    return str(request.getfixturevalue("pg_url"))


def users_config(tmp_path: Path, agent_env: dict[str, str], url: str) -> str:
    return base_config(tmp_path, agent_env) + UNTRUSTED_PROXY_CFG + f"\n[store]\nurl = {json.dumps(url)}\n"


async def users_cli(url: str, *args: str) -> tuple[int, str, str]:
    """The real ``agent-bridge users …`` against the store URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "users",
        *args,
        "--store-url",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), STEP_TIMEOUT * 2)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def add_user(url: str, name: str, *, admin: bool = False) -> str:
    rc, out, err = await users_cli(url, "add", name, *(["--admin"] if admin else []))
    assert rc == 0, err
    token = out.strip()
    assert token.startswith("abu_") and len(token) > 40 and "\n" not in token, out
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def ws_as(d: Daemon, path: str, token: str) -> Any:
    return await websockets.connect(
        f"{d.ws_url}{path}", additional_headers=bearer(token), open_timeout=STEP_TIMEOUT, max_size=None
    )


async def close_code(conn: Any, timeout: float = STEP_TIMEOUT) -> int:
    """Read until the server closes; its close code."""
    with pytest.raises(websockets.exceptions.ConnectionClosed) as info:
        async with asyncio.timeout(timeout):
            while True:
                await conn.recv()
    assert info.value.rcvd is not None
    return int(info.value.rcvd.code)


async def frames_until(conn: Any, pred: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(STEP_TIMEOUT):
        while not seen or not pred(seen[-1]):
            seen.append(json.loads(await conn.recv()))
    return seen


async def sse_until(
    d: Daemon,
    path: str,
    token: str,
    pred: Callable[[dict[str, Any]], bool],
    connected: asyncio.Event | None = None,
) -> list[dict[str, Any]]:
    """An SSE stream's data frames, up to the first that satisfies ``pred``; ``connected``
    is set at the first frame."""
    seen: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as c, asyncio.timeout(STEP_TIMEOUT):
        async with c.stream("GET", path, headers=bearer(token)) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))
                    if connected is not None:
                        connected.set()
                    if pred(seen[-1]):
                        return seen
    raise AssertionError(f"the stream ended first: {seen}")


async def transcript_until(
    http: httpx.AsyncClient, tid: str, token: str, pred: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(STEP_TIMEOUT * 2):
        while not any(pred(e) for e in seen):
            after = seen[-1]["seq"] if seen else 0
            r = await http.get(f"/v1/threads/{tid}/events", params={"after": after, "wait": 5}, headers=bearer(token))
            assert r.status_code == 200, r.text
            seen += r.json()["events"]
    return seen


def marked(tid: str) -> Callable[[dict[str, Any]], bool]:
    return lambda f: f.get("thread", {}).get("id") == tid and f["thread"].get("title") == "marker"


def thread_routes(tid: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    base = f"/v1/threads/{tid}"
    return [
        ("GET", base, None),
        ("PATCH", base, {"title": "mine now"}),
        ("PATCH", base, {"model": "their-model"}),  # a model switch (issue #38 item 2)
        ("POST", f"{base}/messages", {"text": "hello from someone else"}),
        ("POST", f"{base}/interrupt", None),
        ("POST", f"{base}/resume", None),
        ("POST", f"{base}/stop", None),
        ("GET", f"{base}/permissions", None),
        ("POST", f"{base}/permissions/perm_1", {"decision": "allow"}),
        ("GET", f"{base}/tasks", None),
        ("GET", f"{base}/history", None),
        ("GET", f"{base}/events?after=0&wait=0.2", None),
        ("GET", f"{base}/events/stream", None),
        ("DELETE", base, None),
    ]


async def test_each_users_threads_are_theirs_on_every_route_and_an_admin_sees_all(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str], users_url: str
) -> None:
    tok = {n: await add_user(users_url, n, admin=n == "root") for n in ("alice", "bob", "root")}
    d: Daemon = await daemon_factory(users_config(tmp_path, agent_env, users_url))
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        for name, token in tok.items():
            r = await http.get("/v1/me", headers=bearer(token))
            assert r.json() == {"name": name, "admin": name == "root", "mode": "users"}, r.text
        r = await http.get("/v1/me", headers=d.headers)
        assert r.json() == {"name": "operator", "admin": True, "mode": "users"}
        # What is about the daemon, not a user's own threads: admins only. (Native sessions
        # are each user's own, in their own HOME: tests/test_userdirs_e2e.py.)
        for path in ("/v1/daemon", "/v1/cluster"):
            r = await http.get(path, headers=bearer(tok["bob"]))
            assert r.status_code == 403 and r.json()["error"]["code"] == "admin_required", (path, r.text)
            r = await http.get(path, headers=bearer(tok["root"]))
            assert r.status_code == 200, (path, r.text)

        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=bearer(tok["alice"]))
        assert r.status_code == 201 and r.json()["owner"] == "alice", r.text
        a = r.json()["id"]
        r = await http.post(f"/v1/threads/{a}/messages", json={"text": "mine"}, headers=bearer(tok["alice"]))
        assert r.status_code == 202, r.text
        events = await transcript_until(http, a, tok["alice"], lambda e: e["kind"] == "turn.ended")
        prompts = [e for e in events if e["source"] == "client" and e["kind"] == "message"]
        assert [p["data"].get("by") for p in prompts] == ["alice"]

        # Bob: every route of Alice's thread answers exactly as for a thread that does not exist.
        for tid in (a, GHOST):
            for method, path, body in thread_routes(tid):
                r = await http.request(method, path, json=body, headers=bearer(tok["bob"]))
                assert r.status_code == 404, (method, path, r.status_code, r.text)
                assert r.json() == {"error": {"code": "thread_not_found", "message": f"no thread {tid}"}}, path
            conn = await ws_as(d, f"/v1/threads/{tid}/ws", tok["bob"])
            assert await close_code(conn) == 4404
        r = await http.get("/v1/threads", headers=bearer(tok["bob"]))
        assert r.status_code == 200 and r.json()["threads"] == []

        # The admin sees and acts on it; the events record who acted.
        r = await http.get("/v1/threads", headers=bearer(tok["root"]))
        assert [(t["id"], t["owner"]) for t in r.json()["threads"]] == [(a, "alice")]
        r = await http.patch(f"/v1/threads/{a}", json={"title": "seen by root"}, headers=bearer(tok["root"]))
        assert r.status_code == 200 and r.json()["title"] == "seen by root"
        r = await http.post(f"/v1/threads/{a}/messages", json={"text": "admin here"}, headers=bearer(tok["root"]))
        assert r.status_code == 202, r.text
        seq = r.json()["seq"]
        events = await transcript_until(http, a, tok["alice"], lambda e: e["seq"] == seq)
        assert next(e for e in events if e["seq"] == seq)["data"]["by"] == "root"
        for path in (f"/v1/threads/{a}/permissions", f"/v1/threads/{a}/tasks"):
            assert (await http.get(path, headers=bearer(tok["root"]))).status_code == 200

        # Bob's own thread: his alone; the change streams show him only his own. Alice's
        # thread changes first, then Bob's: a stream that reaches Bob's change has passed
        # Alice's (both threads are quiet otherwise, so neither moves on past it).
        await transcript_until(http, a, tok["root"], lambda e: e["seq"] > seq and e["kind"] == "turn.ended")
        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=bearer(tok["bob"]))
        c = r.json()["id"]
        assert (await http.get(f"/v1/threads/{a}", headers=bearer(tok["root"]))).status_code == 200  # settled
        sockets = {n: await ws_as(d, "/v1/ws", tok[n]) for n in ("bob", "root")}
        for conn in sockets.values():
            assert json.loads(await conn.recv())["kind"] == "ready"
        sse: dict[str, asyncio.Task[list[dict[str, Any]]]] = {}
        for n in ("bob", "root"):
            connected = asyncio.Event()
            sse[n] = asyncio.create_task(sse_until(d, "/v1/events", tok[n], marked(c), connected))
            await asyncio.wait_for(connected.wait(), STEP_TIMEOUT)
        r = await http.patch(f"/v1/threads/{a}", json={"title": "marker"}, headers=bearer(tok["alice"]))
        assert r.status_code == 200
        r = await http.patch(f"/v1/threads/{c}", json={"title": "marker"}, headers=bearer(tok["bob"]))
        assert r.status_code == 200
        for n in ("bob", "root"):
            over_ws = await frames_until(sockets[n], marked(c))
            await sockets[n].close()
            over_sse = await asyncio.wait_for(sse[n], STEP_TIMEOUT)
            for seen in (over_ws, over_sse[1:]):
                ids = {f["thread"]["id"] for f in seen}
                assert ids == ({c} if n == "bob" else {a, c}), (n, seen)
        r = await http.get(f"/v1/threads/{c}", headers=bearer(tok["alice"]))
        assert r.status_code == 404

        # Per-user cap: Alice already has one agent running.
        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=bearer(tok["alice"]))
        a2 = r.json()["id"]
        r = await http.post(f"/v1/threads/{a2}/messages", json={"text": "two"}, headers=bearer(tok["alice"]))
        assert r.status_code == 429 and r.json()["error"]["code"] == "user_conversation_limit", r.text
        r = await http.post(f"/v1/threads/{c}/messages", json={"text": "bob's first"}, headers=bearer(tok["bob"]))
        assert r.status_code == 202, r.text

        # A proxy header from a peer that is not in proxy_trusted is no credential.
        r = await http.get("/v1/me", headers={"X-Forwarded-User": "root"})
        assert r.status_code == 401
        r = await http.get("/v1/me", headers={"X-Forwarded-User": "root", **bearer(tok["bob"])})
        assert r.json()["name"] == "bob"

        # Deletion: by the owner; gone for everyone after.
        r = await http.delete(f"/v1/threads/{a2}", headers=bearer(tok["alice"]))
        assert r.status_code == 204
    assert '"auth.proxy_header_ignored"' in d.stderr()


async def test_revoking_a_user_closes_their_streams_and_refuses_them_on_every_replica(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str], users_url: str, store_kind: str
) -> None:
    alice, bob = await add_user(users_url, "alice"), await add_user(users_url, "bob")
    config = users_config(tmp_path, agent_env, users_url)
    d: Daemon = await daemon_factory(config)
    async with contextlib.AsyncExitStack() as stack:
        replicas = [d]
        if store_kind == "postgresql":  # a second replica on the same database
            (tmp_path / "b").mkdir()
            other = Daemon(tmp_path / "b", config)
            await other.start()
            stack.push_async_callback(other.stop)
            replicas.append(other)
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT))
        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=bearer(alice))
        tid = r.json()["id"]
        thread_ws = Client(await ws_as(d, f"/v1/threads/{tid}/ws", alice))
        d.clients.append(thread_ws)
        ended = await thread_ws.turn("over the socket")
        prompt = thread_ws.seen("message", turn_id=ended["data"]["turn_id"])
        assert prompt and prompt[0]["source"] == "client" and prompt[0]["data"]["by"] == "alice"
        change_streams = [await ws_as(r, "/v1/ws", alice) for r in replicas]
        acp = await ws_as(d, "/v1/acp", alice)  # the ACP gateway: closed on revocation too
        assert "result" in await acp_rpc(acp, 1, "initialize", {"protocolVersion": 1})
        bobs = await ws_as(d, "/v1/ws", bob)
        r = await http.post("/v1/session", headers=bearer(alice))
        assert r.status_code == 204
        cookie = {"Cookie": r.headers["set-cookie"].split(";")[0]}
        http.cookies.clear()  # sent only where the test says so
        assert (await http.get(f"/v1/threads/{tid}", headers=cookie)).status_code == 200
        for rep in replicas:
            async with httpx.AsyncClient(base_url=rep.url, timeout=STEP_TIMEOUT) as h:
                assert (await h.get(f"/v1/threads/{tid}", headers=bearer(alice))).status_code == 200
                assert (await h.get(f"/v1/threads/{tid}", headers=bearer(bob))).status_code == 404
        sse_closed = asyncio.create_task(
            sse_until(d, f"/v1/threads/{tid}/events/stream?after=0", alice, lambda f: "reason" in f)
        )
        connected = asyncio.Event()
        changes_closed = asyncio.create_task(sse_until(d, "/v1/events", alice, lambda f: "kind" not in f, connected))
        await asyncio.wait_for(connected.wait(), STEP_TIMEOUT)
        await transcript_until(http, tid, alice, lambda e: e["kind"] == "turn.ended")  # the SSE is reading
        rc, _, err = await users_cli(users_url, "revoke", "alice")
        assert rc == 0, err

        assert (await asyncio.wait_for(sse_closed, STEP_TIMEOUT))[-1] == {"reason": "user_revoked"}
        assert (await asyncio.wait_for(changes_closed, STEP_TIMEOUT))[-1] == {"reason": "user_revoked"}
        assert await close_code(thread_ws.conn) == 4401
        for conn in change_streams:
            assert await close_code(conn) == 4401
        assert await close_code(acp) == 4401
        for rep in replicas:
            async with httpx.AsyncClient(base_url=rep.url, timeout=STEP_TIMEOUT) as h:
                r = await h.get("/v1/me", headers=bearer(alice))
                assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert (await http.get("/v1/me", headers=cookie)).status_code == 401
        with pytest.raises(websockets.exceptions.InvalidStatus) as info:
            await ws_as(d, f"/v1/threads/{tid}/ws", alice)
        assert info.value.response.status_code == 401

        # Bob was not touched: his stream still hears his new thread.
        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=bearer(bob))
        mine = r.json()["id"]
        seen = await frames_until(bobs, lambda f: f.get("thread", {}).get("id") == mine)
        assert seen[-1]["kind"] == "thread.created"
        await bobs.close()

        rc, out, _ = await users_cli(users_url, "list", "--json")
        listed = {u["name"]: u for u in json.loads(out)}
        assert listed["alice"]["revoked_at"] and listed["bob"]["revoked_at"] is None and rc == 0
        rc, _, err = await users_cli(users_url, "add", "bob")
        assert rc == 2 and "exists" in err
        # Alice back with a new token: her thread is hers again; the old token stays dead.
        again = await add_user(users_url, "alice")
        assert (await http.get(f"/v1/threads/{tid}", headers=bearer(again))).status_code == 200
        assert (await http.get(f"/v1/threads/{tid}", headers=bearer(alice))).status_code == 401


async def test_user_tokens_never_reach_the_logs_or_the_data_dir_in_clear(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    """The secrets test of test_hardening_e2e, for users: every credential form of a user
    (bearer, subprotocol, session cookie, a login code minted with the user's token), a
    spoofed proxy header and wrong tokens; then the log and every file of the data dir."""
    url = f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"
    alice = await add_user(url, "alice")
    d: Daemon = await daemon_factory(users_config(tmp_path, agent_env, url))
    spoof = "spoofed-name-4be1c0"
    secrets_seen: dict[str, str] = {"alice's token": alice}
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=bearer(alice))
        tid = r.json()["id"]
        conn = await websockets.connect(
            f"{d.ws_url}/v1/threads/{tid}/ws",
            subprotocols=["agent-bridge.v1", f"bearer.{alice}"],  # type: ignore[list-item]
            open_timeout=STEP_TIMEOUT,
        )
        c = Client(conn)
        d.clients.append(c)
        await c.turn("hello as alice")
        await c.close()
        r = await http.post("/v1/login-codes", headers=bearer(alice))
        assert r.status_code == 201, r.text
        code = r.json()["code"]
        secrets_seen["a login code"] = code
        r = await http.post("/v1/session", json={"code": code})
        assert r.status_code == 204, r.text
        jar = r.headers["set-cookie"].split(";")[0]
        secrets_seen["the session cookie"] = jar.split("=", 1)[1]
        http.cookies.clear()  # sent only where a test says so
        r = await http.get("/v1/me", headers={"Cookie": jar})
        assert r.json()["name"] == "alice"  # the code signed Alice in, not the operator
        for headers in (
            {"Authorization": f"Bearer {alice}x"},
            {"Authorization": f"Bearer x{alice}"},
            {"X-Forwarded-User": spoof},
            {"X-Forwarded-User": spoof, "Authorization": f"Bearer {alice}0"},
        ):
            assert (await http.get("/v1/me", headers=headers)).status_code == 401, headers
        assert (await http.delete("/v1/session", headers={"Cookie": jar})).status_code == 204
    rc, _, err = await users_cli(url, "revoke", "alice")
    assert rc == 0, err
    assert await d.stop() == 0
    logs = d.stderr()
    assert '"daemon.stopped"' in logs and '"auth.proxy_header_ignored"' in logs
    for what, needle in {**secrets_seen, "the spoofed header's value": spoof}.items():
        assert needle not in logs, f"{what} is in the daemon's log"
    searched = 0
    for path in sorted(d.data_dir.rglob("*")):
        if not path.is_file() or path.name == "token":
            continue
        blob = path.read_bytes()
        searched += 1
        for what, needle in secrets_seen.items():
            for form in {needle.encode(), needle.encode("utf-16-le")}:
                assert form not in blob, f"{what} is in {path.relative_to(d.data_dir)}"
    assert searched, "nothing in the data dir to search"


async def acp_rpc(conn: Any, rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One JSON-RPC request on the ACP gateway and its answer (notifications skipped)."""
    await conn.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
    while True:
        msg = json.loads(await asyncio.wait_for(conn.recv(), STEP_TIMEOUT))
        if msg.get("id") == rid and "method" not in msg:
            return dict(msg)


async def test_the_acp_gateway_acts_as_its_user(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str], users_url: str
) -> None:
    """An ACP connection is its user's: its sessions are owned by them, `session/list`
    shows only theirs, and another user's thread is "no session" to load, resume and
    prompt — exactly as a thread that does not exist (an admin sees all)."""
    tok = {n: await add_user(users_url, n, admin=n == "root") for n in ("alice", "bob", "root")}
    d: Daemon = await daemon_factory(users_config(tmp_path, agent_env, users_url))
    conns = {n: await ws_as(d, "/v1/acp", t) for n, t in tok.items()}
    try:
        for n, conn in conns.items():
            init = await acp_rpc(conn, 1, "initialize", {"protocolVersion": 1})
            assert init["result"]["protocolVersion"] == 1, (n, init)
        # Her own workspace root (docs/security.md "Users mode"), as she is shown it.
        (d.data_dir / "workspaces" / "users" / "alice").mkdir(parents=True)
        mine = "<data-dir>/workspaces/users/alice"
        refused = await acp_rpc(conns["alice"], 4, "session/new", {"cwd": str(tmp_path), "mcpServers": []})
        assert refused["error"]["data"]["code"] == "cwd_not_allowed", refused
        made = await acp_rpc(conns["alice"], 2, "session/new", {"cwd": mine, "mcpServers": []})
        sid = made["result"]["sessionId"]
        async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
            r = await http.get(f"/v1/threads/{sid}", headers=bearer(tok["alice"]))
            assert r.status_code == 200 and r.json()["owner"] == "alice", r.text
        listed = {n: await acp_rpc(c, 3, "session/list", {}) for n, c in conns.items()}
        assert [(s["sessionId"], s["cwd"]) for s in listed["alice"]["result"]["sessions"]] == [(sid, mine)]
        assert listed["bob"]["result"]["sessions"] == []
        real = os.path.realpath(d.data_dir / "workspaces" / "users" / "alice")
        assert [(s["sessionId"], s["cwd"]) for s in listed["root"]["result"]["sessions"]] == [(sid, real)]
        again = await acp_rpc(conns["alice"], 5, "session/list", {"cwd": mine})
        assert [s["sessionId"] for s in again["result"]["sessions"]] == [sid]
        for k, method in enumerate(("session/load", "session/resume", "session/prompt")):
            params: dict[str, Any] = {"sessionId": sid, "cwd": str(tmp_path), "mcpServers": []}
            if method == "session/prompt":
                params["prompt"] = [{"type": "text", "text": "not yours"}]
            theirs = await acp_rpc(conns["bob"], 10 + k, method, {**params})
            ghost = await acp_rpc(conns["bob"], 20 + k, method, {**params, "sessionId": GHOST})
            assert theirs["error"]["code"] == ghost["error"]["code"], (method, theirs, ghost)
            assert theirs["error"]["message"] == ghost["error"]["message"].replace(GHOST, sid), method
        loaded = await acp_rpc(
            conns["root"], 30, "session/load", {"sessionId": sid, "cwd": str(tmp_path), "mcpServers": []}
        )
        assert "result" in loaded, loaded
    finally:
        for conn in conns.values():
            await conn.close()
