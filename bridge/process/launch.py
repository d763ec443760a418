"""Launch rules (docs/api.md §2): what may be spawned, with which argv and environment.

Everything here is checked before anything is spawned; a refusal raises
:class:`~bridge.errors.LaunchRefused` with a machine-readable ``code``.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from bridge.errors import LaunchRefused
from bridge.network import is_loopback_host

# docs/api.md §2.5: opaque, but safe to put on a command line as one argument.
SESSION_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,256}")

# The OS variables an agent may inherit from the daemon; everything else it gets comes
# from its profile's ``env``. Tokens, cloud credentials and our own settings never leak.
ENV_ALLOWLIST = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "LANG",
        "LANGUAGE",
        "TMPDIR",
        "TZ",
        "SYSTEMROOT",
        "COLORTERM",
        "XDG_RUNTIME_DIR",
    }
)
ENV_ALLOWLIST_PREFIXES = ("LC_",)

# "http:" + any slashes + the rest: WHATWG URL parsers (Node, i.e. the agent CLIs) accept
# "http:host" and "http:/host" too, read a backslash as "/" and drop ASCII tabs and newlines
# anywhere, so url_problem checks each value as written and as such a parser reads it.
_URL_RE = re.compile(r"(?i)\b(https?):(/*)([^\s\"'<>]*)")
_WHATWG_DROP = str.maketrans("", "", "\t\n\r")


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str


def valid_session_id(value: object) -> bool:
    return isinstance(value, str) and SESSION_ID_RE.fullmatch(value) is not None


def executable_problem(path: str) -> str | None:
    """Why ``path`` may not be launched, or None. Checked at load and before each spawn."""
    if not path or not os.path.isabs(path):
        return f"executable must be an absolute path: {path!r}"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"executable not found: {path}"
    except OSError as exc:
        return f"executable cannot be inspected: {path}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"executable is a symlink (give its real path {os.path.realpath(path)}): {path}"
    if not stat.S_ISREG(st.st_mode):
        return f"executable is not a regular file: {path}"
    if not os.access(path, os.X_OK):
        return f"executable is not executable by this user: {path}"
    return None


def url_problem(values: Iterable[str], *, opt_in: bool) -> str | None:
    """Remote-URL rule: loopback always allowed; remote https needs the opt-in; remote
    plain http is refused even with it."""
    for value in values:
        # Otherwise "https://evil.example\\@127.0.0.1" or "http://localhost\n.evil.example"
        # would be loopback here and remote for the agent.
        whatwg = value.translate(_WHATWG_DROP).replace("\\", "/")
        for text in dict.fromkeys((value, whatwg)):
            for match in _URL_RE.finditer(text):
                scheme, slashes, rest = match.group(1).lower(), match.group(2), match.group(3)
                if not slashes and not rest:
                    continue  # a bare "http:" in prose
                try:
                    host = urlsplit(f"{scheme}://{rest}").hostname
                except ValueError:
                    return f"malformed URL in agent arguments or environment: {match.group(0)[:100]}"
                if is_loopback_host(host):
                    continue
                if not opt_in:
                    return f"remote URL {scheme}://{host} needs remote_api_opt_in (AWP_AGENT_REMOTE_API_OPT_IN=1)"
                if scheme == "http":
                    return f"plain http to a non-loopback host is refused: http://{host}"
    return None


def child_env(daemon_env: Mapping[str, str], profile_env: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in daemon_env.items() if k in ENV_ALLOWLIST or k.startswith(ENV_ALLOWLIST_PREFIXES)}
    env.update(profile_env)
    return env


def build_launch(
    *,
    executable: str,
    args: Sequence[str],
    protocol_flags: Sequence[str],
    profile_env: Mapping[str, str],
    cwd: str,
    model: str | None,
    resume_id: str | None,
    extra_args: Sequence[str] = (),
    mcp_config: str | None = None,
    remote_api_opt_in: bool = False,
    daemon_env: Mapping[str, str] | None = None,
) -> LaunchSpec:
    """argv = executable + args + protocol flags + extra + --model M [+ --resume=ID]
    [+ --mcp-config F]; never a shell. Raises LaunchRefused."""
    problem = executable_problem(executable)
    if problem:
        raise LaunchRefused(problem, code="executable_unusable")
    if not os.path.isabs(cwd) or not os.path.isdir(cwd):
        raise LaunchRefused(f"working directory must be an existing absolute directory: {cwd}", code="bad_cwd")
    argv = [executable, *args, *protocol_flags, *extra_args]
    if model:
        argv += ["--model", model]
    if resume_id is not None:
        if not valid_session_id(resume_id):
            raise LaunchRefused("native session id is not valid; refusing to pass it on", code="invalid_session_id")
        # One argument with "=": an id that starts with "-" cannot become a flag (docs/api.md §2.2).
        argv.append(f"--resume={resume_id}")
    if mcp_config:
        if not os.path.isabs(mcp_config):
            raise LaunchRefused("mcp_config must be an absolute path", code="bad_mcp_config")
        argv += ["--mcp-config", mcp_config]
    for a in argv:
        if "\x00" in a:
            raise LaunchRefused("argument contains a NUL byte", code="bad_argument")
    problem = url_problem([*argv[1:], *profile_env.values()], opt_in=remote_api_opt_in)
    if problem:
        raise LaunchRefused(problem, code="remote_url_refused")
    env = child_env(os.environ if daemon_env is None else daemon_env, profile_env)
    return LaunchSpec(tuple(argv), env, cwd)
