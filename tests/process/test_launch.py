"""Launch rules (docs/api.md §2): unit tests of bridge.process.launch, then every refusal end to
end through a real daemon — a clear HTTP 4xx with a machine-readable code, and nothing
spawned (no ``start`` line in the fake agent's log, no child process of the daemon)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import (
    FAKE_AGENT,
    PYTHON,
    STEP_TIMEOUT,
    Daemon,
    agent_log,
    new_thread,
)

from bridge.errors import LaunchRefused
from bridge.process.launch import (
    ENV_ALLOWLIST,
    build_launch,
    child_env,
    executable_problem,
    url_problem,
    valid_session_id,
)

# --------------------------------------------------------------------------- helpers


def fake_profile(
    name: str,
    env: dict[str, str],
    *,
    executable: str = PYTHON,
    dialect: str = "stream-json",
    extra_args: list[str] | None = None,
    **fields: Any,
) -> str:
    """A TOML agent profile running the fake agent (like conftest.profile_toml, but the
    executable can be anything)."""
    args = ["-I", str(FAKE_AGENT), "--dialect", dialect, *(extra_args or [])]
    if dialect == "awp-jsonl":
        # The AWP host always passes --model (AWP_AGENT_DEFAULT_MODEL); the strict fake, like the
        # reference adapter, refuses to start without one (model_required).
        fields = {"model": "fake-model", **fields}
    lines = [
        f"[agents.{name}]",
        f'protocol = "{dialect}"',
        f"executable = {json.dumps(executable)}",
        f"args = {json.dumps(args)}",
        "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }",
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in fields.items()]
    return "\n".join(lines) + "\n\n"


def config(*profiles: str) -> str:
    return "[server]\nstop_grace_s = 2\n\n" + "".join(profiles)


def children(pid: int) -> list[int]:
    """The daemon's children but its store's writer process (test_chat_e2e.children)."""
    from test_chat_e2e import children as non_helper_children

    return non_helper_children(pid)


def starts(tmp_path: Path) -> list[dict[str, Any]]:
    return [e for e in agent_log(tmp_path) if e["event"] == "start"]


def assert_nothing_spawned(d: Daemon, tmp_path: Path) -> None:
    assert d.proc is not None
    assert children(d.proc.pid) == [], "the daemon has a child process"
    assert starts(tmp_path) == [], "the fake agent was started"


def assert_refused(r: httpx.Response, code: str, status: int = 422) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code, body
    assert body["error"]["message"], body
    return dict(body["error"])


async def wait_event(
    d: Daemon, thread_id: str, pred: Callable[[dict[str, Any]], bool], within_s: float = STEP_TIMEOUT
) -> list[dict[str, Any]]:
    """Long-poll the transcript until an event matches ``pred``; every event so far."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    events: list[dict[str, Any]] = []
    async with d.http() as http:
        while not any(pred(e) for e in events):
            if loop.time() > end:
                raise AssertionError(f"no matching event within {within_s}s; saw {[e['kind'] for e in events]}")
            after = events[-1]["seq"] if events else 0
            r = await http.get(f"/v1/threads/{thread_id}/events", params={"after": after, "wait": 1})
            assert r.status_code == 200, r.text
            events += r.json()["events"]
    return events


async def chat(d: Daemon, thread_id: str, text: str) -> list[dict[str, Any]]:
    """POST a message and wait for its turn to end successfully; the whole transcript."""
    async with d.http() as http:
        r = await http.post(f"/v1/threads/{thread_id}/messages", json={"text": text})
        assert r.status_code == 202, r.text
    turn_id = r.json()["turn_id"]
    events = await wait_event(d, thread_id, lambda e: e["kind"] == "turn.ended" and e["data"].get("turn_id") == turn_id)
    (end,) = [e for e in events if e["kind"] == "turn.ended" and e["data"].get("turn_id") == turn_id]
    assert end["data"]["status"] == "success", end
    return events


def launch(tmp_path: Path, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "executable": PYTHON,
        "args": ["-I", "agent.py"],
        "protocol_flags": ["--output-format", "stream-json"],
        "profile_env": {},
        "cwd": str(tmp_path),
        "model": "m1",
        "resume_id": None,
        "daemon_env": {"PATH": "/usr/bin"},
    }
    args.update(kw)
    return build_launch(**args)


# --------------------------------------------------------------------------- unit tests


@pytest.mark.parametrize(
    "sid", ["abc", "fake-123e4567-e89b-12d3-a456-426614174000", "A.b_c:d-e", "-starts-with-dash", "x" * 256]
)
def test_valid_session_ids(sid: str) -> None:
    assert valid_session_id(sid)


