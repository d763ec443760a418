"""Where settings come from (the config file, environment twins, flags) and how their
refusals are said (issue #34 item 5).

Every refusal of the config names where the value came from (the file, or the variable or
flag that set it), the section and the key, and says what the value must be in words; a
misspelt key or section gets the nearest valid name (``did you mean 'port'?``). Values are
never quoted back: a config holds tokens, passwords in URLs and API keys.

Also here: why a profile cannot run because of its own settings (a launch rule it breaks),
said with the way to fix it, and text made safe for a log line (URLs lose their userinfo
and query).
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from bridge.errors import BOUND_WORDS, ConfigError

# The sections a config file may have, as written in it.
SECTIONS = ("server", "agents", "store", "cluster", "auth", "sandbox", "capacity")
SHOWN_SECTIONS = "[server], [agents.NAME], [store], [cluster], [auth], [sandbox], [capacity]"

# pydantic's error types, said as a config's reader would: TOML words (a table, text, a
# whole number), never the library's phrasing.
_WORDS: dict[str, str] = {
    **BOUND_WORDS,
    "dict_type": "must be a table",
    "model_type": "must be a table",
    "string_type": "must be text in quotes",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "string_pattern_mismatch": "must match the pattern {pattern}",
}
# Types whose refusal also says what was given instead (its kind, never its value).
_TYPE_ERRORS = frozenset(k for k in _WORDS if k.endswith(("_type", "_parsing")))


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``word`` (a typo's intended name), or None."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def _kind(value: object) -> str:
    """What a TOML value is, in words."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return "a date or time"


@dataclass
class Sources:
    """Where each setting came from: the config file, or for a value an environment
    variable or a flag replaced, that variable or flag (named in the refusal instead)."""

    file: str | None = None
    given: dict[tuple[str, str], str] = field(default_factory=dict)

    def put(self, raw: dict[str, Any], section: str, key: str, value: Any, label: str) -> None:
        """Set ``raw[key]`` from ``label`` (``AGENT_BRIDGE_PORT``, ``--port``)."""
        raw[key] = value
        self.given[(section, key)] = label

    def error(self, message: str) -> ConfigError:
        """A refusal that names the file it is about (when there is one)."""
        return ConfigError(f"{self.file}: {message}" if self.file else message)

    def invalid(self, exc: ValidationError, model: type[BaseModel], section: str, table: str) -> ConfigError:
        """``exc`` (from validating ``table``, e.g. ``[server]`` or ``[agents.mine]``, against
        ``model``) in words: one ``[table] key: what is wrong`` per error."""
        hidden = {"name", "builtin"} if section == "agents" else set()
        keys = [k for k in model.model_fields if k not in hidden]
        # A misspelt key first: the "is required" that often comes with it is its echo.
        errors = sorted(exc.errors(), key=lambda e: e.get("type") != "extra_forbidden")
        said = [self._one(err, section, table, keys) for err in errors]
        text = "; ".join(words for words, _ in said)
        # The file is named when one of the values refused is the file's.
        from_file = any(label is None for _, label in said)
        return ConfigError(f"{self.file}: {text}" if self.file and from_file else text)

    def _one(self, err: Mapping[str, Any], section: str, table: str, keys: list[str]) -> tuple[str, str | None]:
        """One error in words, and the variable or flag its value came from (None: the file)."""
        loc = [str(p) for p in err.get("loc", ())]
        key = loc[0] if loc else ""
        path = ".".join(loc)
        label = self.given.get((section, key))
        where = f"{table} {path}" if path else table
        if label:
            where += f" (from {label})"
        return self._what(err, where, table, keys, key), label

    @staticmethod
    def _what(err: Mapping[str, Any], where: str, table: str, keys: list[str], key: str) -> str:
        kind = str(err.get("type", ""))
        if kind == "extra_forbidden":
            guess = nearest(key, keys)
            hint = f"did you mean {guess!r}?" if guess else f"the settings of {table} are in docs/configuration.md"
            return f"{where}: not a setting; {hint}"
        template = _WORDS.get(kind)
        if template is None:  # a validator of ours: already in words
            return f"{where}: {str(err.get('msg', 'is not valid')).removeprefix('Value error, ')}"
        try:
            what = template.format(**(err.get("ctx") or {}))
        except (KeyError, IndexError):
            what = "is not valid"
        if kind in _TYPE_ERRORS and "input" in err:
            what += f", not {_kind(err['input'])}"
        return f"{where}: {what}"


def unknown_section(sources: Sources, name: str, value: Any, fields: Mapping[str, Iterable[str]]) -> ConfigError:
    """A top-level name that is not a section: the nearest section, or the section that
    has a setting of that name (``port = 1`` at the top belongs under ``[server]``)."""
    guess = nearest(name, SECTIONS)
    owner = next((s for s, keys in fields.items() if name in keys), None)
    if guess is not None:
        hint = f"did you mean [{guess}]?"
    elif owner is not None:
        hint = f"did you mean {name} under [{owner}]?"
    else:
        hint = f"the sections are {SHOWN_SECTIONS}"
    shown = f"[{name}]" if isinstance(value, dict) else name
    return sources.error(f"{shown}: not a section; {hint}")


_TOML_WHERE = re.compile(r"^(?P<what>.*?)\s*\(at line (?P<line>\d+), column (?P<col>\d+)\)$", re.S)


