"""Claude Code / CodeBuddy / Qwen Code ``stream-json`` dialect (docs/api.md §7.1).

Decoding maps every stdout line onto the normalized kinds of docs/api.md §6.3. Parsing is
lenient by design (docs/api.md §7): unknown ``type``/``subtype`` values become
``agent.other``, unknown keys are ignored, a missing field is never assumed present.
A line that is not a JSON object becomes a ``diagnostic``; nothing here raises on agent
output.

The awp-jsonl dialect (``awp_jsonl.py``) is a subset with a few extras: a subclass that
changes the handler table and the decode shortcuts, nothing else.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import orjson

from bridge.protocols import jsonrpc
from bridge.protocols import stream_json_fast as fast
from bridge.protocols import stream_json_map as smap
from bridge.protocols.codec import AgentRequest, Decoded, RawAnswer
from bridge.protocols.events import REDACTED, SECRET_KEY_RE, Event, mark_interrupted
from bridge.protocols.jsonline import dumps, parse_object
from bridge.protocols.stream_json_elicit import ElicitationAnswers, with_elicitation

PROTOCOL = "stream-json"

# Host launch flags (docs/api.md §2.2). Claude Code and CodeBuddy require ``--verbose``
# with ``--output-format stream-json``; Qwen Code refuses it.
LAUNCH_FLAGS = ("--output-format", "stream-json", "--input-format", "stream-json", "--verbose")
QUIET_LAUNCH_FLAGS = LAUNCH_FLAGS[:4]

# The stream-json CLIs whose flags are known, by the name a command or an npm package
# directory goes by; each named CLI's own ``--help`` was checked (docs/agents.md).
_CLI_NAMES = {
    "claude": "claude",
    "claude.exe": "claude",
    "claude-code": "claude",
    "codebuddy": "codebuddy",
    "cbc": "codebuddy",
    "codebuddy-code": "codebuddy",
    "qwen": "qwen",
    "qwen-code": "qwen",
}
_FLAGS_BY_CLI = {"claude": LAUNCH_FLAGS, "codebuddy": LAUNCH_FLAGS, "qwen": QUIET_LAUNCH_FLAGS}
# Interpreters that run a CLI given as their first argument (``node …/cli-entry.js``).
_INTERPRETERS = re.compile(r"(node|nodejs|bun|deno)(\d+(\.\d+)*)?(\.exe)?")


def stream_json_cli(executable: str, args: Sequence[str] = ()) -> str | None:
    """Which known stream-json CLI a profile runs: ``claude``, ``codebuddy``, ``qwen``, or
    None. Pure string work on the path (nothing is read from disk): the command's own name
    (``/usr/bin/qwen``), else the npm package the file lies in
    (``…/node_modules/@qwen-code/qwen-code/cli-entry.js``, the real path of an npm symlink);
    for an interpreter (``node``), the same for its first argument, the script."""
    target = executable
    if _INTERPRETERS.fullmatch(executable.replace("\\", "/").rsplit("/", 1)[-1]) and args:
        target = args[0]
    parts = [p for p in target.replace("\\", "/").split("/") if p]
    if not parts:
        return None
    if parts[-1] in _CLI_NAMES:
        return _CLI_NAMES[parts[-1]]
    package = _npm_package(parts)
    # claude-code-linux-x64 and the like: a platform package of the CLI
    for name, cli in _CLI_NAMES.items():
        if package and (package == name or package.startswith((name + "-linux", name + "-darwin"))):
            return cli
    return None


def _npm_package(parts: list[str]) -> str | None:
    """The npm package directory right below the last ``node_modules`` of a path."""
    if "node_modules" not in parts:
        return None
    rest = parts[len(parts) - parts[::-1].index("node_modules") :]
    if rest and rest[0].startswith("@") and len(rest) > 1:
        return rest[1]
    return rest[0] if rest else None


def launch_flags_for(executable: str, args: Sequence[str] = ()) -> tuple[str, ...]:
    """The stream-json compatibility flags for the CLI a profile runs (docs/api.md §2.2):
    ``--verbose`` for Claude Code and CodeBuddy (they refuse stream-json output without
    it), none for Qwen Code (which refuses the unknown flag). An unknown CLI gets the
    Claude Code flags: every stream-json CLI this bridge was written for but Qwen Code
    mirrors Claude Code's command line, and it is what the bridge always passed before;
    a profile whose CLI differs states its flags with ``protocol_flags``."""
    return _FLAGS_BY_CLI.get(stream_json_cli(executable, args) or "", LAUNCH_FLAGS)


def permission_prompt_flags_for(executable: str, args: Sequence[str] = ()) -> tuple[str, ...]:
    """What makes the CLI send ``can_use_tool`` control requests to the bridge:
    ``--permission-prompt-tool stdio`` for Claude Code, CodeBuddy and unknown CLIs;
    nothing for Qwen Code, which refuses the flag (``Unknown arguments:
    permission-prompt-tool``, 0.24.4) and asks once it got an ``initialize`` request
    (:attr:`StreamJsonCodec.initialize`)."""
    if stream_json_cli(executable, args) == "qwen":
        return ()
    return ("--permission-prompt-tool", "stdio")


# CLIs that enable their control protocol (can_use_tool, interrupt) only when the host's
# first stdin line is an ``initialize`` control request, as the agent SDKs send: Qwen Code
# (0.24.4: without it a tool call that needs approval waits for ever and an interrupt
# ends the process; an initialize after the first prompt is ignored).
INITIALIZE_FIRST = frozenset({"qwen"})

_CANCELLED_TERMINAL_REASONS = ("aborted_streaming", "aborted_tools")
_MAX_SENT_REQUESTS = 64


# The secret keys of events.py, plus the account details an initialize response carries.
_SECRET_KEY = re.compile(SECRET_KEY_RE.pattern + r"|(?i:email|organi[sz]ation|account)")


def redact_secrets(value: Any, inside: bool = False, depth: int = 0) -> Any:
    """Replace every scalar under a secret-looking key (at any depth below it) with
    "[redacted]" (issue #5 item 5: the initialize response carries account tokens, e-mail
    and organisation ids)."""
    if depth > 64:
        return REDACTED
    if isinstance(value, dict):
        return {k: redact_secrets(v, inside or bool(_SECRET_KEY.search(k)), depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_secrets(v, inside, depth + 1) for v in value]
    return REDACTED if inside and value is not None else value


def _s(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _d(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _truncate(text: str, limit: int = 4096) -> str:
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more chars]"


_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


def spawn_option_flags(options: Mapping[str, Any], prompt_flags: Sequence[str]) -> list[str]:
    """Claude Code's spawn options as flags (docs/configuration.md, per-thread options);
    ``prompt_flags``: what sends this CLI's permission prompts to the bridge."""
    extra: list[str] = []
    if options.get("permission_prompts"):
        # can_use_tool control requests come to us, and from us to clients (docs/api.md §6.4)
        extra += prompt_flags
    if options.get("permission_mode"):
        extra += ["--permission-mode", options["permission_mode"]]
    if options.get("allowed_tools"):
        extra += ["--allowedTools", ",".join(options["allowed_tools"])]
    if options.get("disallowed_tools"):
        extra += ["--disallowedTools", ",".join(options["disallowed_tools"])]
    if options.get("system_prompt") is not None:
        extra += ["--system-prompt", options["system_prompt"]]
    return extra


