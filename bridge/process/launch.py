"""Launch rules (docs/api.md §2): what may be spawned, with which argv and environment.

Everything here is checked before anything is spawned; a refusal raises
:class:`~bridge.errors.LaunchRefused` with a machine-readable ``code``.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from bridge.errors import LaunchRefused
from bridge.network import is_loopback_host

if TYPE_CHECKING:
    from bridge.process.sandbox import Plan

# docs/api.md §2.5: opaque, but safe to put on a command line as one argument.
SESSION_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,256}")
# docs/api.md §2.2: a model id; never beginning with "-", so it can never read as a flag.
MODEL_RE = re.compile(r"[A-Za-z0-9._:/@-]{1,200}")

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
        # The locale variables POSIX defines (never any other LC_* a daemon may carry).
        "LC_ALL",
        "LC_COLLATE",
        "LC_CTYPE",
        "LC_MESSAGES",
        "LC_MONETARY",
        "LC_NUMERIC",
        "LC_TIME",
        "LANGUAGE",
        "TMPDIR",
        "TZ",
        "SYSTEMROOT",
        "COLORTERM",
        "XDG_RUNTIME_DIR",
    }
)

# A scheme WHATWG URL parsers (Node, i.e. the agent CLIs) treat as special + any slashes +
# the rest: they accept "http:host" and "http:/host" too, read a backslash as "/" and drop
# ASCII tabs and newlines anywhere, so url_problem checks each value as written and as such
# a parser reads it. A scheme-relative "//host" (at the start of a value, after "=" or a
# space) takes the scheme of whatever base the agent joins it with.
_URL_RE = re.compile(r"(?i)\b(https?|wss?|ftp):(/*)([^\s\"'<>]*)")
_RELATIVE_RE = re.compile(r"(?:^|(?<=[=\s]))//([^\s\"'<>/]+)")
# Remote hosts with the opt-in: only over these; the others (and "//host") never.
SECURE_SCHEMES = frozenset({"https", "wss"})
# Flags whose value is prose for the model, not an endpoint: never checked for URLs.
PROSE_FLAGS = frozenset({"--system-prompt", "--append-system-prompt"})
_WHATWG_DROP = str.maketrans("", "", "\t\n\r")


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    # The agent's confinement (process/sandbox.py); None: it runs unconfined.
    sandbox: Plan | None = None
    # Its profile's memory_limit_mb: a cgroup of its own where the daemon may make one
    # (process/cgroup.py); None: no limit.
    memory_limit_mb: int | None = None


def within(path: str, root: str) -> bool:
    """``path`` is ``root`` or lies beneath it (both normalized, absolute; no file system
    access: resolve symlinks first where that matters)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def valid_session_id(value: object) -> bool:
    return isinstance(value, str) and SESSION_ID_RE.fullmatch(value) is not None


def joined_resume(session_id: str) -> list[str]:
    """``--resume=ID``, one argument (the stream-json form, and the default)."""
    return [f"--resume={session_id}"]


def model_problem(value: object) -> str | None:
    """Why ``value`` may not be a model id (docs/api.md §2.2), or None."""
    if isinstance(value, str) and value.startswith("-"):
        return "a model id may not begin with '-' (it would read as a flag)"
    if not isinstance(value, str) or MODEL_RE.fullmatch(value) is None:
        return "a model id is 1-200 characters of letters, digits and . _ : / @ -"
    return None


def joined_model(model: str) -> list[str]:
    """``--model=M``, one argument (the stream-json form, and the default)."""
    return [f"--model={model}"]


def model_argv(model: str, form: Callable[[str], Sequence[str]] = joined_model) -> list[str]:
    """The model arguments for ``model`` in a dialect's ``form`` (its codec's
    ``model_args``), checked first: raises LaunchRefused (``invalid_model``)."""
    problem = model_problem(model)
    if problem:
        raise LaunchRefused(f"model {model[:80]!r}: {problem}", code="invalid_model")
    return list(form(model))


