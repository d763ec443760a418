"""A thread's MCP servers at launch (bridge/launching.py, sessions/mcp_config.py): the
remote-URL rule on them, and the generated --mcp-config file of the dialects that take one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bridge.config import AgentProfile
from bridge.errors import LaunchRefused
from bridge.launching import check_servers
from bridge.process.launch import LaunchSpec
from bridge.protocols.events import Event
from bridge.sessions.mcp_config import discard, scrubbed, scrubber, with_servers

STDIO = {"name": "fs", "command": "/usr/bin/mcp-fs", "args": [], "env": [{"name": "T", "value": "secret"}]}


def http(url: str) -> dict[str, Any]:
    return {"type": "http", "name": "web", "url": url, "headers": []}


def profile(protocol: str = "stream-json", **kw: Any) -> AgentProfile:
    return AgentProfile(executable="/bin/true", protocol=protocol, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("servers", "opt_in", "code"),
    [
        ([http("http://127.0.0.1:9/mcp")], False, None),
        ([http("https://mcp.example.com/")], False, "remote_url_refused"),
        ([http("https://mcp.example.com/")], True, None),
        ([http("http://mcp.example.com/")], True, "remote_url_refused"),  # plain http to a remote host: never
        ([{**STDIO, "args": ["--url", "https://evil.example"]}], False, "remote_url_refused"),
        ([{**STDIO, "env": [{"name": "U", "value": "wss://evil.example"}]}], False, "remote_url_refused"),
        ([{**STDIO, "command": "rel"}], False, "bad_mcp_config"),
    ],
)
def test_the_remote_url_rule_holds_for_mcp_servers(servers: list[Any], opt_in: bool, code: str | None) -> None:
    prof = profile(remote_api_opt_in=opt_in)
    if code is None:
        check_servers(prof, {"mcp_servers": servers})
        return
    with pytest.raises(LaunchRefused) as info:
        check_servers(prof, {"mcp_servers": servers})
    assert info.value.code == code


def test_an_awp_agent_takes_one_file() -> None:
    both = {"mcp_servers": [STDIO], "mcp_config": "/etc/mcp.json"}
    check_servers(profile("stream-json"), both)
    check_servers(profile("awp-jsonl"), {"mcp_servers": [STDIO]})
    with pytest.raises(LaunchRefused) as info:
        check_servers(profile("awp-jsonl"), both)
    assert info.value.code == "bad_mcp_config"


def spec(home: Path | None, *argv: str) -> LaunchSpec:
    env = {} if home is None else {"HOME": str(home)}
    return LaunchSpec(argv=("/bin/claude", "-p", *argv), env=env, cwd="/")


def test_the_file_is_private_and_named_last_on_the_command_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    got, path = with_servers(spec(home), "thr_1", {"mcp_servers": [STDIO]}, "stream-json")
    assert path == home / ".agent-bridge-mcp" / "thr_1.json"
    assert got.argv[-2:] == ("--mcp-config", str(path))
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(path.parent).st_mode & 0o777 == 0o700
    assert json.loads(path.read_text())["mcpServers"]["fs"]["env"] == {"T": "secret"}
    assert "secret" not in " ".join(got.argv)
    both, _ = with_servers(spec(home, "--mcp-config", "/p.json"), "thr_1", {"mcp_servers": [STDIO]}, "stream-json")
    assert both.argv[-3:] == ("--mcp-config", "/p.json", str(path))
    discard(path)
    assert not path.exists()
    discard(path)  # gone already: nothing


def test_no_file_where_none_is_needed_or_there_is_no_home(tmp_path: Path) -> None:
    none = spec(tmp_path)
    assert with_servers(none, "t", {}, "stream-json") == (none, None)
    assert with_servers(none, "t", {"mcp_servers": [STDIO]}, "acp") == (none, None)  # in its session
    with pytest.raises(LaunchRefused) as info:
        with_servers(spec(None), "t", {"mcp_servers": [STDIO]}, "stream-json")  # no HOME to hold it
    assert info.value.code == "bad_mcp_config"
    users_home = tmp_path / "data" / "homes" / "u"  # users mode: the home is in the data dir, and the agent's
    assert with_servers(spec(users_home), "t", {"mcp_servers": [STDIO]}, "stream-json")[1] is not None


def test_the_lines_written_to_the_agent_are_stored_without_the_servers_secrets() -> None:
    scrub = scrubber(
        {"mcp_servers": [STDIO, {**http("http://127.0.0.1:1/"), "headers": [{"name": "A", "value": "tok-123456"}]}]}
    )
    written = Event(
        "client", "client.other", {"op": "auto_reply"}, '{"env":[{"name":"T","value":"secret"}],"h":"tok-123456"}'
    )
    echoed = Event("agent", "message", {"text": "secret"}, '"secret"')  # scrubbed when it was read, not here
    out = scrubbed([written, echoed], scrub)
    assert "secret" not in (out[0].raw or "") and "tok-123456" not in (out[0].raw or "") and out[1] is echoed
    assert scrubber({}) is None and scrubbed([written], None) == [written]
