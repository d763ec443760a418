"""Per-user secrets end to end (issue #32 item 2, docs/security.md "Per-user secrets"): a
real daemon, real fake agents and the real ``agent-bridge users secret`` command. A user
stores a secret over REST; their agent of that profile gets it as an environment
variable, while another user's agent and their own agent of another profile do not; the
value is never returned, never in the daemon's log, never in the transcript (the agent
that prints it is scrubbed) and never in clear in the data dir. The operator (token mode)
sets one from stdin with the CLI, and a malformed key variable stops the daemon's start."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from conftest import STEP_TIMEOUT, Client, Daemon, agent_log, base_config, bridge_cli

pytestmark = pytest.mark.timeout(120)

ALICE_VALUE = "alice-s3cret-Value-7f1c"
OPERATOR_VALUE = "op-s3cret\nsecond line-9d2e"


async def cli(*args: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The real ``agent-bridge …`` with ``stdin``."""
    return await bridge_cli(*args, stdin=stdin, env=env, timeout=STEP_TIMEOUT * 2)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def leak_turn(d: Daemon, token: str, agent: str, name: str) -> tuple[str, list[dict[str, Any]]]:
    """A new thread of ``agent`` as the holder of ``token`` whose agent prints env var
    ``name`` (its reply and its stderr); the thread id and every frame of the turn."""
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT, headers=bearer(token)) as http:
        r = await http.post("/v1/threads", json={"agent": agent})
        assert r.status_code == 201, r.text
        tid = str(r.json()["id"])
    conn = await websockets.connect(
        f"{d.ws_url}/v1/threads/{tid}/ws", additional_headers=bearer(token), open_timeout=STEP_TIMEOUT
    )
    c = Client(conn)
    d.clients.append(c)
    await c.turn(f"leak {name}")
    # Its stderr line may come after the turn's end: waited for, unless it is there already.
    if not any("my secret is" in f["data"].get("text", "") for f in c.seen("diagnostic")):
        await c.next(lambda f: f.get("kind") == "diagnostic" and "my secret is" in f["data"].get("text", ""))
    await c.close()
    return tid, c.frames


def started_env(tmp_path: Path) -> list[dict[str, str]]:
    """The environment of every agent started so far, in order (the fakes log it)."""
    return [e["env"] for e in agent_log(tmp_path) if e.get("event") == "start"]


def users_config(tmp_path: Path, agent_env: dict[str, str]) -> str:
    return base_config(tmp_path, agent_env) + '\n[auth]\nmode = "users"\n'


async def test_a_users_secret_reaches_only_their_agents_of_that_profile_and_is_never_shown(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    url = f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"
    tokens = {}
    for name in ("alice", "bob"):
        rc, out, err = await cli("users", "add", name, "--store-url", url)
        assert rc == 0, err
        tokens[name] = out.strip()
    d: Daemon = await daemon_factory(users_config(tmp_path, agent_env))
    alice, bob = tokens["alice"], tokens["bob"]
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        r = await http.put(
            "/v1/me/secrets/stream-json/MY_API_TOKEN", json={"value": ALICE_VALUE}, headers=bearer(alice)
        )
        assert r.status_code == 204, r.text
        assert (d.data_dir / "secrets.key").stat().st_mode & 0o777 == 0o600
        refused = {
            ("stream-json", "PATH", ALICE_VALUE): (400, "secret_name_reserved"),
            ("stream-json", "LD_PRELOAD", ALICE_VALUE): (400, "secret_name_reserved"),
            ("stream-json", "FAKE_AGENT_LOG", ALICE_VALUE): (400, "secret_name_reserved"),  # the profile's
            ("stream-json", "lower_case", ALICE_VALUE): (400, "invalid_secret_name"),
            ("no-such-profile", "MY_API_TOKEN", ALICE_VALUE): (404, "agent_not_found"),
            ("stream-json", "MY_API_TOKEN", ALICE_VALUE + "\x00"): (400, "invalid_secret_value"),
            ("stream-json", "MY_API_TOKEN", "x" * 20_000): (400, "secret_too_large"),
            ("stream-json", "MY_API_TOKEN", "https://api.example.com/?k=" + ALICE_VALUE): (400, "remote_url_refused"),
        }
        for (profile, key, value), (status, code) in refused.items():
            r = await http.put(f"/v1/me/secrets/{profile}/{key}", json={"value": value}, headers=bearer(alice))
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), (key, r.text)
            assert ALICE_VALUE not in r.text
        r = await http.put("/v1/me/secrets/stream-json/X", json={"value": 5}, headers=bearer(alice))
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"

        r = await http.get("/v1/me/secrets", headers=bearer(alice))
        assert r.status_code == 200 and ALICE_VALUE not in r.text
        listed = r.json()["secrets"]
        assert [(s["profile"], s["key"]) for s in listed] == [("stream-json", "MY_API_TOKEN")]
        assert set(listed[0]) == {"profile", "key", "updated_at"}
        r = await http.get("/v1/me/secrets", headers=bearer(bob))
        assert r.json() == {"secrets": []}
        r = await http.delete("/v1/me/secrets/stream-json/MY_API_TOKEN", headers=bearer(bob))
        assert r.status_code == 404 and r.json()["error"]["code"] == "secret_not_found"  # bob has none

    alice_tid, alice_frames = await leak_turn(d, alice, "stream-json", "MY_API_TOKEN")
    await leak_turn(d, bob, "stream-json", "MY_API_TOKEN")
    await leak_turn(d, alice, "awp-jsonl", "MY_API_TOKEN")
    envs = started_env(tmp_path)
    assert len(envs) == 3
    assert envs[0].get("MY_API_TOKEN") == ALICE_VALUE  # alice's agent of that profile
    assert "MY_API_TOKEN" not in envs[1]  # bob's agent
    assert "MY_API_TOKEN" not in envs[2]  # alice's agent of another profile
    # The agent printed it (its reply and its stderr): the transcript holds neither.
    texts = json.dumps(alice_frames)
    assert ALICE_VALUE not in texts and "[redacted]" in texts
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        r = await http.get(f"/v1/threads/{alice_tid}/events?after=0&limit=1000", headers=bearer(alice))
        assert r.status_code == 200 and r.json()["events"]
        assert ALICE_VALUE not in r.text
        diagnostics = [e for e in r.json()["events"] if e["kind"] == "diagnostic"]
        assert any("my secret is [redacted]" in e["data"].get("text", "") for e in diagnostics), diagnostics
        r = await http.delete("/v1/me/secrets/stream-json/MY_API_TOKEN", headers=bearer(alice))
        assert r.status_code == 204
        assert (await http.get("/v1/me/secrets", headers=bearer(alice))).json() == {"secrets": []}
    await leak_turn(d, alice, "stream-json", "MY_API_TOKEN")
    assert "MY_API_TOKEN" not in started_env(tmp_path)[3]  # deleted: the next agent has none

    assert await d.stop() == 0
    logs = d.stderr()
    assert '"daemon.stopped"' in logs and '"secrets.set"' in logs
    assert ALICE_VALUE not in logs
    searched = 0
    for path in sorted(d.data_dir.rglob("*")):
        if path.is_file():
            searched += 1
            assert ALICE_VALUE.encode() not in path.read_bytes(), f"the value is in {path.relative_to(d.data_dir)}"
    assert searched


