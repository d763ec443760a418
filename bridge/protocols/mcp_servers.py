"""MCP servers a client gives a thread (docs/api.md §1.5 ``mcp_servers``, §11): ACP's
``mcpServers`` shape, checked, stored with the thread's options and handed to its agent —
an ACP agent in its ``session/new``/``load``/``resume``, Claude Code (and the other
stream-json agents) as a generated ``--mcp-config`` file.

Pure. The list is untrusted: every field is checked against ACP's schema and bounded,
unknown fields are refused (``_meta`` is accepted and dropped), names are unique. A stdio
server is a command the agent will run as its own child, so it gets no power the agent
does not have; an http or sse server is a URL the agent will reach, held to the launch's
remote-URL rule by bridge/launching.py. The values of ``env`` and ``headers`` may be
secrets: :func:`redacted` is the only form that leaves the daemon in an API answer or a
log line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from bridge.protocols.events import REDACTED

MAX_SERVERS = 16
MAX_NAME = 128
MAX_PATH = 4096
MAX_ARGS = 64
MAX_ARG = 4096
MAX_PAIRS = 64  # env variables or headers of one server
MAX_VALUE = 8192
MAX_URL = 2048

STDIO, HTTP, SSE = "stdio", "http", "sse"
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_HEADER_NAME_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")  # an HTTP token
_URL_RE = re.compile(r"https?://[^\s]+", re.IGNORECASE)
_FIELDS = {
    STDIO: frozenset({"name", "command", "args", "env"}),
    HTTP: frozenset({"name", "url", "headers"}),
    SSE: frozenset({"name", "url", "headers"}),
}


class McpServersInvalid(ValueError):
    """The list is not what ACP's schema allows, or breaks a bound: the message says where."""


