#!/usr/bin/env python3
"""Scripted fake agent for the test suite: speaks stream-json or awp-jsonl, with
misbehaviours on demand. Standard library only; run as ``python -I fake_agent.py
--dialect stream-json|awp-jsonl [bridge flags...]``.

Directives are the first word of a prompt:
  (anything)         stream "echo: <prompt>" in three deltas, then a terminal line
  crash              start a reply, then exit 3 without a terminal line
  exit0              exit 0 right away, mid-turn
  garbage            write a non-JSON line, a JSON array and a bare string, then reply
  huge               write 5 MiB with no newline, then wait to be killed
  big                reply with one valid 1 MiB line
  tool               a tool_use, its tool_result, then text
  slow               stream a tick every 50 ms for up to 10 s; honours interrupt
  count [N]          stream "0 " "1 " … "N-1 " (default 400), one every 30 ms; honours interrupt
                     (distinct deltas: a gap or a duplicate in what a client shows is visible)
  workflow           a local_workflow task: a first snapshot (phase Gather, agent child-1
                     running), then waits until $FAKE_AGENT_STATE/go exists (at most 20 s),
                     then child-1 done + child-2 running, then the notification
  hang               start a turn and never end it (ignores interrupt)
  stderr             write three stderr lines, then reply
  stderr flood MB    write MB MiB (1..512) to stderr as fast as the pipe takes it: 200-byte
                     lines, then one 1 MiB line without a newline, then a newline; reply
                     "stderr flood done"
  orphan             reply, then write a second terminal line with no turn pending
  recall             reply with every prompt this native session has seen (proves resume)
  ask                (stream-json) send a can_use_tool control_request and wait for the answer
  elicit             (stream-json) send an elicitation control_request (form: a required
                     "repo" string) and reply "elicit: <action> <content as JSON>"
  badsession         report a native session id that is not valid
  tasks              a Task tool call with task_started/progress (two workflow snapshots)/
                     updated/notification, then a duplicate notification
  leak NAME          reply with (and write to stderr) the value of env var NAME
  splitleak NAME     stream the value of env var NAME split across two deltas (each line
                     written and flushed, 0.3 s apart, so they reach the bridge in two reads),
                     then the whole message and the result, as Claude Code streams a reply;
                     "splitleak NAME hold" keeps the turn open after the deltas until interrupted
  flood N            write N deltas as fast as possible, then a terminal line
  alloc N [wait]     keep N more MiB resident (every page written; 1 <= N <= 2048, else an error
                     reply), then reply "allocated N MiB (T held)"; with "wait", stream
                     "allocated" and keep the turn open (ignores interrupt) until stdin closes
  alloc N hide       as a hostile agent hides memory: a child that leaves the agent's session
                     and process group (setsid) keeps the N MiB; reply "hidden N MiB in <pid>"
  spawnchild         start a grandchild (sleeps 300 s, cmdline carries FAKE_AGENT_LOG) and hang
  spawnsetsid [exit] start a grandchild that calls setsid() (leaves the agent's process group
                     and session; sleeps 300 s, cmdline carries FAKE_AGENT_LOG), then hang, or
                     with "exit" exit 3 (the grandchild is orphaned)

Every stream-json result line carries usage (3 tokens in, 5 out) and, as Claude Code's,
total_cost_usd: what this process has spent so far, 0.125 USD more with each result line.

Flags: --exit-at-start (exit 5 before reading anything). stream-json takes Claude Code's
options only (CLAUDE_OPTIONS; another is "error: unknown option '--x'", exit 1), among them
--fork-session (with --resume: the history under a new session id) and
--resume-session-at UUID (only with --resume, else "Error: --resume-session-at requires
--resume", exit 1: the history up to the assistant line that carried UUID).

awp-jsonl (``--dialect awp-jsonl``) is as strict as the AWP reference adapter
(awp-agent-cli.mjs): after the fake's own prefix (``--dialect awp-jsonl``, then
``--exit-at-start`` if wanted: the profile's prefix args, which the contract passes as they
are) it takes exactly the reference's arguments: ``--model M``, ``--resume ID`` (two
arguments), ``--mcp-config P``, and the stream-json launcher's ``--input-format V
--output-format V --print --verbose``. Anything else (``--resume=ID`` included), a missing
model (no ``--model`` and no AWP_REFERENCE_MODEL) or a resume id outside
``[A-Za-z0-9._:-]{1,256}`` is a start-up failure: one line
``{"type":"result","subtype":"startup_error","is_error":true,"result":R}`` before any input
is read, then exit status 1. R is the reference's public error: the message
(``unsupported_argument:--x``, ``model_required``, ``invalid_session_id``) when it matches
``[a-z0-9_:-]{1,160}``, else ``provider_request_failed`` (so ``--resume=ID``, whose ``=``
does not match, reads ``provider_request_failed``). Like the reference it writes
``system/init`` once, after the first accepted input; skips blank input lines; answers an
input line that is not JSON (``invalid_input_json``) or not a user line
(``invalid_input_message``) with an error result; and exits 0 on ``{"type":"shutdown"}``.

Environment: FAKE_AGENT_LOG (append JSON lines: start argv/env/cwd/pid, every stdin line),
FAKE_AGENT_STATE (directory for per-session history files), FAKE_IGNORE_SIGTERM=1,
FAKE_IGNORE_EOF=1 (keep running after stdin closes), FAKE_HEARTBEAT_S (log
``{"event":"beat","pid","t"}`` with the wall time at start and every so many seconds), FAKE_SHUTDOWN_DELAY_S (seconds to
take before exiting on a shutdown line), AWP_REFERENCE_MODEL (awp-jsonl: the model when
no --model is given, as the reference reads it).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import sys
import threading
import time
import uuid
from typing import NoReturn

LOCK = threading.Lock()
INVALID_INPUT = "\x00invalid"  # an input line the awp-jsonl reader could not take
INBOX: queue.Queue[dict | None] = queue.Queue()
HELD: list[bytes] = []  # what "alloc N" keeps resident


def hide_memory(mib: int) -> int:
    """A child in a session (and process group) of its own that holds ``mib`` MiB until it
    is killed; its pid once it holds them."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.setsid()
        held = b"\x01" * (mib * 1024 * 1024)
        os.write(ready_w, b"1")
        while held:
            time.sleep(3600)
        os._exit(0)
    os.close(ready_w)
    os.read(ready_r, 1)
    os.close(ready_r)
    return pid


