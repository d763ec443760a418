"""Settings and agent profiles: embedded defaults < TOML file < env twins < flags (docs/api.md §1.2).

Agent profiles come from, in order: the ``[agents.*]`` tables of the config file, the AWP
launch variables (profile ``awp``), real agent CLIs found on ``PATH`` (``claude``,
``qwen``, ``codebuddy``/``cbc``), and the bundled ``demo`` agent, which needs no API key
and is always present. A profile that cannot run (its executable is unusable, or its own
settings break a launch rule: a remote URL without the opt-in, a relative ``mcp_config``)
is still listed, with the reason and the fix (``agent-bridge agents``, ``GET /v1/agents``),
never the default, and refused at launch; the daemon starts all the same. A config that is
malformed (TOML syntax, an unknown key, a wrong type) stops the start, naming the file,
the section and the key (bridge/config_sources.py).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from bridge.config_capacity import CapacitySettings
from bridge.config_push import PushSettings
from bridge.config_sources import (
    Sources,
    awp_json,
    port_given,
    profile_refusal,
    server_env_twins,
    toml_error,
    twins,
    unknown_section,
)
from bridge.config_sources import section as _section
from bridge.config_sources import table as _table
from bridge.errors import ConfigError, LaunchRefused
from bridge.launching import check_profile, spawn_options
from bridge.network import parse_host_port, parse_origin
from bridge.process.launch import LaunchSpec, executable_problem, model_problem
from bridge.process.sandbox import Sandbox, SandboxConfig, confine
from bridge.process.sandbox import resolve as resolve_sandbox

Protocol = Literal["stream-json", "awp-jsonl", "acp"]
PermissionMode = Literal["default", "acceptEdits", "plan", "bypassPermissions", "dontAsk"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEMO_PROFILE = "demo"
ETC_DIR = "/etc/agent-bridge"  # where the deploy artefacts keep the config and the env file

# Agent CLIs we look for on PATH when nothing is configured under that name.
KNOWN_CLIS: tuple[tuple[str, str, Protocol], ...] = (
    ("claude", "claude", "stream-json"),
    ("qwen", "qwen", "stream-json"),
    ("codebuddy", "codebuddy", "stream-json"),
    ("cbc", "codebuddy", "stream-json"),
)

# Keys a thread may override at creation (docs/api.md §1.5, "options").
THREAD_OPTION_KEYS = frozenset(
    "permission_mode allowed_tools disallowed_tools system_prompt mcp_config mcp_servers permission_prompts".split()
)


class AgentProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    protocol: Protocol = "stream-json"
    executable: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    model: str | None = None
    # The models a client may switch its threads to (ACP's ``model`` config option, docs/api.md §11.2).
    models: list[str] | None = Field(None, max_length=64)
    remote_api_opt_in: bool = False
    permission_mode: PermissionMode | None = None
    allowed_tools: list[str] | None = None
    disallowed_tools: list[str] | None = None
    system_prompt: str | None = None
    mcp_config: str | None = None
    mcp_servers: list[dict[str, Any]] | None = None  # ACP's shape, checked by bridge/launching.py
    auth_method: str | None = None  # ACP: the authMethods id to authenticate with
    # stream-json: send permission prompts to clients (--permission-prompt-tool stdio);
    # ACP agents always ask clients.
    permission_prompts: bool = False
    # The protocol's compatibility flags, exactly (docs/api.md §2.2); unset: the codec decides
    # from the CLI (stream_json.launch_flags_for).
    protocol_flags: list[str] | None = None
    builtin: bool = False
    # [sandbox] for this profile's agents (docs/security.md "Confinement"): its own mode,
    # and paths added to the daemon-wide extra_read / extra_write.
    sandbox: Literal["auto", "landlock", "bubblewrap", "none"] | None = None
    sandbox_extra_read: list[str] = Field(default_factory=list, max_length=64)
    sandbox_extra_write: list[str] = Field(default_factory=list, max_length=64)
    # [capacity]: what one agent of this profile is expected to take before any run of it
    # was measured, and the most its process tree may take (MiB; None: no limit).
    memory_estimate_mb: int | None = Field(None, ge=1)
    memory_limit_mb: int | None = Field(None, ge=1)

    @field_validator("sandbox_extra_read", "sandbox_extra_write")
    @classmethod
    def _sandbox_paths(cls, v: list[str]) -> list[str]:
        return _absolute_paths(v, "sandbox paths must be absolute")

    @field_validator("args")
    @classmethod
    def _args_are_lines(cls, v: list[str]) -> list[str]:
        for a in v:
            if "\x00" in a:
                raise ValueError("argument contains a NUL byte")
        return v

    @field_validator("model")
    @classmethod
    def _model_is_an_id(cls, v: str | None) -> str | None:
        if v is not None and (problem := model_problem(v)):
            raise ValueError(f"model {v[:80]!r}: {problem}")
        return v

    @field_validator("models")
    @classmethod
    def _models_are_ids(cls, v: list[str] | None) -> list[str] | None:
        for model in v or ():
            if problem := model_problem(model):
                raise ValueError(f"models: {model[:80]!r}: {problem}")
        return v

    @field_validator("protocol_flags")
    @classmethod
    def _flags_are_arguments(cls, v: list[str] | None) -> list[str] | None:
        for a in v or ():
            if not a or "\x00" in a or "\n" in a or "\r" in a:
                raise ValueError(f"protocol_flags: {a!r} is not a command-line argument (empty, NUL or newline)")
        if v and not v[0].startswith("-"):
            raise ValueError(f"protocol_flags must start with a flag, not {v[0]!r}")
        return v


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
    # permessage-deflate for WebSocket clients that offer it: "auto" is off on a loopback
    # bind (compression costs CPU per client and saves nothing on loopback; Hardening II:
    # 50 stalled clients cost a normal one 6x, ~65% of it in deflate) and on elsewhere.
    ws_compression: Literal["auto", "on", "off"] = "auto"
    subscriber_buffer: int = Field(1024, ge=16)
    # Open connections at most (capped below the open-files limit); at the limit the
    # oldest connection still waiting for its request headers is closed (bridge/connections.py).
    max_connections: int = Field(4096, ge=16)
    header_timeout_s: float = Field(10.0, gt=0)  # request headers must be complete by then
    body_timeout_s: float = Field(30.0, gt=0)  # and the body this long after the headers
    tls_cert: str | None = None
    tls_key: str | None = None
    # Directories whose subdirectories GET /v1/workspace/dirs lists (the page's working
    # directory picker); absolute, "~" expanded. Empty: no listing.
    workspace_roots: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("workspace_roots")
    @classmethod
    def _roots(cls, v: list[str]) -> list[str]:
        return _absolute_paths(v, "workspace_roots entries must be absolute directories")

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


REPLICA_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


class StoreSettings(BaseModel):
    """``[store]``: where threads and transcripts live (docs/api.md §1.2)."""

    model_config = ConfigDict(extra="forbid")

    # sqlite:///<path> or postgresql://…; None: sqlite:///<data-dir>/bridge.db
    url: str | None = None
    # SQLite: where the one write connection lives (docs/configuration.md)
    writer: Literal["process", "thread"] = "process"


class ClusterSettings(BaseModel):
    """``[cluster]``: this replica among several sharing one store (issue #18)."""

    model_config = ConfigDict(extra="forbid")

    replica_id: str = Field(default_factory=lambda: f"{socket.gethostname()[:100]}-{os.getpid()}", min_length=1)
    lease_ttl_s: float = Field(15.0, gt=0, le=3600)
    # redis://… or rediss://…: the bus between replicas (bridge/bus); None: no bus
    bus_url: str | None = None

    @field_validator("replica_id")
    @classmethod
    def _identifier(cls, v: str) -> str:
        # It names keys and channels on the bus and rows in the store.
        if not REPLICA_ID.fullmatch(v):
            raise ValueError("replica_id must be 1-128 letters, digits and _.:- (starting with a letter or digit)")
        return v

    @field_validator("bus_url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        if v is not None and urlsplit(v).scheme not in ("redis", "rediss", "unix"):
            raise ValueError("bus_url must be a redis://, rediss:// or unix:// URL")
        return v


class AuthSettings(BaseModel):
    """``[auth]``: who the callers are (docs/security.md "Users")."""

    model_config = ConfigDict(extra="forbid")

    # token: one token, one caller (the default); users: users and their tokens in the store
    mode: Literal["token", "users"] = "token"
    # A trusted reverse proxy names the user in this header; honoured only from proxy_trusted.
    proxy_user_header: str | None = Field(None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9-]+$")
    proxy_trusted: list[str] = Field(default_factory=list)
    # Agents one user may have running at once (users mode); None: only max_conversations.
    max_conversations_per_user: int | None = Field(None, ge=1)
    # Users mode (bridge/userdirs.py): each user's HOME for their agents, "{user}" replaced by
    # the name (default <data dir>/homes/{user}); and where a non-admin's thread cwd must lie
    # (default <data dir>/workspaces/users/{user}).
    user_home: str | None = Field(None, max_length=4096)
    user_workspace_roots: list[str] | None = Field(None, max_length=64)

    @field_validator("user_home")
    @classmethod
    def _home_template(cls, v: str | None) -> str | None:
        if v is not None and "{user}" not in v:
            raise ValueError('user_home must contain "{user}" (one home per user)')
        return None if v is None else _user_templates([v], "user_home")[0]

    @field_validator("user_workspace_roots")
    @classmethod
    def _root_templates(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else _user_templates(v, "user_workspace_roots")

    @field_validator("proxy_trusted")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        for entry in v:
            ipaddress.ip_network(entry, strict=False)  # ValueError: not an address or CIDR
        return v

    @model_validator(mode="after")
    def _consistent(self) -> AuthSettings:
        if self.proxy_user_header and self.mode != "users":
            raise ValueError('proxy_user_header needs mode = "users"')
        if self.proxy_user_header and not self.proxy_trusted:
            raise ValueError("proxy_user_header needs proxy_trusted (the proxy's addresses)")
        return self


def _absolute_paths(v: list[str], refusal: str) -> list[str]:
    """Each entry, ``~`` expanded, absolute and normalized; ``refusal: entry`` otherwise."""
    out = []
    for entry in v:
        path = os.path.expanduser(entry)
        if not os.path.isabs(path) or "\x00" in path:
            raise ValueError(f"{refusal}: {entry!r}")
        out.append(os.path.normpath(path))
    return out


class SandboxSettings(BaseModel):
    """``[sandbox]``: how every agent process tree is confined (docs/security.md)."""

    model_config = ConfigDict(extra="forbid")

    # auto: Landlock where the kernel has it, else none (token mode warns; users mode refuses
    # to start unless "none" is written here).
    mode: Literal["auto", "landlock", "bubblewrap", "none"] = "auto"
    extra_read: list[str] = Field(default_factory=list, max_length=64)
    extra_write: list[str] = Field(default_factory=list, max_length=64)
    # Never reachable by any agent, whatever else grants them (secrets the daemon's
    # environment or config is made from); the data dir, the config file and
    # /etc/agent-bridge always are.
    deny: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("extra_read", "extra_write", "deny")
    @classmethod
    def _paths(cls, v: list[str]) -> list[str]:
        return _absolute_paths(v, "[sandbox] paths must be absolute")


def _user_templates(v: list[str], what: str) -> list[str]:
    for entry in v:
        if "\x00" in entry or not os.path.isabs(os.path.expanduser(entry)):
            raise ValueError(f"{what} must be absolute paths: {entry!r}")
    return v


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: ServerSettings = Field(default_factory=lambda: ServerSettings())
    auth: AuthSettings = Field(default_factory=lambda: AuthSettings())
    store: StoreSettings = Field(default_factory=lambda: StoreSettings())
    cluster: ClusterSettings = Field(default_factory=lambda: ClusterSettings())
    sandbox: SandboxSettings = Field(default_factory=lambda: SandboxSettings())
    capacity: CapacitySettings = Field(default_factory=lambda: CapacitySettings())
    push: PushSettings = Field(default_factory=lambda: PushSettings())
    data_dir: Path
    token: str | None = None
    no_auth: bool = False
    log_format: Literal["json", "console"] = "console"
    agents: dict[str, AgentProfile] = Field(default_factory=dict)
    default_agent: str = DEMO_PROFILE
    # Who may be the default, in order: the configured profiles, then the demo (issue #34:
    # the first of them that can run, not the first whatever its state).
    default_order: list[str] = Field(default_factory=list)
    # Profiles whose own settings break a launch rule, found at load: name → (the rule's
    # code, why and how to fix it). They are listed and refused, never the default.
    refused_profiles: dict[str, tuple[str, str]] = Field(default_factory=dict)
    config_file: Path | None = None
    _confinement: Sandbox | None = PrivateAttr(default=None)

    def default_profile(self) -> str:
        """The profile a thread created without ``agent`` runs: the first of
        ``default_order`` that can run now (a CLI installed after start counts), else
        ``default_agent``, whose refusal then says what is wrong."""
        for name in self.default_order:
            if name in self.agents and self.profile_problem(name) is None:
                return name
        return self.default_agent

    def profile_problem(self, name: str) -> str | None:
        """Why the profile ``name`` cannot run now, or None: a launch rule its settings break
        or a sandbox it cannot have (said with the fix), else its executable's problem
        (checked now)."""
        refused = self.refused_profiles.get(name) or self._sandbox_refusal(name)
        if refused is not None:
            return refused[1]
        return executable_problem(self.agents[name].executable)

    def check_runnable(self, name: str) -> None:
        """Raise LaunchRefused (the rule's code, 422) for a profile whose own settings break
        a launch rule or ask for a sandbox it cannot have; an unusable executable is refused
        by the launch rules themselves."""
        refused = self.refused_profiles.get(name) or self._sandbox_refusal(name)
        if refused is not None:
            raise LaunchRefused(f"agent profile {name!r} cannot run: {refused[1]}", code=refused[0])

    def _sandbox_refusal(self, name: str) -> tuple[str, str] | None:
        """The profile's own ``sandbox`` that cannot be had: a mechanism this host lacks, or
        ``"none"`` in users mode without ``[sandbox] mode = "none"`` written down. Its
        agents would run less confined than asked, so it cannot run (never unconfined)."""
        mode = self.agents[name].sandbox
        if mode in ("landlock", "bubblewrap") and (own := self.confinement().for_profile(mode)).mechanism != mode:
            why = f'[agents.{name}] asks for sandbox = "{mode}", but {own.problem}'
            return "sandbox_unavailable", f"{why}; install it, or give this profile another sandbox"
        if mode == "none" and self.auth.mode == "users" and self.sandbox.mode != "none":
            why = f'users mode: [agents.{name}] has sandbox = "none", so its agents could reach other users\' files'
            return "sandbox_unavailable", f'{why}; remove it, or write [sandbox] mode = "none" to accept that for all'
        return None

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def port(self) -> int:
        return self.server.port

    def confinement(self) -> Sandbox:
        """The sandbox in force for this daemon's agents (probed once)."""
        if self._confinement is None:
            cfg = self.sandbox
            # The deploy artefacts keep the config and the token's env file in /etc/agent-bridge.
            deny = [str(self.data_dir), ETC_DIR, *cfg.deny]
            if self.config_file is not None:
                deny.append(str(self.config_file))
            self._confinement = resolve_sandbox(
                SandboxConfig(cfg.mode, tuple(cfg.extra_read), tuple(cfg.extra_write)),
                deny=deny,
                agent_areas=[str(self.data_dir / "workspaces"), str(self.data_dir / "homes")],
                allow=[str(self.data_dir / "demo-agent")],
            )
        return self._confinement

    def confine(self, spec: LaunchSpec, profile: AgentProfile) -> LaunchSpec:
        """``spec`` with the sandbox plan for ``profile``'s agent. Raises LaunchRefused,
        also for a profile whose own sandbox cannot be had (every spawn comes here)."""
        if profile.name in self.agents and (refused := self._sandbox_refusal(profile.name)) is not None:
            raise LaunchRefused(f"agent profile {profile.name!r} cannot run: {refused[1]}", code=refused[0])
        return confine(
            spec,
            self.confinement().for_profile(profile.sandbox),
            extra_read=profile.sandbox_extra_read,
            extra_write=profile.sandbox_extra_write,
        )

    @property
    def store_url(self) -> str:
        """The store's URL (it may hold a password: show it only through
        bridge.store.urls.redact)."""
        return self.store.url or f"sqlite:///{self.data_dir / 'bridge.db'}"


def sandbox_refusal(settings: Settings) -> str | None:
    """Why the daemon may not start with its sandbox settings, or None: a mechanism asked
    for by name in ``[sandbox]`` that this host lacks, or users mode with agents
    unconfined without ``[sandbox] mode = "none"`` written down. (A profile's own
    ``sandbox`` that cannot be had makes that profile unusable: Settings.profile_problem.)"""
    box = settings.confinement()
    named = settings.sandbox.mode
    if named in ("landlock", "bubblewrap") and box.mechanism != named:
        return f'[sandbox] mode = "{named}", but {box.problem}'
    if settings.auth.mode == "users" and settings.sandbox.mode != "none" and not box.confined:
        return (
            f"users mode refuses to run agents unconfined ({box.problem}); "
            "write [sandbox] mode = \"none\" to accept that every user's agent can reach the others'"
        )
    return None


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
        memory_estimate_mb=32,  # a small Python process (~15 MiB resident), not a CLI's 768
        # Its "edit" and "tour" ask before they change a file: the page shows the prompt.
        permission_prompts=True,
        # Its histories (every demo thread's: it is a demo) are the one part of the data dir
        # an agent may reach.
        sandbox_extra_write=[str(data_dir / "demo-agent")],
    )


def _awp_profile(env: Mapping[str, str]) -> AgentProfile | None:
    exe = env.get("AWP_AGENT_CLI_EXECUTABLE")
    if not exe:
        return None
    args, child_env = awp_json(env)
    protocol = env.get("AWP_AGENT_CLI_PROTOCOL") or "awp-jsonl"
    if protocol not in ("awp-jsonl", "stream-json"):
        raise ConfigError(f"AWP_AGENT_CLI_PROTOCOL must be awp-jsonl or stream-json, not {protocol!r}")
    model = env.get("AWP_AGENT_DEFAULT_MODEL") or None
    if model is not None and (problem := model_problem(model)):
        raise ConfigError(f"AWP_AGENT_DEFAULT_MODEL: {problem}")
    try:
        return AgentProfile(
            name="awp",
            protocol=protocol,
            executable=exe,
            args=args,
            env=child_env,
            model=model,
            remote_api_opt_in=env.get("AWP_AGENT_REMOTE_API_OPT_IN") == "1",
        )
    except ValidationError as exc:
        raise Sources().invalid(exc, AgentProfile, "agents", "the AWP_AGENT_CLI_* variables:") from exc


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
    except tomllib.TOMLDecodeError as exc:
        raise toml_error(str(path.absolute()), exc) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {getattr(exc, 'strerror', None) or exc}") from exc


# Each section's settings, for the refusal of a name that is not a section.
_SECTION_MODELS: dict[str, type[BaseModel]] = {
    "server": ServerSettings,
    "store": StoreSettings,
    "cluster": ClusterSettings,
    "auth": AuthSettings,
    "sandbox": SandboxSettings,
    "capacity": CapacitySettings,
    "push": PushSettings,
}


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
    raw, src, config_file = _config_file(config or env.get("AGENT_BRIDGE_CONFIG"))
    server_raw = _table(src, raw.pop("server", {}), "[server] must be a table")
    agents_raw = _table(src, raw.pop("agents", {}), "[agents] must be a table of profiles")
    store, cluster, auth = _store(src, raw, env), _cluster(src, raw, env), _auth(src, raw)
    sandbox = _sandbox(src, raw, env)
    capacity_raw, push_raw = (_table(src, raw.pop(n, {}), f"[{n}] must be a table") for n in ("capacity", "push"))
    capacity = _section(src, CapacitySettings, "capacity", capacity_raw)
    for name, value in sorted(raw.items()):
        raise unknown_section(src, name, value, {s: m.model_fields for s, m in _SECTION_MODELS.items()})
    host_from = ("--host", host) if host else ("AGENT_BRIDGE_HOST", env.get("AGENT_BRIDGE_HOST"))
    server = _server(src, server_raw, host_from, port_given(port, env), env)
    ddir = Path(data_dir or env.get("AGENT_BRIDGE_DATA_DIR") or default_data_dir(env)).expanduser().absolute()
    agents, default, order, refused = _all_profiles(src, agents_raw, env, ddir, discover_path=discover_path)
    return Settings(
        server=server,
        store=store,
        cluster=cluster,
        auth=auth,
        sandbox=sandbox,
        capacity=capacity,
        push=_section(src, PushSettings, "push", push_raw),
        data_dir=ddir,
        token=token or env.get("AGENT_BRIDGE_TOKEN") or None,
        no_auth=no_auth,
        log_format=_log_format(log_format or env.get("AGENT_BRIDGE_LOG_FORMAT") or "console"),
        agents=agents,
        default_agent=default,
        default_order=order,
        refused_profiles=refused,
        config_file=config_file,
    )


def _config_file(config: str | None) -> tuple[dict[str, Any], Sources, Path | None]:
    """The TOML file's tables (none without a file), where settings came from, its path."""
    if not config:
        return {}, Sources(None), None
    return load_toml(Path(config)), Sources(str(Path(config).absolute())), Path(config).absolute()


def _all_profiles(
    src: Sources, agents_raw: dict[str, Any], env: Mapping[str, str], ddir: Path, *, discover_path: bool
) -> tuple[dict[str, AgentProfile], str, list[str], dict[str, tuple[str, str]]]:
    """Every profile — configured, the AWP variables', found on PATH, the demo — the
    preferred default (the first configured, else the demo), who may be the default in
    order (the configured ones, then the demo; never one found on PATH), and the profiles
    whose own settings break a launch rule (Settings.refused_profiles)."""
    agents = _profiles(src, agents_raw)
    configured = list(agents)
    awp = _awp_profile(env)
    if awp is not None and "awp" not in agents:
        agents["awp"] = awp
        configured.append("awp")
    if discover_path:
        agents.update(_path_profiles(env, set(agents) | {DEMO_PROFILE}))
    if DEMO_PROFILE not in agents:
        agents[DEMO_PROFILE] = demo_profile(ddir)
    refused: dict[str, tuple[str, str]] = {}
    for name, prof in agents.items():
        # Rules a profile can break by itself (remote URLs, a relative mcp_config): found
        # once, here. Such a profile cannot run, like one whose executable is missing: it
        # is listed with the reason and refused, and the daemon starts (issue #34 item 4).
        try:
            check_profile(prof, spawn_options(prof, None, THREAD_OPTION_KEYS), check_executable=False)
        except LaunchRefused as exc:
            awp_vars = name == "awp" and name not in agents_raw
            refused[name] = (exc.code, profile_refusal(name, exc.code, exc.message, awp=awp_vars))
    return agents, configured[0] if configured else DEMO_PROFILE, [*configured, DEMO_PROFILE], refused


def _server(
    src: Sources,
    raw: dict[str, Any],
    host: tuple[str, str | None],
    port: tuple[str, int] | None,
    env: Mapping[str, str],
) -> ServerSettings:
    if host[1]:
        src.put(raw, "server", "host", host[1], host[0])
    if port is not None:
        src.put(raw, "server", "port", port[1], port[0])
    server_env_twins(src, raw, env)
    return _section(src, ServerSettings, "server", raw)


def _store(src: Sources, config: dict[str, Any], env: Mapping[str, str]) -> StoreSettings:
    """``[store]`` (taken out of ``config``) with its env twin."""
    raw = _table(src, config.pop("store", {}), "[store] must be a table")
    twins(src, raw, "store", env, {"url": "AGENT_BRIDGE_STORE_URL", "writer": "AGENT_BRIDGE_STORE_WRITER"})
    settings = _section(src, StoreSettings, "store", raw)
    if settings.url is not None:
        from bridge.store.urls import parse

        try:
            parse(settings.url)  # a bad URL is a start-up error (shown without its password)
        except ConfigError as exc:
            label = src.given.get(("store", "url"))
            message = f"{label}: {exc.message}" if label else src.error(exc.message).message
            raise ConfigError(message, code=exc.code) from exc  # invalid_store_url, kept
    return settings


def _auth(src: Sources, config: dict[str, Any]) -> AuthSettings:
    """``[auth]`` (taken out of ``config``)."""
    return _section(src, AuthSettings, "auth", _table(src, config.pop("auth", {}), "[auth] must be a table"))


def _sandbox(src: Sources, config: dict[str, Any], env: Mapping[str, str]) -> SandboxSettings:
    """``[sandbox]`` (taken out of ``config``) with its env twin for the mode."""
    raw = _table(src, config.pop("sandbox", {}), "[sandbox] must be a table")
    twins(src, raw, "sandbox", env, {"mode": "AGENT_BRIDGE_SANDBOX"})
    return _section(src, SandboxSettings, "sandbox", raw)


def _cluster(src: Sources, config: dict[str, Any], env: Mapping[str, str]) -> ClusterSettings:
    """``[cluster]`` (taken out of ``config``) with its env twin."""
    raw = _table(src, config.pop("cluster", {}), "[cluster] must be a table")
    twins(src, raw, "cluster", env, {"replica_id": "AGENT_BRIDGE_REPLICA_ID", "bus_url": "AGENT_BRIDGE_BUS_URL"})
    return _section(src, ClusterSettings, "cluster", raw)


def _profiles(src: Sources, agents_raw: dict[str, Any]) -> dict[str, AgentProfile]:
    agents: dict[str, AgentProfile] = {}
    for name, prof in agents_raw.items():
        if not isinstance(prof, dict):
            raise src.error(f"[agents.{name}] must be a table")
        for key in sorted({"name", "builtin"} & set(prof)):
            raise src.error(f"[agents.{name}] {key}: cannot be set (the profile's name is its table's)")
        agents[name] = _section(src, AgentProfile, "agents", {**prof, "name": name}, f"[agents.{name}]")
    return agents


def _log_format(value: str) -> Literal["json", "console"]:
    if value not in ("json", "console"):
        raise ConfigError(f"log format must be json or console, not {value!r}")
    return value  # type: ignore[return-value]
