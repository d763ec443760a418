"""The bundled agent-bridge demo agent: a tiny offline stand-in for Claude Code.

It speaks Claude Code's stream-json dialect (docs/api.md §7.1) on stdin/stdout,
needs no API key and no network, and uses the standard library only. The daemon launches
it as ``<python> -I <this file> --output-format stream-json --input-format stream-json
--verbose --model M [--resume=ID] ...``, so it must never import the ``bridge`` package.

Things a newcomer can type:

* anything at all: a short friendly reply that echoes what was said;
* ``list files`` (or ``ls``): a ``ListFiles`` tool call on the working directory;
* ``read <file>``: a ``ReadFile`` tool call (refused outside the working directory);
* ``what did I say?`` (or ``history`` / ``remember``): the prompts of this session,
  including those loaded with ``--resume=<id>``;
* ``slow``: a long, slowly streamed reply, to try the interrupt button.

History is persisted per session as JSON under ``$DEMO_AGENT_STATE_DIR`` (default
``~/.local/share/agent-bridge/demo-agent``), in ``<session_id>.json``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import re
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
ALL_TOOLS = (TOOL_LIST, TOOL_READ)

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,256}$")
CHUNK_DELAY_S = 0.04
SLOW_CHUNK_DELAY_S = 0.05
SLOW_CHUNKS = 100
TOOL_DELAY_S = 0.05
MAX_LIST_ENTRIES = 50
MAX_READ_BYTES = 64 * 1024
MAX_HISTORY = 200
MAX_HISTORY_FILE_BYTES = 16 * 1024 * 1024
MAX_LINE_BYTES = 64 * 1024 * 1024

INTERRUPT_MARKER = "[Request interrupted by user]"
INTERRUPT_TOOL_MARKER = "[Request interrupted by user for tool use]"

Json = dict[str, Any]

# Flags whose value is the next argv token (unless given as --flag=value). Anything not
# listed here is treated as a boolean flag; stray positional tokens are ignored, so an
# unknown flag that does take a value is harmless either way.
_VALUE_FLAGS = frozenset(
    {
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


def parse_args(argv: list[str]) -> Options:
    """Parse the Claude-Code-like command line; never fails, unknown things are ignored."""
    opts = Options()
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
            if i < len(argv) and not argv[i].startswith("-"):
                values[arg] = argv[i]
                i += 1
            else:
                values[arg] = None
        elif arg in _BOOL_FLAGS:
            values[arg] = None
        elif arg.startswith("-") and arg != "-":
            _err(f"ignoring unknown flag {arg!r}")
        else:
            _err(f"ignoring positional argument {arg[:80]!r}")

    opts.flags = values
    if values.get("--model"):
        opts.model = str(values["--model"])
    resume_given = "--resume" in values or "-r" in values
    resume = values.get("--resume") or values.get("-r")
    if resume_given and not resume:
        _err("--resume without a session id: starting a fresh session")
    opts.resume = resume or None
    opts.session_id = values.get("--session-id") or None
    opts.fork_session = "--fork-session" in values
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
        }
        for it in items
        if isinstance(it, dict) and isinstance(it.get("prompt"), str)
    ]


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
    root = os.path.realpath(cwd)
    target = os.path.realpath(os.path.join(root, os.path.expanduser(name)))
    if os.path.commonpath([root, target]) != root:
        raise ToolError(f"Refusing to read {name}: it is outside the working directory ({root}).")
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
    'Try: "list files" to watch me use a tool, "read <file>", "what did I say?" to see '
    'that I remember this conversation, or "slow" for a long reply you can interrupt.'
)

SHORT_HINT = 'Try "list files", "read <file>", "what did I say?" or "slow".'


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
        self.session_id = self._choose_session()

    # ---- session

    def _choose_session(self) -> str:
        opts = self.opts
        if opts.resume is not None:
            if valid_session_id(opts.resume):
                self.history = load_history(opts.resume)
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
        elif mtype in ("control_response", "control_cancel_request", "keep_alive"):
            pass  # we never send requests, and keep_alive needs no answer
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
        return obj

    def _stream(self, event: Json, **extra: Any) -> None:
        self.write(self._env({"type": "stream_event", "event": event, **extra}))

    def _assistant(self, msg_id: str, request_id: str, block: Json, aborted: bool = False) -> None:
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
                    "agents": [],
                    "skills": [],
                    "plugins": [],
                    "analytics_disabled": True,
                    "product_feedback_disabled": True,
                    "fast_mode_state": "off",
                }
            )
        )

    def stream_message(self, chunks: list[str], delay: float, tool: ToolCall | None = None) -> str:
        """One model message: a streamed text block, optionally followed by a tool_use block.

        Raises Interrupted (after flushing the partial text as an assistant line).
        """
        msg_id = f"msg_demo_{_hex(16)}"
        request_id = f"req_demo_{_hex(12)}"
        self.write(self._env({"type": "system", "subtype": "status", "status": "requesting"}))
        self._stream(
            {
                "type": "message_start",
                "message": {
                    "id": msg_id,
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
        self._stream({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        text = ""
        try:
            for chunk in chunks:
                self.wait(delay)
                self._stream(
                    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": chunk}}
                )
                text += chunk
        except Interrupted as exc:
            if text:
                self._assistant(msg_id, request_id, {"type": "text", "text": text}, aborted=True)
            exc.partial_text = text
            raise
        self._assistant(msg_id, request_id, {"type": "text", "text": text})
        self._stream({"type": "content_block_stop", "index": 0})
        if tool is not None:
            self._stream(
                {
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {"type": "tool_use", "id": tool.id, "name": tool.name, "input": {}},
                }
            )
            self._stream(
                {
                    "type": "content_block_delta",
                    "index": 1,
                    "delta": {"type": "input_json_delta", "partial_json": json.dumps(tool.input)},
                }
            )
            self._assistant(
                msg_id, request_id, {"type": "tool_use", "id": tool.id, "name": tool.name, "input": tool.input}
            )
            self._stream({"type": "content_block_stop", "index": 1})
        self._stream(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use" if tool else "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": _tokens(text)},
            }
        )
        self._stream({"type": "message_stop"})
        return text

    def _result(
        self, *, started: float, num_turns: int, prompt: str, replies: list[str], error: str | None = None
    ) -> None:
        out_tokens = sum(_tokens(r) for r in replies)
        in_tokens = 50 * max(num_turns, 1) + _tokens(prompt)
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
                "permission_denials": [],
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
        first = not self.history and self.turns_this_process == 0
        previous = list(self.history)
        replies: list[str] = []
        num_turns = 0
        interrupted = False
        try:
            self._init()
            if self.opts.replay_user_messages:  # --replay-user-messages: echo, keep uuid
                replay = self._env({"type": "user", "message": message, "timestamp": _now_iso(), "isReplay": True})
                if isinstance(msg.get("uuid"), str):
                    replay["uuid"] = msg["uuid"]
                self.write(replay)
            kind, arg = self.plan(prompt)
            num_turns = 1
            if kind == "slow":
                replies.append(self.stream_message(slow_chunks(), SLOW_CHUNK_DELAY_S))
            elif kind == "history":
                replies.append(self.stream_message(chunk_text(history_reply(previous, self.session_id)), CHUNK_DELAY_S))
            elif kind in ("list", "read"):
                self.tool_turn(kind, arg, replies)
                num_turns = 2
            else:
                replies.append(
                    self.stream_message(chunk_text(default_reply(prompt, attachments, first)), CHUNK_DELAY_S)
                )
            self._result(started=started, num_turns=num_turns, prompt=prompt, replies=replies)
        except Interrupted as exc:
            interrupted = True
            if exc.terminal_reason == "aborted_streaming":
                self._user([{"type": "text", "text": INTERRUPT_MARKER}])
            if exc.partial_text:
                replies.append(exc.partial_text)
            self._result(
                started=started, num_turns=max(num_turns, 1), prompt=prompt, replies=replies, error=exc.terminal_reason
            )
        finally:
            self.in_turn = False
            self.interrupt_requested = False
            self.turns_this_process += 1
            entry: Json = {"prompt": prompt, "reply": "\n\n".join(replies)}
            if interrupted:
                entry["interrupted"] = True
            self.history.append(entry)
            self._save()

    def tool_turn(self, kind: str, arg: str | None, replies: list[str]) -> None:
        name = TOOL_LIST if kind == "list" else TOOL_READ
        if name not in self.tools:
            replies.append(
                self.stream_message(
                    chunk_text(
                        f"I'd use my {name} tool for that, but it is disallowed for this session "
                        "(--disallowedTools), so I won't."
                    ),
                    CHUNK_DELAY_S,
                )
            )
            return
        if kind == "list":
            call = ToolCall(TOOL_LIST, {"path": "."})
            intro = "Sure — let me list the files in the working directory."
        else:
            call = ToolCall(TOOL_READ, {"path": str(arg)})
            intro = f"Sure — let me read {arg}."
        replies.append(self.stream_message(chunk_text(intro), CHUNK_DELAY_S, tool=call))
        try:
            self.wait(TOOL_DELAY_S)  # "running" the tool; an interrupt here aborts the tool
        except Interrupted as exc:
            self._user(
                [{"tool_use_id": call.id, "type": "tool_result", "is_error": True, "content": "Interrupted by user"}]
            )
            self._user([{"type": "text", "text": INTERRUPT_TOOL_MARKER}])
            exc.terminal_reason = "aborted_tools"
            raise
        is_error = False
        structured: Json
        if kind == "list":
            try:
                content, structured, shown, total = list_files(self.cwd)
            except OSError as exc:
                is_error = True
                content = f"Cannot list {self.cwd}: {exc.strerror or exc}"
                structured = {"path": self.cwd, "error": content}
                summary = f"I couldn't list the working directory: {exc.strerror or exc}."
            else:
                if total == 0:
                    summary = "I found no entries: the working directory is empty."
                else:
                    preview = ", ".join(shown[:5]) + (", …" if total > 5 else "")
                    more = f" (showing the first {len(shown)})" if total > len(shown) else ""
                    noun = "entry" if total == 1 else "entries"
                    summary = (
                        f"I found {total} {noun} in {self.cwd}{more}: {preview}. "
                        'Ask me to "read <file>" to look inside one.'
                    )
        else:
            try:
                content, structured = read_file(self.cwd, str(arg))
            except ToolError as exc:
                is_error = True
                content = str(exc)
                structured = {"error": content}
                summary = f"I couldn't do that. {content}"
            else:
                lines = structured["file"]["numLines"]
                first_line = next((ln for ln in content.splitlines() if ln.strip()), "")
                summary = f"{arg} has {lines} line{'s' if lines != 1 else ''}."
                if first_line:
                    summary += f" It starts with: “{_short(first_line, 80)}”"
        self._user(
            [{"tool_use_id": call.id, "type": "tool_result", "content": content, "is_error": is_error}],
            tool_use_result=structured,
        )
        replies.append(self.stream_message(chunk_text(summary), CHUNK_DELAY_S))


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
