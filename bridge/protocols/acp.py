"""Agent Client Protocol (ACP) v1: the bridge as the JSON-RPC *client* (docs/api.md §7.3).

A sans-I/O state machine. It owns the request ids, the pending requests and the
handshake (``initialize`` → [``authenticate``] → ``session/new`` | ``session/load`` |
``session/resume``), and turns every line the agent writes into normalized events plus the
lines the bridge must write back. Anything that needs I/O — reading or writing a file for
``fs/*`` — is handed to the caller as an :class:`AgentRequest`, answered later with
:meth:`AcpCodec.encode_result` / :meth:`AcpCodec.encode_error`.

Responses are matched by id in any order. Ids are per direction (JSON-RPC 2.0; docs/api.md §7.3): the agent's own
requests may reuse numbers we use, so a line is a response only if it has no ``method``.
Malformed lines and invalid JSON-RPC become ``diagnostic`` events, never exceptions.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from bridge.protocols.codec import AgentInfo, AgentRequest, Decoded, Fatal, RawRefused, Ready, RoutedReply
from bridge.protocols.events import INTERRUPTED, Event
from bridge.protocols.jsonline import dumps, parse_object

PROTOCOL = "acp"
PROTOCOL_VERSION = 1

# JSON-RPC / ACP error codes (docs/api.md §7.3)
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
REQUEST_CANCELLED = -32800
AUTH_REQUIRED = -32000

# What the bridge implements, and so all it declares (issue #4: never claim more).
CLIENT_CAPABILITIES: dict[str, Any] = {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": False}
FS_METHODS = frozenset({"fs/read_text_file", "fs/write_text_file"})
STOP_REASONS = frozenset({"end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"})


def _s(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _d(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _l(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _valid_id(v: Any) -> bool:
    return (isinstance(v, str) or isinstance(v, int)) and not isinstance(v, bool)


def _content_text(block: Any) -> str:
    block = _d(block)
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        return str(block["text"])
    if block.get("type") == "resource_link":
        return f"[{block.get('name') or block.get('uri')}]({block.get('uri')})"
    return ""


def _plain_text(source: dict[str, Any]) -> str | None:
    try:
        return base64.b64decode(str(source.get("data")), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None


def to_acp_blocks(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bridge (Anthropic-shaped) content blocks → ACP ContentBlocks (docs/api.md §7.3)."""
    out: list[dict[str, Any]] = []
    for b in content:
        if b.get("type") == "text":
            out.append({"type": "text", "text": b.get("text", "")})
        elif b.get("type") == "image":
            src = _d(b.get("source"))
            out.append({"type": "image", "mimeType": src.get("media_type"), "data": src.get("data")})
        elif b.get("type") == "document":
            src = _d(b.get("source"))
            resource: dict[str, Any] = {"uri": "attachment:document", "mimeType": src.get("media_type")}
            text = _plain_text(src) if src.get("media_type") == "text/plain" else None
            if text is not None:
                resource["text"] = text  # an embedded text resource, as agents expect for text
            else:
                resource["blob"] = src.get("data")
            out.append({"type": "resource", "resource": resource})
    return out


def content_refusal(content: list[dict[str, Any]], capabilities: Any) -> str | None:
    """Why an agent with these ``agentCapabilities`` cannot take ``content``, or None.
    Text is baseline; images need ``promptCapabilities.image`` and documents (sent as
    embedded resources) ``promptCapabilities.embeddedContext`` (docs/api.md §7.3). Refused, never
    silently dropped or turned into something else."""
    caps = _d(_d(capabilities).get("promptCapabilities"))
    for b in content:
        if b.get("type") == "image" and caps.get("image") is not True:
            return "this agent does not accept images (its promptCapabilities.image is not true)"
        if b.get("type") == "document" and caps.get("embeddedContext") is not True:
            return "this agent does not accept documents (its promptCapabilities.embeddedContext is not true)"
    return None


MAX_TOOL_NAMES = 1024  # tool call ids whose names are remembered for permission requests
MAX_MODES = 64  # session modes kept from an agent's answer
MAX_MODE_TEXT = 1024  # characters of a mode's id, name or description


def _mode_text(v: Any) -> str | None:
    return v if isinstance(v, str) and 0 < len(v) <= MAX_MODE_TEXT else None


