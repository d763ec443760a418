"""Confinement end to end (issue #32): a hostile agent (tests/agents/hostile_agent.py) in a
real daemon tries every escape the attack found — the token file, the database, the
daemon's /proc, another thread's workspace, another user's home, writing outside what is
its own, signalling the daemon, using the API with whatever credential it could find — in
token mode and users mode, on SQLite and PostgreSQL. The data dir sits inside the agent's
HOME, as in the default layout (``~/.local/share/agent-bridge``)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import PYTHON, ROOT, STEP_TIMEOUT, Daemon
from support.postgres import PASSWORD
from test_users_e2e import add_user, bearer

from bridge.process import bwrap

pytestmark = pytest.mark.timeout(120)

HOSTILE = ROOT / "tests" / "agents" / "hostile_agent.py"


def hostile_config(extra: str = "", sandbox: str = "") -> str:
    return (
        "[server]\nstop_grace_s = 2\n\n"
        "[agents.hostile]\n"
        'protocol = "stream-json"\n'
        f"executable = {json.dumps(PYTHON)}\n"
        f"args = {json.dumps(['-I', str(HOSTILE)])}\n"
        'protocol_flags = ["--output-format", "stream-json", "--input-format", "stream-json", "--verbose"]\n'
        "\n[sandbox]\n"
        f"extra_read = [{json.dumps(str(HOSTILE.parent))}]\n" + sandbox + extra
    )


def layout(tmp: Path) -> tuple[Path, Path]:
    """HOME and, inside it, the data dir where the daemon puts it by default."""
    home = tmp / "home"
    (home / ".config").mkdir(parents=True)
    return home, home / ".local" / "share" / "agent-bridge"


async def start(
    tmp: Path, config: str, home: Path, data: Path, env: dict[str, str] | None = None, token_from: str = "argv"
) -> Daemon:
    """A daemon whose token comes from ``token_from``: ``argv`` (--token), ``env``
    (AGENT_BRIDGE_TOKEN) or ``file`` (generated in the data dir)."""
    env = {"HOME": str(home), **(env or {})}
    token = "t0ken-" + uuid.uuid4().hex + uuid.uuid4().hex
    if token_from == "env":
        env["AGENT_BRIDGE_TOKEN"] = token
    d = Daemon(tmp, config, token=token if token_from == "argv" else None, extra_env=env)
    d.data_dir = data
    await d.start()
    if token_from == "env":
        d.token = token
    elif token_from == "file":
        d.token = (data / "token").read_text().strip()
    return d


async def attack(
    http: httpx.AsyncClient, thread: str, targets: dict[str, str], headers: dict[str, str] | None = None
) -> dict[str, str]:
    """One turn of the hostile agent; its report."""
    r = await http.post(f"/v1/threads/{thread}/messages", json={"text": json.dumps(targets)}, headers=headers)
    assert r.status_code == 202, r.text
    after = r.json()["seq"]
    deadline = time.monotonic() + STEP_TIMEOUT * 2
    while time.monotonic() < deadline:
        r = await http.get(f"/v1/threads/{thread}/events", params={"after": after, "wait": 5}, headers=headers)
        assert r.status_code == 200, r.text
        for e in r.json()["events"]:
            after = e["seq"]
            if e["kind"] == "message" and e["source"] == "agent":
                return dict(json.loads(e["data"]["text"]))
            if e["kind"] == "turn.ended" and e["data"]["status"] != "success":
                raise AssertionError(f"the hostile turn failed: {e}")
    raise AssertionError("no report from the hostile agent")


async def new_thread(http: httpx.AsyncClient, headers: dict[str, str] | None = None, **body: Any) -> dict[str, Any]:
    r = await http.post("/v1/threads", json={"agent": "hostile", **body}, headers=headers)
    assert r.status_code == 201, r.text
    return dict(r.json())


def escapes(d: Daemon, victim_cwd: str, own_cwd: str) -> dict[str, str]:
    data = d.data_dir
    return {
        "read:token": str(data / "token"),
        "read:db": str(data / "bridge.db"),
        "read:daemon.json": str(data / "daemon.json"),
        "read:config": str(d.config_path),
        "read:victim": f"{victim_cwd}/secret.txt",
        "list:data": str(data),
        "list:workspaces": str(data / "workspaces"),
        "write:data": str(data / "planted"),
        "write:victim": f"{victim_cwd}/planted",
        "write:tmp": f"/tmp/agent-bridge-planted-{uuid.uuid4().hex}",
        "environ": str(d.pid),
        "mem": str(d.pid),
        "cmdline": str(d.pid),
        "signal": str(d.pid),
        "sqlite:db": str(data / "bridge.db"),
        "api:own": f"{d.url}|{own_cwd}",
        # What is its own: these must work.
        "write:cwd": f"{own_cwd}/mine.txt",
        "write:home": str(Path(d.extra_env["HOME"]) / ".config" / "mine.txt"),
        "write:tmpdir": "",
    }


def check(report: dict[str, str], secrets: list[str], mechanism: str = "landlock", own_cwd: str = "") -> None:
    for key in ("write:cwd", "write:home"):
        assert report[key] == "ok", (key, report)
    for key, got in report.items():
        if key in ("write:cwd", "write:home", "write:tmpdir", "cmdline"):
            continue
        if mechanism == "bubblewrap" and key == "write:tmp":
            continue  # its /tmp is its own private dir there (the caller checks the host's /tmp)
        if mechanism == "bubblewrap" and key.startswith("list:") and got.startswith("ok:"):
            # An empty tmpfs over the data dir, with only the way to its own workspace in it.
            assert set(filter(None, got[3:].split(","))) <= set(Path(own_cwd).parts), (key, got)
            continue
        # "absent": no such file (the token given by --token or the environment has none),
        # or a process out of its sight (bubblewrap: a pid namespace of its own).
        assert got in ("denied", "absent") or got.startswith("denied:"), (key, got)
    # The daemon's command line is public (ps), so it must hold no secret (bubblewrap: not seen).
    assert report["cmdline"].startswith("ok:" if mechanism == "landlock" else "absent"), report["cmdline"]
    for secret in secrets:
        assert secret not in json.dumps(report), "a secret reached the hostile agent"


@pytest.mark.parametrize(
    ("store_kind", "token_from", "mechanism"),
    [
        ("sqlite", "file", "landlock"),
        ("sqlite", "env", "landlock"),
        ("postgresql", "argv", "landlock"),
        ("sqlite", "file", "bubblewrap"),
        ("postgresql", "argv", "bubblewrap"),
    ],
)
async def test_a_hostile_agent_reaches_nothing_but_its_own_in_token_mode(
    tmp_path: Path, store_kind: str, token_from: str, mechanism: str, request: pytest.FixtureRequest
) -> None:
    if mechanism == "bubblewrap" and bwrap.find() is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    home, data = layout(tmp_path)
    env: dict[str, str] = {"AGENT_BRIDGE_SANDBOX": mechanism}
    if store_kind == "postgresql":
        env["AGENT_BRIDGE_STORE_URL"] = str(request.getfixturevalue("pg_url"))  # with its password
    d = await start(tmp_path, hostile_config(), home, data, env, token_from)
    try:
        async with d.http() as http:
            info = (await http.get("/v1/daemon")).json()
            assert info["sandbox"] == mechanism, info
            agents = {a["name"]: a for a in (await http.get("/v1/agents")).json()}
            assert agents["hostile"]["sandbox"] == mechanism
            victim = await new_thread(http)
            Path(victim["cwd"], "secret.txt").write_text("the victim's secret\n")
            own = await new_thread(http)
            targets = escapes(d, victim["cwd"], own["cwd"])
            targets["api:own"] = f"{d.url}|{own['id']}"
            # Directly in a HOME that holds the data dir: bubblewrap's mounts allow it,
            # Landlock's rules cannot (docs/security.md §6).
            targets["write:home-top"] = str(home / f"new-{mechanism}.txt")
            report = await attack(http, own["id"], targets)
        secrets = [d.token or ""]
        if store_kind == "postgresql":
            secrets.append(PASSWORD)
        assert report.pop("write:home-top") == ("ok" if mechanism == "bubblewrap" else "denied"), report
        check(report, [s for s in secrets if s], mechanism, own["cwd"])
        assert not Path(targets["write:tmp"]).exists()
        assert not Path(victim["cwd"], "planted").exists() and not (data / "planted").exists()
        assert Path(own["cwd"], "mine.txt").read_text().startswith("planted")
    finally:
        await d.stop()


async def test_the_data_dir_is_no_agents_cwd(tmp_path: Path) -> None:
    home, data = layout(tmp_path)
    d = await start(tmp_path, hostile_config(), home, data)
    try:
        link = tmp_path / "innocent"
        link.symlink_to(data)
        async with d.http() as http:
            await new_thread(http)  # the workspaces dir exists from now on
            for cwd in (str(data), str(data / "workspaces"), str(link)):
                r = await http.post("/v1/threads", json={"agent": "hostile", "cwd": cwd})
                if r.status_code == 201:  # refused at the latest when the agent would start
                    r = await http.post(f"/v1/threads/{r.json()['id']}/messages", json={"text": "{}"})
                assert r.status_code in (400, 403, 422), (cwd, r.status_code, r.text)
                assert r.json()["error"]["code"] == "cwd_not_allowed", r.text
    finally:
        await d.stop()


@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"])
async def test_a_hostile_agent_of_one_user_reaches_nothing_of_another_in_users_mode(
    tmp_path: Path, store_kind: str, request: pytest.FixtureRequest
) -> None:
    home, data = layout(tmp_path)
    url = f"sqlite:///{data / 'bridge.db'}"
    if store_kind == "postgresql":
        url = str(request.getfixturevalue("pg_url"))
    data.mkdir(parents=True)
    alice_token, bob_token = await add_user(url, "alice"), await add_user(url, "bob")
    config = hostile_config('\n[auth]\nmode = "users"\n') + f"\n[store]\nurl = {json.dumps(url)}\n"
    d = await start(tmp_path, config, home, data, token_from="file")
    try:
        async with d.http() as http:
            alice = await new_thread(http, headers=bearer(alice_token))
            await attack(http, alice["id"], {}, headers=bearer(alice_token))  # her agent ran: her home exists
            alice_home = data / "homes" / "alice"
            (alice_home / "login.json").write_text("alice's CLI login\n")
            # Her workspace, as the daemon shows it to her, and as it is on disk.
            alice_cwd = data / "workspaces" / "users" / "alice"
            Path(str(alice["cwd"]).replace("<data-dir>", str(data))).joinpath("secret.txt").write_text("hers\n")
            bob = await new_thread(http, headers=bearer(bob_token))
            bob_cwd = str(bob["cwd"]).replace("<data-dir>", str(data))
            bob_home = data / "homes" / "bob"
            targets = escapes(d, str(alice["cwd"]).replace("<data-dir>", str(data)), bob_cwd)
            targets.update(
                {
                    "read:alice-home": str(alice_home / "login.json"),
                    "list:alice-home": str(alice_home),
                    "write:alice-home": str(alice_home / "planted"),
                    "list:alice-roots": str(alice_cwd),
                    "api:own": f"{d.url}|{bob['id']}",
                    "write:home": str(bob_home / "mine.txt"),
                }
            )
            report = await attack(http, bob["id"], targets, headers=bearer(bob_token))
        secrets = [d.token or "", alice_token, bob_token] + ([PASSWORD] if store_kind == "postgresql" else [])
        check(report, secrets)
        assert not (alice_home / "planted").exists()
        assert (bob_home / "mine.txt").is_file()
    finally:
        await d.stop()


async def test_unconfined_agents_are_said_everywhere(tmp_path: Path) -> None:
    """``mode = "none"`` (here by its env twin): the daemon starts in token mode, warns on
    stderr, and says "none" wherever the sandbox is shown."""
    home, data = layout(tmp_path)
    d = await start(tmp_path, hostile_config(), home, data, {"AGENT_BRIDGE_SANDBOX": "none"})
    try:
        async with d.http() as http:
            info = (await http.get("/v1/daemon")).json()
            assert info["sandbox"] == "none" and info["sandbox_detail"]["requested"] == "none", info
            assert {a["sandbox"] for a in (await http.get("/v1/agents")).json()} == {"none"}
        assert "agents run unconfined" in d.stderr()
    finally:
        await d.stop()


async def test_the_daemons_secrets_are_blanked_in_proc_and_libpq_still_reads_its_own(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The store's password given as PGPASSWORD (read by libpq with getenv) and the token
    given as AGENT_BRIDGE_TOKEN: the daemon works with both, and neither is left in what
    /proc shows of it (its command line and environment)."""
    home, data = layout(tmp_path)
    url = str(request.getfixturevalue("pg_url")).replace(f":{PASSWORD}@", "@")
    env = {"AGENT_BRIDGE_STORE_URL": url, "PGPASSWORD": PASSWORD}
    d = await start(tmp_path, hostile_config(), home, data, env, token_from="env")
    try:
        async with d.http() as http:
            thread = await new_thread(http)  # the store answered: libpq had the password
            report = await attack(http, thread["id"], {"write:cwd": f"{thread['cwd']}/x"})
            assert report == {"write:cwd": "ok"}
        shown = Path(f"/proc/{d.pid}/environ").read_bytes() + Path(f"/proc/{d.pid}/cmdline").read_bytes()
        assert PASSWORD.encode() not in shown and (d.token or "").encode() not in shown
        assert b"PGPASSWORD=" in shown  # the variable is there, its value blanked
    finally:
        await d.stop()
