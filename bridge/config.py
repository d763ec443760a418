"""Settings and agent profiles: embedded defaults < TOML file < env twins < flags (API.md §1).

Agent profiles come from, in order: the ``[agents.*]`` tables of the config file, the AWP
launch variables (profile ``awp``), real agent CLIs found on ``PATH`` (``claude``,
``qwen``, ``codebuddy``/``cbc``), and the bundled ``demo`` agent, which needs no API key
and is always present. A profile whose executable is unusable is still listed, with the
reason (``agent-bridge agents``, ``GET /v1/agents``); it is simply refused at launch.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bridge.errors import ConfigError

Protocol = Literal["stream-json", "awp-jsonl", "acp"]
PermissionMode = Literal["default", "acceptEdits", "plan", "bypassPermissions", "dontAsk"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEMO_PROFILE = "demo"

# Agent CLIs we look for on PATH when nothing is configured under that name.
KNOWN_CLIS: tuple[tuple[str, str, Protocol], ...] = (
    ("claude", "claude", "stream-json"),
    ("qwen", "qwen", "stream-json"),
    ("codebuddy", "codebuddy", "stream-json"),
    ("cbc", "codebuddy", "stream-json"),
)

# Keys a thread may override at creation (API.md §1, "options").
THREAD_OPTION_KEYS = frozenset(
    {"permission_mode", "allowed_tools", "disallowed_tools", "system_prompt", "mcp_config", "permission_prompts"}
)


class AgentProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    protocol: Protocol = "stream-json"
    executable: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    model: str | None = None
    remote_api_opt_in: bool = False
    permission_mode: PermissionMode | None = None
    allowed_tools: list[str] | None = None
    disallowed_tools: list[str] | None = None
    system_prompt: str | None = None
    mcp_config: str | None = None
    auth_method: str | None = None  # ACP: the authMethods id to authenticate with
    # stream-json: send permission prompts to clients (--permission-prompt-tool stdio);
    # ACP agents always ask clients.
    permission_prompts: bool = False
    builtin: bool = False

    @field_validator("args")
    @classmethod
    def _args_are_lines(cls, v: list[str]) -> list[str]:
        for a in v:
            if "\x00" in a:
                raise ValueError("argument contains a NUL byte")
        return v


def parse_host_port(value: str) -> tuple[str, int | None]:
    """``name``, ``name:port``, ``1.2.3.4:port``, ``[::1]:port`` → (lower-case name, port).

    The form of an HTTP ``Host`` header and of a ``[server] allowed_hosts`` entry; brackets
    are kept on IPv6 literals, a trailing dot is dropped. ValueError if malformed."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        if end < 0:
            raise ValueError(f"unterminated IPv6 literal in {value!r}")
        host, rest = v[: end + 1], v[end + 1 :]
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"bad IPv6 literal in {value!r}") from None
        if rest and not rest.startswith(":"):
            raise ValueError(f"junk after the IPv6 literal in {value!r}")
        port_text = rest[1:] if rest else None
    else:
        host, sep, port_text_ = v.partition(":")
        port_text = port_text_ if sep else None
        host = host.removesuffix(".")
        if not _HOST_NAME_RE.fullmatch(host):
            raise ValueError(f"not a host name or address: {value!r}")
    port: int | None = None
    if port_text is not None:
        if not port_text.isdigit() or len(port_text) > 5 or not 0 < int(port_text) <= 65535:
            raise ValueError(f"bad port in {value!r}")
        port = int(port_text)
    return host, port


def parse_origin(value: str) -> tuple[str, str, int]:
    """``scheme://host[:port]`` (a browser's ``Origin``) → (scheme, host, port); the
    default port of the scheme fills in a missing one. ValueError if malformed (``null``,
    a path, user info, another scheme)."""
    scheme, sep, rest = value.strip().partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in DEFAULT_PORTS or not rest or any(c in rest for c in "/?#@"):
        raise ValueError(f"not an origin (scheme://host[:port]): {value!r}")
    host, port = parse_host_port(rest)
    return scheme, host, DEFAULT_PORTS[scheme] if port is None else port


DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST_NAME_RE = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")


class ServerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = DEFAULT_HOST
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    # Browser origins besides the daemon's own that may call it (CORS, WebSocket, POST…).
    allowed_origins: list[str] = Field(default_factory=list)
    # Host header values accepted besides loopback names with the bound port (issue #6).
    allowed_hosts: list[str] = Field(default_factory=list)
    # Honour X-Forwarded-Proto (only behind a TLS-terminating proxy; docs/security.md).
    trust_proxy_headers: bool = False
    session_ttl_s: float = Field(12 * 3600, gt=0)  # browser sessions (POST /v1/session)
    max_sessions: int = Field(1024, ge=1)  # beyond → the oldest is logged out
    login_code_ttl_s: float = Field(600, gt=0)  # the one-time code in the start-up link
    max_conversations: int = Field(64, ge=1)
    idle_timeout_s: float = Field(600, gt=0)
    max_pending_prompts: int = Field(5, ge=0)
    stop_grace_s: float = Field(5.0, ge=0)
    interrupt_timeout_s: float = Field(10.0, gt=0)
    permission_timeout_s: float = Field(300.0, gt=0)  # unanswered prompts are denied
    ws_ping_interval_s: float = Field(20.0, gt=0)
    ws_ping_timeout_s: float = Field(20.0, gt=0)
    subscriber_buffer: int = Field(1024, ge=16)
    tls_cert: str | None = None
    tls_key: str | None = None

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        for entry in v:
            parse_host_port(entry)
        return v

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        for entry in v:
            parse_origin(entry)
        return v


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: ServerSettings = Field(default_factory=lambda: ServerSettings())
    data_dir: Path
    token: str | None = None
    no_auth: bool = False
    log_format: Literal["json", "console"] = "console"
    agents: dict[str, AgentProfile] = Field(default_factory=dict)
    default_agent: str = DEMO_PROFILE
    config_file: Path | None = None

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def port(self) -> int:
        return self.server.port


def default_data_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".local/share")
    return Path(base) / "agent-bridge"


def demo_profile(data_dir: Path) -> AgentProfile:
    """The bundled demo agent, run by this very interpreter in isolated mode (``-I``)."""
    script = Path(__file__).resolve().parent / "demo_agent.py"
    return AgentProfile(
        name=DEMO_PROFILE,
        protocol="stream-json",
        executable=os.path.realpath(sys.executable),
        args=["-I", str(script)],
        env={"DEMO_AGENT_STATE_DIR": str(data_dir / "demo-agent")},
        model="demo",
        builtin=True,
    )


def _awp_profile(env: Mapping[str, str]) -> AgentProfile | None:
    exe = env.get("AWP_AGENT_CLI_EXECUTABLE")
    if not exe:
        return None
    try:
        args = json.loads(env.get("AWP_AGENT_CLI_ARGS_JSON") or "[]")
        child_env = json.loads(env.get("AWP_AGENT_CLI_ENV_JSON") or "{}")
    except ValueError as exc:
        raise ConfigError(f"AWP_AGENT_CLI_ARGS_JSON / AWP_AGENT_CLI_ENV_JSON is not JSON: {exc}") from exc
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError("AWP_AGENT_CLI_ARGS_JSON must be a JSON array of strings")
    if not isinstance(child_env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in child_env.items()
    ):
        raise ConfigError("AWP_AGENT_CLI_ENV_JSON must be a JSON object of strings")
    protocol = env.get("AWP_AGENT_CLI_PROTOCOL") or "awp-jsonl"
    if protocol not in ("awp-jsonl", "stream-json"):
        raise ConfigError(f"AWP_AGENT_CLI_PROTOCOL must be awp-jsonl or stream-json, not {protocol!r}")
    try:
        return AgentProfile(
            name="awp",
            protocol=protocol,
            executable=exe,
            args=args,
            env=child_env,
            model=env.get("AWP_AGENT_DEFAULT_MODEL") or None,
            remote_api_opt_in=env.get("AWP_AGENT_REMOTE_API_OPT_IN") == "1",
        )
    except ValidationError as exc:
        raise ConfigError(f"AWP_AGENT_CLI_* variables: {exc}") from exc


