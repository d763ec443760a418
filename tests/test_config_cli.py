"""Configuration and command line (docs/api.md §1): precedence of flags / env twins / TOML /
defaults, the AWP launch variables, config errors, the token file, ``--no-auth``,
``agent-bridge agents``, ``--version`` and a clean exit on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import PYTHON, STEP_TIMEOUT

from bridge import __version__
from bridge.config import DEFAULT_HOST, DEFAULT_PORT, load_settings
from bridge.errors import ConfigError
from bridge.process.sandbox import MIN_ABI, landlock_abi

LISTENING_RE = re.compile(r"agent-bridge listening on http://127\.0\.0\.1:(\d+)")
_serial = itertools.count()

# --------------------------------------------------------------------------- helpers


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The test runner's environment without anything that configures the bridge, with a
    private HOME and a PATH that holds no agent CLI unless the test adds one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_BRIDGE_", "AWP_")) and k != "XDG_DATA_HOME"}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    env.update(HOME=str(home), PATH=str(empty))
    env.update(extra)
    return env


def run_cli(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    """A one-shot ``python -m bridge ...``; killed if it outlives ``timeout``."""
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or clean_env(tmp_path),
        cwd=str(tmp_path),
        check=False,
    )


@dataclass
class Served:
    proc: asyncio.subprocess.Process
    first_line: str
    url: str
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text()


async def terminate(proc: asyncio.subprocess.Process, sig: int = signal.SIGTERM, within_s: float = 10) -> int:
    if proc.returncode is None:
        proc.send_signal(sig)
    try:
        return await asyncio.wait_for(proc.wait(), within_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"serve did not exit within {within_s}s of signal {sig}") from None


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> AsyncIterator[Served]:
    """``python -m bridge serve ARGS``; yields once the first stdout line is out. The
    process is always stopped (and reaped) on the way out."""
    err_path = tmp_path / f"serve-{next(_serial)}.stderr"
    with err_path.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bridge",
            "serve",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=env or clean_env(tmp_path),
            cwd=str(tmp_path),
        )
    try:
        assert proc.stdout is not None
        try:
            raw = await asyncio.wait_for(proc.stdout.readline(), STEP_TIMEOUT)
        except TimeoutError:
            raise AssertionError(f"serve printed nothing: {err_path.read_text()}") from None
        line = raw.decode()
        assert line.endswith("\n"), (line, err_path.read_text())
        line = line[:-1]
        yield Served(proc, line, line.removeprefix("agent-bridge listening on "), err_path)
    finally:
        if proc.returncode is None:
            proc.kill()
        await asyncio.wait_for(proc.wait(), STEP_TIMEOUT)


def port_of(first_line: str) -> int:
    m = LISTENING_RE.fullmatch(first_line)
    assert m, f"unexpected first line: {first_line!r}"
    port = int(m.group(1))
    assert 0 < port < 65536
    return port


async def get_agents(url: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with httpx.AsyncClient(base_url=url, timeout=STEP_TIMEOUT) as http:
        return await http.get("/v1/agents", headers=headers)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def nothing_listens(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


# --------------------------------------------------------------------------- precedence


def test_defaults(tmp_path: Path) -> None:
    s = load_settings(env={"HOME": str(tmp_path)}, discover_path=False)
    assert (s.host, s.port) == (DEFAULT_HOST, DEFAULT_PORT) == ("127.0.0.1", 8765)
    assert s.data_dir == tmp_path / ".local" / "share" / "agent-bridge"
    assert s.token is None and s.no_auth is False and s.config_file is None
    assert list(s.agents) == ["demo"] and s.default_agent == "demo"
    assert s.agents["demo"].executable == PYTHON
    assert s.agents["demo"].env["DEMO_AGENT_STATE_DIR"] == str(s.data_dir / "demo-agent")


def test_flags_beat_env_twins_beat_toml_beat_defaults(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.toml", '[server]\nhost = "127.0.0.2"\nport = 1111\n')
    home = {"HOME": str(tmp_path)}
    twins = {
        **home,
        "AGENT_BRIDGE_HOST": "127.0.0.3",
        "AGENT_BRIDGE_PORT": "2222",
        "AGENT_BRIDGE_DATA_DIR": str(tmp_path / "env-data"),
        "AGENT_BRIDGE_TOKEN": "env-token",
    }

    s = load_settings(config=str(cfg), env=home, discover_path=False)
    assert (s.host, s.port, s.token) == ("127.0.0.2", 1111, None)
    assert s.data_dir == tmp_path / ".local/share/agent-bridge"
    assert s.config_file == cfg

    s = load_settings(config=str(cfg), env=twins, discover_path=False)
    assert (s.host, s.port, s.token) == ("127.0.0.3", 2222, "env-token")
    assert s.data_dir == tmp_path / "env-data"

    s = load_settings(
        config=str(cfg),
        host="127.0.0.4",
        port=3333,
        data_dir=str(tmp_path / "flag-data"),
        token="flag-token",
        env=twins,
        discover_path=False,
    )
    assert (s.host, s.port, s.token) == ("127.0.0.4", 3333, "flag-token")
    assert s.data_dir == tmp_path / "flag-data"

    # --port 0 is a real value, not "unset".
    s = load_settings(config=str(cfg), port=0, env=twins, discover_path=False)
    assert s.port == 0


def test_config_env_twin_and_flag(tmp_path: Path) -> None:
    from_env = write(tmp_path / "env.toml", "[server]\nport = 1234\n")
    from_flag = write(tmp_path / "flag.toml", "[server]\nport = 4321\n")
    env = {"HOME": str(tmp_path), "AGENT_BRIDGE_CONFIG": str(from_env)}
    assert load_settings(env=env, discover_path=False).port == 1234
    assert load_settings(config=str(from_flag), env=env, discover_path=False).port == 4321


def test_relative_data_dir_becomes_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = load_settings(data_dir="rel/data", env={"HOME": str(tmp_path)}, discover_path=False)
    assert s.data_dir == tmp_path / "rel" / "data"


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"AGENT_BRIDGE_PORT": "eighty"}, ["AGENT_BRIDGE_PORT"]),
        ({"AGENT_BRIDGE_LOG_FORMAT": "xml"}, ["log format", "xml"]),
        ({"AGENT_BRIDGE_PORT": "70000"}, ["[server]", "port"]),
    ],
)
def test_bad_env_twin_values(tmp_path: Path, env: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(env={"HOME": str(tmp_path), **env}, discover_path=False)
    assert all(w in exc.value.message for w in words), exc.value.message


def test_xdg_data_home_is_honoured(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home"), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    s = load_settings(env=env, discover_path=False)
    assert s.data_dir == tmp_path / "xdg" / "agent-bridge"
    env["AGENT_BRIDGE_DATA_DIR"] = str(tmp_path / "explicit")
    assert load_settings(env=env, discover_path=False).data_dir == tmp_path / "explicit"


# --------------------------------------------------------------------------- AWP variables


def test_awp_variables_define_the_awp_profile(tmp_path: Path) -> None:
    env = {
        "HOME": str(tmp_path),
        "AWP_AGENT_CLI_EXECUTABLE": PYTHON,
        "AWP_AGENT_CLI_ARGS_JSON": json.dumps(["-I", "/opt/agent.py", "$(not a shell)"]),
        "AWP_AGENT_CLI_ENV_JSON": json.dumps({"ANTHROPIC_BASE_URL": "https://api.example.com"}),
        "AWP_AGENT_CLI_PROTOCOL": "stream-json",
        "AWP_AGENT_DEFAULT_MODEL": "model-x",
        "AWP_AGENT_REMOTE_API_OPT_IN": "1",
    }
    s = load_settings(env=env, discover_path=False)
    awp = s.agents["awp"]
    assert awp.name == "awp" and awp.protocol == "stream-json" and awp.executable == PYTHON
    assert awp.args == ["-I", "/opt/agent.py", "$(not a shell)"]
    assert awp.env == {"ANTHROPIC_BASE_URL": "https://api.example.com"}
    assert awp.model == "model-x" and awp.remote_api_opt_in is True
    assert s.default_agent == "awp" and "demo" in s.agents


def test_awp_defaults(tmp_path: Path) -> None:
    env = {
        "HOME": str(tmp_path),
        "AWP_AGENT_CLI_EXECUTABLE": PYTHON,
        "AWP_AGENT_REMOTE_API_OPT_IN": "true",
    }  # only "1" opts in
    awp = load_settings(env=env, discover_path=False).agents["awp"]
    assert awp.protocol == "awp-jsonl" and awp.args == [] and awp.env == {}
    assert awp.model is None and awp.remote_api_opt_in is False
    assert "awp" not in load_settings(env={"HOME": str(tmp_path)}, discover_path=False).agents


def test_config_file_awp_profile_wins_over_awp_variables(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.toml", f'[agents.awp]\nexecutable = {json.dumps(PYTHON)}\nargs = ["from-file"]\n')
    env = {"HOME": str(tmp_path), "AWP_AGENT_CLI_EXECUTABLE": "/from/env", "AWP_AGENT_CLI_ARGS_JSON": '["from-env"]'}
    s = load_settings(config=str(cfg), env=env, discover_path=False)
    assert s.agents["awp"].args == ["from-file"]


@pytest.mark.parametrize(
    ("var", "value", "words"),
    [
        ("AWP_AGENT_CLI_ARGS_JSON", "[not json", ["AWP_AGENT_CLI_ARGS_JSON", "not JSON"]),
        ("AWP_AGENT_CLI_ENV_JSON", "{'single': 'quotes'}", ["AWP_AGENT_CLI_ENV_JSON", "not JSON"]),
        ("AWP_AGENT_CLI_ARGS_JSON", '"-v"', ["AWP_AGENT_CLI_ARGS_JSON", "array of strings"]),
        ("AWP_AGENT_CLI_ARGS_JSON", "[1, 2]", ["AWP_AGENT_CLI_ARGS_JSON", "array of strings"]),
        ("AWP_AGENT_CLI_ENV_JSON", '["A=1"]', ["AWP_AGENT_CLI_ENV_JSON", "object of strings"]),
        ("AWP_AGENT_CLI_ENV_JSON", '{"A": 1}', ["AWP_AGENT_CLI_ENV_JSON", "object of strings"]),
        ("AWP_AGENT_CLI_PROTOCOL", "acp-ish", ["AWP_AGENT_CLI_PROTOCOL", "acp-ish"]),
    ],
)
def test_malformed_awp_variables_are_a_clear_config_error(
    tmp_path: Path, var: str, value: str, words: list[str]
) -> None:
    env = {"HOME": str(tmp_path), "AWP_AGENT_CLI_EXECUTABLE": PYTHON, var: value}
    with pytest.raises(ConfigError) as exc:
        load_settings(env=env, discover_path=False)
    assert all(w in exc.value.message for w in words), exc.value.message
    assert exc.value.code == "config_error"


# --------------------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ("[server]\nbogus_key = 1\n", ["[server]", "bogus_key"]),
        ('[server]\nport = "eighty"\n', ["[server]", "port"]),
        ('[agents.mine]\nexecutable = "/bin/true"\ncolour = "red"\n', ["[agents.mine]", "colour"]),
        ('[agents.mine]\nexecutable = "/bin/true"\nprotocol = "telnet"\n', ["[agents.mine]", "protocol"]),
        ("[agents.mine]\nargs = []\n", ["[agents.mine]", "executable"]),
        ("[servr]\nport = 1\n", ["[servr]: not a section; did you mean [server]?"]),
        ("server = 5\n", ["[server]", "table"]),
        ('server = "ab"\n', ["[server]", "table"]),
        ("agents = 5\n", ["[agents]", "table"]),
        ("[agents]\nmine = 5\n", ["[agents.mine]", "table"]),
        ("[server\nport = 1\n", ["line 1, column 8: not valid TOML: expected ']'"]),
    ],
)
def test_bad_config_file_is_a_config_error_naming_the_problem(tmp_path: Path, toml: str, words: list[str]) -> None:
    cfg = write(tmp_path / "bad.toml", toml)
    with pytest.raises(ConfigError) as exc:
        load_settings(config=str(cfg), env={"HOME": str(tmp_path)}, discover_path=False)
    assert all(w in exc.value.message for w in words), exc.value.message
    assert exc.value.message.startswith(f"{cfg}: "), exc.value.message  # the file, first


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        # Issue #34: "[server]: prot: Extra inputs are not permitted" named neither the
        # file nor the key meant.
        ("[server]\nprot = 8000\n", "[server] prot: not a setting; did you mean 'port'?"),
        ("[store]\nurll = 'x'\n", "[store] urll: not a setting; did you mean 'url'?"),
        ("[cluster]\nreplica = 'x'\n", "[cluster] replica: not a setting; did you mean 'replica_id'?"),
        ("[auth]\nmod = 'users'\n", "[auth] mod: not a setting; did you mean 'mode'?"),
        ("[sandbox]\nextra_reads = []\n", "[sandbox] extra_reads: not a setting; did you mean 'extra_read'?"),
        (
            '[agents.mine]\nexecutable = "/bin/true"\nremote_api_optin = true\n',
            "[agents.mine] remote_api_optin: not a setting; did you mean 'remote_api_opt_in'?",
        ),
        ("[server]\nzzz = 1\n", "[server] zzz: not a setting; the settings of [server] are in docs/configuration.md"),
        (
            '[agents.mine]\nexecutible = "/bin/true"\n',
            "[agents.mine] executible: not a setting; did you mean 'executable'?; "
            "[agents.mine] executable: is required",
        ),
        # Wrong types, said in TOML's words, never quoting the value (it may be a secret).
        ('[server]\nport = "eighty"\n', "[server] port: must be a whole number, not text"),
        ("[server]\nallowed_hosts = 'a.example'\n", "[server] allowed_hosts: must be a list, not text"),
        (
            "[server]\ntrust_proxy_headers = 'yes please'\n",
            "[server] trust_proxy_headers: must be true or false, not text",
        ),
        (
            '[agents.mine]\nexecutable = "/bin/true"\nenv = "sk-secret"\n',
            "[agents.mine] env: must be a table, not text",
        ),
        (
            '[agents.mine]\nexecutable = "/bin/true"\nenv = { A = 1 }\n',
            "[agents.mine] env.A: must be text in quotes, not a whole number",
        ),
        ("[auth]\nmode = 'user'\n", "[auth] mode: must be one of 'token' or 'users'"),
        ("[server]\nport = 70000\n", "[server] port: must be at most 65535"),
        # Names that are not sections: the nearest section, or the section the key is in.
        ("[agent.x]\nexecutable = '/bin/true'\n", "[agent]: not a section; did you mean [agents]?"),
        ("port = 1\n", "port: not a section; did you mean port under [server]?"),
        # TOML syntax: the line and column.
        ("[server]\nport = = 1\n", "line 2, column 8: not valid TOML: invalid value"),
    ],
)
def test_config_errors_name_the_file_section_key_and_the_nearest_name(tmp_path: Path, toml: str, said: str) -> None:
    cfg = write(tmp_path / "config.toml", toml)
    with pytest.raises(ConfigError) as exc:
        load_settings(config=str(cfg), env={"HOME": str(tmp_path)}, discover_path=False)
    assert exc.value.message == f"{cfg}: {said}"
    assert "sk-secret" not in exc.value.message and "Input should" not in exc.value.message


def test_a_value_from_an_env_twin_or_a_flag_is_named_by_it_not_by_the_file(tmp_path: Path) -> None:
    cfg = write(tmp_path / "config.toml", "[server]\nport = 80\n")
    home = {"HOME": str(tmp_path)}
    with pytest.raises(ConfigError) as exc:
        load_settings(config=str(cfg), env={**home, "AGENT_BRIDGE_PORT": "70000"}, discover_path=False)
    assert exc.value.message == "[server] port (from AGENT_BRIDGE_PORT): must be at most 65535"
    with pytest.raises(ConfigError) as exc:
        load_settings(config=str(cfg), port=70000, env=home, discover_path=False)
    assert exc.value.message == "[server] port (from --port): must be at most 65535"
    with pytest.raises(ConfigError) as exc:
        load_settings(env={**home, "AGENT_BRIDGE_SANDBOX": "chroot"}, discover_path=False)
    assert exc.value.message.startswith("[sandbox] mode (from AGENT_BRIDGE_SANDBOX): must be one of 'auto'")


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(config=str(tmp_path / "nope.toml"), env={}, discover_path=False)


@pytest.mark.parametrize(
    ("command", "toml", "word"),
    [
        ("serve", "[server]\nbogus_key = 1\n", "bogus_key"),
        ("serve", '[agents.mine]\nexecutable = "/bin/true"\ncolour = "red"\n', "colour"),
        ("agents", '[agents.mine]\nexecutable = "/bin/true"\ncolour = "red"\n', "colour"),
        ("serve", "[server\n", "not valid TOML"),
        ("agents", "server = 5\n", "[server] must be a table"),
    ],
)
def test_cli_bad_config_exits_2_with_one_line_on_stderr(tmp_path: Path, command: str, toml: str, word: str) -> None:
    cfg = write(tmp_path / "bad.toml", toml)
    extra = ["--port", "0"] if command == "serve" else []
    r = run_cli(tmp_path, command, "--config", str(cfg), "--data-dir", str(tmp_path / "d"), *extra)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agent-bridge: ") and word in lines[0], r.stderr


# --------------------------------------------------------------------------- token


async def test_token_file_is_generated_0600_and_reused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    token_file = data / "token"
    async with serving(tmp_path, "--port", "0", "--data-dir", str(data)) as s:
        port_of(s.first_line)
        assert token_file.exists()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32
        r = await get_agents(s.url, token)
        assert r.status_code == 200, r.text
        assert "demo" in [a["name"] for a in r.json()]
        for wrong in ("wrong-token", token[:-1], token + "x"):
            r = await get_agents(s.url, wrong)
            assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", r.text
        r = await get_agents(s.url, None)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert await terminate(s.proc) == 0
    assert not list(data.glob("token.*")), "temporary token file left behind"

    async with serving(tmp_path, "--port", "0", "--data-dir", str(data)) as s:
        assert token_file.read_text().strip() == token
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert (await get_agents(s.url, token)).status_code == 200
        assert (await get_agents(s.url, "wrong-token")).status_code == 401


async def test_token_env_twin_and_flag(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    env = clean_env(tmp_path, AGENT_BRIDGE_TOKEN="env-token-0123456789")
    async with serving(tmp_path, "--port", "0", "--data-dir", str(fresh), env=env) as s:
        port_of(s.first_line)
        assert (await get_agents(s.url, "env-token-0123456789")).status_code == 200
        assert (await get_agents(s.url, "other")).status_code == 401
    assert not (fresh / "token").exists(), "an explicit token must not be written to disk"

    # The flag beats the env twin, and an explicit token beats the file.
    data = tmp_path / "data"
    write(data / "token", "file-token-0123456789\n")
    async with serving(
        tmp_path, "--port", "0", "--data-dir", str(data), "--token", "flag-token-0123456789", env=env
    ) as s:
        assert (await get_agents(s.url, "flag-token-0123456789")).status_code == 200
        assert (await get_agents(s.url, "env-token-0123456789")).status_code == 401
        assert (await get_agents(s.url, "file-token-0123456789")).status_code == 401
    async with serving(tmp_path, "--port", "0", "--data-dir", str(data)) as s:
        assert (await get_agents(s.url, "file-token-0123456789")).status_code == 200


async def test_env_twins_for_host_port_and_data_dir(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(
        tmp_path,
        AGENT_BRIDGE_HOST="127.0.0.1",
        AGENT_BRIDGE_PORT=str(port),
        AGENT_BRIDGE_DATA_DIR=str(tmp_path / "env-data"),
    )
    async with serving(tmp_path, env=env) as s:
        assert s.first_line == f"agent-bridge listening on http://127.0.0.1:{port}"
        token = (tmp_path / "env-data" / "token").read_text().strip()
        assert (await get_agents(s.url, token)).status_code == 200


# --------------------------------------------------------------------------- --no-auth


@pytest.mark.parametrize("how", ["flag", "env"])
def test_no_auth_on_a_non_loopback_address_is_refused(tmp_path: Path, how: str) -> None:
    port = free_port()
    args = ["serve", "--no-auth", "--port", str(port), "--data-dir", str(tmp_path / "d")]
    env = clean_env(tmp_path)
    if how == "flag":
        args += ["--host", "0.0.0.0"]
    else:
        env["AGENT_BRIDGE_HOST"] = "0.0.0.0"
    r = run_cli(tmp_path, *args, env=env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert "--no-auth" in r.stderr and "loopback" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert nothing_listens(port)
    assert not (tmp_path / "d" / "token").exists()


def test_cli_bad_env_twin_exits_2_with_one_line_on_stderr(tmp_path: Path) -> None:
    env = clean_env(tmp_path, AGENT_BRIDGE_LOG_FORMAT="xml")
    r = run_cli(tmp_path, "serve", "--port", "0", "--data-dir", str(tmp_path / "d"), env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == "agent-bridge: log format must be json or console, not 'xml'"


def test_no_auth_and_token_are_mutually_exclusive(tmp_path: Path) -> None:
    r = run_cli(tmp_path, "serve", "--no-auth", "--token", "t", "--port", "0")
    assert r.returncode == 2 and "not allowed with" in r.stderr


async def test_no_auth_on_loopback_needs_no_token(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with serving(tmp_path, "--no-auth", "--port", "0", "--data-dir", str(data)) as s:
        port_of(s.first_line)
        r = await get_agents(s.url, None)
        assert r.status_code == 200, r.text
        assert "demo" in [a["name"] for a in r.json()]
        assert (await get_agents(s.url, "anything")).status_code == 200
    assert not (data / "token").exists()


# --------------------------------------------------------------------------- agents


def agents_json(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> list[Any]:
    r = run_cli(tmp_path, "agents", "--json", "--data-dir", str(tmp_path / "d"), *args, env=env)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert isinstance(rows, list)
    return rows


def test_agents_with_nothing_configured_lists_the_demo_as_default(tmp_path: Path) -> None:
    rows = agents_json(tmp_path)
    assert [r["name"] for r in rows] == ["demo"]
    (demo,) = rows
    assert demo == {
        "name": "demo",
        "protocol": "stream-json",
        "model": "demo",
        "executable": PYTHON,
        "available": True,
        "problem": None,
        "default": True,
        "sandbox": "landlock" if landlock_abi() >= MIN_ABI else "none",
        "cli": None,
    }
    r = run_cli(tmp_path, "agents", "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.splitlines()[0].startswith("ok demo (default)  [stream-json]")


def test_agents_lists_a_broken_profile_with_its_problem(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "c.toml",
        '[agents.broken]\nexecutable = "/nonexistent/agent-bin"\n\n[agents.relative]\nexecutable = "claude"\n',
    )
    rows = {r["name"]: r for r in agents_json(tmp_path, "--config", str(cfg))}
    assert set(rows) == {"broken", "relative", "demo"}
    assert rows["broken"]["available"] is False
    assert rows["broken"]["problem"] == "executable not found: /nonexistent/agent-bin"
    assert rows["relative"]["available"] is False and "absolute" in rows["relative"]["problem"]
    assert rows["demo"]["available"] is True
    r = run_cli(tmp_path, "agents", "--config", str(cfg), "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 0, r.stderr
    assert re.search(r"^-- broken\b", r.stdout, re.M)
    assert "unusable: executable not found: /nonexistent/agent-bin" in r.stdout
    assert re.search(r"^ok demo\b", r.stdout, re.M)


def test_agents_finds_claude_on_path_and_resolves_the_symlink(tmp_path: Path) -> None:
    script = write(tmp_path / "real" / "claude-impl.sh", "#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "claude").symlink_to(script)
    env = clean_env(tmp_path, PATH=str(bindir))
    rows = {r["name"]: r for r in agents_json(tmp_path, env=env)}
    claude = rows["claude"]
    assert claude["executable"] == os.path.realpath(script) != str(bindir / "claude")
    assert claude["available"] is True and claude["problem"] is None
    assert claude["protocol"] == "stream-json" and claude["default"] is False
    assert rows["demo"]["default"] is True


# --------------------------------------------------------------------------- misc


def test_version(tmp_path: Path) -> None:
    r = run_cli(tmp_path, "--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"agent-bridge {__version__}"


def test_no_command_prints_help_and_exits_2(tmp_path: Path) -> None:
    r = run_cli(tmp_path)
    assert r.returncode == 2 and "serve" in r.stdout


def every_parser(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += every_parser(sub)
    return out


def test_help_is_plain_text_with_every_default_and_examples(tmp_path: Path) -> None:
    """Issue #34: ``--help`` showed the module docstring's reST (````serve````), and
    options without their defaults."""
    from bridge.cli import _parser

    parsers = every_parser(_parser())
    assert len(parsers) > 12
    for parser in parsers:
        text = parser.format_help()
        assert "``" not in text and not re.search(r":\w+:`", text), text
        assert re.search(r"^examples?:\n  agent-bridge ", text, re.M), text  # laid out as written
        for action in parser._actions:
            if action.option_strings and action.dest not in ("help", "version"):
                assert action.help and "(default: " in action.help, (parser.prog, action.option_strings)
    r = run_cli(tmp_path, "serve", "--help")
    assert r.returncode == 0 and "``" not in r.stdout
    assert "(default: AGENT_BRIDGE_PORT, else [server] port, else 8765)" in " ".join(r.stdout.split())
    assert "  agent-bridge serve --port 0 --data-dir /tmp/bridge-try" in r.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_signal_stops_serve_with_exit_0(tmp_path: Path, sig: int) -> None:
    async with serving(tmp_path, "--port", "0", "--data-dir", str(tmp_path / "d"), "--token", "t-0123456789") as s:
        port = port_of(s.first_line)
        assert (await get_agents(s.url, "t-0123456789")).status_code == 200
        assert await terminate(s.proc, sig, within_s=5) == 0
        assert nothing_listens(port)


async def test_serve_logs_where_the_token_is_and_never_the_token(tmp_path: Path) -> None:
    data = tmp_path / "data"
    token_file = data / "token"
    async with serving(tmp_path, "--port", "0", "--data-dir", str(data)) as s:
        port_of(s.first_line)
        assert await terminate(s.proc) == 0
    token = token_file.read_text().strip()
    first = s.stderr()
    assert "auth.token" in first and "source=generated" in first, first
    assert f"cat {token_file}" in first, first
    async with serving(tmp_path, "--port", "0", "--data-dir", str(data)) as s:
        assert await terminate(s.proc) == 0
    second = s.stderr()
    assert "source=file" in second and f"cat {token_file}" in second, second
    env = clean_env(tmp_path, AGENT_BRIDGE_TOKEN="env-token-0123456789")
    async with serving(tmp_path, "--port", "0", "--data-dir", str(tmp_path / "other"), env=env) as s:
        assert await terminate(s.proc) == 0
    third = s.stderr()
    assert "AGENT_BRIDGE_TOKEN" in third and "cat " not in third, third
    for text in (first, second, third):
        assert token not in text and "env-token-0123456789" not in text


# --------------------------------------------------------------------------- [server] env twins


def test_allowed_hosts_and_trust_proxy_headers_env_twins(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.toml", '[server]\nallowed_hosts = ["toml.example"]\ntrust_proxy_headers = true\n')
    home = {"HOME": str(tmp_path)}
    s = load_settings(config=str(cfg), env=home, discover_path=False)
    assert (s.server.allowed_hosts, s.server.trust_proxy_headers) == (["toml.example"], True)
    env = {
        **home,
        "AGENT_BRIDGE_ALLOWED_HOSTS": " bridge.example:443, [::1]:8765 ,,10.0.0.5",
        "AGENT_BRIDGE_TRUST_PROXY_HEADERS": "false",
    }
    s = load_settings(config=str(cfg), env=env, discover_path=False)
    assert s.server.allowed_hosts == ["bridge.example:443", "[::1]:8765", "10.0.0.5"]
    assert s.server.trust_proxy_headers is False
    s = load_settings(env={**home, "AGENT_BRIDGE_TRUST_PROXY_HEADERS": "YES"}, discover_path=False)
    assert s.server.trust_proxy_headers is True and s.server.allowed_hosts == []
    # Set but empty: the TOML list is cleared.
    s = load_settings(config=str(cfg), env={**home, "AGENT_BRIDGE_ALLOWED_HOSTS": ""}, discover_path=False)
    assert s.server.allowed_hosts == []


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"AGENT_BRIDGE_ALLOWED_HOSTS": "ok.example,bad host"}, ["allowed_hosts", "bad host"]),
        ({"AGENT_BRIDGE_ALLOWED_HOSTS": "ok.example:99999"}, ["allowed_hosts", "port"]),
        ({"AGENT_BRIDGE_TRUST_PROXY_HEADERS": "maybe"}, ["AGENT_BRIDGE_TRUST_PROXY_HEADERS", "maybe"]),
    ],
)
def test_bad_server_env_twins(tmp_path: Path, env: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(env={"HOME": str(tmp_path), **env}, discover_path=False)
    assert all(w in exc.value.message for w in words), exc.value.message


async def test_allowed_hosts_env_twin_reaches_the_host_check(tmp_path: Path) -> None:
    env = clean_env(tmp_path, AGENT_BRIDGE_ALLOWED_HOSTS="bridge.example", AGENT_BRIDGE_TOKEN="t-0123456789")
    async with serving(tmp_path, "--port", "0", "--data-dir", str(tmp_path / "d"), env=env) as s:
        port = port_of(s.first_line)
        async with httpx.AsyncClient(base_url=s.url, timeout=STEP_TIMEOUT) as http:
            auth = {"Authorization": "Bearer t-0123456789"}
            r = await http.get("/v1/agents", headers={**auth, "Host": "bridge.example"})
            assert r.status_code == 200, r.text
            r = await http.get("/v1/agents", headers={**auth, "Host": "other.example"})
            assert r.status_code == 421 and r.json()["error"]["code"] == "host_not_allowed", r.text
            r = await http.get("/v1/agents", headers={**auth, "Host": f"127.0.0.1:{port}"})
            assert r.status_code == 200, r.text
        assert await terminate(s.proc) == 0


def test_tune_gc_freezes_what_start_up_built_and_raises_the_young_threshold() -> None:
    import gc

    from bridge.cli import GC_GEN0_THRESHOLD, tune_gc

    before = gc.get_threshold()
    try:
        gc.unfreeze()
        tune_gc()
        assert gc.get_freeze_count() > 0, "nothing moved to the permanent generation"
        assert gc.get_threshold() == (GC_GEN0_THRESHOLD, before[1], before[2])
        assert GC_GEN0_THRESHOLD > before[0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_the_default_profile_is_the_first_configured_one_that_can_run(tmp_path: Path) -> None:
    """Issue #34: a thread created without ``agent`` took the first configured profile even
    when its executable was missing (422), while a usable one was configured next."""
    good = tmp_path / "good-agent"
    good.write_text("#!/bin/sh\n")
    good.chmod(0o755)
    missing = tmp_path / "not-installed"
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[agents.broken]\nprotocol = "stream-json"\nexecutable = "{missing}"\n\n'
        f'[agents.works]\nprotocol = "stream-json"\nexecutable = "{good}"\n'
    )
    s = load_settings(config=str(cfg), data_dir=str(tmp_path / "data"))
    assert s.default_agent == "broken"  # the preference, as configured
    assert s.default_profile() == "works"  # what a thread without ``agent`` runs
    good.unlink()
    assert s.default_profile() == "demo"  # decided when asked: neither configured one runs
    missing.write_text("#!/bin/sh\n")
    missing.chmod(0o755)
    assert s.default_profile() == "broken"  # installed after start: first again


def test_a_profile_asking_for_a_sandbox_the_host_lacks_cannot_run_but_the_daemon_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #34 item 4: one treatment for every profile that cannot run. Such a profile
    stopped the daemon at start; now it is unusable, said why, and never spawned (not even
    unconfined)."""
    from bridge.config import sandbox_refusal
    from bridge.errors import LaunchRefused
    from bridge.process import bwrap
    from bridge.process import sandbox as sb
    from bridge.process.launch import LaunchSpec

    monkeypatch.setattr(bwrap, "find", lambda: None)  # no bubblewrap on this host
    sb._for_mode.cache_clear()
    try:
        cfg = write(tmp_path / "c.toml", f'[agents.boxed]\nexecutable = "{PYTHON}"\nsandbox = "bubblewrap"\n')
        s = load_settings(config=str(cfg), data_dir=str(tmp_path / "d"), env={"HOME": str(tmp_path)})
        assert sandbox_refusal(s) is None  # the daemon starts
        problem = s.profile_problem("boxed") or ""
        assert problem.startswith('[agents.boxed] asks for sandbox = "bubblewrap", but '), problem
        assert problem.endswith("install it, or give this profile another sandbox")
        assert s.default_profile() == "demo"
        with pytest.raises(LaunchRefused) as refused:
            s.check_runnable("boxed")
        assert refused.value.code == "sandbox_unavailable"
        with pytest.raises(LaunchRefused):  # every spawn passes here: never run unconfined
            s.confine(LaunchSpec((PYTHON,), {}, str(tmp_path)), s.agents["boxed"])
        users = write(
            tmp_path / "u.toml", f'[auth]\nmode = "users"\n[agents.loose]\nexecutable = "{PYTHON}"\nsandbox = "none"\n'
        )
        s = load_settings(config=str(users), data_dir=str(tmp_path / "d"), env={"HOME": str(tmp_path)}, token="t" * 32)
        if s.confinement().confined:
            assert sandbox_refusal(s) is None
            assert 'users mode: [agents.loose] has sandbox = "none"' in (s.profile_problem("loose") or "")
    finally:
        sb._for_mode.cache_clear()