def toml_error(path: str, exc: tomllib.TOMLDecodeError) -> ConfigError:
    """A TOML syntax error as ``FILE: line L, column C: not valid TOML: what``."""
    text = str(exc)
    m = _TOML_WHERE.match(text)
    if m is None:
        return ConfigError(f"{path}: not valid TOML: {text}")
    what = m["what"][:1].lower() + m["what"][1:]
    return ConfigError(f"{path}: line {m['line']}, column {m['col']}: not valid TOML: {what}")


# --------------------------------------------------------------------------- environment twins


def awp_json(env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """AWP_AGENT_CLI_ARGS_JSON (an array of strings) and AWP_AGENT_CLI_ENV_JSON (an object
    of strings)."""
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
    return args, child_env


def port_given(port: int | None, env: Mapping[str, str]) -> tuple[str, int] | None:
    """The port of the flag or the env twin, with its name; None: neither is set."""
    if port is not None:
        return "--port", port
    if env.get("AGENT_BRIDGE_PORT"):
        try:
            return "AGENT_BRIDGE_PORT", int(env["AGENT_BRIDGE_PORT"])
        except ValueError as exc:
            raise ConfigError("AGENT_BRIDGE_PORT must be a whole number (a port, 0-65535)") from exc
    return None


def twins(src: Sources, raw: dict[str, Any], section: str, env: Mapping[str, str], names: dict[str, str]) -> None:
    """The environment twins (``names``: key → variable) that are set replace the file's."""
    for key, var in names.items():
        if env.get(var):
            src.put(raw, section, key, env[var], var)


def server_env_twins(src: Sources, raw: dict[str, Any], env: Mapping[str, str]) -> None:
    """``[server]`` keys a container or unit sets without a config file: replace the TOML
    value when the variable is set (an empty ``AGENT_BRIDGE_ALLOWED_HOSTS`` clears the list)."""
    hosts = env.get("AGENT_BRIDGE_ALLOWED_HOSTS")
    if hosts is not None:
        hosts_list = [h.strip() for h in hosts.split(",") if h.strip()]
        src.put(raw, "server", "allowed_hosts", hosts_list, "AGENT_BRIDGE_ALLOWED_HOSTS")
    trust = env.get("AGENT_BRIDGE_TRUST_PROXY_HEADERS")
    if trust is not None:
        if trust.strip().lower() not in _BOOLS:
            raise ConfigError(f"AGENT_BRIDGE_TRUST_PROXY_HEADERS must be true or false, not {trust!r}")
        src.put(raw, "server", "trust_proxy_headers", _BOOLS[trust.strip().lower()], "AGENT_BRIDGE_TRUST_PROXY_HEADERS")


_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


# --------------------------------------------------------------------------- unusable profiles

# A URL's userinfo (``user:password@``) and query (``?key=…``): what a log line or a listing
# must not carry of a profile's arguments and environment.
_USERINFO = re.compile(r"(?i)\b((?:[a-z][a-z0-9+.-]*:)?//)[^\s/@\"'<>]*@")
_QUERY = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s?\"'<>]*)\?[^\s\"'<>]*")


def redacted(text: str) -> str:
    """``text`` with every URL's userinfo and query replaced by ``…``."""
    return _QUERY.sub(r"\1?…", _USERINFO.sub(r"\1…@", text))


def profile_refusal(name: str, code: str, message: str, *, awp: bool) -> str:
    """Why the profile ``name`` cannot run, a launch rule its own settings break (``code``,
    ``message``: the rule's refusal), with what to change and where: in its
    ``[agents.NAME]`` table, or for the ``awp`` profile of the AWP variables, in them."""
    table = "the AWP_AGENT_CLI_* variables" if awp else f"[agents.{name}]"
    message = message.replace(" (AWP_AGENT_REMOTE_API_OPT_IN=1)", "")
    # Only a remote https or wss URL is allowed by the opt-in; anything else would still be
    # refused with it, so the fix offered is then a different URL.
    secure = re.search(r"remote URL (?:https|wss)://\S+ needs remote_api_opt_in", message) is not None
    if code == "remote_url_refused" and secure:
        opt_in = "AWP_AGENT_REMOTE_API_OPT_IN=1" if awp else f"remote_api_opt_in = true in [agents.{name}]"
        fix = f"to let this agent reach that host, set {opt_in}"
    elif code == "remote_url_refused":
        fix = f"use an https or wss URL (remote hosts need the opt-in) or a loopback address in {table}"
    elif code == "bad_mcp_config":
        fix = f"give mcp_config as an absolute path in {table}"
    else:
        fix = f"change {table}"
    return redacted(f"{message}; {fix}")


_M = TypeVar("_M", bound=BaseModel)


def table(src: Sources, value: Any, problem: str) -> dict[str, Any]:
    """A TOML table of the config (nothing: empty); ``problem`` when it is not a table."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise src.error(problem)
    return dict(value)


def section(src: Sources, model: type[_M], name: str, raw: dict[str, Any], table: str = "") -> _M:
    """``raw`` validated as ``model``; a refusal names the file, ``[name]`` and the key."""
    try:
        return model(**raw)
    except ValidationError as exc:
        raise src.invalid(exc, model, name, table or f"[{name}]") from exc