Handler = Callable[["StreamJsonCodec", dict[str, Any], str, Decoded], list[Event]]


class StreamJsonCodec(ElicitationAnswers):
    """Sans-I/O codec for one agent process. Keeps only the little state the dialect needs
    (the streaming content block types, so that a ``tool_use`` block start is recognised).

    A variant (awp-jsonl) changes class attributes only: its handler table, the line
    decode shortcuts (by line type) and which top-level types are streaming deltas."""

    protocol = PROTOCOL
    resume_on_argv = True  # --resume=ID, see resume_args (docs/api.md §2.2)
    requires_model = False
    ready = True  # no handshake: prompts may be written as soon as the process runs
    cancel_resolves_permissions = False  # the agent withdraws its own (control_cancel_request)
    # The decode shortcut of each line type, and how such lines begin.
    _fast_handlers: ClassVar[dict[str, fast.FastHandler]] = fast.STREAM_JSON
    _fast_prefixes: ClassVar[tuple[bytes, ...]] = fast.prefixes(fast.STREAM_JSON)
    _toplevel_deltas: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self, *, executable: str = "", args: Sequence[str] = (), protocol_flags: Sequence[str] | None = None
    ) -> None:
        cli = stream_json_cli(executable, args)
        self._flags = tuple(protocol_flags) if protocol_flags is not None else launch_flags_for(executable, args)
        self._prompt_flags = permission_prompt_flags_for(executable, args)
        # Send an initialize control request before anything else (INITIALIZE_FIRST).
        self.initialize = cli in INITIALIZE_FIRST
        self._req_counter = 0
        # The control requests written to the agent and not answered yet: id → subtype, so
        # that an answer names what it answers (agent.reply ``op``). Bounded.
        self._sent: dict[str, str] = {}
        self._spent = 0.0  # the process's running total when its last turn ended (smap.result_usage)

    def launch_flags(self, options: Mapping[str, Any]) -> list[str]:
        return [*self._flags, *spawn_option_flags(options, self._prompt_flags)]

    def model_args(self, model: str) -> list[str]:
        # One argument with "=", as Claude Code, CodeBuddy and Qwen Code take it: with the
        # validation (no leading "-"), a model id can never be read as a flag.
        return [f"--model={model}"]

    def resume_args(self, session_id: str) -> list[str]:
        # One argument with "=", as Claude Code takes it: an id can never be read as a flag.
        return [f"--resume={session_id}"]

    def prompts_to_clients(self, options: Mapping[str, Any]) -> bool:
        return bool(options.get("permission_prompts"))

    # ------------------------------------------------------------------ decoding

    def decode(self, line: bytes) -> Decoded:
        """Decode one stdout line (without its newline).

        The lines a turn is mostly made of (``stream_event`` and ``assistant``; awp-jsonl:
        its top-level ``content_block_delta`` and ``assistant`` lines) take an exact
        shortcut (stream_json_fast.py, issue #8 and #22): a line that begins as such lines
        do is parsed once by orjson and mapped by the shortcut for the type it holds, which
        returns what :meth:`_decode_slow` would, or None. Every other line, one orjson
        refuses, and one a shortcut declines decode as :meth:`_decode_slow` does;
        tests/protocols/test_codec_fast_path.py checks that the two always agree.
        """
        return self.decode_many((line,))[0]

    def decode_many(self, lines: Sequence[bytes]) -> list[Decoded]:
        """What :meth:`decode` makes of each line, with the lines a shortcut decodes back to
        back merged into one :class:`Decoded` (issue #22: a flood's read is hundreds of
        them). Exact for :meth:`~bridge.sessions.output.AgentOutput.agent_output`, which
        takes each Decoded's events, then its replies, then its control items, in order:
        such lines have neither."""
        out: list[Decoded] = []
        run: list[Event] | None = None  # the events of the Decoded being merged into
        prefixes, handlers = self._fast_prefixes, self._fast_handlers
        for line in lines:
            events: list[Event] | None = None
            if line.startswith(prefixes):
                # Subscripts, not .get(), in the shortcuts: on values straight from orjson,
                # x["k"] succeeds only when x is a dict holding "k"; any other shape takes
                # the generic path.
                try:
                    obj = _loads(line)
                    shortcut = handlers.get(obj["type"])  # (the line begins "{": a dict)
                    if shortcut is not None:
                        events = shortcut(self, obj, line)
                except (_JSONDecodeError, KeyError, TypeError):
                    events = None
            if events is None:
                out.append(self._decode_slow(line))
                run = None
            elif run is None:
                run = events
                out.append(Decoded(run, [], []))
            else:
                run += events
        return out

    def _decode_slow(self, line: bytes) -> Decoded:
        """The generic decoder: :func:`parse_object`, then dispatch on ``type``. What
        :meth:`decode` must always agree with."""
        obj, text, problem = parse_object(line)
        if obj is not None and obj.get("type") == "control_response":
            cleaned = redact_secrets(obj)
            if cleaned != obj:  # the transcript and clients get the redacted line instead
                obj, text = cleaned, dumps(cleaned)
        if obj is None:
            return Decoded(
                [Event("agent", "diagnostic", {"stream": "protocol", "text": f"{problem}: {_truncate(text, 512)}"})]
            )
        out = Decoded()
        events = self._map(obj, text, out)
        if not events:
            events = [Event("agent", "agent.other", {}, text)]
        events[0].relay = True
        out.events = events
        return out

    def _map(self, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
        handler = self._handlers.get(_s(obj.get("type")) or "")
        if handler is None:
            return []
        return handler(self, obj, raw, out)

    def _ev(self, kind: str, data: dict[str, Any], raw: str) -> Event:
        return Event("agent", kind, data, raw)

    def _system(self, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
        sub = _s(obj.get("subtype")) or ""
        if sub in ("init", "session_start"):
            data: dict[str, Any] = {
                "native_session_id": _s(obj.get("session_id")),
                "model": _s(obj.get("model")),
            }
            if isinstance(obj.get("tools"), list):
                data["tools"] = [t for t in obj["tools"] if isinstance(t, str)]
            return [self._ev("session.started", data, raw)]
        status = smap.system_status(sub, obj)
        if status is not None:
            return [self._ev("agent.status", status, raw)]
        if sub in smap.NOTICE_SYSTEM:
            return [self._ev("notice", smap.notice(sub, obj), raw)]
        if sub in ("hook_started", "hook_progress", "hook_response"):
            data = {
                "hook_event": _s(obj.get("hook_event")),
                "hook_name": _s(obj.get("hook_name")),
                "phase": sub.removeprefix("hook_"),
            }
            if sub == "hook_response":
                data["outcome"] = _s(obj.get("outcome"))
            return [self._ev("hook", data, raw)]
        if sub in ("task_started", "task_progress", "task_updated", "task_notification"):
            return [self._ev("task.updated", self._task(sub, obj), raw)]
        return []

    @staticmethod
    def _task(sub: str, obj: dict[str, Any]) -> dict[str, Any]:
        patch = _d(obj.get("patch"))
        status = _s(obj.get("status")) or _s(patch.get("status"))
        if status is None:
            status = "running" if sub in ("task_started", "task_progress") else None
        data: dict[str, Any] = {
            "task_id": _s(obj.get("task_id")),
            "task_type": _s(obj.get("task_type")) or _s(obj.get("subagent_type")),
            "status": status,
            "event": sub,
        }
        for key in ("description", "summary", "tool_use_id"):
            val = _s(obj.get(key)) or _s(patch.get(key))
            if val is not None:
                data[key] = val
        if "workflow_progress" in obj:
            data["workflow_progress"] = obj["workflow_progress"]
        return data

    def _assistant(self, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
        msg = _d(obj.get("message"))
        mid = _s(msg.get("id"))
        events: list[Event] = []
        content = msg.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for block in _l(content):
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "text" and isinstance(block.get("text"), str):
                data: dict[str, Any] = {"role": "assistant", "text": block["text"], "message_id": mid}
                if obj.get("error") is not None or msg.get("model") == "<synthetic>":
                    data["error"] = _s(obj.get("error")) or "unknown"
                events.append(self._ev("message", data, raw))
            elif btype == "thinking" and isinstance(block.get("thinking"), str):
                events.append(
                    self._ev(
                        "message",
                        {"role": "assistant", "text": block["thinking"], "channel": "thought", "message_id": mid},
                        raw,
                    )
                )
            elif btype in ("tool_use", "server_tool_use"):
                events.append(
                    self._ev(
                        "tool.call",
                        {
                            "tool_call_id": _s(block.get("id")),
                            "name": _s(block.get("name")),
                            "input": block.get("input"),
                            "parent_tool_use_id": _s(obj.get("parent_tool_use_id")),
                        },
                        raw,
                    )
                )
        return events

    def _user(self, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
        msg = _d(obj.get("message"))
        content = msg.get("content")
        events = [] if obj.get("isReplay") else self._tool_results(content, raw)
        if not events and isinstance(content, (str, list)):
            data = smap.user_message(obj, content)
            if data is not None:
                events.append(self._ev("message", data, raw))
        return events

    def _tool_results(self, content: Any, raw: str) -> list[Event]:
        events: list[Event] = []
        for block in _l(content):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                events.append(
                    self._ev(
                        "tool.result",
                        {
                            "tool_call_id": _s(block.get("tool_use_id")),
                            "output": block.get("content") if block.get("content") is not None else "",
                            "is_error": bool(block.get("is_error")),
                        },
                        raw,
                    )
                )
        return events

    def _stream_event(self, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
        return self._raw_stream(_d(obj.get("event")), raw)

    def _raw_stream(self, ev: dict[str, Any], raw: str) -> list[Event]:
        etype = ev.get("type")
        if etype == "content_block_delta":
            delta = _d(ev.get("delta"))
            dtype = delta.get("type")
            if dtype == "text_delta" and isinstance(delta.get("text"), str):
                return [self._ev("message.delta", {"text": delta["text"], "channel": "text"}, raw)]
            if dtype == "thinking_delta" and isinstance(delta.get("thinking"), str):
                return [self._ev("message.delta", {"text": delta["thinking"], "channel": "thought"}, raw)]
        structure = smap.stream_structure(ev)
        if structure is not None:
            return [self._ev("message.stream", structure, raw)]
        other = smap.other_stream_event(ev)
        return [] if other is None else [self._ev(other[0], other[1], raw)]

    def _result(self, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
        sub = _s(obj.get("subtype")) or ""
        is_error = bool(obj.get("is_error")) or (sub not in ("", "success"))
        terminal_reason = _s(obj.get("terminal_reason"))
        if not is_error:
            status = "success"
        elif sub == "error_during_execution" and terminal_reason in _CANCELLED_TERMINAL_REASONS:
            status = "cancelled"
        else:
            status = "error"
        data: dict[str, Any] = {"status": status, "stop_reason": _s(obj.get("stop_reason"))}
        usage, self._spent = smap.result_usage(obj, self._spent)
        if usage is not None:
            data["usage"] = usage
        internal: list[str] = []
        if is_error:
            data["error"], internal = smap.result_error(obj, sub)
            data["subtype"] = sub
        if terminal_reason is not None:
            data["terminal_reason"] = terminal_reason
        if _s(obj.get("session_id")):
            data["native_session_id"] = obj["session_id"]
        return self._turn_end(data, internal, raw)

    def _turn_end(self, data: dict[str, Any], internal: list[str], raw: str) -> list[Event]:
        if data["status"] == "cancelled":
            # An interrupted turn reads as one; what the agent said about it is a diagnostic.
            said = mark_interrupted(data)
            if not internal and isinstance(said, str) and said not in smap.RESULT_ERRORS.values():
                internal = [said]
        end = self._ev("turn.ended", data, raw)
        if not internal:
            return [end]
        # The diagnostic first: the turn's end is the last event of its turn.
        return [self._ev("diagnostic", {"stream": "protocol", "text": _truncate("; ".join(internal))}, raw), end]

    def _control_request(self, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
        request_id = _s(obj.get("request_id"))
        req = _d(obj.get("request"))
        sub = _s(req.get("subtype")) or ""
        if sub == "can_use_tool" and request_id is not None:
            return [
                self._ev(
                    "permission.requested",
                    {
                        "request_id": request_id,
                        "tool": _s(req.get("tool_name")),
                        "input": req.get("input") if isinstance(req.get("input"), dict) else {},
                        "options": [],
                        "tool_call_id": _s(req.get("tool_use_id")),
                        "suggestions": req.get("permission_suggestions"),
                    },
                    raw,
                )
            ]
        # Every other CLI → host request must be answered or the agent hangs (docs/api.md §6.4):
        # a default where the protocol has a harmless one, an error otherwise.
        if request_id is None:
            return [
                self._ev(
                    "diagnostic", {"stream": "protocol", "text": f"control request {sub!r} without a request_id"}, raw
                )
            ]
        default = self._control_default(sub, req)
        if default is None:
            out.replies.append(self.encode_control_error(request_id, f"Unsupported control request subtype: {sub}"))
            text = f"answered control request {sub!r} with an error: not supported by the bridge"
        else:
            out.replies.append(
                dumps(
                    {
                        "type": "control_response",
                        "response": {"subtype": "success", "request_id": request_id, "response": default},
                    }
                )
            )
            text = f"answered control request {sub!r} with the default {dumps(default)}"
        return [self._ev("diagnostic", {"stream": "protocol", "text": text, "control": sub}, raw)]

    @staticmethod
    def _control_default(sub: str, req: dict[str, Any]) -> dict[str, Any] | None:
        if sub == "hook_callback":
            return {}  # "no opinion": the hook lets the agent continue (docs/api.md §6.4)
        if sub == "mcp_message":
            # The bridge hosts no SDK MCP servers: answer the JSON-RPC inside with an error.
            msg = _d(req.get("message"))
            if "id" not in msg:  # a notification: no error to give, but the control request wants its answer
                return {"mcp_response": {"jsonrpc": jsonrpc.VERSION, "result": {}}}
            err = jsonrpc.RpcError.method_not_found(f"no MCP server {req.get('server_name')!r} in this host")
            return {"mcp_response": jsonrpc.error(msg.get("id"), err)}
        return None

    def _control_cancel(self, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
        # The agent withdrew one of its requests (a permission prompt, after an interrupt):
        # dismiss it and write nothing back (docs/api.md §6.4).
        rid = _s(obj.get("request_id"))
        return [self._ev("permission.resolved", {"request_id": rid, "decision": "cancelled", "by": "agent"}, raw)]

    def _control_response(self, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
        # Answers to control requests (interrupt acks, or a raw client's initialize, whose
        # response carries account details): recorded with secrets redacted.
        response = _d(obj.get("response"))
        rid = _s(response.get("request_id"))
        data: dict[str, Any] = {"request_id": rid, "subtype": _s(response.get("subtype"))}
        op = self._sent.get(rid) if rid is not None else None
        op = op or _s(_d(response.get("response")).get("subtype"))  # qwen names it
        if op:
            data["op"] = op
        if _s(response.get("error")):
            data["error"] = response["error"]
        return [self._ev("agent.reply", data, raw)]

    def _toplevel(self, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
        mapped = smap.toplevel(_s(obj.get("type")) or "", obj)
        return [] if mapped is None else [self._ev(mapped[0], mapped[1], raw)]

    def _rate_limit(self, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
        info = _d(obj.get("rate_limit_info"))
        return [
            self._ev(
                "rate_limit",
                {
                    "status": _s(info.get("status")) or _s(obj.get("status")),
                    "resets_at": info.get("resetsAt", obj.get("resets_at")),
                    "utilization": info.get("utilization", obj.get("utilization")),
                },
                raw,
            )
        ]

    def _tool_progress(self, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
        return [
            self._ev(
                "tool.progress",
                {
                    "tool_call_id": _s(obj.get("tool_use_id")),
                    "name": _s(obj.get("tool_name")),
                    "elapsed_s": obj.get("elapsed_time_seconds"),
                },
                raw,
            )
        ]

    _handlers: ClassVar[dict[str, Handler]] = {
        "system": _system,
        "assistant": _assistant,
        "user": _user,
        "stream_event": _stream_event,
        "result": _result,
        "control_request": with_elicitation(_control_request),  # elicitations: protocols/stream_json_elicit.py
        "control_cancel_request": _control_cancel,
        "control_response": _control_response,
        "rate_limit_event": _rate_limit,
        "tool_progress": _tool_progress,
        **dict.fromkeys(smap.QUIET_TOPLEVEL | smap.NOTICE_TOPLEVEL, _toplevel),
    }

    # ------------------------------------------------------------------ encoding

    def refuse_content(self, content: list[dict[str, Any]]) -> str | None:
        return None  # the Messages API takes text, images and documents

    def encode_prompt(self, content: list[dict[str, Any]], trace: Mapping[str, str] | None = None) -> str:
        # No per-turn trace channel: Claude Code reads TRACEPARENT from its environment,
        # once per process (docs/agents.md "Trace context").
        return dumps(
            {
                "type": "user",
                "message": {"role": "user", "content": content},
                "parent_tool_use_id": None,
                "session_id": "",
                "uuid": str(uuid.uuid4()),
            }
        )

    def _next_request_id(self, op: str) -> str:
        self._req_counter += 1
        rid = f"req_{self._req_counter}_{uuid.uuid4().hex[:8]}"
        self._remember(rid, op)
        return rid

    def _remember(self, rid: str, op: str) -> None:
        if len(self._sent) >= _MAX_SENT_REQUESTS:
            self._sent.pop(next(iter(self._sent)))
        self._sent[rid] = op

    def encode_interrupt(self) -> str | None:
        return dumps(
            {
                "type": "control_request",
                "request_id": self._next_request_id("interrupt"),
                "request": {"subtype": "interrupt"},
            }
        )

    def encode_shutdown(self) -> str | None:
        return None  # closing stdin is stream-json's polite shutdown (docs/api.md §2.7)

    def start(self) -> list[str]:
        if not self.initialize:
            return []
        return [
            dumps(
                {
                    "type": "control_request",
                    "request_id": self._next_request_id("initialize"),
                    "request": {"subtype": "initialize"},
                }
            )
        ]

    def interrupt(self) -> list[str] | None:
        """Lines that interrupt the turn; None when the dialect cannot (stop the process)."""
        line = self.encode_interrupt()
        return None if line is None else [line]

    def answer_permission(
        self,
        request_id: str,
        decision: str,
        *,
        option_id: str | None = None,
        options: Sequence[dict[str, Any]] = (),
        updated_input: dict[str, Any] | None = None,
        message: str = "",
    ) -> str | None:
        return self.encode_permission(
            request_id, decision == "allow", updated_input=updated_input or {}, message=message
        )

    def raw_permission_answer(self, message: dict[str, Any]) -> RawAnswer | None:
        """A raw client answering a can_use_tool prompt itself (a ``control_response``)."""
        if message.get("type") != "control_response":
            return None
        resp = _d(message.get("response"))
        rid = resp.get("request_id")
        if not isinstance(rid, str):
            return None
        inner = _d(resp.get("response"))
        note = inner.get("message")
        decision = "allow" if inner.get("behavior") == "allow" else "deny"
        return RawAnswer(rid, decision, note if isinstance(note, str) else None)

    def forward_raw(self, message: dict[str, Any], route: str) -> str:
        # stream-json has no ids of ours to protect: written unchanged
        if message.get("type") == "control_request" and isinstance(message.get("request_id"), str):
            self._remember(message["request_id"], _s(_d(message.get("request")).get("subtype")) or "")
        return dumps(message)

    def answer_request(self, request: AgentRequest, result: Any = None, error: tuple[int, str] | None = None) -> str:
        raise NotImplementedError("stream-json agents make no requests the caller serves")

    def encode_permission(
        self, request_id: str, allow: bool, *, updated_input: dict[str, Any], message: str = ""
    ) -> str:
        answer: dict[str, Any] = (
            {"behavior": "allow", "updatedInput": updated_input}
            if allow
            else {"behavior": "deny", "message": message or "Denied"}
        )
        return dumps(
            {
                "type": "control_response",
                "response": {"subtype": "success", "request_id": request_id, "response": answer},
            }
        )

    @staticmethod
    def encode_control_error(request_id: str, error: str) -> str:
        return dumps(
            {"type": "control_response", "response": {"subtype": "error", "request_id": request_id, "error": error}}
        )