SLASH_COMMANDS = ["clear", "compact", "context", "review", "security-review"]


def log(**entry: object) -> None:
    path = os.environ.get("FAKE_AGENT_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")


def out(obj: object) -> None:
    with LOCK:
        sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
        sys.stdout.flush()


def raw_out(data: str) -> None:
    with LOCK:
        sys.stdout.write(data)
        sys.stdout.flush()


# Claude Code 2.1.332's options (``claude --help``, plus the hidden ones the bridge or its
# tests pass): stream-json refuses any other ``--name`` as the real CLI does (commander's
# "error: unknown option '--x'", exit 1), so a flag the bridge invents fails here too.
CLAUDE_OPTIONS = frozenset(
    """add-dir agent agents allow-dangerously-skip-permissions allowedTools allowed-tools
    append-system-prompt append-system-prompt-file autocompact bare betas brief continue
    dangerously-skip-permissions debug debug-file disable-slash-commands disallowedTools
    disallowed-tools effort exclude-dynamic-system-prompt-sections fallback-model file
    fork-session forward-subagent-text help include-hook-events include-partial-messages
    input-format json-schema max-budget-usd max-thinking-tokens max-turns mcp-config model
    name no-session-persistence output-format permission-mode permission-prompt-tool
    plugin-dir print replay-user-messages resume resume-session-at resume-drops-turn
    session-id setting-sources settings strict-mcp-config system-prompt system-prompt-file
    thinking tools verbose version""".split()
)
# The fake's own switches: its dialect, a refusal to start, and --api=URL, which stands
# for an agent's endpoint flag in the launch rules' tests (tests/process/test_launch.py).
FAKE_OPTIONS = frozenset({"dialect", "exit-at-start", "api"})


def parse_args(argv: list[str]) -> dict[str, str | None]:
    """stream-json: ``--model=M`` or ``--model M``, ``--resume=ID`` or ``--resume ID``, both
    forms as the real CLIs take them; ``--fork-session`` and ``--resume-session-at`` as
    Claude Code takes them (the second only with a resume: its error otherwise). Other
    arguments are skipped, an unknown option refused (CLAUDE_OPTIONS)."""
    opts: dict[str, str | None] = {"dialect": "stream-json", "model": None, "resume": None, "fork": None, "at": None}
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, value = a[2:].partition("=")
        if a.startswith("--") and name not in CLAUDE_OPTIONS | FAKE_OPTIONS:
            sys.stderr.write(f"error: unknown option '{a.split('=', 1)[0]}'\n")
            sys.exit(1)
        if a.startswith("--") and name in ("dialect", "model", "resume", "resume-session-at") and not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
            i += 1
        if name in ("dialect", "model", "resume") and a.startswith("--"):
            opts[name] = value
        elif a == "--resume-session-at" or a.startswith("--resume-session-at="):
            opts["at"] = value
        elif a == "--fork-session":
            opts["fork"] = "1"
        elif a == "--mcp-config" and opts["dialect"] == "stream-json":
            i = read_mcp_configs(argv, i + 1) - 1
        i += 1
    if opts["at"] is not None and not opts["resume"]:
        sys.stderr.write("Error: --resume-session-at requires --resume\n")
        sys.exit(1)
    return opts