def resume_argv(session_id: str, form: Callable[[str], Sequence[str]] = joined_resume) -> list[str]:
    """The resume arguments for ``session_id`` in a dialect's ``form`` (its codec's
    ``resume_args``), checked: the id matches docs/api.md §2.5, and where the form passes it
    as an argument of its own (awp-jsonl's ``--resume ID``) it may not begin with ``-``, or
    the agent would read it as a flag. Raises LaunchRefused (``invalid_session_id``)."""
    if not valid_session_id(session_id):
        raise LaunchRefused("native session id is not valid; refusing to pass it on", code="invalid_session_id")
    args = list(form(session_id))
    if session_id.startswith("-") and session_id in args:
        raise LaunchRefused(
            "native session id begins with '-', and this agent takes it as an argument of its own "
            "(--resume ID), where it would read as a flag; refusing to pass it on",
            code="invalid_session_id",
        )
    return args


def executable_problem(path: str) -> str | None:
    """Why ``path`` may not be launched, or None. Checked at load, at thread creation and
    before each spawn (where :func:`open_executable` then opens what is executed). Never
    raises."""
    try:
        return _executable_problem(path)
    except (OSError, ValueError) as exc:
        return f"executable cannot be inspected: {path!r}: {getattr(exc, 'strerror', None) or exc}"


def _executable_problem(path: str) -> str | None:
    if not path or not os.path.isabs(path):
        return f"executable must be an absolute path: {path!r}"
    if "\x00" in path:
        return "executable path contains a NUL byte"
    if path.startswith("//") or os.path.normpath(path) != path:
        return f"executable path must be normalized (no '.', '..', '//' or trailing '/'): {path}"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"executable not found: {path}"
    except OSError as exc:
        return f"executable cannot be inspected: {path}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"executable is a symlink (give its real path {_real(path)}): {path}"
    if not stat.S_ISREG(st.st_mode):
        return f"executable is not a regular file: {path}"
    parent = os.path.dirname(path)
    if _real(parent) != parent:
        return f"executable's directory is reached through a symlink (give its real path {_real(path)}): {path}"
    if not os.access(path, os.X_OK):
        return f"executable is not executable by this user: {path}"
    return None


def _real(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return "(unresolvable)"


# Where the kernel shows an open descriptor's file; exec through it runs exactly that file.
_FD_DIR = "/proc/self/fd"
_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)


def open_executable(path: str) -> int | None:
    """Check ``path`` and open it once (``O_PATH|O_NOFOLLOW``); the spawn then executes
    ``/proc/self/fd/N``, so the file executed is the file checked, whatever happens to the
    path in between (issue #15 item 8). The opened file is checked again: a regular,
    executable file whose kernel path is ``path`` itself (no symlink anywhere on the way).
    None where ``/proc`` is missing (the path is executed after the check). Raises
    LaunchRefused; the caller closes the descriptor."""
    problem = executable_problem(path)
    if problem:
        raise LaunchRefused(problem, code="executable_unusable")
    if not os.path.isdir(_FD_DIR):
        return None
    try:
        fd = os.open(path, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, ValueError) as exc:
        raise LaunchRefused(
            f"executable changed while it was being launched: {path}: {getattr(exc, 'strerror', None) or exc}",
            code="executable_unusable",
        ) from exc
    try:
        problem = _opened_problem(fd, path)
    except (OSError, ValueError) as exc:
        problem = f"executable changed while it was being launched: {path}: {getattr(exc, 'strerror', None) or exc}"
    if problem:
        os.close(fd)
        raise LaunchRefused(problem, code="executable_unusable")
    return fd