@pytest.mark.parametrize(
    "sid", ["", "../../etc", "-x y", "a" * 257, "a" * 300, "a/b", "a\nb", "a\x00b", "id;rm", "$(id)", "ünï", None, 42]
)
def test_invalid_session_ids(sid: object) -> None:
    assert not valid_session_id(sid)


def test_executable_problem_for_each_rule(tmp_path: Path) -> None:
    good = tmp_path / "agent"
    good.write_text("#!/bin/sh\nexit 0\n")
    good.chmod(0o755)
    assert executable_problem(str(good)) is None
    assert executable_problem(PYTHON) is None

    assert "absolute" in (executable_problem("python3") or "")
    assert "absolute" in (executable_problem("./agent") or "")
    assert "absolute" in (executable_problem("") or "")
    assert "not found" in (executable_problem(str(tmp_path / "missing")) or "")

    link = tmp_path / "link"
    link.symlink_to(good)
    problem = executable_problem(str(link)) or ""
    assert "symlink" in problem and str(good.resolve()) in problem  # tells the real path

    assert "regular file" in (executable_problem(str(tmp_path)) or "")

    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    assert "not executable" in (executable_problem(str(plain)) or "")


@pytest.mark.parametrize(
    ("values", "opt_in", "refused"),
    [
        (["--api=https://api.example.com/v1"], False, "remote_api_opt_in"),
        (["https://api.example.com"], False, "remote_api_opt_in"),
        (["HTTPS://API.EXAMPLE.COM"], False, "remote_api_opt_in"),
        (["see http://example.com for docs"], False, "remote_api_opt_in"),
        (["https://api.example.com"], True, None),
        (["http://example.com"], True, "plain http"),
        (["http://10.0.0.1:8080/v1"], True, "plain http"),
        (["http://127.0.0.1:9"], False, None),
        (["http://127.8.9.10:9/x"], False, None),
        (["http://localhost:9"], False, None),
        (["http://[::1]:9"], False, None),
        (["https://localhost/v1", "http://[::1]:9/a?b=c"], False, None),
        (["no url here", "file:///etc/passwd"], False, None),
        (["ftp://example.com"], False, "remote_api_opt_in"),
        (["http://127.0.0.1:9", "x https://evil.example"], False, "remote_api_opt_in"),
        (["http://127.0.0.1:9@evil.example/"], False, "evil.example"),
        (["http://evil.example#@127.0.0.1"], False, "evil.example"),
        (["http://localhost.evil.example"], False, "remote_api_opt_in"),
        # What a WHATWG parser (Node: the agent CLIs) reads as a remote host is remote here too.
        (["https://evil.example\\@127.0.0.1/"], False, "evil.example"),
        (["http://localhost\n.evil.example/"], False, "localhost.evil.example"),
        (["http://127.0.0.1\t.evil.example"], False, "127.0.0.1.evil.example"),
        (["line one\nhttps://evil.example"], False, "evil.example"),
        (["http:evil.example"], False, "evil.example"),
        (["--api=https:/evil.example/v1"], False, "evil.example"),
        (["http:\\\\evil.example"], False, "evil.example"),
        (["http:localhost:9", "https:/127.0.0.1:9"], False, None),
        (["Use https: everywhere; http: too."], False, None),
    ],
)
def test_url_problem(values: list[str], opt_in: bool, refused: str | None) -> None:
    problem = url_problem(values, opt_in=opt_in)
    if refused is None:
        assert problem is None
    else:
        assert problem is not None and refused in problem


def test_child_env_is_the_allowlist_plus_exactly_the_profile_env() -> None:
    daemon_env = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TZ": "UTC",
        "AGENT_BRIDGE_TOKEN": "t",
        "AWS_SECRET_ACCESS_KEY": "s",
        "ANTHROPIC_API_KEY": "k",
        "GITHUB_TOKEN": "g",
        "PYTHONPATH": "/evil",
        "LD_PRELOAD": "/evil.so",
        "SSH_AUTH_SOCK": "/sock",
    }
    env = child_env(daemon_env, {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "HOME": "/agent"})
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/agent",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TZ": "UTC",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
    }
    assert {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "TMPDIR", "TZ"} <= ENV_ALLOWLIST