def _text(value: Any, where: str, bound: int, *, empty: bool = False, line: bool = False) -> str:
    if not isinstance(value, str) or len(value) > bound or (not empty and not value):
        least = "a string" if empty else "a non-empty string"
        raise McpServersInvalid(f"{where} must be {least} of at most {bound} characters")
    if "\x00" in value or (line and ("\r" in value or "\n" in value)):
        raise McpServersInvalid(f"{where} holds a forbidden control character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise McpServersInvalid(f"{where} must be valid Unicode text") from None
    return value


def _pairs(value: Any, where: str, name_re: re.Pattern[str], *, line: bool) -> list[dict[str, str]]:
    if not isinstance(value, list) or len(value) > MAX_PAIRS:
        raise McpServersInvalid(f"{where} must be a list of at most {MAX_PAIRS} {{name, value}} objects")
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for i, pair in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(pair, dict) or set(pair) - {"name", "value", "_meta"}:
            raise McpServersInvalid(f"{at} must be an object with name and value")
        name = pair.get("name")
        if not isinstance(name, str) or not name_re.fullmatch(name):
            raise McpServersInvalid(f"{at}.name is not a valid name")
        if name.lower() in seen:
            raise McpServersInvalid(f"{at}.name {name!r} is given twice")
        seen.add(name.lower())
        out.append({"name": name, "value": _text(pair.get("value"), f"{at}.value", MAX_VALUE, empty=True, line=line)})
    return out


def _url(value: Any, where: str) -> str:
    url = _text(value, where, MAX_URL, line=True)
    if not _URL_RE.fullmatch(url):
        raise McpServersInvalid(f"{where} must be an http:// or https:// URL")
    return url


def _server(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise McpServersInvalid(f"{where} must be an object")
    kind = value.get("type", STDIO)
    if not isinstance(kind, str) or kind not in _FIELDS:
        # "acp" (an MCP server carried over the ACP connection itself) needs the client's
        # side of that transport, which a gateway in the middle does not have.
        raise McpServersInvalid(f"{where}.type must be http or sse (or absent: stdio)")
    unknown = set(value) - _FIELDS[kind] - {"type", "_meta"}
    if unknown:
        raise McpServersInvalid(f"{where} has unknown fields: {', '.join(sorted(unknown))}")
    missing = _FIELDS[kind] - set(value)
    if missing:
        raise McpServersInvalid(f"{where} lacks {', '.join(sorted(missing))}")
    out: dict[str, Any] = {"name": _text(value["name"], f"{where}.name", MAX_NAME, line=True)}
    if kind == STDIO:
        command = _text(value["command"], f"{where}.command", MAX_PATH, line=True)
        if not command.startswith("/"):
            raise McpServersInvalid(f"{where}.command must be an absolute path")
        args = value["args"]
        if not isinstance(args, list) or len(args) > MAX_ARGS:
            raise McpServersInvalid(f"{where}.args must be a list of at most {MAX_ARGS} strings")
        out["command"] = command
        out["args"] = [_text(a, f"{where}.args[{i}]", MAX_ARG, empty=True) for i, a in enumerate(args)]
        out["env"] = _pairs(value["env"], f"{where}.env", _ENV_NAME_RE, line=False)
    else:
        out["type"] = kind
        out["url"] = _url(value["url"], f"{where}.url")
        out["headers"] = _pairs(value["headers"], f"{where}.headers", _HEADER_NAME_RE, line=True)
    return out


def parse(value: Any, where: str = "mcpServers") -> list[dict[str, Any]]:
    """The servers in the bridge's stored form (ACP's, without ``_meta``; a stdio server
    has no ``type``). Raises :class:`McpServersInvalid`."""
    if not isinstance(value, list) or len(value) > MAX_SERVERS:
        raise McpServersInvalid(f"{where} must be a list of at most {MAX_SERVERS} servers")
    servers = [_server(s, f"{where}[{i}]") for i, s in enumerate(value)]
    names = [s["name"] for s in servers]
    if len(set(names)) != len(names):
        raise McpServersInvalid(f"{where}: two servers have the same name")
    return servers


def kind(server: Mapping[str, Any]) -> str:
    return str(server.get("type", STDIO))


def redacted(servers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The servers as an API answer shows them: every env and header value replaced."""
    out = []
    for server in servers:
        shown = dict(server)
        for key in ("env", "headers"):
            if isinstance(server.get(key), list):
                shown[key] = [{"name": p.get("name"), "value": REDACTED} for p in server[key] if isinstance(p, Mapping)]
        out.append(shown)
    return out


def secret_values(servers: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every env and header value: what is kept out of the transcript (the lines written
    to the agent, what the agent writes) as a profile's secrets are."""
    return [str(p.get("value", "")) for s in servers for key in ("env", "headers") for p in s.get(key, ())]


def endpoints(servers: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the launch's remote-URL rule judges: every URL, argument and env value (a
    stdio server's arguments can name a remote endpoint as well as the agent's own can)."""
    values: list[str] = []
    for server in servers:
        values += [str(server["url"])] if "url" in server else []
        values += [str(a) for a in server.get("args", ())]
        values += [str(p.get("value", "")) for p in server.get("env", ())]
    return values


def for_acp(
    servers: Sequence[Mapping[str, Any]], capabilities: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], list[str]]:
    """ACP's ``mcpServers`` for an agent that said ``capabilities`` (its
    ``agentCapabilities.mcpCapabilities``): stdio servers always (every ACP agent takes
    them), http and sse ones only if it said it takes them. Returns (servers, the names
    left out)."""
    given: list[dict[str, Any]] = []
    left: list[str] = []
    for server in servers:
        k = kind(server)
        if k != STDIO and capabilities.get(k) is not True:
            left.append(str(server["name"]))
            continue
        given.append(dict(server))
    return given, left


def claude_config(servers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``--mcp-config`` file of Claude Code (and the CLIs sharing its flags): one
    object ``mcpServers`` keyed by name, env and headers as objects."""
    config: dict[str, Any] = {}
    for server in servers:
        k = kind(server)
        if k == STDIO:
            env = {p["name"]: p["value"] for p in server.get("env", ())}
            config[server["name"]] = {
                "type": STDIO,
                "command": server["command"],
                "args": list(server["args"]),
                "env": env,
            }
        else:
            headers = {p["name"]: p["value"] for p in server.get("headers", ())}
            config[server["name"]] = {"type": k, "url": server["url"], "headers": headers}
    return {"mcpServers": config}


__all__ = [
    "MAX_SERVERS",
    "McpServersInvalid",
    "claude_config",
    "endpoints",
    "for_acp",
    "kind",
    "parse",
    "redacted",
    "secret_values",
]