def _path_profiles(env: Mapping[str, str], taken: set[str]) -> dict[str, AgentProfile]:
    found: dict[str, AgentProfile] = {}
    for cmd, name, protocol in KNOWN_CLIS:
        if name in taken or name in found:
            continue
        where = shutil.which(cmd, path=env.get("PATH", os.defpath))
        if where:
            # Launch rules want a non-symlink: npm installs CLIs as symlinks, so resolve.
            found[name] = AgentProfile(name=name, protocol=protocol, executable=os.path.realpath(where))
    return found


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except (tomllib.TOMLDecodeError, OSError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc


def load_settings(
    *,
    config: str | None = None,
    host: str | None = None,
    port: int | None = None,
    data_dir: str | None = None,
    token: str | None = None,
    no_auth: bool = False,
    log_format: str | None = None,
    env: Mapping[str, str] | None = None,
    discover_path: bool = True,
) -> Settings:
    """Build Settings from flags (highest), env twins, the TOML file and defaults."""
    env = os.environ if env is None else env
    config = config or env.get("AGENT_BRIDGE_CONFIG")
    raw: dict[str, Any] = load_toml(Path(config)) if config else {}
    server_raw = raw.pop("server", {}) or {}
    if not isinstance(server_raw, dict):
        raise ConfigError("[server] must be a table")
    server_raw = dict(server_raw)
    agents_raw = raw.pop("agents", {}) or {}
    if raw:
        raise ConfigError(f"unknown config sections: {', '.join(sorted(raw))}")

    host = host or env.get("AGENT_BRIDGE_HOST")
    if host:
        server_raw["host"] = host
    if port is None and env.get("AGENT_BRIDGE_PORT"):
        try:
            port = int(env["AGENT_BRIDGE_PORT"])
        except ValueError as exc:
            raise ConfigError("AGENT_BRIDGE_PORT must be an integer") from exc
    if port is not None:
        server_raw["port"] = port
    server_raw.update(_server_env_twins(env))
    try:
        server = ServerSettings(**server_raw)
    except ValidationError as exc:
        raise ConfigError(f"[server]: {_errors(exc)}") from exc

    ddir = Path(data_dir or env.get("AGENT_BRIDGE_DATA_DIR") or default_data_dir(env)).expanduser()
    ddir = ddir.absolute()

    agents: dict[str, AgentProfile] = {}
    if not isinstance(agents_raw, dict):
        raise ConfigError("[agents] must be a table of profiles")
    for name, prof in agents_raw.items():
        if not isinstance(prof, dict):
            raise ConfigError(f"[agents.{name}] must be a table")
        reserved = {"name", "builtin"} & set(prof)
        if reserved:
            raise ConfigError(f"[agents.{name}]: {', '.join(sorted(reserved))} cannot be set")
        try:
            agents[name] = AgentProfile(**{**prof, "name": name})
        except ValidationError as exc:
            raise ConfigError(f"[agents.{name}]: {_errors(exc)}") from exc
    configured = list(agents)
    awp = _awp_profile(env)
    if awp is not None and "awp" not in agents:
        agents["awp"] = awp
        configured.append("awp")
    if discover_path:
        agents.update(_path_profiles(env, set(agents) | {DEMO_PROFILE}))
    if DEMO_PROFILE not in agents:
        agents[DEMO_PROFILE] = demo_profile(ddir)

    return Settings(
        server=server,
        data_dir=ddir,
        token=token or env.get("AGENT_BRIDGE_TOKEN") or None,
        no_auth=no_auth,
        log_format=_log_format(log_format or env.get("AGENT_BRIDGE_LOG_FORMAT") or "console"),
        agents=agents,
        default_agent=configured[0] if configured else DEMO_PROFILE,
        config_file=Path(config).absolute() if config else None,
    )


def _server_env_twins(env: Mapping[str, str]) -> dict[str, Any]:
    """``[server]`` keys a container or unit sets without a config file: replace the TOML
    value when the variable is set (an empty ``AGENT_BRIDGE_ALLOWED_HOSTS`` clears the list)."""
    out: dict[str, Any] = {}
    hosts = env.get("AGENT_BRIDGE_ALLOWED_HOSTS")
    if hosts is not None:
        out["allowed_hosts"] = [h.strip() for h in hosts.split(",") if h.strip()]
    trust = env.get("AGENT_BRIDGE_TRUST_PROXY_HEADERS")
    if trust is not None:
        if trust.strip().lower() not in _BOOLS:
            raise ConfigError(f"AGENT_BRIDGE_TRUST_PROXY_HEADERS must be true or false, not {trust!r}")
        out["trust_proxy_headers"] = _BOOLS[trust.strip().lower()]
    return out


_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _log_format(value: str) -> Literal["json", "console"]:
    if value not in ("json", "console"):
        raise ConfigError(f"log format must be json or console, not {value!r}")
    return value  # type: ignore[return-value]


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors())