def read_mcp_configs(argv: list[str], i: int) -> int:
    """Claude Code's ``--mcp-config <configs...>``: every following argument up to the next
    option is one file (the fake takes no inline JSON), holding an object whose
    ``mcpServers`` is an object; anything else is its start-up error (stderr, exit 1),
    before any input is read. The servers read are logged (``mcp_config``). Returns the
    index after the last file."""
    files: list[str] = []
    while i < len(argv) and not argv[i].startswith("-"):
        files.append(argv[i])
        i += 1
    servers: dict[str, object] = {}
    for path in files:
        try:
            with open(path, encoding="utf-8") as fh:
                config = json.load(fh)
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"Error: Invalid MCP configuration:\nMCP config file not readable: {path}: {exc}\n")
            sys.exit(1)
        if not isinstance(config, dict) or not isinstance(config.get("mcpServers"), dict):
            sys.stderr.write("Error: Invalid MCP configuration:\nmcpServers: expected record\n")
            sys.exit(1)
        servers.update(config["mcpServers"])
    if not files:
        sys.stderr.write("error: option '--mcp-config <configs...>' argument missing\n")
        sys.exit(1)
    log(event="mcp_config", files=files, servers=servers, modes=[oct(os.stat(p).st_mode & 0o777) for p in files])
    return i


# -- awp-jsonl: as strict as the AWP reference adapter (awp-agent-cli.mjs, the contract's own
# example CLI). Its argument parser knows exactly these; any other argument is a start-up
# failure. (It takes the stream-json launcher's flags too, as the reference does.)
AWP_VALUE_FLAGS = frozenset({"--input-format", "--output-format", "--mcp-config"})
AWP_BARE_FLAGS = frozenset({"--print", "--verbose"})
AWP_SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,256}")
AWP_PUBLIC_ERROR = re.compile(r"[a-z0-9_:-]{1,160}", re.IGNORECASE)
# The fake's own switches: only at the very start of argv (the profile's prefix args, which
# the contract passes unchanged), never among what the host adds after them.
FAKE_PREFIX_FLAGS = frozenset({"--exit-at-start"})


class StartupError(Exception):
    """What the reference adapter's main() throws before it reads any input."""


def fake_prefix(argv: list[str]) -> tuple[str, list[str], list[str]]:
    """(dialect, the fake's own prefix switches, the rest): ``--dialect D`` first, then any
    of FAKE_PREFIX_FLAGS."""
    dialect, rest = "stream-json", argv
    if rest[:1] == ["--dialect"] and len(rest) > 1:
        dialect, rest = rest[1], rest[2:]
    own: list[str] = []
    while rest and rest[0] in FAKE_PREFIX_FLAGS:
        own.append(rest[0])
        rest = rest[1:]
    return dialect, own, rest


def parse_awp_args(argv: list[str]) -> dict[str, str | None]:
    """The reference adapter's parseArgs: ``--model V``, ``--resume V`` (a missing value is
    empty), value flags skipped with their value, bare compatibility flags; anything else
    (``--resume=ID`` included) is ``unsupported_argument:<arg>``."""
    model = resume = ""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--model", "--resume"):
            value = (argv[i + 1] if i + 1 < len(argv) else "").strip()
            model, resume = (value, resume) if a == "--model" else (model, value)
            i += 1
        elif a in AWP_VALUE_FLAGS:
            i += 1
        elif a not in AWP_BARE_FLAGS:
            raise StartupError(f"unsupported_argument:{a}")
        i += 1
    model = model or os.environ.get("AWP_REFERENCE_MODEL", "").strip()
    if not model or len(model) > 256 or any(ord(c) < 0x20 or ord(c) == 0x7F for c in model):
        raise StartupError("model_required")
    if resume and not AWP_SESSION_ID.fullmatch(resume):
        raise StartupError("invalid_session_id")
    return {"dialect": "awp-jsonl", "model": model, "resume": resume or None}


def awp_startup_failure(exc: StartupError) -> NoReturn:
    """As the reference's main().catch: one result line (its message if it reads as a code,
    else ``provider_request_failed``), then exit status 1, no input read."""
    message = str(exc)
    public = message if AWP_PUBLIC_ERROR.fullmatch(message) else "provider_request_failed"
    out({"type": "result", "subtype": "startup_error", "is_error": True, "result": public})
    log(event="startup_error", error=message)
    sys.exit(1)


