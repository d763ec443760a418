"""The bundled agent-bridge demo agent: a tiny offline stand-in for Claude Code.

It speaks Claude Code's stream-json dialect (docs/api.md §7.1) on stdin/stdout,
needs no API key and no network, and uses the standard library only. The daemon launches
it as ``<python> -I <this file> --output-format stream-json --input-format stream-json
--verbose --model M [--resume=ID] ...``, so it must never import the ``bridge`` package.

Things a newcomer can type (each shows one thing the web page draws):

* anything at all: a short friendly reply that echoes what was said;
* ``tour`` (or ``demo``): all of the below in one turn — a thinking block, an edit of
  ``hello.py`` (or the first text file) that asks first, ``wc -l`` on the files, a
  sub-agent, and a fenced code block;
* ``list files`` (or ``ls``): a ``ListFiles`` tool call on the working directory;
* ``read <file>``: a ``ReadFile`` tool call (refused outside the working directory);
* ``edit [<file>]`` (default ``hello.py``): an ``Edit`` tool call whose input holds the
  old and the new string (the page shows a diff). It asks for permission first, over the
  real stream-json path (a ``can_use_tool`` control request, when launched with
  ``--permission-prompt-tool stdio``); refused, nothing changes. Permission mode
  ``acceptEdits`` / ``bypassPermissions`` or ``--allowedTools Edit`` skip the question;
  without a way to ask, the edit is refused. The edit: the first line with "Hello" says
  "Hi there" instead, else a comment goes on top;
* ``run [<command>]`` (or ``bash``): a ``Bash`` tool call with its output and exit status,
  as Claude Code reports them ("Exit code N" on failure). Only a fixed set of read-only
  commands runs (``ls``, ``wc -l [files]``, ``git status``, ``git log``, ``date``,
  ``python3 --version``; default ``ls -l``), as an argument list, never through a shell:
  the demo agent must not run what it is sent;
* ``task`` (or ``agents``): a ``Task`` tool call whose sub-agent lists and reads the files
  — its lines carry the call's id as ``parent_tool_use_id``, and ``task_started`` /
  ``task_progress`` / ``task_notification`` lines feed the page's Tasks panel;
* ``code``: a reply with a fenced code block;
* ``think``: a thinking block before the reply (``edit`` and ``task`` think first too);
* ``what did I say?`` (or ``history`` / ``remember``): the prompts of this session,
  including those loaded with ``--resume=<id>``;
* ``slow``: a long, slowly streamed reply, to try the interrupt button.

History is persisted per session as JSON under ``$DEMO_AGENT_STATE_DIR`` (default
``~/.local/share/agent-bridge/demo-agent``), in ``<session_id>.json``.
"""

from __future__ import annotations

import collections
import contextlib
import difflib
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

DEMO_AGENT_VERSION = "1.0.0"
TOOL_LIST = "ListFiles"
TOOL_READ = "ReadFile"
# Claude Code's own names: the page draws an Edit as a diff, a Bash call with its exit
# status, and follows a Task's sub-agent in its task panel.
TOOL_EDIT = "Edit"
TOOL_BASH = "Bash"
TOOL_TASK = "Task"
ALL_TOOLS = (TOOL_LIST, TOOL_READ, TOOL_EDIT, TOOL_BASH, TOOL_TASK)

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,256}$")
CHUNK_DELAY_S = 0.04
SLOW_CHUNK_DELAY_S = 0.05
SLOW_CHUNKS = 100
TOOL_DELAY_S = 0.05
SUBAGENT_STEP_S = 0.3  # between a sub-agent's steps, so its progress can be watched
SHELL_TIMEOUT_S = 10.0
MAX_SHELL_OUTPUT = 30_000
MAX_LIST_ENTRIES = 50
MAX_READ_BYTES = 64 * 1024
MAX_HISTORY = 200
MAX_HISTORY_FILE_BYTES = 16 * 1024 * 1024
MAX_ENTRIES = 8  # chain entries kept per turn: --resume-session-at names the kept turn's last
MAX_LINE_BYTES = 64 * 1024 * 1024

INTERRUPT_MARKER = "[Request interrupted by user]"
INTERRUPT_TOOL_MARKER = "[Request interrupted by user for tool use]"

Json = dict[str, Any]

# Flags whose value is the next argv token (unless given as --flag=value). Anything not
# listed here is treated as a boolean flag; stray positional tokens are ignored, so an
# unknown flag that does take a value is harmless either way.
_VALUE_FLAGS = frozenset(
    {
        "--resume-session-at",
        "--output-format",
        "--input-format",
        "--model",
        "--mcp-config",
        "--permission-mode",
        "--system-prompt",
        "--append-system-prompt",
        "--system-prompt-file",
        "--append-system-prompt-file",
        "--allowedTools",
        "--allowed-tools",
        "--disallowedTools",
        "--disallowed-tools",
        "--tools",
        "--permission-prompt-tool",
        "--max-turns",
        "--max-budget-usd",
        "--setting-sources",
        "--settings",
        "--add-dir",
        "--session-id",
        "--fallback-model",
        "--effort",
        "--max-thinking-tokens",
        "--thinking",
        "--json-schema",
        "--agents",
        "--betas",
        "--debug-file",
    }
)
_OPTIONAL_VALUE_FLAGS = frozenset({"--resume", "-r"})
_BOOL_FLAGS = frozenset(
    {
        "--verbose",
        "--include-partial-messages",
        "--replay-user-messages",
        "--include-hook-events",
        "--fork-session",
        "--continue",
        "-c",
        "-p",
        "--print",
        "--strict-mcp-config",
        "--bare",
        "--no-session-persistence",
        "--await-initialize",
        "--dangerously-skip-permissions",
        "--allow-dangerously-skip-permissions",
    }
)


