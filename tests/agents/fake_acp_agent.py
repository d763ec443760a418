#!/usr/bin/env python3
"""Scripted fake ACP agent (Agent Client Protocol, JSON-RPC 2.0 over stdio, one JSON
object a line) for the test suite, with misbehaviours on demand. Standard library only;
run as ``python -I fake_acp_agent.py [flags...]``. The bridge is the ACP client.

Client → agent methods: initialize, authenticate, session/new, session/load,
session/resume (only with --resume-cap), session/fork (only with --fork-cap),
session/list, session/prompt, session/set_mode (only with --modes), and the notification
session/cancel. Anything else gets -32601 (notifications are ignored). session/new, load,
resume and fork take stdio mcpServers only (it advertises no mcpCapabilities): anything
else there is -32602.

Directives are the first word of a prompt's text (text blocks concatenated):
  (anything)         "echo: <text>" (plus " [image,...]" for non-text blocks) in three
                     agent_message_chunk updates with one messageId, a usage_update, end_turn
  think              an agent_thought_chunk, then a message chunk
  tool               tool_call (pending) → tool_call_update in_progress → completed
                     (content "hi", rawOutput "hi") → message chunk
  plan               a plan update with two entries
  ask [command]      tool_call (pending), then session/request_permission (agent ids count
                     from 0) with options allow / allow_always / reject; waits for the answer,
                     a tool_call_update (completed or failed), a chunk "permission: <optionId
                     or cancelled>"; stopReason "cancelled" if the outcome or the turn was
  read <abs path>    fs/read_text_file, then a chunk "read: <content>" or "read error <code>: <msg>"
  write <path> <txt> fs/write_text_file, then a chunk "write: ok" or "write error <code>: <msg>"
  slow               a chunk "tick " every 50 ms for up to 10 s; session/cancel stops it with
                     stopReason "cancelled"
  hang               one chunk, then never answers (ignores cancel) until stdin EOF
  crash              one chunk, then exit 3
  unknown            sends the request "_fake/whatever" to the client, then a chunk
                     "unknown: error <code>" (or "unknown: result <json>")
  garbage            writes a non-JSON line and {"jsonrpc":"2.0"}, then echoes
  twoupdates         a session/update for another sessionId, then echoes
  mode <id>          (--modes) the agent switches its own mode: a current_mode_update, then
                     a chunk "mode: <id>" (an unknown id: a chunk "mode: unknown <id>")
  whatmode           a chunk "mode: <the session's current mode id>"
  recall             a chunk "history: <every earlier prompt of the session, joined by " | ">"
  usage              a chunk, a usage_update {used, size, cost: the session's cumulative cost,
                     0.25 USD more each time}, and the response's usage (10 in, 5 out, 2
                     cached, 17 in all)
  title [text]       a session_info_update {title: text, updatedAt} (no text: title null),
                     then a chunk "title: <text>"
  config <id> <val>  (--config-options) the agent sets its own option: a config_option_update
                     with the full list, then a chunk "config: <id>=<val>" (unknown: a chunk
                     "config: unknown <id>")
  whatconfig         a chunk "config: model=<current model> mode=<current mode>"
  elicit [form|url|bad]  elicitation/create (form: ELICIT_FORM; url: a URL; bad: a nested
                     object the spec forbids), only if the client advertised that mode (else
                     a chunk "elicit: <mode> not advertised"); waits for the answer, then a
                     chunk "elicit: <action> <content as JSON>" or "elicit: error <code>"
Every session/update of a turn is written before the session/prompt response.

Flags: --version N (protocolVersion answered, default 1), --no-load (no loadSession;
session/load is -32601), --resume-cap (advertise and serve session/resume), --fork-cap (advertise
sessionCapabilities.fork and serve session/fork),
--auth-required (authMethods [fake-key]; session/new, load and resume answer -32000
until authenticate{methodId:"fake-key"}), --delay-initialize S (answer initialize after
S seconds, from a timer, so later requests can be answered first), --exit-at-start
(exit 5 before reading), --exit-after-initialize (answer initialize, then exit 4),
--text-only (promptCapabilities image and embeddedContext false), --no-list (no
sessionCapabilities.list; session/list is -32601), --modes (session/new, load and resume
answer ``modes`` {currentModeId "default", availableModes default / acceptEdits / plan};
session/set_mode {sessionId, modeId} answers {} — and sends no current_mode_update, as
claude-agent-acp — an unknown modeId -32603 "Internal error" {details: "Invalid Mode"}
— modelled on claude-agent-acp, whose handler throws "Invalid Mode" and whose SDK sends a
thrown error so; no recorded transcript has a refused set_mode — an unknown session -32603
"Session not found").

--config-options (session/new, load and resume answer ``configOptions``: mode (category
mode, the same values as --modes), model (category model: fast / deep, grouped), and the
boolean "brave" only when the client advertised session.configOptions.boolean;
session/set_config_option {sessionId, configId, value[, type: "boolean"]} answers the full
list; an unknown configId or value, or a boolean for a select option, -32602 "Invalid
params" {details}, as the SDK's own validation and the spec's invalid-params rule say),
--models (the older unstable API, as Gemini CLI 0.61: session/new, load and resume answer
``models`` {currentModelId, availableModels [{modelId, name, description}]};
session/set_model {sessionId, modelId} answers {}; an unknown model -32602).

Environment: FAKE_AGENT_LOG (append JSON lines: start argv/env/cwd/pid, every stdin line,
initialize clientCapabilities/clientInfo, ...), FAKE_AGENT_STATE (directory of per-session
history files <sessionId>.json: a list of {"role": "user"|"agent", "text"}).
Exits 0 on stdin EOF.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
import uuid
from typing import Any

LOCK = threading.Lock()
INBOX: queue.Queue[Any] = queue.Queue()
EOF = object()

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
AUTH_REQUIRED = -32000
NOT_FOUND = -32002


def log(**entry: object) -> None:
    path = os.environ.get("FAKE_AGENT_LOG")
    if path:
        with LOCK, open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")


def diag(text: str) -> None:
    sys.stderr.write(f"fake acp agent: {text}\n")
    sys.stderr.flush()


def out(obj: object) -> None:
    raw_out(json.dumps(obj, separators=(",", ":")) + "\n")


def raw_out(data: str) -> None:
    with LOCK:
        sys.stdout.write(data)
        sys.stdout.flush()


def respond(rid: Any, result: Any) -> None:
    out({"jsonrpc": "2.0", "id": rid, "result": result})


def fail(rid: Any, code: int, message: str, data: Any = None) -> None:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    out({"jsonrpc": "2.0", "id": rid, "error": err})


def hard_exit(code: int) -> None:
    """Exit now, without interpreter shutdown (worker threads may hold stdout)."""
    log(event="exit", code=code)
    with LOCK:
        sys.stdout.flush()
    os._exit(code)


def mcp_server_ok(server: Any) -> bool:
    """A stdio McpServer as ACP's schema has it ({name, command, args, env: [{name, value}]});
    http and sse ones are refused, as this agent advertises no mcpCapabilities."""
    if not isinstance(server, dict) or "type" in server:
        return False
    env = server.get("env")
    return (
        isinstance(server.get("name"), str)
        and isinstance(server.get("command"), str)
        and isinstance(server.get("args"), list)
        and all(isinstance(a, str) for a in server["args"])
        and isinstance(env, list)
        and all(isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("value"), str) for e in env)
    )


def opt_value(argv: list[str], name: str, default: str | None = None) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


class Outgoing:
    """The agent's own requests to the client: ids 0, 1, 2, …; responses matched by id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_id = 0
        self.waiting: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}

    def send(self, method: str, params: dict[str, Any]) -> tuple[int, threading.Event, list[dict[str, Any]]]:
        with self.lock:
            rid = self.next_id
            self.next_id += 1
            slot: tuple[threading.Event, list[dict[str, Any]]] = (threading.Event(), [])
            self.waiting[rid] = slot
        out({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return rid, slot[0], slot[1]

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request and block for its response (the full response object)."""
        _, event, box = self.send(method, params)
        event.wait()
        return box[0]

    def deliver(self, msg: dict[str, Any]) -> None:
        rid = msg.get("id")
        with self.lock:
            slot = self.waiting.pop(rid, None) if isinstance(rid, int) else None
        if slot is None:
            log(event="unmatched_response", msg=msg)
            diag(f"response to unknown request id {rid!r}")
            return
        slot[1].append(msg)
        slot[0].set()


OUTGOING = Outgoing()


def reader() -> None:
    for line in sys.stdin:
        line = line.rstrip("\n")
        log(event="stdin", line=line)
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            fail(None, PARSE_ERROR, "Parse error")
            continue
        if not isinstance(obj, dict):
            fail(None, INVALID_REQUEST, "Invalid Request")
            continue
        if "method" not in obj and "id" in obj and ("result" in obj or "error" in obj):
            OUTGOING.deliver(obj)  # a response to one of our requests: never queued behind a turn
        else:
            INBOX.put(obj)
    INBOX.put(EOF)


class Turn:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.cancelled = threading.Event()
        self.usage: dict[str, Any] | None = None  # the response's usage, when a directive set one


class Session:
    def __init__(self, session_id: str, cwd: str, history: list[dict[str, Any]]) -> None:
        self.id = session_id
        self.cwd = cwd
        self.history = history
        self.lock = threading.Lock()  # one turn at a time; later prompts queue
        self.turn: Turn | None = None
        self.mode = "default"
        self.model = "fast"
        self.brave = False
        self.cost = 0.0  # the cumulative cost the usage directive reports


MODES = [
    {"id": "default", "name": "Default", "description": "Prompts for dangerous operations"},
    {"id": "acceptEdits", "name": "Accept Edits", "description": "Auto-accept file edit operations"},
    {"id": "plan", "name": "Plan Mode", "description": "Planning mode, no actual tool execution"},
]


ELICIT_FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name", "minLength": 1, "maxLength": 40},
        "count": {"type": "integer", "minimum": 1, "maximum": 5, "default": 2},
        "color": {"type": "string", "enum": ["red", "green"]},
        "agree": {"type": "boolean", "title": "Agree"},
        "tags": {"type": "array", "items": {"anyOf": [{"const": "a", "title": "A"}, {"const": "b", "title": "B"}]}},
    },
    "required": ["name"],
}
# A form the specification does not allow: a nested object.
ELICIT_BAD = {"type": "object", "properties": {"x": {"type": "object", "properties": {}}}}


MODELS = [("fast", "Fast"), ("deep", "Deep")]


class Agent:
    def __init__(self, argv: list[str]) -> None:
        self.version = int(opt_value(argv, "--version", "1") or "1")
        self.load_cap = "--no-load" not in argv
        self.resume_cap = "--resume-cap" in argv
        self.fork_cap = "--fork-cap" in argv
        self.list_cap = "--no-list" not in argv
        self.auth_required = "--auth-required" in argv
        self.authed = not self.auth_required
        self.delay_init = float(opt_value(argv, "--delay-initialize", "0") or "0")
        self.exit_after_init = "--exit-after-initialize" in argv
        self.modes = "--modes" in argv
        self.config = "--config-options" in argv
        self.models = "--models" in argv
        self.text_only = "--text-only" in argv  # promptCapabilities: no images, no embedded resources
        self.state_dir = os.environ.get("FAKE_AGENT_STATE")
        self.sessions: dict[str, Session] = {}
        self.lock = threading.Lock()
        self.client_caps: dict[str, Any] = {}  # initialize's clientCapabilities (elicit checks them)

    # -- persistence
    def _path(self, sid: str) -> str | None:
        if not self.state_dir or not sid or "/" in sid or sid.startswith("."):
            return None
        return os.path.join(self.state_dir, f"{sid}.json")

    def _stored(self, sid: str) -> list[dict[str, Any]] | None:
        path = self._path(sid)
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                history: list[dict[str, Any]] = json.load(fh)
                return history
        return None

    def _save(self, s: Session) -> None:
        path = self._path(s.id)
        if path:
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(s.history, fh)

    def _record(self, s: Session, role: str, text: str) -> None:
        if text:
            s.history.append({"role": role, "text": text})
            self._save(s)

    def _find(self, sid: Any) -> tuple[Session | None, list[dict[str, Any]] | None]:
        """A session open in this process, or the stored history of a closed one."""
        if not isinstance(sid, str):
            return None, None
        with self.lock:
            s = self.sessions.get(sid)
        if s is not None:
            return s, s.history
        return None, self._stored(sid)

    def _open(self, sid: str, cwd: str, history: list[dict[str, Any]]) -> Session:
        with self.lock:
            s = self.sessions.get(sid)
            if s is None:
                s = self.sessions[sid] = Session(sid, cwd, history)
            s.cwd = cwd
            return s

    # -- output helpers
    @staticmethod
    def update(sid: str, upd: dict[str, Any]) -> None:
        out({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": upd}})

    def chunk(self, sid: str, text: str, mid: str, kind: str = "agent_message_chunk") -> None:
        self.update(sid, {"sessionUpdate": kind, "content": {"type": "text", "text": text}, "messageId": mid})

    def message(self, s: Session, text: str, *, chunks: int = 1) -> None:
        mid = f"msg_{uuid.uuid4().hex[:16]}"
        if chunks <= 1:
            self.chunk(s.id, text, mid)
        else:
            size = max(1, len(text) // chunks)
            parts = [text[i * size : (i + 1) * size] for i in range(chunks - 1)] + [text[(chunks - 1) * size :]]
            for part in parts:
                if part:
                    self.chunk(s.id, part, mid)
        self._record(s, "agent", text)

    # -- dispatch (main thread)
    def handle(self, msg: dict[str, Any]) -> None:
        method = msg.get("method")
        is_request = "id" in msg
        rid = msg.get("id")
        if not isinstance(method, str):
            if is_request:
                fail(rid, INVALID_REQUEST, "Invalid Request")
            else:
                log(event="invalid_message", msg=msg)
            return
        params = msg.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            if is_request:
                fail(rid, INVALID_PARAMS, "Invalid params", {"details": "params must be an object"})
            return
        if not is_request:
            if method == "session/cancel":
                self.cancel(params)
            else:
                log(event="ignored_notification", method=method)
            return
        handler = {
            "initialize": self.initialize,
            "authenticate": self.authenticate,
            "session/new": self.session_new,
            "session/load": self.session_load,
            "session/resume": self.session_resume,
            "session/fork": self.session_fork,
            "session/list": self.session_list,
            "session/prompt": self.session_prompt,
            "session/set_mode": self.session_set_mode if self.modes else None,
            "session/set_config_option": self.session_set_config_option if self.config else None,
            "session/set_model": self.session_set_model if self.models else None,
        }.get(method)
        if handler is None:
            fail(rid, METHOD_NOT_FOUND, "Method not found", {"method": method})
            return
        handler(rid, params)

    def initialize(self, rid: Any, params: dict[str, Any]) -> None:
        log(
            event="initialize",
            protocolVersion=params.get("protocolVersion"),
            clientCapabilities=params.get("clientCapabilities"),
            clientInfo=params.get("clientInfo"),
        )
        caps = params.get("clientCapabilities")
        self.client_caps = caps if isinstance(caps, dict) else {}
        session_caps: dict[str, Any] = {"list": {}} if self.list_cap else {}
        if self.resume_cap:
            session_caps["resume"] = {}
        if self.fork_cap:
            session_caps["fork"] = {}
        result = {
            "protocolVersion": self.version,
            "agentCapabilities": {
                "loadSession": self.load_cap,
                "promptCapabilities": {"image": not self.text_only, "embeddedContext": not self.text_only},
                "sessionCapabilities": session_caps,
            },
            "agentInfo": {"name": "fake-acp", "title": "Fake ACP", "version": "1.0"},
            "authMethods": [{"id": "fake-key", "name": "Fake key"}] if self.auth_required else [],
        }

        def answer() -> None:
            respond(rid, result)
            if self.exit_after_init:
                diag("exiting after initialize on purpose")
                hard_exit(4)

        if self.delay_init > 0 and not self.exit_after_init:
            threading.Timer(self.delay_init, answer).start()
        else:
            if self.delay_init > 0:
                time.sleep(self.delay_init)
            answer()

    def authenticate(self, rid: Any, params: dict[str, Any]) -> None:
        method_id = params.get("methodId")
        if method_id != "fake-key":
            fail(rid, INVALID_PARAMS, "Invalid params", {"details": f"unknown auth method {method_id!r}"})
            return
        self.authed = True
        respond(rid, {})

    def _setup_params_ok(self, rid: Any, params: dict[str, Any], *, need_session: bool) -> bool:
        if not self.authed:
            fail(rid, AUTH_REQUIRED, "Authentication required")
            return False
        cwd = params.get("cwd")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            fail(rid, INVALID_PARAMS, "Invalid params", {"details": "cwd must be an absolute path"})
            return False
        servers = params.get("mcpServers", [])
        if not isinstance(servers, list) or not all(mcp_server_ok(s) for s in servers):
            fail(rid, INVALID_PARAMS, "Invalid params", {"details": "mcpServers must be a list of McpServer"})
            return False
        if need_session and not isinstance(params.get("sessionId"), str):
            fail(rid, INVALID_PARAMS, "Invalid params", {"details": "sessionId must be a string"})
            return False
        return True

    def session_new(self, rid: Any, params: dict[str, Any]) -> None:
        if not self._setup_params_ok(rid, params, need_session=False):
            return
        if not isinstance(params.get("mcpServers"), list):
            fail(rid, INVALID_PARAMS, "Invalid params", {"details": "mcpServers is required"})
            return
        sid = f"acp-{uuid.uuid4().hex}"
        s = self._open(sid, params["cwd"], [])
        self._save(s)
        log(event="session_new", sessionId=sid, cwd=params["cwd"], mcpServers=params["mcpServers"])
        respond(rid, {"sessionId": sid, **self._modes(s)})

    def _modes(self, s: Session) -> dict[str, Any]:
        """What a session/new, load or resume answer says of the session's settings."""
        out: dict[str, Any] = {}
        if self.modes:
            out["modes"] = {"currentModeId": s.mode, "availableModes": MODES}
        if self.config:
            out["configOptions"] = self._config_options(s)
        if self.models:
            out["models"] = {
                "currentModelId": s.model,
                "availableModels": [{"modelId": m, "name": n, "description": None} for m, n in MODELS],
            }
        return out

    def _boolean_ok(self) -> bool:
        """Whether the client advertised boolean config options (the spec: never send one
        otherwise)."""
        session = self.client_caps.get("session") if isinstance(self.client_caps, dict) else None
        config = session.get("configOptions") if isinstance(session, dict) else None
        return isinstance(config, dict) and isinstance(config.get("boolean"), dict)

    def _config_options(self, s: Session) -> list[dict[str, Any]]:
        options: list[dict[str, Any]] = [
            {
                "id": "mode",
                "name": "Mode",
                "category": "mode",
                "type": "select",
                "currentValue": s.mode,
                "options": [{"value": m["id"], "name": m["name"]} for m in MODES],
            },
            {
                "id": "model",
                "name": "Model",
                "category": "model",
                "type": "select",
                "currentValue": s.model,
                "options": [{"group": "all", "name": "All", "options": [{"value": m, "name": n} for m, n in MODELS]}],
            },
        ]
        if self._boolean_ok():
            options.append({"id": "brave", "name": "Brave", "type": "boolean", "currentValue": s.brave})
        return options

    def _set_option(self, s: Session, config_id: str, value: Any, typed_boolean: bool) -> str | None:
        """Set one option as the SDK's models validate it; the reason it is refused, or None."""
        if config_id == "brave" and self._boolean_ok():
            if not typed_boolean or not isinstance(value, bool):
                return "brave is a boolean option: send type boolean and a boolean value"
            s.brave = value
            return None
        values = {"mode": [m["id"] for m in MODES], "model": [m for m, _ in MODELS]}.get(config_id)
        if values is None:
            return f"Unknown config option: {config_id}"
        if typed_boolean or not isinstance(value, str) or value not in values:
            return f"Invalid value for config option {config_id}: {value}"
        if config_id == "mode":
            s.mode = value
        else:
            s.model = value
        return None

    def session_set_config_option(self, rid: Any, params: dict[str, Any]) -> None:
        s, _ = self._find(params.get("sessionId"))
        config_id, value, typ = params.get("configId"), params.get("value"), params.get("type")
        if not isinstance(config_id, str) or not isinstance(value, (str, bool)) or typ not in (None, "boolean"):
            fail(rid, INVALID_PARAMS, "Invalid params", {"details": "configId and value are required"})
            return
        if s is None:
            fail(rid, INVALID_PARAMS, "Invalid params", {"details": "Session not found"})
            return
        refused = self._set_option(s, config_id, value, typ == "boolean")
        log(event="set_config_option", sessionId=s.id, configId=config_id, value=value, refused=refused)
        if refused is not None:
            fail(rid, INVALID_PARAMS, "Invalid params", {"details": refused})
            return
        respond(rid, {"configOptions": self._config_options(s)})

    def session_set_model(self, rid: Any, params: dict[str, Any]) -> None:
        s, _ = self._find(params.get("sessionId"))
        model = params.get("modelId")
        if s is None or not isinstance(model, str):
            fail(rid, INVALID_PARAMS, "Invalid params", {"details": "sessionId and modelId are required"})
        elif model not in [m for m, _ in MODELS]:
            fail(rid, INVALID_PARAMS, "Invalid params", {"details": f"Unknown model: {model}"})
        else:
            s.model = model
            log(event="set_model", sessionId=s.id, modelId=model)
            respond(rid, {})

    def session_set_mode(self, rid: Any, params: dict[str, Any]) -> None:
        s, _ = self._find(params.get("sessionId"))
        mode = params.get("modeId")
        if s is None:
            fail(rid, INTERNAL_ERROR, "Internal error", {"details": "Session not found"})
        elif not isinstance(mode, str) or mode not in {m["id"] for m in MODES}:
            fail(rid, INTERNAL_ERROR, "Internal error", {"details": "Invalid Mode"})
        else:
            s.mode = mode
            log(event="set_mode", sessionId=s.id, modeId=mode)
            respond(rid, {})

    def session_load(self, rid: Any, params: dict[str, Any]) -> None:
        if not self.load_cap:
            fail(rid, METHOD_NOT_FOUND, "Method not found", {"method": "session/load"})
            return
        if not self._setup_params_ok(rid, params, need_session=True):
            return
        sid = params["sessionId"]
        _, history = self._find(sid)
        if history is None:
            fail(rid, NOT_FOUND, "Resource not found", {"sessionId": sid})
            return
        s = self._open(sid, params["cwd"], history)
        for entry in list(s.history):
            kind = "user_message_chunk" if entry.get("role") == "user" else "agent_message_chunk"
            self.chunk(sid, str(entry.get("text", "")), uuid.uuid4().hex, kind)
        log(event="session_load", sessionId=sid, replayed=len(s.history))
        respond(rid, self._modes(s))

    def session_resume(self, rid: Any, params: dict[str, Any]) -> None:
        if not self.resume_cap:
            fail(rid, METHOD_NOT_FOUND, "Method not found", {"method": "session/resume"})
            return
        if not self._setup_params_ok(rid, params, need_session=True):
            return
        sid = params["sessionId"]
        _, history = self._find(sid)
        if history is None:
            fail(rid, NOT_FOUND, "Resource not found", {"sessionId": sid})
            return
        s = self._open(sid, params["cwd"], history)
        log(event="session_resume", sessionId=sid)
        respond(rid, self._modes(s))

    def session_fork(self, rid: Any, params: dict[str, Any]) -> None:
        """ACP's unstable session/fork (ForkSessionRequest: sessionId and cwd required,
        mcpServers, additionalDirectories and _meta optional, nothing else): the source's
        history copied into a new session, which is open at once (ForkSessionResponse:
        sessionId, and the session's settings as session/new gives them)."""
        if not self.fork_cap:
            fail(rid, METHOD_NOT_FOUND, "Method not found", {"method": "session/fork"})
            return
        unknown = sorted(set(params) - {"sessionId", "cwd", "mcpServers", "additionalDirectories", "_meta"})
        if unknown:
            fail(rid, INVALID_PARAMS, "Invalid params", {"details": f"unknown field {unknown[0]}"})
            return
        if not self._setup_params_ok(rid, params, need_session=True):
            return
        source = params["sessionId"]
        _, history = self._find(source)
        if history is None:
            fail(rid, NOT_FOUND, "Resource not found", {"sessionId": source})
            return
        sid = f"acp-{uuid.uuid4().hex}"
        s = self._open(sid, params["cwd"], [dict(e) for e in history])
        self._save(s)
        log(event="session_fork", source=source, sessionId=sid, copied=len(history))
        respond(rid, {"sessionId": sid, **self._modes(s)})

    def session_list(self, rid: Any, params: dict[str, Any]) -> None:
        if not self.list_cap:
            fail(rid, METHOD_NOT_FOUND, "Method not found", {"method": "session/list"})
            return
        found: dict[str, dict[str, Any]] = {}
        if self.state_dir and os.path.isdir(self.state_dir):
            for name in sorted(os.listdir(self.state_dir)):
                if name.endswith(".json"):
                    sid = name[:-5]
                    history = self._stored(sid) or []
                    mtime = os.stat(os.path.join(self.state_dir, name)).st_mtime
                    updated = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mtime))
                    found[sid] = {"sessionId": sid, "cwd": os.getcwd(), "updatedAt": updated, "history": history}
        with self.lock:
            for s in self.sessions.values():
                found[s.id] = {"sessionId": s.id, "cwd": s.cwd, "history": s.history}
        sessions = []
        for info in found.values():
            history = info.pop("history")
            if params.get("cwd") and info["cwd"] != params["cwd"]:
                continue
            title = next((e.get("text") for e in history if e.get("role") == "user"), None)
            if title:
                info["title"] = title[:80]
            sessions.append(info)
        respond(rid, {"sessions": sessions, "nextCursor": None})

    def cancel(self, params: dict[str, Any]) -> None:
        s, _ = self._find(params.get("sessionId"))
        log(event="cancel", sessionId=params.get("sessionId"), running=bool(s and s.turn))
        if s is not None and s.turn is not None:
            s.turn.cancelled.set()

    def session_prompt(self, rid: Any, params: dict[str, Any]) -> None:
        sid = params.get("sessionId")
        s, _ = self._find(sid)
        if s is None:
            fail(rid, INTERNAL_ERROR, "Internal error", {"details": "Session not found"})
            return
        blocks = params.get("prompt")
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            fail(rid, INVALID_PARAMS, "Invalid params", {"details": "prompt must be a list of content blocks"})
            return
        threading.Thread(target=self._run_turn, args=(s, rid, blocks), daemon=True).start()

    # -- turns (worker threads)
    def _run_turn(self, s: Session, rid: Any, blocks: list[dict[str, Any]]) -> None:
        with s.lock:
            turn = s.turn = Turn(s.id)
            try:
                text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
                kinds = [str(b.get("type")) for b in blocks if b.get("type") != "text"]
                self._record(s, "user", text)
                word = (text.split() or [""])[0].lower()
                handler = getattr(self, f"do_{word}", None)
                if handler is None:
                    stop = self.do_echo(s, turn, text, kinds)
                else:
                    stop = handler(s, turn, text, kinds)
                respond(rid, {"stopReason": stop, **({"usage": turn.usage} if turn.usage else {})})
            except Exception as exc:  # a bug in the fake must not look like a hang
                diag(f"turn failed: {exc!r}")
                fail(rid, INTERNAL_ERROR, "Internal error", {"details": repr(exc)})
            finally:
                s.turn = None

    def do_echo(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        extra = f" [{','.join(kinds)}]" if kinds else ""
        reply = f"echo: {text}{extra}"
        self.message(s, reply, chunks=3)
        self.update(s.id, {"sessionUpdate": "usage_update", "used": 10 + len(reply), "size": 1000000})
        return "end_turn"

    def do_think(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        self.chunk(s.id, "Let me think about that.", f"msg_{uuid.uuid4().hex[:16]}", "agent_thought_chunk")
        self.message(s, "thought about it")
        return "end_turn"

    def do_tool(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        tid = f"call_{uuid.uuid4().hex[:12]}"
        self.update(
            s.id,
            {
                "sessionUpdate": "tool_call",
                "toolCallId": tid,
                "title": "Run echo",
                "kind": "execute",
                "status": "pending",
                "rawInput": {"command": "echo hi"},
            },
        )
        self.update(s.id, {"sessionUpdate": "tool_call_update", "toolCallId": tid, "status": "in_progress"})
        self.update(
            s.id,
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": tid,
                "status": "completed",
                "content": [{"type": "content", "content": {"type": "text", "text": "hi"}}],
                "rawOutput": "hi",
            },
        )
        self.message(s, "tool done")
        return "end_turn"

    def do_plan(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        self.update(
            s.id,
            {
                "sessionUpdate": "plan",
                "entries": [
                    {"content": "Read the code", "priority": "high", "status": "completed"},
                    {"content": "Write the fix", "priority": "medium", "status": "pending"},
                ],
            },
        )
        return "end_turn"

    def do_ask(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        command = text.split(None, 1)[1].strip() if len(text.split(None, 1)) > 1 else "touch x"
        tid = f"call_{uuid.uuid4().hex[:12]}"
        tool = {"toolCallId": tid, "title": command, "kind": "execute", "rawInput": {"command": command}}
        self.update(s.id, {"sessionUpdate": "tool_call", **tool, "status": "pending"})
        _, event, box = OUTGOING.send(
            "session/request_permission",
            {
                "sessionId": s.id,
                "toolCall": tool,
                "options": [
                    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "allow_always", "name": "Always", "kind": "allow_always"},
                    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
                ],
            },
        )
        cancel_seen: float | None = None
        while not event.wait(0.05):
            if turn.cancelled.is_set() and cancel_seen is None:
                cancel_seen = time.monotonic()
            if cancel_seen is not None and time.monotonic() - cancel_seen > 5:
                # The client must answer a pending permission with "cancelled" after session/cancel.
                log(event="permission_unanswered_after_cancel")
                diag("client never answered the permission request after session/cancel")
                break
        resp = box[0] if box else {}
        outcome = (resp.get("result") or {}).get("outcome") if isinstance(resp.get("result"), dict) else None
        if isinstance(outcome, dict) and outcome.get("outcome") == "selected":
            choice = str(outcome.get("optionId"))
        elif "error" in resp:
            choice = f"error {resp['error'].get('code')}"
        else:
            choice = "cancelled"
        cancelled = choice == "cancelled" or turn.cancelled.is_set()
        ok = choice.startswith("allow") and not cancelled
        self.update(
            s.id,
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": tid,
                "status": "completed" if ok else "failed",
                "rawOutput": "done" if ok else f"not run: {choice}",
            },
        )
        self.message(s, f"permission: {choice}")
        return "cancelled" if cancelled else "end_turn"

    def do_elicit(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        """elicit [form|url|bad]: elicitation/create, only in a mode the client advertised
        (the specification forbids any other); a chunk says what came back."""
        mode = (text.split()[1:] or ["form"])[0]
        cap = (self.client_caps.get("elicitation") or {}).get("url" if mode == "url" else "form")
        if not isinstance(cap, dict):
            self.message(s, f"elicit: {mode} not advertised")
            return "end_turn"
        params: dict[str, Any] = {"sessionId": s.id, "mode": "url" if mode == "url" else "form"}
        if mode == "url":
            params.update(elicitationId="fake-1", url="https://example.com/connect?e=fake-1", message="Sign in")
        else:
            params.update(message="Tell me about it", requestedSchema=ELICIT_BAD if mode == "bad" else ELICIT_FORM)
        _, event, box = OUTGOING.send("elicitation/create", params)
        while not event.wait(0.05):
            if turn.cancelled.is_set() and not event.wait(5):
                diag("client never answered the elicitation after session/cancel")
                return "cancelled"
        resp = box[0]
        result = resp.get("result")
        if "error" in resp:
            self.message(s, f"elicit: error {resp['error'].get('code')}")
        elif not isinstance(result, dict) or result.get("action") not in ("accept", "decline", "cancel"):
            diag(f"invalid elicitation response {result!r}")  # what the SDK's validation refuses
            self.message(s, "elicit: invalid response")
        else:
            content = result.get("content")
            self.message(s, f"elicit: {result['action']} {json.dumps(content, sort_keys=True)}")
            if result["action"] == "cancel":
                # A client cancels what is pending on session/cancel, which it sends first; the
                # notification may still be queued behind this answer (read on another thread).
                turn.cancelled.wait(2)
        return "cancelled" if turn.cancelled.is_set() else "end_turn"

    def _fs_report(self, label: str, resp: dict[str, Any], ok_text: str) -> str:
        if "error" in resp and isinstance(resp["error"], dict):
            return f"{label} error {resp['error'].get('code')}: {resp['error'].get('message')}"
        return f"{label}: {ok_text}"

    def do_read(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        parts = text.split(None, 1)
        path = parts[1].strip() if len(parts) > 1 else ""
        resp = OUTGOING.call("fs/read_text_file", {"sessionId": s.id, "path": path})
        result = resp.get("result")
        content = result.get("content") if isinstance(result, dict) else None
        self.message(s, self._fs_report("read", resp, str(content)))
        return "end_turn"

    def do_write(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        parts = text.split(None, 2)
        path = parts[1] if len(parts) > 1 else ""
        content = parts[2] if len(parts) > 2 else ""
        resp = OUTGOING.call("fs/write_text_file", {"sessionId": s.id, "path": path, "content": content})
        self.message(s, self._fs_report("write", resp, "ok"))
        return "end_turn"

    def do_slow(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        mid = f"msg_{uuid.uuid4().hex[:16]}"
        sent = ""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if turn.cancelled.wait(0.05):
                self._record(s, "agent", sent)
                return "cancelled"
            self.chunk(s.id, "tick ", mid)
            sent += "tick "
        self.chunk(s.id, "slow done", mid)
        self._record(s, "agent", sent + "slow done")
        return "end_turn"

    def do_hang(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        self.message(s, "hanging")
        threading.Event().wait()  # forever; the process exits on stdin EOF
        return "end_turn"

    def do_crash(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        self.message(s, "about to crash")
        diag("crashing on purpose")
        hard_exit(3)
        return "end_turn"

    def do_unknown(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        resp = OUTGOING.call("_fake/whatever", {"sessionId": s.id, "x": 1})
        if "error" in resp and isinstance(resp["error"], dict):
            self.message(s, f"unknown: error {resp['error'].get('code')}")
        else:
            self.message(s, f"unknown: result {json.dumps(resp.get('result'))}")
        return "end_turn"

    def do_garbage(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        raw_out("this is not json\n")
        out({"jsonrpc": "2.0"})
        return self.do_echo(s, turn, text, kinds)

    def do_mode(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        mode = text.split(maxsplit=1)[1].strip() if len(text.split(maxsplit=1)) > 1 else ""
        if not self.modes or mode not in {m["id"] for m in MODES}:
            self.message(s, f"mode: unknown {mode}")
            return "end_turn"
        s.mode = mode
        self.update(s.id, {"sessionUpdate": "current_mode_update", "currentModeId": mode})
        self.message(s, f"mode: {mode}")
        return "end_turn"

    def do_recall(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        said = [str(e.get("text")) for e in s.history[:-1] if e.get("role") == "user"]
        self.message(s, "history: " + " | ".join(said))
        return "end_turn"

    def do_whatmode(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        self.message(s, f"mode: {s.mode}")
        return "end_turn"

    def do_usage(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        self.message(s, "counted")
        s.cost += 0.25
        cost = {"amount": s.cost, "currency": "USD"}
        self.update(s.id, {"sessionUpdate": "usage_update", "used": 1200, "size": 200000, "cost": cost})
        turn.usage = {"inputTokens": 10, "outputTokens": 5, "cachedReadTokens": 2, "totalTokens": 17}
        return "end_turn"

    def do_title(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        title = text.split(maxsplit=1)[1].strip() if len(text.split(maxsplit=1)) > 1 else None
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.update(s.id, {"sessionUpdate": "session_info_update", "title": title, "updatedAt": stamp})
        self.message(s, f"title: {title}")
        return "end_turn"

    def do_config(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        words = text.split()
        config_id, value = [*words[1:3], "", ""][:2]
        if not self.config or self._set_option(s, config_id, value, False) is not None:
            self.message(s, f"config: unknown {config_id}")
            return "end_turn"
        self.update(s.id, {"sessionUpdate": "config_option_update", "configOptions": self._config_options(s)})
        self.message(s, f"config: {config_id}={value}")
        return "end_turn"

    def do_whatconfig(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        self.message(s, f"config: model={s.model} mode={s.mode}")
        return "end_turn"

    def do_twoupdates(self, s: Session, turn: Turn, text: str, kinds: list[str]) -> str:
        self.update(
            "acp-not-this-session",
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "stray"},
                "messageId": "msg_stray",
            },
        )
        return self.do_echo(s, turn, text, kinds)

    def run(self) -> None:
        while True:
            msg = INBOX.get()
            if msg is EOF:
                return
            try:
                self.handle(msg)
            except Exception as exc:
                diag(f"handler failed: {exc!r}")
                if "id" in msg:
                    fail(msg.get("id"), INTERNAL_ERROR, "Internal error", {"details": repr(exc)})


def main() -> None:
    argv = sys.argv[1:]
    log(event="start", argv=sys.argv, env=dict(os.environ), cwd=os.getcwd(), pid=os.getpid())
    if "--exit-at-start" in argv:
        diag("refusing to start")
        sys.exit(5)
    agent = Agent(argv)
    threading.Thread(target=reader, daemon=True).start()
    agent.run()
    hard_exit(0)


if __name__ == "__main__":
    main()