def reader(awp: bool) -> None:
    for line in sys.stdin:
        log(event="stdin", line=line.rstrip("\n"))
        if awp and not line.strip():
            continue  # the reference adapter skips blank lines
        try:
            obj = json.loads(line)
        except ValueError:
            if awp:  # the reference answers it with an error result (the turn it would have been)
                INBOX.put({"type": INVALID_INPUT, "error": "invalid_input_json"})
            continue
        if isinstance(obj, dict):
            INBOX.put(obj)
        elif awp:
            INBOX.put({"type": INVALID_INPUT, "error": "invalid_input_message"})
    if os.environ.get("FAKE_IGNORE_EOF") == "1":
        return  # never tell the agent: it keeps running with its stdin closed
    INBOX.put(None)


class Agent:
    def __init__(self, opts: dict[str, str | None]) -> None:
        self.awp = opts["dialect"] == "awp-jsonl"
        self.model = opts["model"] or "fake-model"
        self.session_id = opts["resume"] or f"fake-{uuid.uuid4()}"
        self.state_dir = os.environ.get("FAKE_AGENT_STATE")
        self.history: list[str] = self._load()
        self.entries = 0  # assistant lines written in this turn (their uuids: entry_uuid)
        if opts.get("at") is not None:
            kept = self._turn_of(opts["at"] or "")
            if kept is None:  # Claude Code's words (print mode), then its exit
                sys.stderr.write(f"No message found with message.uuid of: {opts['at']}\n")
                sys.exit(1)
            self.history = self.history[:kept]
        if opts.get("fork") and opts["resume"]:
            # --fork-session: the history copied under a new session id, the source untouched.
            self.session_id = f"fake-{uuid.uuid4()}"
            log(event="forked", source=opts["resume"], at=opts.get("at"), session=self.session_id)
        if opts.get("fork") or opts.get("at") is not None:
            self._save()
        self.deferred: list[dict] = []
        self.initialized = False  # awp-jsonl: system/init once, after the first accepted input
        # stream-json: what this process has spent, as Claude Code's total_cost_usd gives it
        # (a running total of the process: 0.125 USD more with every result line)
        self.spent = 0.0

    def _path(self) -> str | None:
        return os.path.join(self.state_dir, f"{self.session_id}.json") if self.state_dir else None

    def _load(self) -> list[str]:
        path = self._path()
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                return json.load(fh)
        return []

    def entry_uuid(self, prompts: int, k: int) -> str:
        """The uuid of the k-th assistant line of the turn that brought the session to
        ``prompts`` prompts: derived (the session id's own uuid, its last group replaced),
        not stored, so that --resume-session-at finds the turn with no file written while
        a turn runs, and made as fast as uuid4 (a pause between a reply's deltas and its
        message would change what one read of the bridge holds, which other tests see)."""
        base = self.session_id[-36:] if len(self.session_id) >= 36 else "00000000-0000-4000-8000-000000000000"
        return f"{base[:24]}{prompts % 0x1000000:06x}{k % 0x1000000:06x}"

    def _turn_of(self, entry: str) -> int | None:
        """How many prompts the session held when ``entry`` was written (None: unknown)."""
        for n in range(1, len(self.history) + 1):
            if any(self.entry_uuid(n, k) == entry for k in range(64)):
                return n
        return None

    def _save(self) -> None:
        path = self._path()
        if path:
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(self.history, fh)

    # -- output helpers
    def delta(self, text: str) -> None:
        ev = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
        out(
            ev
            if self.awp
            else {
                "type": "stream_event",
                "event": ev,
                "session_id": self.session_id,
                "parent_tool_use_id": None,
                "uuid": str(uuid.uuid4()),
            }
        )

    def assistant(self, blocks: list[dict]) -> None:
        entry = self.entry_uuid(len(self.history), self.entries)
        self.entries += 1
        out(
            {
                "type": "assistant",
                "message": {
                    "id": "msg_fake",
                    "role": "assistant",
                    "type": "message",
                    "model": self.model,
                    "content": blocks,
                },
                "parent_tool_use_id": None,
                "session_id": self.session_id,
                "uuid": entry,
            }
        )

    def result(
        self,
        text: str,
        *,
        error: bool = False,
        subtype: str | None = None,
        terminal_reason: str | None = None,
        errors: list[str] | None = None,
    ) -> None:
        sub = subtype or ("error" if (error and self.awp) else "success")
        obj = {
            "type": "result",
            "subtype": sub,
            "is_error": error,
            "result": text,
            "session_id": self.session_id,
            "usage": {"input_tokens": 3, "output_tokens": 5},
            "stop_reason": None if error else "end_turn",
            "uuid": str(uuid.uuid4()),
        }
        if not self.awp:
            self.spent += 0.125
            obj["total_cost_usd"] = self.spent
        if terminal_reason:
            obj["terminal_reason"] = terminal_reason
        if errors is not None:
            obj["errors"] = errors
        out(obj)

    def interrupted(self, terminal_reason: str, stop_reason: str = "null") -> None:
        # As Claude Code 2.1.197 ends an interrupted turn: its internal diagnostic in errors.
        self.result(
            "",
            error=True,
            subtype="error_during_execution",
            terminal_reason=terminal_reason,
            errors=[f"[ede_diagnostic] result_type=user last_content_type=n/a stop_reason={stop_reason}"],
        )

    def reply(self, text: str) -> None:
        third = max(1, len(text) // 3)
        for chunk in (text[:third], text[third : 2 * third], text[2 * third :]):
            if chunk:
                self.delta(chunk)
        self.assistant([{"type": "text", "text": text}])
        self.result(text)

    # -- turns
    def turn(self, msg: dict) -> None:
        content = msg.get("message", {}).get("content")
        if isinstance(content, list):
            text = "".join(b.get("text", "") for b in content if isinstance(b, dict))
            kinds = [b.get("type") for b in content if isinstance(b, dict)]
        else:
            text, kinds = str(content), ["text"]
        word = (text.split() or [""])[0].lower()
        self.history.append(text)
        self._save()
        self.entries = 0
        sid = "not a valid id!" if word == "badsession" else self.session_id
        if not (self.awp and self.initialized):
            self.initialized = True
            out(
                {
                    "type": "system",
                    "subtype": "init",
                    "session_id": sid,
                    "model": self.model,
                    "cwd": os.getcwd(),
                    "tools": ["Bash"],
                    # As Claude Code lists its commands (names, without the slash).
                    **({} if self.awp else {"slash_commands": SLASH_COMMANDS}),
                    "uuid": str(uuid.uuid4()),
                }
            )
        handler = getattr(self, f"do_{word}", None)
        if handler is not None:
            handler(text)
        else:
            extra = f" [{','.join(k for k in kinds if k != 'text')}]" if kinds != ["text"] else ""
            self.reply(f"echo: {text}{extra}")

    def do_alloc(self, text: str) -> None:
        parts = text.split()
        wait, hide = parts[2:] == ["wait"], parts[2:] == ["hide"]
        if len(parts) != 2 + (wait or hide) or not parts[1].isdigit() or not 1 <= int(parts[1]) <= 2048:
            self.reply("alloc: give one whole number of MiB, 1 to 2048, then optionally 'wait' or 'hide'")
            return
        if hide:
            self.reply(f"hidden {parts[1]} MiB in {hide_memory(int(parts[1]))}")
            return
        # bytes() of a repeated non-zero byte: every page is written, so all of it is resident
        HELD.append(b"\x01" * (int(parts[1]) * 1024 * 1024))
        if wait:
            self.do_hang("allocated")
        self.reply(f"allocated {parts[1]} MiB ({sum(len(h) for h in HELD) >> 20} held)")

    def do_crash(self, text: str) -> None:
        self.delta("about to crash")
        sys.stderr.write("fake agent: crashing on purpose\n")
        sys.stderr.flush()
        os._exit(3)

    def do_exit0(self, text: str) -> None:
        os._exit(0)

    def do_garbage(self, text: str) -> None:
        raw_out('this is not json\n[1,2,3]\n"just a string"\n')
        self.reply("after garbage")

    def do_huge(self, text: str) -> None:
        raw_out("x" * (5 * 1024 * 1024))
        time.sleep(60)

    def do_big(self, text: str) -> None:
        self.assistant([{"type": "text", "text": "B" * (1024 * 1024)}])
        self.result("big done")

    def do_tool(self, text: str) -> None:
        tid = f"toolu_{uuid.uuid4().hex[:8]}"
        self.assistant([{"type": "tool_use", "id": tid, "name": "Bash", "input": {"command": "echo hi"}}])
        out(
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": tid, "content": "hi", "is_error": False}],
                },
                "session_id": self.session_id,
                "parent_tool_use_id": None,
            }
        )
        self.reply("tool done")

    def do_slow(self, text: str) -> None:
        deadline = time.monotonic() + 10
        sent = ""
        while time.monotonic() < deadline:
            try:
                msg = INBOX.get(timeout=0.05)
            except queue.Empty:
                self.delta("tick ")
                sent += "tick "
                continue
            if msg is None:
                os._exit(0)
            if msg.get("type") == "control_request" and msg.get("request", {}).get("subtype") == "interrupt":
                out(
                    {
                        "type": "control_response",
                        "response": {"subtype": "success", "request_id": msg.get("request_id")},
                    }
                )
                self.assistant([{"type": "text", "text": sent}])
                out(
                    {
                        "type": "user",
                        "message": {
                            "role": "user",
                            "content": [{"type": "text", "text": "[Request interrupted by user]"}],
                        },
                    }
                )
                self.interrupted("aborted_streaming")
                return
            self.deferred.append(msg)
        self.reply("slow done")

    def do_count(self, text: str) -> None:
        parts = text.split()
        total = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 400
        sent = ""
        for i in range(total):
            try:
                msg = INBOX.get(timeout=0.03)
            except queue.Empty:
                self.delta(f"{i} ")
                sent += f"{i} "
                continue
            if msg is None:
                os._exit(0)
            if msg.get("type") == "control_request" and msg.get("request", {}).get("subtype") == "interrupt":
                out(
                    {
                        "type": "control_response",
                        "response": {"subtype": "success", "request_id": msg.get("request_id")},
                    }
                )
                self.assistant([{"type": "text", "text": sent}])
                self.interrupted("aborted_streaming")
                return
            self.deferred.append(msg)
        self.assistant([{"type": "text", "text": sent}])
        self.result(sent)

    def do_workflow(self, text: str) -> None:
        def system(sub: str, **fields: object) -> None:
            out({"type": "system", "subtype": sub, "session_id": self.session_id, "uuid": str(uuid.uuid4()), **fields})

        phase = {"type": "workflow_phase", "index": 1, "title": "Gather"}
        self.assistant([{"type": "tool_use", "id": "toolu_wf", "name": "Workflow", "input": {"name": "review"}}])
        system(
            "task_started",
            task_id="wf1",
            tool_use_id="toolu_wf",
            task_type="local_workflow",
            workflow_name="review",
            description="Review the change",
        )
        system(
            "task_progress",
            task_id="wf1",
            tool_use_id="toolu_wf",
            description="Review the change",
            usage={"total_tokens": 10, "tool_uses": 1, "duration_ms": 100},
            workflow_progress=[
                phase,
                {
                    "type": "workflow_agent",
                    "index": 1,
                    "agentId": "v2:a",
                    "state": "start",
                    "label": "child-1",
                    "phaseIndex": 1,
                },
            ],
        )
        go = os.path.join(self.state_dir or ".", "go")
        deadline = time.monotonic() + 20
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.02)
        system(
            "task_progress",
            task_id="wf1",
            tool_use_id="toolu_wf",
            description="Review the change",
            usage={"total_tokens": 30, "tool_uses": 3, "duration_ms": 900},
            workflow_progress=[
                phase,
                {
                    "type": "workflow_agent",
                    "index": 1,
                    "agentId": "v2:a",
                    "state": "done",
                    "label": "child-1",
                    "phaseIndex": 1,
                },
                {
                    "type": "workflow_agent",
                    "index": 2,
                    "agentId": "v2:b",
                    "state": "start",
                    "label": "child-2",
                    "phaseIndex": 1,
                },
            ],
        )
        system(
            "task_notification",
            task_id="wf1",
            tool_use_id="toolu_wf",
            status="completed",
            output_file="/tmp/out",
            summary="Reviewed 2 files",
        )
        out(
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_wf",
                            "content": "Reviewed 2 files",
                            "is_error": False,
                        }
                    ],
                },
                "session_id": self.session_id,
                "parent_tool_use_id": None,
            }
        )
        self.reply("workflow done")

    def do_hang(self, text: str) -> None:
        self.delta("hanging")
        while True:
            msg = INBOX.get()
            if msg is None:
                os._exit(0)
            log(event="ignored_while_hanging", msg=msg)

    def do_stderr(self, text: str) -> None:
        words = text.split()
        if words[1:2] == ["flood"]:
            self._stderr_flood(words[2:])
            return
        for i in range(3):
            sys.stderr.write(f"diagnostic line {i}\n")
        sys.stderr.flush()
        self.reply("stderr done")

    def _stderr_flood(self, args: list[str]) -> None:
        if len(args) != 1 or not args[0].isdigit() or not 1 <= int(args[0]) <= 512:
            self.reply("error: stderr flood wants MB, 1 <= MB <= 512")
            return
        line = b"x" * 199 + b"\n"
        block = line * 5000  # about 1 MiB
        for _ in range(int(args[0])):
            sys.stderr.buffer.write(block)
        sys.stderr.buffer.write(b"y" * (1 << 20) + b"\n")
        sys.stderr.flush()
        self.reply("stderr flood done")

    def do_orphan(self, text: str) -> None:
        self.reply("first")
        self.result("unsolicited")

    def do_recall(self, text: str) -> None:
        self.reply("history: " + " | ".join(self.history[:-1]))

    def do_ask(self, text: str) -> None:
        rid = str(uuid.uuid4())
        out(
            {
                "type": "control_request",
                "request_id": rid,
                "request": {
                    "subtype": "can_use_tool",
                    "tool_name": "Bash",
                    "input": {"command": "touch x"},
                    "tool_use_id": "toolu_ask",
                },
            }
        )
        while True:
            msg = INBOX.get()
            if msg is None:
                os._exit(0)
            if msg.get("type") == "control_response" and msg.get("response", {}).get("request_id") == rid:
                answer = msg["response"].get("response", {})
                log(event="permission_answer", answer=answer)
                self.reply(f"permission: {answer.get('behavior')}")
                return
            if msg.get("type") == "control_request" and msg.get("request", {}).get("subtype") == "interrupt":
                # As Claude Code does: withdraw the prompt, ack, abort (docs/api.md §6.5).
                out({"type": "control_cancel_request", "request_id": rid})
                out(
                    {
                        "type": "control_response",
                        "response": {"subtype": "success", "request_id": msg.get("request_id")},
                    }
                )
                self.interrupted("aborted_tools", "tool_use")
                return
            self.deferred.append(msg)

    def do_elicit(self, text: str) -> None:
        # As Claude Code asks its host for an MCP server's elicitation; withdrawn on interrupt.
        rid = str(uuid.uuid4())
        schema = {"type": "object", "properties": {"repo": {"type": "string"}}, "required": ["repo"]}
        request = {"subtype": "elicitation", "mcp_server_name": "gh", "message": "Which repo?"}
        out({"type": "control_request", "request_id": rid, "request": {**request, "requested_schema": schema}})
        while True:
            msg = INBOX.get()
            if msg is None:
                os._exit(0)
            if msg.get("type") == "control_response" and msg.get("response", {}).get("request_id") == rid:
                answer = msg["response"].get("response", {})
                self.reply(f"elicit: {answer.get('action')} {json.dumps(answer.get('content'), sort_keys=True)}")
                return
            if msg.get("type") == "control_request" and msg.get("request", {}).get("subtype") == "interrupt":
                out({"type": "control_cancel_request", "request_id": rid})
                ack = {"subtype": "success", "request_id": msg.get("request_id")}
                out({"type": "control_response", "response": ack})
                self.interrupted("aborted_tools", "tool_use")
                return
            self.deferred.append(msg)

    def do_tasks(self, text: str) -> None:
        def system(sub: str, **fields: object) -> None:
            out({"type": "system", "subtype": sub, "session_id": self.session_id, "uuid": str(uuid.uuid4()), **fields})

        self.assistant([{"type": "tool_use", "id": "toolu_task", "name": "Task", "input": {"prompt": "go"}}])
        system(
            "task_started",
            task_id="t1",
            tool_use_id="toolu_task",
            description="Explore repo",
            subagent_type="Explore",
            task_type="local_agent",
        )
        system(
            "task_progress",
            task_id="t1",
            tool_use_id="toolu_task",
            description="Explore repo",
            usage={"total_tokens": 10, "tool_uses": 1, "duration_ms": 5},
            workflow_progress=[{"step": "a", "state": "done"}, {"step": "b", "state": "running"}],
        )
        system(
            "task_progress",
            task_id="t1",
            tool_use_id="toolu_task",
            description="Explore repo",
            usage={"total_tokens": 20, "tool_uses": 2, "duration_ms": 9},
            workflow_progress=[{"step": "c", "state": "running"}],
        )
        system("task_updated", task_id="t1", patch={"description": "Explore the repo", "status": "running"})
        system(
            "task_notification",
            task_id="t1",
            tool_use_id="toolu_task",
            status="completed",
            output_file="/tmp/out",
            summary="Found 3 files",
        )
        system(
            "task_notification",
            task_id="t1",
            tool_use_id="toolu_task",
            status="failed",
            output_file="/tmp/out",
            summary="duplicate",
        )
        out(
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_task",
                            "content": "Found 3 files",
                            "is_error": False,
                        }
                    ],
                },
                "session_id": self.session_id,
                "parent_tool_use_id": None,
            }
        )
        self.reply("tasks done")

    def do_leak(self, text: str) -> None:
        name = ([*text.split(), "", ""])[1]
        value = os.environ.get(name, "")
        sys.stderr.write(f"my secret is {value}\n")
        sys.stderr.flush()
        self.reply(f"the value of {name} is {value}")

    def do_splitleak(self, text: str) -> None:
        name = ([*text.split(), "", ""])[1]
        value = os.environ.get(name, "")
        half = len(value) // 2
        self.delta(f"the value of {name} is {value[:half]}")
        time.sleep(0.3)  # a model's pause between two stream events
        self.delta(f"{value[half:]}, keep it")
        said = f"the value of {name} is {value}, keep it"
        if text.split()[2:3] == ["hold"]:  # the stream stays open until an interrupt
            while (msg := INBOX.get()) is not None:
                req = msg.get("request", {}) if msg.get("type") == "control_request" else {}
                if req.get("subtype") == "interrupt":
                    rid = msg.get("request_id")
                    out({"type": "control_response", "response": {"subtype": "success", "request_id": rid}})
                    self.assistant([{"type": "text", "text": said}])
                    self.interrupted("aborted_streaming")
                    return
                self.deferred.append(msg)
            os._exit(0)
        self.assistant([{"type": "text", "text": said}])
        self.result(said)

    def do_flood(self, text: str) -> None:
        parts = text.split()
        count = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 1000
        for i in range(count):
            self.delta(f"{i} ")
        self.assistant([{"type": "text", "text": f"flooded {count}"}])
        self.result(f"flooded {count}")

    def do_spawnchild(self, text: str) -> None:
        import subprocess

        marker = os.environ.get("FAKE_AGENT_LOG", "fake-agent-child")
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", marker])
        log(event="child", pid=child.pid)
        self.delta(f"child {child.pid}")
        self.do_hang(text)

    def do_spawnsetsid(self, text: str) -> None:
        import subprocess

        marker = os.environ.get("FAKE_AGENT_LOG", "fake-agent-child")
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)", marker, "setsid"], start_new_session=True
        )
        log(event="setsid_child", pid=child.pid)
        self.delta(f"setsid child {child.pid}")
        if text.split()[1:2] == ["exit"]:
            os._exit(3)
        self.do_hang(text)

    def do_badsession(self, text: str) -> None:
        self.reply("bad session reported")

    def handle(self, msg: dict) -> bool:
        mtype = msg.get("type")
        if mtype == "user":
            self.turn(msg)
        elif mtype == "shutdown":
            log(event="shutdown")
            # Flushing its history takes a while: the host must wait, not signal (FAKE_SHUTDOWN_DELAY_S).
            time.sleep(float(os.environ.get("FAKE_SHUTDOWN_DELAY_S") or 0))
            return False
        elif self.awp:
            # The reference adapter takes only user lines (and shutdown): anything else is
            # answered with an error result, as a turn that failed.
            error = msg.get("error") if mtype == INVALID_INPUT else "invalid_input_message"
            out(
                {"type": "result", "subtype": "error", "is_error": True, "session_id": self.session_id, "result": error}
            )
        elif mtype == "control_request":
            rid = msg.get("request_id")
            sub = msg.get("request", {}).get("subtype")
            if sub == "interrupt":
                out({"type": "control_response", "response": {"subtype": "success", "request_id": rid}})
            else:
                out(
                    {
                        "type": "control_response",
                        "response": {"subtype": "error", "request_id": rid, "error": f"unsupported {sub}"},
                    }
                )
        return True

    def run(self) -> None:
        while True:
            msg = self.deferred.pop(0) if self.deferred else INBOX.get()
            if msg is None or not self.handle(msg):
                return