def test_build_launch_argv_order_and_resume_is_one_element(tmp_path: Path) -> None:
    mcp = str(tmp_path / "mcp.json")
    spec = launch(
        tmp_path, resume_id="-abc.1:2", extra_args=["--permission-mode", "plan"], mcp_config=mcp, profile_env={"X": "1"}
    )
    assert spec.argv == (
        PYTHON,
        "-I",
        "agent.py",
        "--output-format",
        "stream-json",
        "--permission-mode",
        "plan",
        "--model=m1",
        "--resume=-abc.1:2",
        "--mcp-config",
        mcp,
    )
    assert spec.cwd == str(tmp_path)
    assert spec.env == {"PATH": "/usr/bin", "X": "1"}
    assert "--resume" not in spec.argv  # never split into a flag and a value
    no_resume = launch(tmp_path, model=None)
    assert not any(a.startswith(("--resume", "--model")) for a in no_resume.argv)


def test_build_launch_passes_shell_metacharacters_literally(tmp_path: Path) -> None:
    meta = ["$(touch PWNED)", "; rm -rf x", "`id`", "a|b", "&&", "> out", "*", "'\"\\"]
    spec = launch(tmp_path, args=meta, profile_env={"V": "$(touch PWNED2)"})
    assert list(spec.argv[1 : 1 + len(meta)]) == meta
    assert spec.env["V"] == "$(touch PWNED2)"


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        ({"executable": "python3"}, "executable_unusable"),
        ({"cwd": "relative/dir"}, "bad_cwd"),
        ({"cwd": "/nonexistent/dir/for/test"}, "bad_cwd"),
        ({"resume_id": "../../etc"}, "invalid_session_id"),
        ({"resume_id": "-x y"}, "invalid_session_id"),
        ({"resume_id": "a" * 300}, "invalid_session_id"),
        ({"resume_id": ""}, "invalid_session_id"),
        ({"mcp_config": "mcp.json"}, "bad_mcp_config"),
        ({"args": ["a\x00b"]}, "bad_argument"),
        ({"profile_env": {"ANTHROPIC_BASE_URL": "https://api.example.com"}}, "remote_url_refused"),
        ({"args": ["--api=https://api.example.com/v1"]}, "remote_url_refused"),
        ({"model": "http://example.com"}, "remote_url_refused"),
        ({"args": ["http://example.com"], "remote_api_opt_in": True}, "remote_url_refused"),
    ],
)
def test_build_launch_refusals(tmp_path: Path, kw: dict[str, Any], code: str) -> None:
    with pytest.raises(LaunchRefused) as exc:
        launch(tmp_path, **kw)
    assert exc.value.code == code and exc.value.status == 422
    if "resume_id" in kw:
        assert kw["resume_id"] not in exc.value.message or kw["resume_id"] == ""


def test_build_launch_allows_remote_https_with_opt_in_and_loopback_always(tmp_path: Path) -> None:
    launch(tmp_path, profile_env={"U": "https://api.example.com"}, remote_api_opt_in=True)
    launch(tmp_path, args=["--api=http://127.0.0.1:9", "http://localhost:9", "http://[::1]:9"])


# --------------------------------------------------------------------------- end to end


def _bad_executable(kind: str, tmp_path: Path) -> tuple[str, str]:
    """(executable, a word its problem string must contain)"""
    if kind == "relative":
        return "python3", "absolute"
    if kind == "symlink":
        link = tmp_path / "python-link"
        link.symlink_to(PYTHON)
        return str(link), "symlink"
    if kind == "directory":
        d = tmp_path / "a-directory"
        d.mkdir()
        return str(d), "regular file"
    plain = tmp_path / "not-executable"
    shutil.copy2(PYTHON, plain)
    plain.chmod(0o644)
    return str(plain), "not executable"


@pytest.mark.parametrize("kind", ["relative", "symlink", "directory", "not_executable"])
async def test_unusable_executable_is_listed_and_refused(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str], kind: str
) -> None:
    exe, word = _bad_executable(kind, tmp_path)
    d = await daemon_factory(config(fake_profile("broken", agent_env, executable=exe), fake_profile("good", agent_env)))
    async with d.http() as http:
        agents = {a["name"]: a for a in (await http.get("/v1/agents")).json()}
        assert agents["good"]["available"] is True and agents["good"]["problem"] is None
        broken = agents["broken"]
        assert broken["available"] is False and word in broken["problem"], broken
        r = await http.post("/v1/threads", json={"agent": "broken"})
        err = assert_refused(r, "executable_unusable")
        assert word in err["message"]
        assert (await http.get("/v1/threads")).json()["threads"] == []
    assert_nothing_spawned(d, tmp_path)


