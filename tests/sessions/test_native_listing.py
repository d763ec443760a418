"""Listing an agent's own session files (bridge/sessions/native.py) on a real file system,
in-process: the store laid out as the real CLIs lay it out, with the hostile cases a
user's HOME can hold (symlinks, odd names, huge files, a file where a directory goes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.memory import MemoryAgent, Script, Spawner

from bridge.config import AgentProfile, load_settings
from bridge.errors import InvalidRequest
from bridge.protocols.native_sessions import HEAD_BYTES, claude_project_dir, qwen_project_dir
from bridge.sessions.native import MAX_SCAN, NativeSessions, list_files

pytestmark = pytest.mark.timeout(30)
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "native_sessions"
CLAUDE_ID = "2dd926a9-92c1-4cfd-bdf2-cba3d107be39"
QWEN_ID = "2f48b416-0809-4ddc-be73-fb571f698516"


def prompt_line(text: str) -> bytes:
    return json.dumps({"type": "user", "message": {"role": "user", "content": text}}).encode() + b"\n"


def put(directory: Path, sid: str, body: bytes, mtime: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{sid}.jsonl"
    path.write_bytes(body)
    os.utime(path, ns=(mtime * 10**9, mtime * 10**9))
    return path


def claude_dir(home: Path, cwd: Path) -> Path:
    return home / ".claude" / "projects" / claude_project_dir(str(cwd))


def claude(home: Path, **env: str) -> AgentProfile:
    return AgentProfile(
        name="claude", protocol="stream-json", executable="/usr/local/bin/claude", env={"HOME": str(home), **env}
    )


@pytest.fixture
def native(tmp_path: Path) -> NativeSessions:
    return NativeSessions(load_settings(data_dir=str(tmp_path / "data"), token="t" * 32))


async def test_claude_sessions_of_a_directory_are_listed_newest_first(tmp_path: Path, native: NativeSessions) -> None:
    home, work = tmp_path / "home", tmp_path / "my work"
    work.mkdir()
    store = claude_dir(home, work)
    put(store, CLAUDE_ID, (FIXTURES / "claude-code-2.1.197.jsonl").read_bytes(), 1_800_000_000)
    put(store, "newer", prompt_line("second session"), 1_800_000_100)
    (store / "memory").mkdir()  # what the CLI keeps next to its sessions
    out = await native.list(claude(home), str(work), 50, None)
    assert out == {
        "agent": "claude",
        "cwd": str(work),
        "store": "claude-code",
        "sessions": [
            {
                "id": "newer",
                "title": "second session",
                "last_activity": "2027-01-15T08:01:40.000Z",
                "source": "claude-code",
            },
            {
                "id": CLAUDE_ID,
                "title": "CHAT remember the word PINEAPPLE",
                "last_activity": "2027-01-15T08:00:00.000Z",
                "source": "claude-code",
            },
        ],
        "next_cursor": None,
        "reason": None,
        "detail": None,
        "truncated": False,
    }


async def test_the_store_is_keyed_by_the_real_path_and_claude_config_dir_wins(
    tmp_path: Path, native: NativeSessions
) -> None:
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    config = tmp_path / "elsewhere"
    put(config / "projects" / claude_project_dir(str(real)), "s1", prompt_line("hi"), 1_800_000_000)
    out = await native.list(claude(tmp_path / "home", CLAUDE_CONFIG_DIR=str(config)), str(link), 50, None)
    assert [s["id"] for s in out["sessions"]] == ["s1"] and out["cwd"] == str(real)


async def test_qwen_sessions_are_read_from_its_chats_dir(tmp_path: Path, native: NativeSessions) -> None:
    home, work = tmp_path / "home", tmp_path / "w"
    work.mkdir()
    chats = home / ".qwen" / "projects" / qwen_project_dir(str(work)) / "chats"
    put(chats, QWEN_ID, (FIXTURES / "qwen-code-0.24.4.jsonl").read_bytes(), 1_800_000_000)
    prof = AgentProfile(
        name="qwen",
        protocol="stream-json",
        executable="/usr/bin/node",
        args=["/opt/node_modules/@qwen-code/qwen-code/cli-entry.js"],
        env={"HOME": str(home)},
    )
    out = await native.list(prof, str(work), 50, None)
    assert out["store"] == "qwen-code" and out["reason"] is None
    assert [(s["id"], s["title"]) for s in out["sessions"]] == [(QWEN_ID, "CHAT remember the word MANGO")]


def test_untrusted_entries_are_skipped(tmp_path: Path) -> None:
    store, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    secret = put(outside, "secret", prompt_line("outside the store"), 1_800_000_000)
    put(store, "good", prompt_line("ok"), 1_800_000_000)
    (store / "linked.jsonl").symlink_to(secret)  # a symlink, even to a session file, is not followed
    (store / "dir.jsonl").mkdir()
    put(store, "bad name!", prompt_line("x"), 1_800_000_000)
    put(store, "a:" + "x" * 240 + "é", prompt_line("x"), 1_800_000_000)  # not in the id alphabet
    (store / "notes.txt").write_text("x")
    os.mkfifo(store / "fifo.jsonl")  # would block a reader that opened it
    out = list_files("claude-code", str(store), 50, None)
    assert [s["id"] for s in out["sessions"]] == ["good"]


def test_a_huge_session_file_is_read_only_at_its_ends(tmp_path: Path) -> None:
    # Sparse: 64 GiB on paper; reading it whole would never finish within the timeout.
    store = tmp_path / "store"
    path = put(store, "huge", prompt_line("the first prompt"), 1_800_000_000)
    title = json.dumps({"type": "custom-title", "customTitle": "at the end"}).encode() + b"\n"
    with open(path, "r+b") as fh:
        fh.seek(64 * 2**30)
        fh.write(b"\n" + title)
    os.utime(path, ns=(1_800_000_000 * 10**9,) * 2)
    [entry] = list_files("claude-code", str(store), 50, None)["sessions"]
    assert entry["title"] == "at the end" and entry["last_activity"] == "2027-01-15T08:00:00.000Z"
    assert path.stat().st_size > HEAD_BYTES


def test_a_missing_or_unreadable_store_is_an_empty_list_with_a_reason(tmp_path: Path) -> None:
    missing = list_files("claude-code", str(tmp_path / "nothing"), 50, None)
    assert missing["sessions"] == [] and missing["reason"] == "store_missing"
    (tmp_path / "afile").write_text("x")
    unreadable = list_files("qwen-code", str(tmp_path / "afile"), 50, None)
    assert unreadable["sessions"] == [] and unreadable["reason"] == "store_unreadable" and unreadable["detail"]


def test_pages_follow_the_cursor_and_the_scan_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    for i in range(5):
        put(store, f"s{i}", prompt_line(f"p{i}"), 1_800_000_000 + i)
    first = list_files("claude-code", str(store), 2, None)
    second = list_files("claude-code", str(store), 2, first["next_cursor"])
    third = list_files("claude-code", str(store), 2, second["next_cursor"])
    ids = [s["id"] for p in (first, second, third) for s in p["sessions"]]
    assert ids == ["s4", "s3", "s2", "s1", "s0"] and third["next_cursor"] is None
    monkeypatch.setattr("bridge.sessions.native.MAX_SCAN", 3)
    capped = list_files("claude-code", str(store), 50, None)
    assert capped["truncated"] is True and len(capped["sessions"]) <= 3
    assert MAX_SCAN == 10_000


async def test_agents_without_a_known_store_and_bad_requests(tmp_path: Path, native: NativeSessions) -> None:
    demo = AgentProfile(name="awp", protocol="awp-jsonl", executable="/usr/bin/true")
    out = await native.list(demo, str(tmp_path), 50, None)
    assert out["sessions"] == [] and out["reason"] == "no_store" and out["store"] is None
    nohome = await native.list(
        AgentProfile(name="c", protocol="stream-json", executable="/usr/local/bin/claude"), str(tmp_path), 5, None
    )
    assert nohome["reason"] in ("no_home", "store_missing")  # no_home when the daemon itself has no HOME
    for cwd in ("relative/dir", str(tmp_path / "absent")):
        with pytest.raises(InvalidRequest) as err:
            await native.list(claude(tmp_path), cwd, 50, None)
        assert err.value.code == "bad_cwd"
    with pytest.raises(InvalidRequest) as err:
        await native.list(claude(tmp_path), str(tmp_path), 50, "a1/x")
    assert err.value.code == "invalid_cursor"


# ------------------------------------------------------------------ ACP agents, in memory


def acp(tmp_path: Path) -> AgentProfile:
    exe = tmp_path / "agent"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return AgentProfile(name="a", protocol="acp", executable=str(exe), env={"SECRET_TOKEN": "hunter2-secret"})


def lists(sessions: list[dict[str, object]], next_cursor: str | None = None) -> Script:
    def script(agent: MemoryAgent, msg: dict[str, object]) -> None:
        if msg.get("method") == "initialize":
            caps = {"agentCapabilities": {"sessionCapabilities": {"list": {}}}}
            agent.say({"jsonrpc": "2.0", "id": msg["id"], "result": caps})
        elif msg.get("method") == "session/list":
            result = {"sessions": sessions, "nextCursor": next_cursor}
            agent.say({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    return script


async def test_an_acp_agent_is_asked_paged_and_always_stopped(tmp_path: Path) -> None:
    work = str(tmp_path)
    found = [{"sessionId": f"s{i}", "cwd": work, "title": f"t{i}"} for i in range(3)]
    found += [{"sessionId": "../x", "cwd": work}, {"sessionId": "other", "cwd": "/elsewhere"}]
    spawner = Spawner(lists(found, next_cursor="agent-page-2"))
    native = NativeSessions(load_settings(data_dir=str(tmp_path / "d"), token="t" * 32), spawn=spawner)
    first = await native.list(acp(tmp_path), work, 2, None)
    assert [s["id"] for s in first["sessions"]] == ["s0", "s1"] and first["store"] == "acp"
    second = await native.list(acp(tmp_path), work, 2, first["next_cursor"])
    assert [s["id"] for s in second["sessions"]] == ["s2"]  # invalid ids and other cwds left out
    third = await native.list(acp(tmp_path), work, 2, second["next_cursor"])
    asked = [json.loads(a.written[-1])["params"] for a in spawner.agents]
    assert asked == [{"cwd": work}, {"cwd": work}, {"cwd": work, "cursor": "agent-page-2"}]
    assert third["sessions"][0]["id"] == "s0"  # the agent's page 2 (this fake repeats itself)
    assert all(not a.alive and a.released and a.stdin_closed for a in spawner.agents)


async def test_an_acp_agent_that_is_silent_or_exits_is_a_reason_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("bridge.sessions.native.ACP_TIMEOUT_S", 0.2)
    monkeypatch.setattr("bridge.sessions.native.STOP_GRACE_S", 0.1)
    settings = load_settings(data_dir=str(tmp_path / "d"), token="t" * 32)
    silent = Spawner(exit_on_eof=False)  # needs SIGTERM too
    out = await NativeSessions(settings, spawn=silent).list(acp(tmp_path), str(tmp_path), 5, None)
    assert out["reason"] == "agent_timeout" and out["sessions"] == []
    assert not silent.agent.alive and silent.agent.released

    def dies(agent: MemoryAgent, msg: dict[str, object]) -> None:
        agent.exit(1)

    out = await NativeSessions(settings, spawn=Spawner(dies)).list(acp(tmp_path), str(tmp_path), 5, None)
    assert out["reason"] == "agent_error" and "exited" in out["detail"]

    def refuses(agent: MemoryAgent, msg: dict[str, object]) -> None:
        err = {"code": -32000, "message": "auth needed for hunter2-secret"}
        agent.say({"jsonrpc": "2.0", "id": msg["id"], "error": err})

    out = await NativeSessions(settings, spawn=Spawner(refuses)).list(acp(tmp_path), str(tmp_path), 5, None)
    assert out["reason"] == "agent_error" and "hunter2-secret" not in out["detail"]  # a profile secret is redacted

    gone = AgentProfile(name="g", protocol="acp", executable=str(tmp_path / "missing"))
    out = await NativeSessions(settings, spawn=Spawner()).list(gone, str(tmp_path), 5, None)
    assert out["reason"] == "agent_unavailable" and "not found" in out["detail"]