def heartbeat(every_s: float) -> None:
    """A write every ``every_s`` while the process lives (the first at once), with the wall
    time: stands for the agent writing its session files (tests/cluster/test_fence_e2e.py)."""
    pid = os.getpid()
    while True:
        log(event="beat", pid=pid, t=time.time())
        time.sleep(every_s)


def main() -> None:
    if os.environ.get("FAKE_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dialect, own, rest = fake_prefix(sys.argv[1:])
    log(event="start", argv=sys.argv, env=dict(os.environ), cwd=os.getcwd(), pid=os.getpid())
    if beat := os.environ.get("FAKE_HEARTBEAT_S"):
        threading.Thread(target=heartbeat, args=(float(beat),), daemon=True).start()
    if "--exit-at-start" in (own if dialect == "awp-jsonl" else sys.argv):
        sys.stderr.write("fake agent: refusing to start\n")
        sys.exit(5)
    if dialect == "awp-jsonl":
        try:
            opts = parse_awp_args(rest)
        except StartupError as exc:
            awp_startup_failure(exc)
    else:
        opts = parse_args(sys.argv[1:])
    threading.Thread(target=reader, args=(dialect == "awp-jsonl",), daemon=True).start()
    Agent(opts).run()
    log(event="exit")


if __name__ == "__main__":
    main()