async def test_executable_is_checked_again_right_before_spawn(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    copy = tmp_path / "python-copy"
    shutil.copy2(PYTHON, copy)  # a real, regular, executable file
    d = await daemon_factory(config(fake_profile("copy", agent_env, executable=str(copy))))
    thread = await new_thread(d, "copy")
    copy.chmod(stat.S_IMODE(copy.stat().st_mode) & ~0o111)
    async with d.http() as http:
        r = await http.post(f"/v1/threads/{thread['id']}/messages", json={"text": "hi"})
        err = assert_refused(r, "executable_unusable")
        assert "not executable" in err["message"]
        again = await http.post(f"/v1/threads/{thread['id']}/resume")
        assert_refused(again, "executable_unusable")
        agents = {a["name"]: a for a in (await http.get("/v1/agents")).json()}
        assert agents["copy"]["available"] is False
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
        assert t["state"] in ("idle", "exited") and t["turn_active"] is False
    assert_nothing_spawned(d, tmp_path)


META_ARGS = ["$(touch PWNED)", "; rm -rf x", "`id`", "a|b", "&&", "> PWNED.out", "$HOME", "'quoted' \"double\" \\back"]


async def test_shell_metacharacters_are_passed_literally(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    env = {**agent_env, "META_VAR": "$(touch PWNED_ENV) `id` ; &&"}
    d = await daemon_factory(config(fake_profile("meta", env, extra_args=META_ARGS)))
    thread = await new_thread(d, "meta")
    await chat(d, thread["id"], "hello $(touch PWNED_PROMPT)")
    (start,) = starts(tmp_path)
    # sys.argv of the agent: script, --dialect, stream-json, then the profile args unchanged.
    assert start["argv"][:3] == [str(FAKE_AGENT), "--dialect", "stream-json"]
    assert start["argv"][3 : 3 + len(META_ARGS)] == META_ARGS
    assert start["env"]["META_VAR"] == env["META_VAR"]
    assert not list(tmp_path.rglob("PWNED*")), "a shell ran"


async def test_child_env_has_no_daemon_secrets(daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]) -> None:
    secrets = {
        "SECRET_TOKEN_FOR_TEST": "s3cr3t-token",
        "AWS_SECRET_ACCESS_KEY": "aws-s3cr3t",
        "ANTHROPIC_API_KEY": "sk-ant-s3cr3t",
    }
    home = tmp_path / "home"
    home.mkdir()
    profile_env = {**agent_env, "PROFILE_ONLY_VAR": "from the profile"}
    d = await daemon_factory(config(fake_profile("envtest", profile_env)), extra_env={**secrets, "HOME": str(home)})
    assert d.proc is not None
    daemon_environ = Path(f"/proc/{d.proc.pid}/environ").read_bytes()
    assert all(f"{k}={v}".encode() in daemon_environ for k, v in secrets.items())  # sanity
    thread = await new_thread(d, "envtest")
    await chat(d, thread["id"], "hello")
    (start,) = starts(tmp_path)
    env: dict[str, str] = start["env"]
    for key, value in secrets.items():
        assert key not in env and value not in json.dumps(env)
    assert not [k for k in env if k.startswith(("AGENT_BRIDGE", "AWS_", "ANTHROPIC_API"))]
    assert env["PATH"] == os.environ["PATH"] and env["HOME"] == str(home)
    os_part = {k for k in env if k in ENV_ALLOWLIST or k.startswith("LC_")}
    assert {k: env[k] for k in env if k not in os_part} == profile_env


async def test_a_profile_breaking_the_remote_url_rule_is_unusable_and_the_daemon_starts(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    """Issue #34 item 4: such a profile used to stop the daemon at load, while one with a
    missing executable was only listed. Both are now unusable profiles: listed with the
    reason and the fix, never the default, refused at thread creation (the rule's code,
    422), named once in the start-up log without the URL's password or query."""
    secret_url = "https://agent-user:hunter2@api.example.com/v1?api_key=sk-12345"
    d = await daemon_factory(
        config(
            fake_profile("remote_env", {**agent_env, "ANTHROPIC_BASE_URL": secret_url}),
            fake_profile("remote_arg", agent_env, extra_args=["--api=https://api.example.com/v1"]),
            fake_profile("http_opt_in", {**agent_env, "BASE": "http://example.com"}, remote_api_opt_in=True),
            fake_profile("missing_exe", agent_env, executable="/nonexistent/agent"),
            fake_profile("good", agent_env),
        )
    )
    async with d.http() as http:
        rows = {a["name"]: a for a in (await http.get("/v1/agents")).json()}
        for name in ("remote_env", "remote_arg"):
            assert rows[name]["available"] is False and rows[name]["default"] is False
            assert rows[name]["problem"] == (
                "remote URL https://api.example.com needs remote_api_opt_in; to let this agent reach that host, "
                f"set remote_api_opt_in = true in [agents.{name}]"
            )
        assert rows["http_opt_in"]["problem"].startswith("plain http to a non-loopback host is refused")
        assert rows["missing_exe"]["problem"] == "executable not found: /nonexistent/agent"
        assert rows["good"]["available"] is True and rows["good"]["default"] is True
        for name, code in [
            ("remote_env", "remote_url_refused"),
            ("http_opt_in", "remote_url_refused"),
            ("missing_exe", "executable_unusable"),
        ]:
            r = await http.post("/v1/threads", json={"agent": name})
            assert r.status_code == 422 and r.json()["error"]["code"] == code, r.text
            assert rows[name]["problem"] in r.json()["error"]["message"]
        r = await http.post("/v1/threads", json={})
        assert r.status_code == 201 and r.json()["agent"] == "good", r.text
    assert starts(tmp_path) == []
    log = d.stderr_path.read_text()
    (line,) = [json.loads(ln) for ln in log.splitlines() if "agents.unusable" in ln]
    assert set(line["profiles"]) == {"remote_env", "remote_arg", "http_opt_in", "missing_exe"}, line
    assert line["profiles"]["remote_arg"] == rows["remote_arg"]["problem"] and line["default"] == "good"
    for secret in ("hunter2", "agent-user", "sk-12345", "api_key"):
        assert secret not in log


async def test_remote_https_with_opt_in_and_loopback_urls_are_allowed(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    loopback = {"URL_V4": "http://127.0.0.1:9", "URL_NAME": "http://localhost:9", "URL_V6": "http://[::1]:9"}
    d = await daemon_factory(
        config(
            fake_profile(
                "opted_in",
                {**agent_env, "ANTHROPIC_BASE_URL": "https://api.example.com"},
                extra_args=["--api=https://api.example.com/v1"],
                remote_api_opt_in=True,
            ),
            fake_profile("loopback", {**agent_env, **loopback}, extra_args=[f"--api={u}" for u in loopback.values()]),
        )
    )
    for agent in ("opted_in", "loopback"):
        thread = await new_thread(d, agent)
        await chat(d, thread["id"], "hello")
    first, second = starts(tmp_path)
    assert first["env"]["ANTHROPIC_BASE_URL"] == "https://api.example.com"
    assert "--api=https://api.example.com/v1" in first["argv"]
    assert all(second["env"][k] == v for k, v in loopback.items())
    assert all(f"--api={u}" in second["argv"] for u in loopback.values())


@pytest.mark.parametrize("bad_id", ["../../etc", "-x y", "a" * 300])
async def test_invalid_stored_session_id_is_never_launched(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str], bad_id: str
) -> None:
    cfg = config(fake_profile("agent", agent_env))
    d1 = await daemon_factory(cfg)
    thread = await new_thread(d1, "agent")
    assert await d1.stop() == 0
    with sqlite3.connect(tmp_path / "data" / "bridge.db") as db:
        n = db.execute("UPDATE threads SET native_session_id = ? WHERE id = ?", (bad_id, thread["id"])).rowcount
    db.close()
    assert n == 1
    d2 = await daemon_factory(cfg)
    async with d2.http() as http:
        r = await http.post(f"/v1/threads/{thread['id']}/messages", json={"text": "hi"})
        err = assert_refused(r, "invalid_session_id")
        assert bad_id not in err["message"]
        assert_refused(await http.post(f"/v1/threads/{thread['id']}/resume"), "invalid_session_id")
    assert_nothing_spawned(d2, tmp_path)


async def test_invalid_session_id_reported_by_the_agent_is_ignored(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str], dialect: str
) -> None:
    d = await daemon_factory(config(fake_profile("agent", agent_env, dialect=dialect)))
    thread = await new_thread(d, "agent")
    events = await chat(d, thread["id"], "badsession")
    async with d.http() as http:
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
    assert t["native_session_id"] is None
    started = [e for e in events if e["kind"] == "session.started"]
    assert started and started[0]["data"]["native_session_id"] == "not a valid id!"
    diags = [e for e in events if e["kind"] == "diagnostic"]
    assert any("session id" in e["data"]["text"] and "not valid" in e["data"]["text"] for e in diags), diags
    # The next start is a fresh session, not a resume with the bad id.
    async with d.http() as http:
        r = await http.post(f"/v1/threads/{thread['id']}/stop")
        assert r.status_code == 202, r.text
    await chat(d, thread["id"], "again")
    assert [a for s in starts(tmp_path) for a in s["argv"] if a.startswith("--resume")] == []