async def test_the_operator_sets_a_secret_from_stdin_with_the_cli_in_token_mode(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d: Daemon = await daemon_factory(base_config(tmp_path, agent_env))
    where = ["--config", str(d.config_path), "--data-dir", str(d.data_dir)]
    rc, out, err = await cli(
        "users", "secret", "set", "operator", "stream-json", "OP_TOKEN", *where, stdin=OPERATOR_VALUE.encode() + b"\n"
    )
    assert rc == 0, err
    assert OPERATOR_VALUE not in out + err and "OP_TOKEN" in err
    rc, out, err = await cli("users", "secret", "list", "operator", "--json", *where)
    assert rc == 0, err
    assert [(s["profile"], s["key"]) for s in json.loads(out)] == [("stream-json", "OP_TOKEN")]
    assert OPERATOR_VALUE not in out
    for args, why in (
        (["set", "nobody", "stream-json", "OP_TOKEN"], "no user 'nobody'"),
        (["set", "operator", "no-such", "OP_TOKEN"], "no agent profile 'no-such'"),
        (["set", "operator", "stream-json", "HOME"], "reserved"),
        (["unset", "operator", "stream-json", "NOT_SET"], "no secret NOT_SET"),
    ):
        rc, out, err = await cli("users", "secret", *args, *where, stdin=b"value-1234")
        assert rc == 2 and why in err, (args, err)

    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT, headers=d.headers) as http:
        r = await http.get("/v1/me/secrets")  # the operator's own, over REST too
        assert [s["key"] for s in r.json()["secrets"]] == ["OP_TOKEN"]
    await leak_turn(d, str(d.token), "stream-json", "OP_TOKEN")
    assert started_env(tmp_path)[0].get("OP_TOKEN") == OPERATOR_VALUE  # the newline kept inside
    rc, _, err = await cli("users", "secret", "unset", "operator", "stream-json", "OP_TOKEN", *where)
    assert rc == 0, err
    rc, out, _ = await cli("users", "secret", "list", "operator", *where)
    assert rc == 0 and out == ""


async def test_a_malformed_secrets_key_variable_stops_the_start_without_quoting_it(
    tmp_path: Path, agent_env: dict[str, str]
) -> None:
    bad = "bm90LWEta2V5LW9mLTMyLWJ5dGVz"
    d = Daemon(tmp_path, base_config(tmp_path, agent_env), extra_env={"AGENT_BRIDGE_SECRETS_KEY": bad})
    with pytest.raises(AssertionError):
        await d.start()
    assert d.proc is not None
    assert await asyncio.wait_for(d.proc.wait(), STEP_TIMEOUT) == 2
    err = d.stderr()
    assert "AGENT_BRIDGE_SECRETS_KEY must be 32 bytes in base64" in err and bad not in err