def _err(message: str) -> None:
    """Diagnostics go to stderr only (stdout carries protocol)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"demo-agent: {message}\n")
        sys.stderr.flush()


# --------------------------------------------------------------------------- options


@dataclass
class Options:
    model: str = "demo"
    resume: str | None = None
    session_id: str | None = None
    fork_session: bool = False
    resume_at: str | None = None  # --resume-session-at: the chain entry the history ends at
    persist: bool = True
    permission_mode: str = "default"
    system_prompt: str | None = None
    allowed_tools: list[str] = field(default_factory=list)
    disallowed_tools: list[str] = field(default_factory=list)
    replay_user_messages: bool = False
    flags: dict[str, str | None] = field(default_factory=dict)


def _tool_rules(value: str) -> list[str]:
    """``"Read,Bash(git *) Edit"`` -> ``["Read", "Bash(git *)", "Edit"]``."""
    return [m.group(0) for m in re.finditer(r"[^\s,()]+(?:\([^)]*\))?", value)]


def _flag_values(argv: list[str]) -> dict[str, str | None]:
    """The known flags of ``argv`` and their values (None: a flag without one)."""
    values: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg.startswith("-") and "=" in arg:
            name, _, value = arg.partition("=")
            if name not in _VALUE_FLAGS | _OPTIONAL_VALUE_FLAGS | _BOOL_FLAGS:
                _err(f"ignoring unknown flag {name!r}")
                continue
            values[name] = value
        elif arg in _VALUE_FLAGS:
            if i < len(argv):
                values[arg] = argv[i]
                i += 1
            else:
                _err(f"flag {arg} needs a value; ignored")
        elif arg in _OPTIONAL_VALUE_FLAGS:
            takes = i < len(argv) and not argv[i].startswith("-")
            values[arg] = argv[i] if takes else None
            i += int(takes)
        elif arg in _BOOL_FLAGS:
            values[arg] = None
        elif arg.startswith("-") and arg != "-":
            _err(f"ignoring unknown flag {arg!r}")
        else:
            _err(f"ignoring positional argument {arg[:80]!r}")
    return values


def parse_args(argv: list[str]) -> Options:
    """Parse the Claude-Code-like command line; never fails, unknown things are ignored."""
    opts = Options()
    values = opts.flags = _flag_values(argv)
    if values.get("--model"):
        opts.model = str(values["--model"])
    resume_given = "--resume" in values or "-r" in values
    resume = values.get("--resume") or values.get("-r")
    if resume_given and not resume:
        _err("--resume without a session id: starting a fresh session")
    opts.resume = resume or None
    opts.session_id = values.get("--session-id") or None
    opts.fork_session = "--fork-session" in values
    opts.resume_at = values.get("--resume-session-at")
    opts.persist = "--no-session-persistence" not in values
    if values.get("--permission-mode"):
        opts.permission_mode = str(values["--permission-mode"])
    opts.system_prompt = values.get("--system-prompt")
    for flag in ("--allowedTools", "--allowed-tools"):
        opts.allowed_tools += _tool_rules(values.get(flag) or "")
    for flag in ("--disallowedTools", "--disallowed-tools"):
        opts.disallowed_tools += _tool_rules(values.get(flag) or "")
    opts.replay_user_messages = "--replay-user-messages" in values
    for flag, expected in (("--output-format", "stream-json"), ("--input-format", "stream-json")):
        if values.get(flag) not in (None, expected):
            _err(f"{flag} {values.get(flag)!r} is not supported; speaking stream-json anyway")
    return opts


# --------------------------------------------------------------------------- history


def valid_session_id(value: str) -> bool:
    return SESSION_ID_RE.fullmatch(value) is not None


def state_dir() -> str:
    configured = os.environ.get("DEMO_AGENT_STATE_DIR")
    if configured:
        return os.path.abspath(configured)
    home = os.environ.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".local", "share", "agent-bridge", "demo-agent")


def history_path(session_id: str) -> str:
    if not valid_session_id(session_id):  # defence in depth: never build a path from junk
        raise ValueError(f"invalid session id {session_id!r}")
    return os.path.join(state_dir(), f"{session_id}.json")


def load_history(session_id: str) -> list[Json]:
    path = history_path(session_id)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_HISTORY_FILE_BYTES + 1)
    except FileNotFoundError:
        _err(f"no saved history for session {session_id}; starting it empty")
        return []
    except OSError as exc:
        _err(f"cannot read history {path}: {exc}")
        return []
    if len(raw) > MAX_HISTORY_FILE_BYTES:
        _err(f"history file {path} is too large; ignoring it")
        return []
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        _err(f"history file {path} is corrupt ({exc}); ignoring it")
        return []
    items = data.get("history") if isinstance(data, dict) else None
    if not isinstance(items, list):
        _err(f"history file {path} has no history list; ignoring it")
        return []
    return [
        {
            "prompt": it["prompt"],
            "reply": it.get("reply") if isinstance(it.get("reply"), str) else "",
            **({"interrupted": True} if it.get("interrupted") else {}),
            **({"entries": _entries(it["entries"])} if isinstance(it.get("entries"), list) else {}),
        }
        for it in items
        if isinstance(it, dict) and isinstance(it.get("prompt"), str)
    ]


def _entries(value: list[Any]) -> list[str]:
    """A turn's chain entries as a saved history holds them: uuids, the last few."""
    return [u for u in value if isinstance(u, str) and len(u) <= 64][-MAX_ENTRIES:]


def save_history(session_id: str, history: list[Json]) -> None:
    """Atomically write the history file (temp file in the same dir + os.replace)."""
    path = history_path(session_id)
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    payload = {
        "version": 1,
        "session_id": session_id,
        "updated_at": _now_iso(),
        "history": history[-MAX_HISTORY:],
    }
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{session_id}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, ensure_ascii=False, indent=1)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --------------------------------------------------------------------------- helpers


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _uuid() -> str:
    return str(uuid.uuid4())


def _hex(n: int = 12) -> str:
    return uuid.uuid4().hex[:n]


def _tokens(text: str) -> int:
    return max(1, len(text.split()))


def chunk_text(text: str) -> list[str]:
    """Split into deltas of one or two words each (whitespace kept, so they re-join)."""
    words = re.findall(r"\s*\S+\s*", text)
    chunks: list[str] = []
    i = 0
    size = 1
    while i < len(words):
        chunks.append("".join(words[i : i + size]))
        i += size
        size = 3 - size  # alternate 1, 2, 1, 2, ...
    return chunks or [text]


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def prompt_text(content: Any) -> tuple[str, int]:
    """Text of a user message's content, plus the number of non-text attachments."""
    if isinstance(content, str):
        return content, 0
    parts: list[str] = []
    attachments = 0
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
            else:
                attachments += 1
    return "\n".join(parts), attachments


def _as_dict(value: Any) -> Json:
    return value if isinstance(value, dict) else {}


def _usage(input_tokens: int, output_tokens: int) -> Json:
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": output_tokens,
        "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
        "service_tier": "standard",
    }


# --------------------------------------------------------------------------- tools


def list_files(cwd: str) -> tuple[str, Json, list[str], int]:
    """Return (tool_result text, tool_use_result, shown entries, total entries)."""
    names: list[str] = []
    with os.scandir(cwd) as it:
        for entry in it:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            names.append(entry.name + ("/" if is_dir else ""))
    names.sort()
    shown = names[:MAX_LIST_ENTRIES]
    structured: Json = {
        "path": cwd,
        "filenames": shown,
        "numFiles": len(names),
        "truncated": len(names) > len(shown),
    }
    return "\n".join(shown), structured, shown, len(names)


class ToolError(Exception):
    pass


def read_file(cwd: str, name: str) -> tuple[str, Json]:
    """Read a text file inside cwd; raise ToolError otherwise."""
    target = inside(cwd, name, verb="read")
    if not os.path.exists(target):
        raise ToolError(f"File does not exist: {name}")
    if not os.path.isfile(target):
        raise ToolError(f"Not a regular file: {name}")
    try:
        with open(target, "rb") as fh:
            data = fh.read(MAX_READ_BYTES + 1)
    except OSError as exc:
        raise ToolError(f"Cannot read {name}: {exc.strerror or exc}") from exc
    if b"\0" in data[:8192]:
        raise ToolError(f"{name} looks like a binary file; I only read text.")
    truncated = len(data) > MAX_READ_BYTES
    text = data[:MAX_READ_BYTES].decode("utf-8", errors="replace")
    lines = text.splitlines()
    structured: Json = {
        "type": "text",
        "file": {
            "filePath": target,
            "content": text,
            "numLines": len(lines),
            "startLine": 1,
            "totalLines": len(lines),
            "truncated": truncated,
        },
    }
    if truncated:
        text += f"\n[… truncated after {MAX_READ_BYTES} bytes]"
    return text, structured


def inside(cwd: str, name: str, verb: str = "touch") -> str:
    """The real path of ``name`` (relative to cwd), which must lie inside cwd; else ToolError
    ("Refusing to <verb> …")."""
    root = os.path.realpath(cwd)
    target = os.path.realpath(os.path.join(root, os.path.expanduser(name)))
    if os.path.commonpath([root, target]) != root:
        where = f" ({root})" if verb == "read" else ""
        raise ToolError(f"Refusing to {verb} {name}: it is outside the working directory{where}.")
    return target