def session_modes(value: Any) -> dict[str, Any] | None:
    """An agent's ``modes`` (ACP ``SessionModeState``: ``currentModeId`` and
    ``availableModes`` of ``{id, name, description?}``), the well-formed part, or None."""
    value = _d(value)
    current = _mode_text(value.get("currentModeId"))
    available = []
    for m in _l(value.get("availableModes"))[:MAX_MODES]:
        mid, name = _mode_text(_d(m).get("id")), _mode_text(_d(m).get("name"))
        if mid is None or name is None:
            continue
        mode: dict[str, Any] = {"id": mid, "name": name}
        if (text := _mode_text(m.get("description"))) is not None:
            mode["description"] = text
        available.append(mode)
    if current is None or not available:
        return None
    return {"currentModeId": current, "availableModes": available}


def _meta_tool_name(obj: dict[str, Any]) -> str | None:
    """The agent's stable tool name, if it gives one: claude-agent-acp's
    ``_meta.claudeCode.toolName``, Qwen Code's ``_meta.toolName``."""
    meta = _d(obj.get("_meta"))
    return _s(_d(meta.get("claudeCode")).get("toolName")) or _s(meta.get("toolName"))


def initialize_params(client_info: dict[str, Any]) -> dict[str, Any]:
    """What the bridge says about itself in ``initialize``, as a client of an ACP agent."""
    return {"protocolVersion": PROTOCOL_VERSION, "clientCapabilities": CLIENT_CAPABILITIES, "clientInfo": client_info}