def _opened_problem(fd: int, path: str) -> str | None:
    st = os.fstat(fd)
    if stat.S_ISLNK(st.st_mode):
        return f"executable changed into a symlink while it was being launched: {path}"
    if not stat.S_ISREG(st.st_mode):
        return f"executable changed into something other than a regular file while it was being launched: {path}"
    if os.readlink(f"{_FD_DIR}/{fd}") != path:
        return f"executable was reached through a symlink or moved while it was being launched: {path}"
    if not os.access(f"{_FD_DIR}/{fd}", os.X_OK):
        return f"executable is not executable by this user: {path}"
    return None


def exec_path(fd: int) -> str:
    """The path a child executes to run the file open on ``fd`` (kept open in the child)."""
    return f"{_FD_DIR}/{fd}"


def url_problem(values: Iterable[str], *, opt_in: bool) -> str | None:
    """Remote-URL rule: loopback always allowed; remote ``https``/``wss`` need the opt-in;
    remote ``http``, ``ws``, ``ftp`` and scheme-relative ``//host`` are refused even with it."""
    for value in values:
        # Otherwise "https://evil.example\\@127.0.0.1" or "http://localhost\n.evil.example"
        # would be loopback here and remote for the agent.
        whatwg = value.translate(_WHATWG_DROP).replace("\\", "/")
        for text in dict.fromkeys((value, whatwg)):
            for match in _URL_RE.finditer(text):
                scheme, slashes, rest = match.group(1).lower(), match.group(2), match.group(3)
                if not slashes and not rest:
                    continue  # a bare "http:" in prose
                problem = _remote_problem(scheme, rest, match.group(0), opt_in=opt_in)
                if problem:
                    return problem
            for match in _RELATIVE_RE.finditer(text):
                problem = _remote_problem(None, match.group(1), match.group(0), opt_in=opt_in)
                if problem:
                    return problem
    return None


def _remote_problem(scheme: str | None, rest: str, written: str, *, opt_in: bool) -> str | None:
    try:
        host = urlsplit(f"{scheme or 'http'}://{rest}").hostname
    except ValueError:
        return f"malformed URL in agent arguments or environment: {written[:100]}"
    if is_loopback_host(host):
        return None
    shown = f"{scheme}://{host}" if scheme else f"//{host}"
    if not opt_in:
        return f"remote URL {shown} needs remote_api_opt_in (AWP_AGENT_REMOTE_API_OPT_IN=1)"
    if scheme is None:
        return f"scheme-relative URL to a non-loopback host is refused (its scheme is not known): {shown}"
    if scheme not in SECURE_SCHEMES:
        return f"plain {scheme} to a non-loopback host is refused: {shown}"
    return None