def _read_text(path: str, name: str) -> str:
    if not os.path.isfile(path):
        raise ToolError(f"File does not exist: {name}")
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_READ_BYTES + 1)
    except OSError as exc:
        raise ToolError(f"Cannot read {name}: {exc.strerror or exc}") from exc
    if len(data) > MAX_READ_BYTES or b"\0" in data:
        raise ToolError(f"{name} is too large or not text; I only edit small text files.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(f"{name} is not UTF-8 text.") from exc


_COMMENT = {".py": "#", ".sh": "#", ".toml": "#", ".yaml": "#", ".yml": "#", ".txt": "#", ".js": "//", ".ts": "//"}


def choose_edit(text: str, name: str) -> tuple[str, str]:
    """The demo's one edit of a file, as (old_string, new_string): the first "Hello"
    becomes "Hi there"; else a comment goes on top. The old string holds the line before
    the change too, so the diff has some context; it occurs once in the file."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if "Hello" in line:
            old = "".join(lines[max(0, i - 1) : i + 1])
            if text.count(old) == 1:
                return old, old.replace("Hello", "Hi there", 1)
    first = next((ln for ln in lines if ln.strip() and text.count(ln) == 1), None)
    if first is None:
        raise ToolError(f"I found nothing in {name} I could edit safely.")
    ext = os.path.splitext(name)[1].lower()
    note = "Edited by the agent-bridge demo agent."
    comment = f"<!-- {note} -->" if ext in (".md", ".html") else f"{_COMMENT.get(ext, '#')} {note}"
    return first, f"{comment}\n{first}"


def plan_edit(cwd: str, name: str) -> Json:
    """The Edit tool's input for ``edit <name>``: absolute path, old and new strings."""
    path = inside(cwd, name)
    old, new = choose_edit(_read_text(path, name), name)
    return {"file_path": path, "old_string": old, "new_string": new, "replace_all": False}


def structured_patch(before: str, after: str) -> list[Json]:
    """Hunks in the shape Claude Code reports an edit with (``structuredPatch``)."""
    a, b = before.splitlines(), after.splitlines()
    hunks: list[Json] = []
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(3):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        lines: list[str] = []
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                lines += [" " + ln for ln in a[a1:a2]]
                continue
            lines += ["-" + ln for ln in a[a1:a2]]
            lines += ["+" + ln for ln in b[b1:b2]]
        hunks.append({"oldStart": i1 + 1, "oldLines": i2 - i1, "newStart": j1 + 1, "newLines": j2 - j1, "lines": lines})
    return hunks


def apply_edit(cwd: str, spec: Json) -> tuple[str, Json]:
    """Apply an Edit input (checked again: the host may have changed it when it allowed
    it); return (tool_result text, tool_use_result). Raise ToolError when it cannot."""
    name, old, new = spec.get("file_path"), spec.get("old_string"), spec.get("new_string")
    if not (isinstance(name, str) and isinstance(old, str) and isinstance(new, str) and old):
        raise ToolError("The edit needs a file_path, a non-empty old_string and a new_string.")
    path = inside(cwd, name)
    before = _read_text(path, name)
    if before.count(old) != 1:
        raise ToolError(f"The text to replace must occur exactly once in {os.path.basename(path)}.")
    after = before.replace(old, new, 1)
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".demo-edit.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(after)
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ToolError(f"Cannot write {name}: {exc.strerror or exc}") from exc
    start = before[: before.index(old)].count("\n")
    shown = after.splitlines()[max(0, start - 2) : start + new.count("\n") + 3]
    snippet = "\n".join(f"{n:6}\t{ln}" for n, ln in enumerate(shown, max(0, start - 2) + 1))
    content = f"The file {path} has been updated. The edited part now reads:\n{snippet}"
    result: Json = {
        "filePath": path,
        "oldString": old,
        "newString": new,
        "originalFile": before,
        "structuredPatch": structured_patch(before, after),
        "userModified": False,
        "replaceAll": False,
    }
    return content, result


# --------------------------------------------------------------------------- shell

SHELL_HELP = "ls, wc -l [files], git status, git log, date, python3 --version"
_LS_FLAGS = frozenset({"-l", "-a", "-la", "-al", "-1"})


def _wc_files(cwd: str, names: list[str]) -> list[str]:
    if not names:
        with os.scandir(cwd) as it:
            names = sorted(e.name for e in it if e.is_file() and not e.name.startswith("."))[:20]
    for name in names:
        if name.startswith("-") or not os.path.isfile(inside(cwd, name)):
            raise ToolError(f"wc -l takes names of files in the working directory; {name!r} is not one.")
    return names


def shell_command(cwd: str, text: str) -> tuple[str, list[str]] | None:
    """``run <command>``: the command as shown and the argv that runs it, for a small
    fixed set of read-only commands; None for anything else. Never a shell: the demo
    agent must not run what a user types. ToolError for a known command given bad names."""
    words = text.split()
    if not words:
        words = ["ls", "-l"]
    head, rest = words[0], words[1:]
    if head == "ls" and all(w in _LS_FLAGS for w in rest):
        argv = ["ls", *(rest or ["-l"])]
    elif head == "wc" and rest[:1] == ["-l"]:
        argv = ["wc", "-l", *_wc_files(cwd, rest[1:])]
    elif words in (["git", "status"], ["git", "log"]):
        argv = ["git", "--no-pager", "log", "--oneline", "-5"] if rest == ["log"] else ["git", "status"]
    elif words == ["date"]:
        argv = ["date", "-u"]
    elif head in ("python3", "python") and rest == ["--version"]:
        return f"{head} --version", [sys.executable, "--version"]
    else:
        return None
    return " ".join(argv).replace("git --no-pager ", "git "), argv


def run_shell(cwd: str, argv: list[str]) -> tuple[int, str, str]:
    """Run a command of :func:`shell_command` in cwd: (exit code, stdout, stderr), as a
    shell would report them (127: not found)."""
    env = {
        "PATH": os.environ.get("PATH") or "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": os.environ.get("HOME", cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
    }
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=SHELL_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: timed out after {SHELL_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return 126, "", f"{argv[0]}: {exc.strerror or exc}"
    out = done.stdout.decode("utf-8", "replace")[:MAX_SHELL_OUTPUT].rstrip("\n")
    err = done.stderr.decode("utf-8", "replace")[:MAX_SHELL_OUTPUT].rstrip("\n")
    return done.returncode, out, err


def shell_result(code: int, out: str, err: str) -> tuple[str, bool, Json]:
    """(tool_result text, is_error, tool_use_result) as Claude Code's Bash tool gives
    them: the output, or "Exit code N" and the output when the command failed."""
    both = "\n".join(x for x in (out, err) if x)
    structured: Json = {"stdout": out, "stderr": err, "interrupted": False, "isImage": False, "noOutputExpected": False}
    if code != 0:
        return f"Exit code {code}\n{both}".rstrip("\n"), True, structured
    return both or "(Bash completed with no output)", False, structured


# --------------------------------------------------------------------------- replies

_HISTORY_RE = re.compile(r"what did i (?:just )?(?:say|ask|write|tell)|\bhistory\b|\bremember")
_READ_RE = re.compile(r"\b(?:read|cat)\s+(?:the\s+)?(?:file\s+)?([^\s\"'`]+)", re.IGNORECASE)
_LIST_RE = re.compile(r"list\s+(?:the\s+)?files|\bls\b|\bfiles\b|\bdir\b")
_NOT_A_FILE = frozenset(
    {
        "me",
        "it",
        "this",
        "that",
        "a",
        "an",
        "my",
        "your",
        "files",
        "file",
        "about",
        "more",
        "up",
        "on",
        "out",
        "back",
        "carefully",
    }
)
_GREETING_RE = re.compile(r"^\s*(?:hi|hello|hey|hallo|howdy|good (?:morning|afternoon|evening))\b")

TRY_HINT = (
    'Try: "tour" to see everything at once, "list files" to watch me use a tool, "read <file>", '
    '"edit <file>" (I ask first), "run ls", "task" for a sub-agent, "code", "think", '
    '"what did I say?" to see that I remember this conversation, or "slow" for a long reply '
    "you can interrupt."
)

SHORT_HINT = 'Try "tour", "list files", "read <file>", "edit <file>", "run ls", "task", "code", "think" or "slow".'

# First words that name a command (the rest of the prompt is its argument).
COMMANDS = {
    "tour": "tour",
    "demo": "tour",
    "edit": "edit",
    "run": "run",
    "bash": "run",
    "$": "run",
    "task": "task",
    "agent": "task",
    "agents": "task",
    "subagent": "task",
    "code": "code",
    "think": "think",
    "thinking": "think",
}

CODE_REPLY = (
    "Here is a small function in a fenced code block (the page gives it a Copy button):\n\n"
    "```python\n"
    "def fizzbuzz(n: int) -> str:\n"
    '    """Fizz for multiples of 3, Buzz for 5, both for 15."""\n'
    '    word = ("Fizz" if n % 3 == 0 else "") + ("Buzz" if n % 5 == 0 else "")\n'
    "    return word or str(n)\n"
    "\n\n"
    'print(", ".join(fizzbuzz(n) for n in range(1, 16)))\n'
    "```\n\n"
    "Ask me to `run python3 --version` to see a shell command, or `edit hello.py` for a diff."
)

TOUR_THOUGHT = (
    "A tour: show each kind of output once. An edit (asked for first), a shell command, a sub-agent, then a code block."
)
_LANGUAGES = {
    ".py": "python",
    ".md": "markdown",
    ".js": "javascript",
    ".ts": "typescript",
    ".sh": "sh",
    ".toml": "toml",
}

THINK_TEXT = (
    "The user wants to see a thinking block. A real model reasons here before it answers; "
    "the page folds this into a collapsible \u201cThought\u201d. I'll keep it short and then reply."
)


def read_target(prompt: str) -> str | None:
    m = _READ_RE.search(prompt)
    if m is None:
        return None
    name = m.group(1).strip().rstrip(".,!?;:)").strip("\"'`")
    if not name or name.lower() in _NOT_A_FILE:
        return None
    return name


def default_reply(prompt: str, attachments: int, first: bool) -> str:
    text = prompt.strip()
    lower = text.lower()
    if not text and not attachments:
        said = "You sent an empty message."
    elif not text:
        said = f"You sent {attachments} attachment(s) without text; I can't look at those."
    elif lower.rstrip("!.? ") in ("help", "", "what can you do"):
        said = "Happy to help."
    elif _GREETING_RE.match(lower):
        said = f"Hello to you too! You said: “{_short(text, 160)}”."
    elif text.endswith("?"):
        said = f"You asked: “{_short(text, 160)}”. Good question, but I'm only a demo and can't really answer it."
    else:
        said = f"You said: “{_short(text, 160)}”."
    if attachments and text:
        said += f" (Plus {attachments} attachment(s) I can't look at.)"
    if first:
        return (
            "I'm the agent-bridge demo agent: a tiny offline stand-in for a real coding "
            f"agent (no API key, no network). {said} {TRY_HINT}"
        )
    return f"{said} {SHORT_HINT}"


def history_reply(history: list[Json], session_id: str) -> str:
    prompts = [h["prompt"] for h in history]
    if not prompts:
        return (
            f"This is the start of session {session_id}: you haven't said anything before "
            "this. Say something, then ask me again — I'll remember, even after a restart "
            "with --resume."
        )
    shown = prompts[-20:]
    lines = [f"{len(prompts) - len(shown) + n}. “{_short(p)}”" for n, p in enumerate(shown, 1)]
    noun = "message" if len(prompts) == 1 else "messages"
    return f"In this session ({session_id}) you have said {len(prompts)} {noun} before this one:\n" + "\n".join(lines)


def slow_chunks() -> list[str]:
    intro = chunk_text("This is a deliberately slow reply, so you can try interrupting me. Counting to 100: ")
    count = [f"{n}{'.' if n == SLOW_CHUNKS else ','} " for n in range(1, SLOW_CHUNKS + 1)]
    return intro + count + ["Done — nobody interrupted me!"]


# --------------------------------------------------------------------------- the agent


class OutputClosed(Exception):
    """stdout is gone: the host went away."""


class Writer:
    """Compact JSON lines on stdout, one write + flush per line, serialised by a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._out = sys.stdout.buffer

    def __call__(self, obj: Json) -> None:
        data = (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        with self._lock:
            try:
                self._out.write(data)
                self._out.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise OutputClosed(str(exc)) from exc


def stdin_reader(q: queue.Queue[Json | None]) -> None:
    """Read NDJSON from fd 0 until EOF; put parsed objects (then None) on the queue.

    Uses os.read on the raw fd so no buffered-reader lock is held by this daemon thread.
    """
    buf = b""
    discarding = False
    lineno = 0
    while True:
        try:
            chunk = os.read(0, 65536)
        except InterruptedError:
            continue
        except OSError as exc:
            _err(f"stdin read failed: {exc}")
            chunk = b""
        if not chunk:
            if buf.strip() and not discarding:
                lineno += 1
                _parse_line(buf, lineno, q)
            q.put(None)
            return
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line, buf = buf[:nl], buf[nl + 1 :]
            lineno += 1
            if discarding:
                discarding = False
                continue
            _parse_line(line, lineno, q)
        if len(buf) > MAX_LINE_BYTES:
            _err(f"stdin line {lineno + 1} is longer than {MAX_LINE_BYTES} bytes; ignored")
            buf = b""
            discarding = True


def _parse_line(line: bytes, lineno: int, q: queue.Queue[Json | None]) -> None:
    if not line.strip():
        return
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        _err(f"ignoring malformed stdin line {lineno}: {exc}: {line[:200]!r}")
        return
    if not isinstance(obj, dict):
        _err(f"ignoring stdin line {lineno}: not a JSON object")
        return
    q.put(obj)


@dataclass
class ToolCall:
    name: str
    input: Json
    id: str = field(default_factory=lambda: f"toolu_demo_{_hex(16)}")


class Interrupted(Exception):
    """Raised out of the streaming code when the host sent an interrupt."""

    def __init__(self) -> None:
        super().__init__("interrupted")
        self.partial_text = ""
        self.terminal_reason = "aborted_streaming"


@dataclass
class Block:
    """One content block of a model message: ``thinking``, ``text`` or ``tool_use``."""

    kind: str
    chunks: list[str] = field(default_factory=list)
    tool: ToolCall | None = None


def text(value: str) -> Block:
    return Block("text", chunk_text(value))


def thought(value: str) -> Block:
    return Block("thinking", chunk_text(value))


def tool(call: ToolCall) -> Block:
    return Block("tool_use", tool=call)


@dataclass
class Turn:
    """What one turn has said so far: its replies (for the history and the result), how
    many model messages it took, and the tool uses it was refused."""

    prompt: str
    attachments: int
    first: bool
    previous: list[Json]
    replies: list[str] = field(default_factory=list)
    messages: int = 0
    denials: list[Json] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)  # the uuids of its chain's lines


NO_PROMPTS = (
    "this session cannot ask you (the host did not start me with --permission-prompt-tool stdio) "
    'and its permission mode does not allow edits. Create the thread with the option "permission_prompts": '
    'true, or "permission_mode": "acceptEdits"'
)
REJECTED = (
    "The user doesn't want to proceed with this tool use. The tool use was rejected: nothing was changed. "
    "Wait for the user to say how to go on."
)
SUBAGENT_PROMPT = "List the files in the working directory, read {} of the text files, and report their sizes."


class DemoAgent:
    def __init__(self, opts: Options, write: Writer, q: queue.Queue[Json | None]) -> None:
        self.opts = opts
        self.write = write
        self.q = q
        self.cwd = os.getcwd()
        self.model = opts.model
        self.permission_mode = opts.permission_mode
        self.pending: collections.deque[Json] = collections.deque()
        self.eof = False
        self.interrupt_requested = False
        self.in_turn = False
        self.history: list[Json] = []
        self.turns_this_process = 0
        self.asked: set[str] = set()  # our can_use_tool requests awaiting an answer
        self.responses: dict[str, Json] = {}
        self.turn: Turn | None = None
        self.session_id = self._choose_session()

    # ---- session

    def _choose_session(self) -> str:
        opts = self.opts
        if opts.resume is not None:
            if valid_session_id(opts.resume):
                self.history = load_history(opts.resume)
                if opts.resume_at is not None:
                    self.history = self._cut_at(opts.resume_at)
                if opts.fork_session:
                    return _uuid()
                return opts.resume
            _err(
                f"refusing --resume {opts.resume[:80]!r}: a session id must match "
                f"{SESSION_ID_RE.pattern}; starting a fresh session"
            )
        if opts.session_id is not None:
            if valid_session_id(opts.session_id):
                return opts.session_id
            _err(f"refusing --session-id {opts.session_id[:80]!r}; using a fresh id")
        return _uuid()

    def _cut_at(self, entry: str) -> list[Json]:
        """--resume-session-at: the history up to and including the turn that wrote
        ``entry`` (Claude Code keeps its chain up to that entry); an unknown one ends the
        process as Claude Code's print mode does."""
        for i, item in enumerate(self.history):
            if entry in item.get("entries", ()):
                return self.history[: i + 1]
        sys.stderr.write(f"No message found with message.uuid of: {entry}\n")
        sys.exit(1)

    def _save(self) -> None:
        if not self.opts.persist:
            return
        try:
            save_history(self.session_id, self.history)
        except (OSError, ValueError) as exc:
            _err(f"could not save history: {exc}")

    @property
    def tools(self) -> list[str]:
        denied = {r.split("(", 1)[0] for r in self.opts.disallowed_tools}
        return [t for t in ALL_TOOLS if t not in denied]

    # ---- input handling

    def dispatch(self, item: Json | None) -> None:
        if item is None:
            self.eof = True
            return
        mtype = item.get("type")
        if mtype == "user":
            self.pending.append(item)
        elif mtype == "control_request":
            self.handle_control(item)
        elif mtype == "control_response":
            response = _as_dict(item.get("response"))
            rid = response.get("request_id")
            if isinstance(rid, str) and rid in self.asked:  # an answer to a permission prompt
                self.responses[rid] = response
        elif mtype in ("control_cancel_request", "keep_alive"):
            pass  # keep_alive needs no answer
        else:
            _err(f"ignoring stdin message of type {str(mtype)[:40]!r}")

    def handle_control(self, item: Json) -> None:
        rid = item.get("request_id")
        req = _as_dict(item.get("request"))
        sub = req.get("subtype")
        ok: Json = {"subtype": "success", "request_id": rid}
        if sub == "interrupt":
            if self.in_turn:
                self.interrupt_requested = True
            self.write({"type": "control_response", "response": ok})
        elif sub == "initialize":
            ok["response"] = {
                "commands": [],
                "agents": [],
                "output_style": "default",
                "available_output_styles": ["default"],
                "models": [
                    {
                        "value": self.model,
                        "displayName": f"{self.model} (demo)",
                        "description": "Offline demo agent; no API key needed",
                    }
                ],
                "account": {"tokenSource": "none", "apiKeySource": "none"},
                "pid": os.getpid(),
            }
            self.write({"type": "control_response", "response": ok})
        elif sub == "set_model":
            model = req.get("model")
            self.model = model if isinstance(model, str) and model not in ("", "default") else (self.opts.model)
            self.write({"type": "control_response", "response": ok})
        elif sub == "set_permission_mode" and isinstance(req.get("mode"), str):
            self.permission_mode = req["mode"]
            ok["response"] = {"mode": self.permission_mode}
            self.write({"type": "control_response", "response": ok})
        else:
            self.write(
                {
                    "type": "control_response",
                    "response": {
                        "subtype": "error",
                        "request_id": rid,
                        "error": f"Unsupported control request subtype: {sub}",
                    },
                }
            )

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds` while handling stdin; raise Interrupted on an interrupt.

        After EOF on stdin the remaining turn is finished without any delay.
        """
        deadline = time.monotonic() + seconds
        while not self.interrupt_requested:
            remaining = 0.0 if self.eof else deadline - time.monotonic()
            try:
                item = self.q.get(timeout=remaining) if remaining > 0 else self.q.get_nowait()
            except queue.Empty:
                break
            self.dispatch(item)
        if self.interrupt_requested:
            raise Interrupted()

    # ---- main loop

    def run(self) -> int:
        while True:
            if self.pending:
                self.run_turn(self.pending.popleft())
                continue
            if self.eof:
                break
            self.dispatch(self.q.get())
        self._save()
        return 0

    # ---- output helpers

    def _env(self, obj: Json) -> Json:
        """Add the envelope fields: parent_tool_use_id (not on system/result), session_id, uuid."""
        if obj["type"] not in ("system", "result"):
            obj.setdefault("parent_tool_use_id", None)
        obj["session_id"] = self.session_id
        obj["uuid"] = _uuid()
        if obj["type"] in ("assistant", "user") and self.turn is not None:
            # An entry of the session's chain: what --resume-session-at may name.
            self.turn.entries.append(obj["uuid"])
        return obj

    def _stream(self, event: Json, **extra: Any) -> None:
        self.write(self._env({"type": "stream_event", "event": event, **extra}))

    def _assistant(
        self, msg_id: str, request_id: str, block: Json, aborted: bool = False, parent: str | None = None
    ) -> None:
        line = self._env(
            {
                "type": "assistant",
                "message": {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": [block],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 50,
                        "output_tokens": 1,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 0,
                    },
                    "context_management": None,
                },
                "parent_tool_use_id": parent,
            }
        )
        line["request_id"] = request_id
        if aborted:
            line["aborted"] = True
        self.write(line)

    def _user(self, content: list[Json], **extra: Any) -> None:
        self.write(
            self._env(
                {"type": "user", "message": {"role": "user", "content": content}, "timestamp": _now_iso(), **extra}
            )
        )

    def _system(self, subtype: str, **fields: Any) -> None:
        self.write(self._env({"type": "system", "subtype": subtype, **fields}))

    def _init(self) -> None:
        self.write(
            self._env(
                {
                    "type": "system",
                    "subtype": "init",
                    "cwd": self.cwd,
                    "session_id": self.session_id,
                    "tools": self.tools,
                    "mcp_servers": [],
                    "model": self.model,
                    "permissionMode": self.permission_mode,
                    "slash_commands": [],
                    "apiKeySource": "none",
                    "demo_agent_version": DEMO_AGENT_VERSION,
                    "output_style": "default",
                    "agents": ["general-purpose"],
                    "skills": [],
                    "plugins": [],
                    "analytics_disabled": True,
                    "product_feedback_disabled": True,
                    "fast_mode_state": "off",
                }
            )
        )

    def stream_message(self, chunks: list[str], delay: float, tool: ToolCall | None = None) -> str:
        """One model message: a streamed text block, optionally followed by a tool_use block."""
        blocks = [Block("text", chunks)] + ([Block("tool_use", tool=tool)] if tool is not None else [])
        return self.message(blocks, delay)

    def message(self, blocks: list[Block], delay: float = CHUNK_DELAY_S) -> str:
        """One model message, block by block, as Claude Code prints it: the stream events,
        and one complete assistant line per block. Returns its text.

        Raises Interrupted (after flushing the partial block as an aborted assistant line).
        """
        ids = (f"msg_demo_{_hex(16)}", f"req_demo_{_hex(12)}")
        self._system("status", status="requesting")
        self._stream(
            {
                "type": "message_start",
                "message": {
                    "id": ids[0],
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 50,
                        "output_tokens": 1,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 0,
                    },
                },
            },
            ttft_ms=int(delay * 1000),
        )
        said = ""
        for index, block in enumerate(blocks):
            if block.tool is not None:
                self._stream_tool(index, block.tool, ids)
            else:
                said += self._stream_block(index, block, delay, ids, said)
        has_tool = any(b.tool is not None for b in blocks)
        self._stream(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use" if has_tool else "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": _tokens(said)},
            }
        )
        self._stream({"type": "message_stop"})
        return said

    def _stream_block(self, index: int, block: Block, delay: float, ids: tuple[str, str], before: str) -> str:
        """A text or thinking block: its deltas, then the complete block. Returns its text
        (a thought says nothing)."""
        thinking = block.kind == "thinking"
        key = "thinking" if thinking else "text"
        start: Json = (
            {"type": "thinking", "thinking": "", "signature": ""} if thinking else {"type": "text", "text": ""}
        )
        self._stream({"type": "content_block_start", "index": index, "content_block": start})
        done = ""
        try:
            for chunk in block.chunks:
                self.wait(delay)
                delta = {"type": f"{key}_delta", key: chunk}
                self._stream({"type": "content_block_delta", "index": index, "delta": delta})
                done += chunk
        except Interrupted as exc:
            if done:
                self._assistant(*ids, {"type": block.kind, key: done}, aborted=True)
            exc.partial_text = before if thinking else before + done
            raise
        full: Json = {"type": "text", "text": done}
        if thinking:
            # The real API signs a thought; the host only passes the signature along.
            signature = _hex(32)
            self._stream(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": signature},
                }
            )
            full = {"type": "thinking", "thinking": done, "signature": signature}
        self._assistant(*ids, full)
        self._stream({"type": "content_block_stop", "index": index})
        return "" if thinking else done

    def _stream_tool(self, index: int, call: ToolCall, ids: tuple[str, str]) -> None:
        start = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        self._stream({"type": "content_block_start", "index": index, "content_block": start})
        delta = {"type": "input_json_delta", "partial_json": json.dumps(call.input, ensure_ascii=False)}
        self._stream({"type": "content_block_delta", "index": index, "delta": delta})
        self._assistant(*ids, {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input})
        self._stream({"type": "content_block_stop", "index": index})

    def _result(self, *, started: float, turn: Turn, error: str | None = None) -> None:
        replies = turn.replies
        num_turns = max(turn.messages, 1)
        out_tokens = sum(_tokens(r) for r in replies)
        in_tokens = 50 * num_turns + _tokens(turn.prompt)
        duration = int((time.monotonic() - started) * 1000)
        line: Json = {
            "type": "result",
            "subtype": "error_during_execution" if error else "success",
            "is_error": bool(error),
            "api_error_status": None,
            "duration_ms": duration,
            "duration_api_ms": duration,
            "num_turns": num_turns,
        }
        if not error:
            line["result"] = replies[-1] if replies else ""
        line.update(
            {
                "stop_reason": None if error else "end_turn",
                "session_id": self.session_id,
                "total_cost_usd": 0,
                "usage": _usage(in_tokens, out_tokens),
                "modelUsage": {
                    self.model: {
                        "inputTokens": in_tokens,
                        "outputTokens": out_tokens,
                        "cacheReadInputTokens": 0,
                        "cacheCreationInputTokens": 0,
                        "webSearchRequests": 0,
                        "costUSD": 0,
                        "contextWindow": 200000,
                        "maxOutputTokens": 32000,
                    }
                },
                "permission_denials": turn.denials,
                "terminal_reason": error or "completed",
                "fast_mode_state": "off",
            }
        )
        if error:
            line["errors"] = [INTERRUPT_MARKER]
        self.write(self._env(line))

    # ---- a turn

    @staticmethod
    def plan(prompt: str) -> tuple[str, str | None]:
        words = prompt.strip().split(None, 1)
        first = words[0].lower().rstrip(":!.?,") if words else ""
        if first in COMMANDS:
            return COMMANDS[first], words[1].strip() if len(words) > 1 else ""
        lower = prompt.lower()
        if "slow" in lower:
            return "slow", None
        if _HISTORY_RE.search(lower):
            return "history", None
        name = read_target(prompt)
        if name is not None:
            return "read", name
        if _LIST_RE.search(lower):
            return "list", None
        return "chat", None

    def say(self, *blocks: Block, delay: float = CHUNK_DELAY_S) -> str:
        """One model message of this turn (see :meth:`message`)."""
        assert self.turn is not None
        self.turn.messages += 1
        said = self.message(list(blocks), delay)
        if said:
            self.turn.replies.append(said)
        return said

    def run_turn(self, msg: Json) -> None:
        message = _as_dict(msg.get("message"))
        prompt, attachments = prompt_text(message.get("content"))
        if msg.get("shouldQuery") is False:  # context only, no turn
            self.history.append({"prompt": prompt, "reply": ""})
            self._save()
            return
        started = time.monotonic()
        self.in_turn = True
        self.interrupt_requested = False
        turn = self.turn = Turn(
            prompt, attachments, not self.history and self.turns_this_process == 0, list(self.history)
        )
        interrupted = False
        try:
            self._init()
            if self.opts.replay_user_messages:  # --replay-user-messages: echo, keep uuid
                replay = self._env({"type": "user", "message": message, "timestamp": _now_iso(), "isReplay": True})
                if isinstance(msg.get("uuid"), str):
                    replay["uuid"] = msg["uuid"]
                self.write(replay)
            kind, arg = self.plan(prompt)
            getattr(self, f"do_{kind}")(arg)
            self._result(started=started, turn=turn)
        except Interrupted as exc:
            interrupted = True
            if exc.terminal_reason == "aborted_streaming":
                self._user([{"type": "text", "text": INTERRUPT_MARKER}])
            if exc.partial_text:
                turn.replies.append(exc.partial_text)
            self._result(started=started, turn=turn, error=exc.terminal_reason)
        finally:
            self.in_turn = False
            self.interrupt_requested = False
            self.turns_this_process += 1
            entry: Json = {"prompt": prompt, "reply": "\n\n".join(turn.replies)}
            if turn.entries:
                entry["entries"] = turn.entries[-MAX_ENTRIES:]
            if interrupted:
                entry["interrupted"] = True
            self.history.append(entry)
            self._save()

    # ---- the commands (plan() names them; each says what it says through say())

    def do_chat(self, _arg: str | None) -> None:
        assert self.turn is not None
        self.say(text(default_reply(self.turn.prompt, self.turn.attachments, self.turn.first)))

    def do_slow(self, _arg: str | None) -> None:
        self.say(Block("text", slow_chunks()), delay=SLOW_CHUNK_DELAY_S)

    def do_history(self, _arg: str | None) -> None:
        assert self.turn is not None
        self.say(text(history_reply(self.turn.previous, self.session_id)))

    def do_code(self, _arg: str | None) -> None:
        self.say(text(CODE_REPLY))

    def do_think(self, _arg: str | None) -> None:
        self.say(
            thought(THINK_TEXT),
            text(
                "That grey, folded block above my answer is a thinking block: what the model "
                "reasoned before it replied. Click it to read it."
            ),
        )

    def usable(self, name: str) -> bool:
        """Whether the tool is allowed; if not, say so (a whole reply)."""
        if name in self.tools:
            return True
        self.say(
            text(
                f"I'd use my {name} tool for that, but it is disallowed for this session "
                "(--disallowedTools), so I won't."
            )
        )
        return False

    def do_list(self, _arg: str | None) -> None:
        if self.usable(TOOL_LIST):
            call = ToolCall(TOOL_LIST, {"path": "."})
            self.say(text("Sure — let me list the files in the working directory."), tool(call))
            self.say(text(self.list_step(call)))

    def do_read(self, arg: str | None) -> None:
        if self.usable(TOOL_READ):
            call = ToolCall(TOOL_READ, {"path": str(arg)})
            self.say(text(f"Sure — let me read {arg}."), tool(call))
            self.say(text(self.read_step(call, str(arg))))

    def do_edit(self, arg: str | None) -> None:
        name = arg or "hello.py"
        if not self.usable(TOOL_EDIT):
            return
        try:
            call = ToolCall(TOOL_EDIT, plan_edit(self.cwd, name))
        except ToolError as exc:
            self.say(text(f"I can't edit {name}: {exc}"))
            return
        self.say(
            thought(f"A small, safe edit to {name}: change one line, so the diff is easy to read."),
            text(f"I'll make a small edit to {name}. I ask before I change a file."),
            tool(call),
        )
        self.say(text(self.edit_step(call)))

    def do_run(self, arg: str | None) -> None:
        if not self.usable(TOOL_BASH):
            return
        try:
            planned = shell_command(self.cwd, arg or "")
        except ToolError as exc:
            self.say(text(f"I won't run that: {exc}"))
            return
        if planned is None:
            self.say(
                text(
                    f"I only run a few fixed, read-only commands: {SHELL_HELP}. A demo agent "
                    "must not run whatever it is sent, so nothing else."
                )
            )
            return
        call = ToolCall(TOOL_BASH, {"command": planned[0], "description": f"Run {planned[0]}"})
        self.say(text(f"Running `{planned[0]}` in the working directory."), tool(call))
        self.say(text(self.bash_step(call, planned[1])))

    def do_task(self, arg: str | None) -> None:
        if not self.usable(TOOL_TASK):
            return
        call = self.task_call(arg)
        self.say(
            thought("This is a job for a sub-agent: it can look at the files while I wait for its report."),
            text("I'll hand this to a sub-agent; follow it in the Tasks panel."),
            tool(call),
        )
        self.say(text(f"The sub-agent reports: {self.subagent(call)}"))

    def do_tour(self, _arg: str | None) -> None:
        """Every kind of output the page shows, in one turn, kept short enough for one
        screen: a thought, an edit that asks first (a diff), a shell command (its exit
        status), a sub-agent (the Tasks panel), and a fenced code block."""
        welcome = "Welcome to the tour: one turn that shows each thing the page can draw."
        edit = self.tour_edit_call()
        if edit is None:
            self.say(thought(TOUR_THOUGHT), text(f"{welcome} (There is no text file here I could edit.)"))
            lead = ""
        else:
            name = os.path.basename(str(edit.input["file_path"]))
            self.say(
                thought(TOUR_THOUGHT),
                text(f"{welcome} First, an edit of {name}; I ask before I change it."),
                tool(edit),
            )
            lead = self.edit_step(edit)
        planned = shell_command(self.cwd, "wc -l") if TOOL_BASH in self.tools else None
        if planned is not None:
            call = ToolCall(TOOL_BASH, {"command": planned[0], "description": "Count the lines of each file"})
            self.say(text(f"{lead} Next, a shell command:"), tool(call))
            lead = self.bash_step(call, planned[1])
        if TOOL_TASK in self.tools:
            call = self.task_call(None, reads=1)
            self.say(text(f"{lead} Now a sub-agent; the Tasks panel follows it."), tool(call))
            lead = f"The sub-agent reports: {self.subagent(call, reads=1)}"
        self.say(text(f"{lead}\n\nLast, a fenced code block{self.tour_code(edit)}"))

    def tour_edit_call(self) -> ToolCall | None:
        """The tour's edit: of hello.py, or of the first text file there is."""
        if TOOL_EDIT not in self.tools:
            return None
        for name in ["hello.py", *_text_files(self.cwd)]:
            with contextlib.suppress(ToolError):
                return ToolCall(TOOL_EDIT, plan_edit(self.cwd, name))
        return None

    def tour_code(self, edit: ToolCall | None) -> str:
        """The end of the tour's last sentence: the edited file's first lines, fenced."""
        if edit is None:
            return f". {CODE_REPLY}"
        path = str(edit.input["file_path"])
        try:
            head = _read_text(path, os.path.basename(path)).splitlines()[:6]
        except ToolError:
            return f". {CODE_REPLY}"
        lang = _LANGUAGES.get(os.path.splitext(path)[1].lower(), "text")
        body = "\n".join(head)
        return f": the start of {os.path.basename(path)} as it is now.\n\n```{lang}\n{body}\n```\n\nThat was the tour."

    # ---- tool steps: run the call, write its result, return what to say about it

    def tool_pause(self, call: ToolCall) -> None:
        """The tool "runs"; an interrupt here aborts it as Claude Code does."""
        try:
            self.wait(TOOL_DELAY_S)
        except Interrupted as exc:
            self.tool_result(call, "Interrupted by user", True, None)
            self._user([{"type": "text", "text": INTERRUPT_TOOL_MARKER}])
            exc.terminal_reason = "aborted_tools"
            raise

    def tool_result(
        self, call: ToolCall, content: Any, is_error: bool, structured: Any, parent: str | None = None
    ) -> None:
        block = {"tool_use_id": call.id, "type": "tool_result", "content": content, "is_error": is_error}
        extra: Json = {"parent_tool_use_id": parent}
        if structured is not None:
            extra["tool_use_result"] = structured
        self._user([block], **extra)

    def list_step(self, call: ToolCall, parent: str | None = None) -> str:
        if parent is None:
            self.tool_pause(call)
        try:
            content, structured, shown, total = list_files(self.cwd)
        except OSError as exc:
            content = f"Cannot list the working directory: {exc.strerror or exc}"
            self.tool_result(call, content, True, {"error": content}, parent)
            return f"I couldn't list the working directory: {exc.strerror or exc}."
        self.tool_result(call, content, False, structured, parent)
        if total == 0:
            return "I found no entries: the working directory is empty."
        preview = ", ".join(shown[:5]) + (", …" if total > 5 else "")
        more = f" (showing the first {len(shown)})" if total > len(shown) else ""
        noun = "entry" if total == 1 else "entries"
        found = f"I found {total} {noun} in the working directory{more}: {preview}."
        return found + ' Ask me to "read <file>" to look inside one.'

    def read_step(self, call: ToolCall, name: str, parent: str | None = None) -> str:
        if parent is None:
            self.tool_pause(call)
        try:
            content, structured = read_file(self.cwd, name)
        except ToolError as exc:
            self.tool_result(call, str(exc), True, {"error": str(exc)}, parent)
            return f"I couldn't do that. {exc}"
        self.tool_result(call, content, False, structured, parent)
        lines = structured["file"]["numLines"]
        first_line = next((ln for ln in content.splitlines() if ln.strip()), "")
        summary = f"{name} has {lines} line{'s' if lines != 1 else ''}."
        return summary + (f" It starts with: “{_short(first_line, 80)}”" if first_line else "")

    def edit_step(self, call: ToolCall) -> str:
        name = os.path.basename(str(call.input.get("file_path")))
        allowed, spec, why = self.permission(call)
        if not allowed:
            assert self.turn is not None
            self.turn.denials.append({"tool_name": call.name, "tool_use_id": call.id, "tool_input": call.input})
            self.tool_result(call, why, True, f"Error: {why}")
            return f"I left {name} unchanged: {why}."
        self.tool_pause(call)
        try:
            content, structured = apply_edit(self.cwd, spec)
        except ToolError as exc:
            self.tool_result(call, str(exc), True, f"Error: {exc}")
            return f"The edit failed: {exc}"
        self.tool_result(call, content, False, structured)
        return f"Done: {name} is changed; the card above shows the diff."

    def bash_step(self, call: ToolCall, argv: list[str]) -> str:
        self.tool_pause(call)
        code, out, err = run_shell(self.cwd, argv)
        content, is_error, structured = shell_result(code, out, err)
        self.tool_result(call, content, is_error, structured)
        lines = len((out + "\n" + err).strip().splitlines())
        said = f"`{call.input['command']}` exited with status {code}"
        return said + (f" and printed {lines} line{'s' if lines != 1 else ''}." if lines else " and printed nothing.")

    # ---- permission prompts (docs/api.md §6.4: can_use_tool over stdio)

    def permission(self, call: ToolCall) -> tuple[bool, Json, str]:
        """Whether ``call`` may run: (allowed, its input as allowed, why not)."""
        rules = {r.split("(", 1)[0] for r in self.opts.allowed_tools}
        if self.permission_mode in ("acceptEdits", "bypassPermissions") or call.name in rules:
            return True, call.input, ""
        if self.permission_mode in ("plan", "dontAsk"):
            why = "plan mode does not change files" if self.permission_mode == "plan" else "dontAsk mode never asks"
            return False, call.input, why
        if self.opts.flags.get("--permission-prompt-tool") != "stdio":
            return False, call.input, NO_PROMPTS
        answer = self.ask(call)
        if answer.get("behavior") == "allow":
            updated = answer.get("updatedInput")
            return True, updated if isinstance(updated, dict) else call.input, ""
        message = answer.get("message")
        return False, call.input, message if isinstance(message, str) and message else "you said no"

    def ask(self, call: ToolCall) -> Json:
        """A can_use_tool request, and the host's answer (its ``response``). An interrupt
        withdraws the request (control_cancel_request) and aborts the tool."""
        rid = _uuid()
        self.asked.add(rid)
        path = str(call.input.get("file_path") or self.cwd)
        request = {
            "subtype": "can_use_tool",
            "tool_name": call.name,
            "display_name": call.name,
            "input": call.input,
            "description": f"Edit {os.path.basename(path)}",
            "permission_suggestions": [{"type": "setMode", "mode": "acceptEdits", "destination": "session"}],
            "blocked_path": path,
            "tool_use_id": call.id,
        }
        self.write({"type": "control_request", "request_id": rid, "request": request})
        try:
            while rid not in self.responses:
                if self.interrupt_requested:
                    raise Interrupted()
                if self.eof:
                    return {"behavior": "deny", "message": "nobody answered: the host closed my input"}
                self.dispatch(self.q.get())
        except Interrupted as exc:
            self.write({"type": "control_cancel_request", "request_id": rid})
            self.tool_result(call, REJECTED, True, "User rejected tool use")
            self._user([{"type": "text", "text": INTERRUPT_TOOL_MARKER}])
            exc.terminal_reason = "aborted_tools"
            raise
        finally:
            self.asked.discard(rid)
        response = self.responses.pop(rid)
        if response.get("subtype") != "success":
            return {"behavior": "deny", "message": f"the host could not answer ({response.get('error')})"}
        return _as_dict(response.get("response"))

    # ---- a sub-agent (the Task tool): its lines carry the Task call's id as parent_tool_use_id

    def task_call(self, arg: str | None, reads: int = 3) -> ToolCall:
        prompt = SUBAGENT_PROMPT.format("the first" if reads == 1 else "up to three")
        prompt += f" The user asked: {arg}" if arg else ""
        return ToolCall(
            TOOL_TASK, {"description": "Survey the workspace", "prompt": prompt, "subagent_type": "general-purpose"}
        )

    def subagent(self, call: ToolCall, reads: int = 3) -> str:
        """Run the Task ``call``'s sub-agent: task_* lines for the host's task table, the
        sub-agent's own messages and tool calls, then the Task's result. Returns its report."""
        description, prompt = str(call.input["description"]), str(call.input["prompt"])
        task = {"task_id": _hex(17), "tool_use_id": call.id}
        started = time.monotonic()
        self._system(
            "task_started",
            **task,
            description=description,
            subagent_type="general-purpose",
            task_type="local_agent",
            prompt=prompt,
        )
        self._user(
            [{"type": "text", "text": prompt}],
            parent_tool_use_id=call.id,
            subagent_type="general-purpose",
            task_description=description,
        )
        progress = {"tool_uses": 0}
        try:
            report = self.subagent_steps(call.id, {**task, "description": description}, progress, started, reads)
        except Interrupted as exc:
            self._system("task_notification", **task, status="stopped", output_file="", summary="Interrupted by user")
            self.tool_result(call, "Interrupted by user", True, None)
            self._user([{"type": "text", "text": INTERRUPT_TOOL_MARKER}])
            exc.terminal_reason = "aborted_tools"
            raise
        usage = _task_usage(progress["tool_uses"], report, started)
        self._system(
            "task_updated", task_id=task["task_id"], patch={"status": "completed", "end_time": int(time.time() * 1000)}
        )
        self._system("task_notification", **task, status="completed", output_file="", summary=report, usage=usage)
        content = [{"type": "text", "text": report}]
        structured = {
            "status": "completed",
            "prompt": prompt,
            "content": content,
            "totalDurationMs": usage["duration_ms"],
            "totalTokens": usage["total_tokens"],
            "totalToolUseCount": usage["tool_uses"],
        }
        self.tool_result(call, content, False, structured)
        return report

    def subagent_steps(self, parent: str, task: Json, progress: dict[str, int], started: float, reads: int) -> str:
        """The sub-agent's work: list the files, read up to three; progress after each."""
        self.sub_say(parent, {"type": "text", "text": "I'll list the files, then read a few of them."})
        listing = ToolCall(TOOL_LIST, {"path": "."})
        found = self.sub_tool(parent, task, progress, started, listing, lambda: self.list_step(listing, parent))
        sizes: list[str] = []
        for name in _text_files(self.cwd)[:reads]:
            call = ToolCall(TOOL_READ, {"path": name})
            said = self.sub_tool(
                parent, task, progress, started, call, lambda c=call, n=name: self.read_step(c, n, parent)
            )
            sizes.append(said.split(" It starts with")[0].rstrip("."))
        report = found.split(":")[0] + "." + (f" {'; '.join(sizes)}." if sizes else "")
        self.sub_say(parent, {"type": "text", "text": report})
        return report

    def sub_say(self, parent: str, block: Json) -> None:
        self.wait(SUBAGENT_STEP_S)
        self._assistant(f"msg_demo_{_hex(16)}", f"req_demo_{_hex(12)}", block, parent=parent)

    def sub_tool(
        self, parent: str, task: Json, progress: dict[str, int], started: float, call: ToolCall, run: Any
    ) -> str:
        """One tool call of the sub-agent, its result (``run``), and a task_progress line."""
        self.sub_say(parent, {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input})
        try:
            self.wait(SUBAGENT_STEP_S)
        except Interrupted:
            self.tool_result(call, "Interrupted by user", True, None, parent)
            raise
        said = str(run())
        progress["tool_uses"] += 1
        what = f"Reading {call.input['path']}" if call.name == TOOL_READ else "Listing the files"
        self._system(
            "task_progress",
            **task,  # with the task's description (a progress line's would rename the task)
            summary=what,
            usage=_task_usage(progress["tool_uses"], said, started),
            last_tool_name=call.name,
        )
        return said


def _task_usage(tool_uses: int, said: str, started: float) -> Json:
    return {
        "total_tokens": 400 * (tool_uses + 1) + _tokens(said),
        "tool_uses": tool_uses,
        "duration_ms": int((time.monotonic() - started) * 1000),
    }


def _text_files(cwd: str) -> list[str]:
    """Names of the regular, visible files of cwd, sorted."""
    try:
        with os.scandir(cwd) as it:
            return sorted(e.name for e in it if e.is_file() and not e.name.startswith("."))
    except OSError:
        return []


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    q: queue.Queue[Json | None] = queue.Queue()
    threading.Thread(target=stdin_reader, args=(q,), name="stdin-reader", daemon=True).start()
    agent = DemoAgent(opts, Writer(), q)
    try:
        return agent.run()
    except OutputClosed:
        agent._save()
        # Point fd 1 at /dev/null so interpreter shutdown does not complain again.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
        return 0
    except KeyboardInterrupt:
        agent._save()
        return 130


if __name__ == "__main__":
    sys.exit(main())