class AcpCodec:
    protocol = PROTOCOL
    resume_on_argv = False  # resume goes through session/load or session/resume
    requires_model = False
    cancel_resolves_permissions = True  # session/cancel answers every pending request (docs/api.md §6.5)

    def __init__(
        self,
        *,
        cwd: str,
        resume_id: str | None = None,
        auth_method: str | None = None,
        client_name: str = "agent-bridge",
        client_version: str = "0",
        protocol_flags: Sequence[str] | None = None,
    ) -> None:
        self._flags = tuple(protocol_flags or ())
        self.cwd = cwd
        self.resume_id = resume_id
        self.auth_method = auth_method
        self.client_info = {"name": client_name, "title": "agent-bridge", "version": client_version}
        self._next_id = 0
        self._pending: dict[int, tuple[str, dict[str, Any]]] = {}
        self.session_id: str | None = None
        self.ready = False
        self.agent_capabilities: dict[str, Any] = {}
        self.agent_info: dict[str, Any] = {}
        self._info: dict[str, Any] = {}  # the thread's agent_info (docs/api.md §4.2)
        self.modes: dict[str, Any] | None = None  # the session's modes, as the agent last said
        self.auth_methods: list[dict[str, Any]] = []
        self.protocol_version: int | None = None
        self._loading = False
        self._replayed = 0
        self._cancel_sent = False  # session/cancel sent for the prompt in flight
        # permission request_id (str) → the agent's JSON-RPC id, as it sent it
        self._permissions: dict[str, int | str] = {}
        # toolCallId → the stable tool name the agent gave for it (bounded, oldest dropped),
        # so a permission request, whose toolCall has only a title, names the tool too.
        self._tool_names: dict[str, str] = {}

    # ------------------------------------------------------------------ requests we send

    def _request(self, method: str, params: dict[str, Any], ctx: dict[str, Any] | None = None) -> str:
        rid = self._next_id
        self._next_id += 1
        self._pending[rid] = (method, ctx or {})
        return dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})

    @staticmethod
    def _notify(method: str, params: dict[str, Any]) -> str:
        return dumps({"jsonrpc": "2.0", "method": method, "params": params})

    @staticmethod
    def encode_result(rid: int | str, result: Any) -> str:
        return dumps({"jsonrpc": "2.0", "id": rid, "result": result})

    @staticmethod
    def encode_error(rid: int | str | None, code: int, message: str, data: Any = None) -> str:
        err: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            err["data"] = data
        return dumps({"jsonrpc": "2.0", "id": rid, "error": err})

    def start(self) -> list[str]:
        return [self._request("initialize", initialize_params(self.client_info))]

    def refuse_content(self, content: list[dict[str, Any]]) -> str | None:
        """Known after ``initialize``: see :func:`content_refusal`."""
        return content_refusal(content, self.agent_capabilities) if self.ready else None

    def encode_prompt(self, content: list[dict[str, Any]]) -> str:
        return self._request("session/prompt", {"sessionId": self.session_id, "prompt": to_acp_blocks(content)})

    def interrupt(self) -> list[str] | None:
        """session/cancel, and ``cancelled`` for every pending permission request (docs/api.md §6.5)."""
        if self.session_id is None:
            return []
        # Only a prompt still in flight is being cancelled: a late cancel must not turn the
        # next prompt's error into a cancellation.
        self._cancel_sent = any(m == "session/prompt" for m, _ in self._pending.values())
        lines = [self._notify("session/cancel", {"sessionId": self.session_id})]
        for rid in list(self._permissions.values()):
            lines.append(self.encode_result(rid, {"outcome": {"outcome": "cancelled"}}))
        self._permissions.clear()
        return lines

    def encode_shutdown(self) -> str | None:
        return None  # ACP has no shutdown method: close stdin, then terminate (docs/api.md §2.7)

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
        """``decision`` allow|deny|cancel; without ``option_id`` the first option of the
        matching kind is chosen. None if the request is not pending (already answered)."""
        rid = self._permissions.pop(request_id, None)
        if rid is None:
            return None
        if decision == "cancel" or (option_id is None and not options):
            return self.encode_result(rid, {"outcome": {"outcome": "cancelled"}})
        if option_id is None:
            kinds = ("allow_once", "allow_always") if decision == "allow" else ("reject_once", "reject_always")
            option_id = next((o.get("optionId") for k in kinds for o in options or [] if o.get("kind") == k), None)
            if option_id is None:
                return self.encode_result(rid, {"outcome": {"outcome": "cancelled"}})
        return self.encode_result(rid, {"outcome": {"outcome": "selected", "optionId": option_id}})

    def model_args(self, model: str) -> list[str]:
        return []  # an ACP agent chooses its model from its own settings and environment

    def resume_args(self, session_id: str) -> list[str]:
        return []  # never on the command line: session/load or session/resume

    def set_mode(self, mode_id: str, route: str) -> str | None:
        """``session/set_mode``; its answer goes back to ``route``. None when the agent
        reported no modes (or no session yet)."""
        if self.modes is None or self.session_id is None:
            return None
        params = {"sessionId": self.session_id, "modeId": mode_id}
        return self._request("session/set_mode", params, {"route": route, "mode": mode_id})

    def _mode_now(self, mode: str | None, out: Decoded) -> None:
        """The session's current mode changed (the agent said so, or accepted a
        ``session/set_mode``): the thread's agent_info says it too."""
        if mode is None or self.modes is None or self.modes.get("currentModeId") == mode:
            return
        self.modes = {**self.modes, "currentModeId": mode}
        self._info = {**self._info, "modes": self.modes}
        out.control.append(AgentInfo(self._info))

    def launch_flags(self, options: Mapping[str, Any]) -> list[str]:
        return list(self._flags)  # ACP adds nothing to argv, unless a profile states flags

    def prompts_to_clients(self, options: Mapping[str, Any]) -> bool:
        return True  # session/request_permission always waits for an answer

    def raw_permission_answer(self, message: dict[str, Any]) -> None:
        return None  # a client's JSON-RPC response is never forwarded (forward_raw)

    def answer_request(self, request: AgentRequest, result: Any = None, error: tuple[int, str] | None = None) -> str:
        if error is not None:
            return self.encode_error(request.id, error[0], error[1])
        return self.encode_result(request.id, result)

    def pending_permissions(self) -> list[str]:
        return list(self._permissions)

    # ------------------------------------------------------------------ decoding

    def decode_many(self, lines: Sequence[bytes]) -> list[Decoded]:
        return [self.decode(line) for line in lines]

    def decode(self, line: bytes) -> Decoded:
        out = Decoded()
        obj, text, problem = parse_object(line)
        if obj is None:
            out.events.append(Event("agent", "diagnostic", {"stream": "protocol", "text": f"{problem}: {text[:512]}"}))
            return out
        if obj.get("jsonrpc") != "2.0":
            out.events.append(
                Event("agent", "diagnostic", {"stream": "protocol", "text": "not a JSON-RPC 2.0 message"}, text)
            )
        elif isinstance(obj.get("method"), str):
            if "id" in obj:
                self._on_request(obj, text, out)
            else:
                self._on_notification(obj, text, out)
                # Raw-mode clients see the agent's notifications as they are (issue #4.6);
                # responses and agent requests are the bridge's business, or routed.
                if out.events:
                    out.events[0].relay = True
        elif "id" in obj and ("result" in obj or "error" in obj):
            self._on_response(obj, text, out)
        else:
            out.events.append(
                Event("agent", "diagnostic", {"stream": "protocol", "text": "invalid JSON-RPC message"}, text)
            )
        return out

    def forward_raw(self, message: dict[str, Any], route: str) -> str:
        """A raw client's notification unchanged; its request with the id replaced by one of
        ours, so it can never collide with the bridge's requests or another client's (the
        response is routed back with the original id, :class:`RoutedReply`); a response is
        refused: the bridge answers the agent's requests itself."""
        if "method" not in message:
            raise RawRefused(
                "the bridge answers the agent's requests; a response from a client is not forwarded", "not_forwarded"
            )
        if "id" not in message:
            return dumps(message)
        rid = self._next_id
        self._next_id += 1
        self._pending[rid] = ("raw", {"route": route, "id": message.get("id")})
        return dumps({**message, "id": rid})

    # -- responses to our requests

    def _on_response(self, obj: dict[str, Any], raw: str, out: Decoded) -> None:
        rid = obj.get("id")
        pending = self._pending.pop(rid, None) if isinstance(rid, int) and not isinstance(rid, bool) else None
        if pending is None:
            out.events.append(
                Event(
                    "agent",
                    "diagnostic",
                    {"stream": "protocol", "text": f"response to unknown request id {rid!r}"},
                    raw,
                )
            )
            return
        method, ctx = pending
        if method == "raw":
            out.control.append(RoutedReply(ctx["route"], dumps({**obj, "id": ctx["id"]})))
            out.events.append(Event("agent", "agent.other", {"routed_response": True}, raw))
            return
        if method == "session/set_mode":
            self._mode_answered(obj, ctx, raw, out)
            return
        error = obj.get("error")
        if error is not None:
            err = _d(error)
            self._on_error(method, err.get("code"), _s(err.get("message")) or "error", err, raw, out)
            return
        result = obj.get("result")
        handler = getattr(self, "_result_" + method.replace("/", "_"), None)
        if handler is None:
            out.events.append(Event("agent", "agent.other", {"method": method}, raw))
        else:
            handler(_d(result), raw, out)

    def _mode_answered(self, obj: dict[str, Any], ctx: dict[str, Any], raw: str, out: Decoded) -> None:
        """The agent's answer to our ``session/set_mode``: on success the mode is the one
        asked for (agents need not send ``current_mode_update`` for a change the client
        made); the answer itself goes back to whoever asked."""
        out.control.append(RoutedReply(ctx["route"], dumps(obj)))
        error = obj.get("error")
        if error is not None:
            message = _s(_d(error).get("message")) or "error"
            out.events.append(Event("agent", "agent.other", {"method": "session/set_mode", "error": message}, raw))
            return
        mode = str(ctx["mode"])
        out.events.append(Event("agent", "agent.status", {"status": "mode_changed", "mode": mode}, raw))
        self._mode_now(mode, out)

    def _fail(self, out: Decoded, reason: str, message: str, raw: str | None) -> None:
        out.control.append(Fatal(reason, message))
        out.events.append(Event("bridge", "notice", {"code": reason, "text": message}, None))
        if raw is not None:
            out.events.insert(0, Event("agent", "agent.other", {"error": message}, raw))

    def _on_error(self, method: str, code: Any, message: str, err: dict[str, Any], raw: str, out: Decoded) -> None:
        if method == "session/prompt":
            self._end_prompt(
                out, raw, status="cancelled" if self._cancel_sent else "error", error=f"{message} ({code})", code=code
            )
        elif code == AUTH_REQUIRED:
            self._fail(
                out,
                "auth_required",
                f"the agent needs authentication ({message}); set auth_method in its profile "
                f"to one of {[m.get('id') for m in self.auth_methods]}",
                raw,
            )
        elif method in ("session/load", "session/resume"):
            # The old session is gone or cannot be restored: start afresh, and say so.
            out.events.append(Event("agent", "agent.other", {"method": method, "error": message}, raw))
            out.events.append(
                Event(
                    "bridge",
                    "notice",
                    {
                        "code": "history_not_restored",
                        "text": f"the agent could not restore session {self.resume_id} ({message}); "
                        "a new session was started and its history is not available to the agent",
                    },
                )
            )
            self._loading = False
            out.replies.append(self._new_session())
        elif method in ("initialize", "authenticate", "session/new"):
            self._fail(out, "handshake_failed", f"{method} failed: {message} ({code})", raw)
        else:
            out.events.append(Event("agent", "agent.other", {"method": method, "error": message}, raw))

    def _result_initialize(self, result: dict[str, Any], raw: str, out: Decoded) -> None:
        version = result.get("protocolVersion")
        self.agent_capabilities = _d(result.get("agentCapabilities"))
        self.agent_info = _d(result.get("agentInfo"))
        self.auth_methods = [m for m in _l(result.get("authMethods")) if isinstance(m, dict)]
        self.protocol_version = version if isinstance(version, int) else None
        info = {
            "protocol_version": version,
            "info": self.agent_info,
            "capabilities": self.agent_capabilities,
            "auth_methods": [m.get("id") for m in self.auth_methods],
        }
        self._info = info
        out.control.append(AgentInfo(info))
        out.events.append(Event("agent", "agent.other", {"method": "initialize", **info}, raw))
        if version != PROTOCOL_VERSION:
            self._fail(
                out,
                "protocol_version",
                f"the agent speaks ACP protocol version {version!r}; the bridge speaks {PROTOCOL_VERSION}",
                None,
            )
            return
        ids = [m.get("id") for m in self.auth_methods]
        if self.auth_method is not None:
            if self.auth_method not in ids:
                self._fail(
                    out,
                    "auth_required",
                    f"auth_method {self.auth_method!r} is not offered by the agent (it offers {ids})",
                    None,
                )
                return
            out.replies.append(self._request("authenticate", {"methodId": self.auth_method}))
            return
        out.replies.append(self._open_session(out))

    def _result_authenticate(self, result: dict[str, Any], raw: str, out: Decoded) -> None:
        out.events.append(Event("agent", "agent.other", {"method": "authenticate"}, raw))
        out.replies.append(self._open_session(out))

    def _new_session(self) -> str:
        return self._request("session/new", {"cwd": self.cwd, "mcpServers": []})

    def _open_session(self, out: Decoded) -> str:
        rid = self.resume_id
        if rid is None:
            return self._new_session()
        params = {"sessionId": rid, "cwd": self.cwd, "mcpServers": []}
        if self.agent_capabilities.get("loadSession") is True:
            self._loading = True
            self._replayed = 0
            return self._request("session/load", params)
        if isinstance(_d(self.agent_capabilities.get("sessionCapabilities")).get("resume"), dict):
            return self._request("session/resume", params)
        out.events.append(
            Event(
                "bridge",
                "notice",
                {
                    "code": "history_not_restored",
                    "text": "the agent can neither load nor resume sessions; a new session was started and "
                    "the earlier conversation is not available to it",
                },
            )
        )
        return self._new_session()

    def _session_ready(self, sid: str | None, raw: str, out: Decoded, how: str, result: dict[str, Any]) -> None:
        if sid is None:
            self._fail(out, "handshake_failed", f"{how} returned no sessionId", raw)
            return
        self.session_id = sid
        self.ready = True
        modes = session_modes(result.get("modes"))
        if modes is not None or self.modes is not None:
            self.modes = modes  # a session's modes are the ones its new/load/resume answer gave
            self._info = {k: v for k, v in self._info.items() if k != "modes"}
            if modes is not None:
                self._info["modes"] = modes
            out.control.append(AgentInfo(self._info))
        out.control.append(Ready())
        data: dict[str, Any] = {"native_session_id": sid, "model": None, "resumed": how}
        if how == "load":
            data["replayed_updates"] = self._replayed
        out.events.append(Event("agent", "session.started", data, raw))

    def _result_session_new(self, result: dict[str, Any], raw: str, out: Decoded) -> None:
        self._session_ready(_s(result.get("sessionId")), raw, out, "new", result)

    def _result_session_load(self, result: dict[str, Any], raw: str, out: Decoded) -> None:
        self._loading = False
        self._session_ready(_s(result.get("sessionId")) or self.resume_id, raw, out, "load", result)

    def _result_session_resume(self, result: dict[str, Any], raw: str, out: Decoded) -> None:
        self._session_ready(_s(result.get("sessionId")) or self.resume_id, raw, out, "resume", result)

    def _result_session_prompt(self, result: dict[str, Any], raw: str, out: Decoded) -> None:
        stop = _s(result.get("stopReason"))
        status = "cancelled" if stop == "cancelled" else "success"
        if stop not in STOP_REASONS:
            status = "error"
        self._end_prompt(out, raw, status=status, stop_reason=stop, usage=result.get("usage"))

    def _end_prompt(
        self,
        out: Decoded,
        raw: str,
        *,
        status: str,
        stop_reason: str | None = None,
        usage: Any = None,
        error: str | None = None,
        code: Any = None,
    ) -> None:
        self._cancel_sent = False
        data: dict[str, Any] = {"status": status, "stop_reason": stop_reason}
        if usage is not None:
            data["usage"] = usage
        if status == "cancelled":
            data["reason"] = INTERRUPTED  # as on every dialect (docs/api.md §6.5)
        elif error is not None:
            data["error"] = error
            if code == AUTH_REQUIRED:
                data["error_code"] = "auth_required"
        out.events.append(Event("agent", "turn.ended", data, raw))

    # -- agent → client requests

    def _on_request(self, obj: dict[str, Any], raw: str, out: Decoded) -> None:
        method, params = obj["method"], _d(obj.get("params"))
        if not _valid_id(obj.get("id")):
            out.events.append(
                Event("agent", "diagnostic", {"stream": "protocol", "text": f"request {method} has an invalid id"}, raw)
            )
            out.replies.append(self.encode_error(None, INVALID_REQUEST, "Invalid request: bad id"))
            return
        rid: int | str = obj["id"]
        if method == "session/request_permission":
            key = rid if isinstance(rid, str) else dumps(rid)  # 0 and "0" stay distinct keys
            if isinstance(rid, str) and rid.lstrip("-").isdigit():
                key = dumps(rid)
            self._permissions[key] = rid
            call = _d(params.get("toolCall"))
            options = [o for o in _l(params.get("options")) if isinstance(o, dict)]
            tcid = _s(call.get("toolCallId"))
            # The tool's name as tool.call reported it (claude-agent-acp: "Bash"), as on
            # stream-json; the human title only when the agent never named the tool.
            name = _meta_tool_name(call) or (self._tool_names.get(tcid) if tcid else None)
            data: dict[str, Any] = {
                "request_id": key,
                "tool": name or _s(call.get("title")) or _s(call.get("kind")),
                "input": call.get("rawInput") if isinstance(call.get("rawInput"), dict) else {},
                "options": options,
                "tool_call_id": tcid,
            }
            if _s(call.get("title")) is not None:
                data["title"] = call["title"]
            out.events.append(Event("agent", "permission.requested", data, raw))
        elif method in FS_METHODS:
            out.events.append(Event("agent", "agent.other", {"method": method, "path": _s(params.get("path"))}, raw))
            out.control.append(AgentRequest(rid, method, params))
        else:
            out.events.append(Event("agent", "agent.other", {"method": method}, raw))
            out.replies.append(self.encode_error(rid, METHOD_NOT_FOUND, "Method not found", {"method": method}))

    # -- notifications

    def _on_notification(self, obj: dict[str, Any], raw: str, out: Decoded) -> None:
        method, params = obj["method"], _d(obj.get("params"))
        if method == "$/cancel_request":
            # The agent withdrew one of its requests (docs/api.md §6.5): a pending permission
            # request is resolved as cancelled and answered with -32800.
            target = params.get("requestId")
            key = None
            for k, v in self._permissions.items():
                if v == target and type(v) is type(target):
                    key = k
            if key is not None:
                rid = self._permissions.pop(key)
                out.events.append(
                    Event(
                        "agent", "permission.resolved", {"request_id": key, "decision": "cancelled", "by": "agent"}, raw
                    )
                )
                out.replies.append(self.encode_error(rid, REQUEST_CANCELLED, "Request cancelled"))
                return
        if method != "session/update":
            out.events.append(Event("agent", "agent.other", {"method": method}, raw))
            return
        sid = _s(params.get("sessionId"))
        if self._loading and (sid is None or sid == self.resume_id):
            # History the agent replays on session/load is already in our transcript.
            self._replayed += 1
            return
        update = _d(params.get("update"))
        kind = _s(update.get("sessionUpdate")) or ""
        if self.session_id is not None and sid is not None and sid != self.session_id:
            out.events.append(Event("agent", "agent.other", {"session_update": kind, "foreign_session": sid}, raw))
            return
        self._session_update(kind, update, raw, out)

    def _session_update(self, kind: str, update: dict[str, Any], raw: str, out: Decoded) -> None:
        out.events.extend(self._update_events(kind, update, raw))
        if kind == "current_mode_update":
            self._mode_now(_s(update.get("currentModeId")) or _s(update.get("modeId")), out)

    def _update_events(self, kind: str, u: dict[str, Any], raw: str) -> list[Event]:
        mid = _s(u.get("messageId"))
        if kind in ("agent_message_chunk", "agent_thought_chunk"):
            text = _content_text(u.get("content"))
            channel = "text" if kind == "agent_message_chunk" else "thought"
            return [Event("agent", "message.delta", {"text": text, "channel": channel, "message_id": mid}, raw)]
        if kind == "user_message_chunk":
            return [
                Event("agent", "agent.other", {"session_update": kind, "text": _content_text(u.get("content"))}, raw)
            ]
        if kind in ("tool_call", "tool_call_update"):
            tcid, name = _s(u.get("toolCallId")), _meta_tool_name(u)
            if tcid and name:
                self._tool_names.pop(tcid, None)
                self._tool_names[tcid] = name
                while len(self._tool_names) > MAX_TOOL_NAMES:
                    del self._tool_names[next(iter(self._tool_names))]
            return [self._tool_event(kind, u, raw)]
        if kind == "plan":
            entries = [e for e in _l(u.get("entries")) if isinstance(e, dict)]
            return [Event("agent", "plan", {"entries": entries}, raw)]
        if kind == "current_mode_update":
            return [
                Event(
                    "agent",
                    "agent.status",
                    {"status": "mode_changed", "mode": _s(u.get("currentModeId")) or _s(u.get("modeId"))},
                    raw,
                )
            ]
        return [Event("agent", "agent.other", {"session_update": kind}, raw)]

    @staticmethod
    def _tool_event(kind: str, u: dict[str, Any], raw: str) -> Event:
        tcid = _s(u.get("toolCallId"))
        status = _s(u.get("status"))
        if kind == "tool_call_update" and status in ("completed", "failed"):
            output: Any = u.get("rawOutput")
            if output is None:
                output = "".join(_content_text(_d(c).get("content")) for c in _l(u.get("content")))
            return Event(
                "agent", "tool.result", {"tool_call_id": tcid, "output": output, "is_error": status == "failed"}, raw
            )
        # A stable tool name when the agent gives one (claude-agent-acp: _meta.claudeCode.toolName);
        # the title is a human label that changes during the call.
        meta_name = _meta_tool_name(u)
        data: dict[str, Any] = {"tool_call_id": tcid}
        if kind == "tool_call":
            data.update(
                name=meta_name or _s(u.get("title")) or _s(u.get("kind")),
                input=u.get("rawInput"),
                title=_s(u.get("title")),
                kind=_s(u.get("kind")),
                status=status or "pending",
            )
            return Event("agent", "tool.call", data, raw)
        # tool_call_update patches the call: only the fields present (an absent field is
        # unchanged, not cleared).
        data["update"] = True
        if meta_name:
            data["name"] = meta_name
        for src, dst in (("rawInput", "input"), ("title", "title"), ("kind", "kind"), ("status", "status")):
            if src in u:
                data[dst] = u[src]
        return Event("agent", "tool.call", data, raw)