def endpoint_values(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """What the remote-URL rule looks at: every argument and env value, except the value
    of a prose flag (``--system-prompt``: text for the model, not an endpoint)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        flag, eq, _ = a.partition("=")
        if flag in PROSE_FLAGS:
            skip = not eq
            continue
        out.append(a)
    return out + list(env.values())


class ProfileLike(Protocol):
    """What :func:`check_launch_rules` reads of an agent profile (config.AgentProfile)."""

    @property
    def executable(self) -> str: ...
    @property
    def args(self) -> Sequence[str]: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def model(self) -> str | None: ...
    @property
    def remote_api_opt_in(self) -> bool: ...
    @property
    def mcp_config(self) -> str | None: ...
    @property
    def allowed_tools(self) -> Sequence[str] | None: ...
    @property
    def disallowed_tools(self) -> Sequence[str] | None: ...
    @property
    def system_prompt(self) -> str | None: ...


def check_launch_rules(
    profile: ProfileLike,
    flags: Sequence[str] = (),
    *,
    model: str | None = None,
    mcp_config: str | None = None,
    check_executable: bool = True,
    model_form: Callable[[str], Sequence[str]] = joined_model,
) -> None:
    """The launch rules that depend only on the profile and the flags a thread's options
    give (the dialect's, from ``codec.launch_flags``; see bridge/launching.py): for thread
    creation and profile load, so a thread that could never be spawned is refused up
    front. The same rules (:func:`agent_args`) run again in :func:`build_launch`, which
    adds what only a spawn knows (the cwd, the resume id). Pure apart from inspecting the
    executable (skipped with ``check_executable=False``: at load, an unusable executable is
    listed, not fatal); raises LaunchRefused."""
    if check_executable:
        check_executable_usable(profile.executable)
    agent_args(
        [*profile.args, *flags],
        profile.env,
        model=model or profile.model,
        model_form=model_form,
        mcp_config=mcp_config,
        remote_api_opt_in=profile.remote_api_opt_in,
    )


def check_executable_usable(path: str) -> None:
    """Raise LaunchRefused (``executable_unusable``) where :func:`executable_problem` finds one."""
    problem = executable_problem(path)
    if problem:
        raise LaunchRefused(problem, code="executable_unusable")


def agent_args(
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    model: str | None,
    model_form: Callable[[str], Sequence[str]] = joined_model,
    resume_id: str | None = None,
    resume_form: Callable[[str], Sequence[str]] = joined_resume,
    mcp_config: str | None = None,
    remote_api_opt_in: bool = False,
) -> list[str]:
    """The agent's arguments after its executable, ``args`` + model [+ resume]
    [+ --mcp-config F], with every rule on them checked: the one place those rules live,
    run at profile load and thread creation (:func:`check_launch_rules`, without a resume
    id) and at each spawn (:func:`build_launch`). ``env``: what the agent's environment
    will hold, for the remote-URL rule. Raises LaunchRefused."""
    if mcp_config and not os.path.isabs(mcp_config):
        raise LaunchRefused("mcp_config must be an absolute path", code="bad_mcp_config")
    argv = list(args)
    if model:
        argv += model_argv(model, model_form)
    if resume_id is not None:
        argv += resume_argv(resume_id, resume_form)
    if mcp_config:
        argv += ["--mcp-config", mcp_config]
    if any("\x00" in a for a in argv):
        raise LaunchRefused("argument contains a NUL byte", code="bad_argument")
    problem = url_problem(endpoint_values(argv, env), opt_in=remote_api_opt_in)
    if problem:
        raise LaunchRefused(problem, code="remote_url_refused")
    return argv


def child_env(daemon_env: Mapping[str, str], profile_env: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in daemon_env.items() if k in ENV_ALLOWLIST}
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
    resume_form: Callable[[str], Sequence[str]] = joined_resume,
    model_form: Callable[[str], Sequence[str]] = joined_model,
    extra_args: Sequence[str] = (),
    mcp_config: str | None = None,
    remote_api_opt_in: bool = False,
    daemon_env: Mapping[str, str] | None = None,
) -> LaunchSpec:
    """argv = executable + args + protocol flags + extra + model [+ resume]
    [+ --mcp-config F]; never a shell. The model arguments are ``model_form(model)`` (the
    codec's ``model_args``: ``--model=M``, ``--model M`` or none), see :func:`model_argv`;
    the resume arguments ``resume_form(id)`` (the codec's ``resume_args``: ``--resume=ID``
    or ``--resume ID``), see :func:`resume_argv`. Raises LaunchRefused."""
    check_executable_usable(executable)
    if not os.path.isabs(cwd) or not os.path.isdir(cwd):
        raise LaunchRefused(f"working directory must be an existing absolute directory: {cwd}", code="bad_cwd")
    argv = [
        executable,
        *agent_args(
            [*args, *protocol_flags, *extra_args],
            profile_env,
            model=model,
            model_form=model_form,
            resume_id=resume_id,
            resume_form=resume_form,
            mcp_config=mcp_config,
            remote_api_opt_in=remote_api_opt_in,
        ),
    ]
    env = child_env(os.environ if daemon_env is None else daemon_env, profile_env)
    return LaunchSpec(tuple(argv), env, cwd)
