"""Agent Client Protocol (ACP) v1: the bridge as the JSON-RPC *client* (docs/api.md §7.3).

A sans-I/O state machine. It owns the handshake (``initialize`` → [``authenticate``] →
``session/new`` | ``session/load`` | ``session/resume``) and turns every line the agent
writes into normalized events plus the lines the bridge must write back. Anything that
needs I/O — reading or writing a file for ``fs/*`` — is handed to the caller as an
:class:`AgentRequest`, answered later with :meth:`AcpCodec.encode_result` /
:meth:`AcpCodec.encode_error`.

JSON-RPC itself (what a line is, ids, the requests waiting for an answer, error codes,
envelopes) is protocols/jsonrpc.py; ACP's data (updates as events, content blocks, modes)
is protocols/acp_updates.py. Ids are per direction (JSON-RPC 2.0; docs/api.md §7.3): the
agent's own requests may reuse numbers we use, so a line is a response only if it has no
``method``. Malformed lines and invalid JSON-RPC become ``diagnostic`` events, never
exceptions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bridge.protocols import acp_cancel, jsonrpc, mcp_servers
from bridge.protocols.acp_elicit import AcpElicitations
from bridge.protocols.acp_state import SessionState, config_changed, model_of, set_config_params
from bridge.protocols.acp_updates import (
    CLIENT_CAPABILITIES,
    MAX_MODE_TEXT,
    MAX_MODES,
    MAX_TOOL_NAMES,
    PROTOCOL_VERSION,
    ToolNames,
    content_refusal,
    initialize_params,
    mode_in,
    session_modes,
    to_acp_blocks,
    update_events,
)
from bridge.protocols.acp_updates import d as _d
from bridge.protocols.acp_updates import items as _l
from bridge.protocols.acp_updates import s as _s
from bridge.protocols.codec import AgentInfo, AgentRequest, Decoded, Fatal, RawRefused, Ready, RoutedReply
from bridge.protocols.events import INTERRUPTED, Event
from bridge.protocols.jsonline import dumps, parse_object
from bridge.protocols.jsonrpc import Invalid, Notification, Request, Response, RpcError
from bridge.protocols.trace import with_trace

PROTOCOL = "acp"

# The codes this dialect reads or answers with, under the names its callers and tests know.
INVALID_REQUEST = jsonrpc.INVALID_REQUEST
METHOD_NOT_FOUND = jsonrpc.METHOD_NOT_FOUND
REQUEST_CANCELLED = jsonrpc.REQUEST_CANCELLED
AUTH_REQUIRED = jsonrpc.AUTH_REQUIRED

FS_METHODS = frozenset({"fs/read_text_file", "fs/write_text_file"})
STOP_REASONS = frozenset({"end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"})
CANCELLED = {"outcome": {"outcome": "cancelled"}}


def _diagnostic(text: str, raw: str | None) -> Event:
    return Event("agent", "diagnostic", {"stream": "protocol", "text": text}, raw)


def _permission_key(rid: jsonrpc.Id) -> str:
    """The agent's request id as a permission ``request_id`` (a string): a string as it is,
    an integer (or a string that reads as one) as JSON, so 0 and "0" stay two keys."""
    if isinstance(rid, str) and not rid.lstrip("-").isdigit():
        return rid
    return dumps(rid)


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
        mcp_servers: Sequence[Mapping[str, Any]] = (),
        fork: bool = False,
    ) -> None:
        self._flags = tuple(protocol_flags or ())
        # The session ``resume_id`` names is another thread's, copied (session/fork), not
        # reopened: a fork's first process (protocols/forking.py).
        self.fork = fork
        self._mcp_servers = list(mcp_servers)  # the thread's, checked (protocols/mcp_servers.py)
        self.cwd = cwd
        self.resume_id = resume_id
        self.auth_method = auth_method
        self.client_info = {"name": client_name, "title": "agent-bridge", "version": client_version}
        # our requests: id → (method, context for its answer)
        self._pending: jsonrpc.Pending[tuple[str, dict[str, Any]]] = jsonrpc.Pending()
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
        self._permissions: dict[str, jsonrpc.Id] = {}
        self._tool_names = ToolNames()
        self._state = SessionState()  # config options, session info, the turn's usage (acp_state.py)
        self._elicit = AcpElicitations()  # elicitation/create requests waiting for an answer

    # ------------------------------------------------------------------ requests we send

    def _request(self, method: str, params: dict[str, Any], ctx: dict[str, Any] | None = None) -> str:
        rid = self._pending.add((method, ctx or {}))
        return dumps(jsonrpc.request(rid, method, params))

    @staticmethod
    def _notify(method: str, params: dict[str, Any]) -> str:
        return dumps(jsonrpc.notification(method, params))

    @staticmethod
    def encode_result(rid: jsonrpc.Id, result: Any) -> str:
        return dumps(jsonrpc.result(rid, result))

    @staticmethod
    def encode_error(rid: jsonrpc.Id | None, code: int, message: str, data: Any = None) -> str:
        return dumps(jsonrpc.error(rid, RpcError(code, message, data)))

    def start(self) -> list[str]:
        return [self._request("initialize", initialize_params(self.client_info))]

    def refuse_content(self, content: list[dict[str, Any]]) -> str | None:
        """Known after ``initialize``: see :func:`content_refusal`."""
        return content_refusal(content, self.agent_capabilities) if self.ready else None

    def encode_prompt(self, content: list[dict[str, Any]], trace: Mapping[str, str] | None = None) -> str:
        params = {"sessionId": self.session_id, "prompt": to_acp_blocks(content)}
        return self._request("session/prompt", with_trace(params, trace))

    def interrupt(self) -> list[str] | None:
        """session/cancel, and ``cancelled`` for every pending permission request (docs/api.md §6.5)."""
        if self.session_id is None:
            return []
        # Only a prompt still in flight is being cancelled: a late cancel must not turn the
        # next prompt's error into a cancellation.
        self._cancel_sent = any(m == "session/prompt" for m, _ in self._pending.contexts())
        lines = [self._notify("session/cancel", {"sessionId": self.session_id})]
        for rid in list(self._permissions.values()):
            lines.append(self.encode_result(rid, CANCELLED))
        self._permissions.clear()
        return lines + self._elicit.cancel_all()

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
        if decision != "cancel" and option_id is None:
            kinds = ("allow_once", "allow_always") if decision == "allow" else ("reject_once", "reject_always")
            option_id = next((o.get("optionId") for k in kinds for o in options or () if o.get("kind") == k), None)
        if decision == "cancel" or option_id is None:
            return self.encode_result(rid, CANCELLED)
        return self.encode_result(rid, {"outcome": {"outcome": "selected", "optionId": option_id}})

    def answer_elicitation(self, request_id: str, action: str, content: dict[str, Any] | None) -> str | None:
        return self._elicit.answer(request_id, action, content)

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

    def cancel_routed(self, route: str) -> str | None:
        """``$/cancel_request`` for our switch answered to ``route`` (protocols/acp_cancel.py)."""
        return acp_cancel.routed_cancel_line(self._pending, route)

    @property
    def config_options(self) -> list[dict[str, Any]] | None:
        """The session's config options as the agent last said them (None: it has none)."""
        return self._state.options

    def set_config_option(self, config_id: str, value: str | bool, route: str) -> str | None:
        """``session/set_config_option`` (``session/set_model`` for the option made from an
        older agent's ``models``); the answer goes back to ``route`` as a JSON-RPC answer
        with the full ``configOptions``, or the agent's error as it came. None when the
        agent reported no config options (or no session yet)."""
        if self._state.options is None or self.session_id is None:
            return None
        method = self._state.config_method(config_id, value)
        ctx = {"route": route, "config_id": config_id, "value": value}
        if method == "session/set_model":
            return self._request(method, {"sessionId": self.session_id, "modelId": value}, ctx)
        return self._request(method, set_config_params(self.session_id, config_id, value), ctx)

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
        rid = self._pending.add(("raw", {"route": route, "id": message.get("id")}))
        return dumps({**message, "id": rid})

    # ------------------------------------------------------------------ decoding

    def decode_many(self, lines: Sequence[bytes]) -> list[Decoded]:
        return [self.decode(line) for line in lines]

    def decode(self, line: bytes) -> Decoded:
        out = Decoded()
        obj, text, problem = parse_object(line)
        if obj is None:
            out.events.append(_diagnostic(f"{problem}: {text[:512]}", None))
            return out
        msg = jsonrpc.classify(obj)
        if isinstance(msg, Request):
            self._on_request(msg, text, out)
        elif isinstance(msg, Notification):
            self._on_notification(msg, _d(msg.params), text, out)
            # Raw-mode clients see the agent's notifications as they are (issue #4.6);
            # responses and agent requests are the bridge's business, or routed.
            if out.events:
                out.events[0].relay = True
        elif isinstance(msg, Response):
            self._on_response(obj, msg.id, msg.result, msg.error, text, out)
        else:
            self._on_invalid(obj, msg, text, out)
        return out

    def _on_invalid(self, obj: dict[str, Any], msg: Invalid, raw: str, out: Decoded) -> None:
        if msg.reason == jsonrpc.BAD_RESPONSE_ID:  # an id we never use: no request of ours
            out.events.append(_diagnostic(f"response to unknown request id {obj.get('id')!r} ({msg.reason})", raw))
            return
        out.events.append(_diagnostic(msg.reason, raw))
        if msg.reason == jsonrpc.BAD_REQUEST_ID:
            out.replies.append(self.encode_error(None, INVALID_REQUEST, "Invalid request: bad id"))
        elif msg.reply_to in self._pending:
            # A broken answer to one of our requests fails that request: waiting on would
            # hang it (a prompt's turn would never end).
            self._on_response(None, msg.reply_to, None, msg.error(), raw, out)

    # -- responses to our requests

    def _on_response(
        self, obj: dict[str, Any] | None, rid: Any, result: Any, error: RpcError | None, raw: str, out: Decoded
    ) -> None:
        """The answer to one of our requests; ``obj`` is the agent's message, None when it
        was too broken to pass on (``error`` says why)."""
        pending = self._pending.take(rid)
        if pending is None:
            out.events.append(_diagnostic(f"response to unknown request id {rid!r}", raw))
            return
        method, ctx = pending
        # What goes back to whoever asked, for a routed request: the agent's answer as it
        # came (a raw client's with its own id again).
        answer = obj if obj is not None else jsonrpc.error(rid, error or RpcError.internal("no answer"))
        if method == "raw":
            out.control.append(RoutedReply(ctx["route"], dumps({**answer, "id": ctx["id"]})))
            out.events.append(Event("agent", "agent.other", {"routed_response": True}, raw))
        elif method == "session/set_mode":
            out.control.append(RoutedReply(ctx["route"], dumps(answer)))
            self._mode_answered(error, ctx, raw, out)
        elif method in ("session/set_config_option", "session/set_model"):
            self._config_answered(method, rid, answer, result, ctx, raw, out)
        elif error is not None:
            self._on_error(method, error, raw, out)
        else:
            handler = getattr(self, "_result_" + method.replace("/", "_"), None)
            if handler is None:
                out.events.append(Event("agent", "agent.other", {"method": method}, raw))
            else:
                handler(_d(result), raw, out)

    def _mode_answered(self, error: RpcError | None, ctx: dict[str, Any], raw: str, out: Decoded) -> None:
        """The agent's answer to our ``session/set_mode``: on success the mode is the one
        asked for (agents need not send ``current_mode_update`` for a change the client
        made)."""
        if error is not None:
            out.events.append(
                Event("agent", "agent.other", {"method": "session/set_mode", "error": error.message}, raw)
            )
            return
        mode = str(ctx["mode"])
        out.events.append(Event("agent", "agent.status", {"status": "mode_changed", "mode": mode}, raw))
        self._mode_now(mode, out)

    def _config_answered(
        self, method: str, rid: Any, answer: dict[str, Any], result: Any, ctx: dict[str, Any], raw: str, out: Decoded
    ) -> None:
        """The agent's answer to our ``session/set_config_option`` (or ``set_model``): a
        refusal goes back as it came; an acceptance as the full list the thread now has."""
        if "error" in answer:
            err = _d(answer.get("error")).get("message")
            out.events.append(Event("agent", "agent.other", {"method": method, "error": err}, raw))
            out.control.append(RoutedReply(ctx["route"], dumps(answer)))
            return
        options = self._state.config_set(_d(result), ctx["config_id"], ctx["value"])
        out.events.append(config_changed(options, raw))
        self._publish_info(out)
        out.control.append(RoutedReply(ctx["route"], dumps(jsonrpc.result(rid, {"configOptions": options}))))

    def _publish_info(self, out: Decoded) -> None:
        """The thread's agent_info with the session state as it is now."""
        base = {k: v for k, v in self._info.items() if k not in ("config_options", "session_info")}
        self._info = {**base, **self._state.agent_info()}
        out.control.append(AgentInfo(self._info))

    def _fail(self, out: Decoded, reason: str, message: str, raw: str | None) -> None:
        out.control.append(Fatal(reason, message))
        out.events.append(Event("bridge", "notice", {"code": reason, "text": message}, None))
        if raw is not None:
            out.events.insert(0, Event("agent", "agent.other", {"error": message}, raw))

    def _on_error(self, method: str, err: RpcError, raw: str, out: Decoded) -> None:
        code, message = err.code, err.message or "error"
        if method == "session/prompt":
            status = "cancelled" if self._cancel_sent else "error"
            self._end_prompt(out, raw, status=status, error=f"{message} ({code})", code=code)
        elif code == AUTH_REQUIRED:
            offered = [m.get("id") for m in self.auth_methods]
            text = f"the agent needs authentication ({message}); set auth_method in its profile to one of {offered}"
            self._fail(out, "auth_required", text, raw)
        elif method in ("session/load", "session/resume", "session/fork"):
            # The old session is gone or cannot be restored (or copied): start afresh, and say so.
            out.events.append(Event("agent", "agent.other", {"method": method, "error": message}, raw))
            text = (
                f"the agent could not restore session {self.resume_id} ({message}); "
                "a new session was started and its history is not available to the agent"
            )
            out.events.append(Event("bridge", "notice", {"code": "history_not_restored", "text": text}))
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
            text = f"the agent speaks ACP protocol version {version!r}; the bridge speaks {PROTOCOL_VERSION}"
            self._fail(out, "protocol_version", text, None)
            return
        ids = [m.get("id") for m in self.auth_methods]
        if self.auth_method is None:
            out.replies.append(self._open_session(out))
        elif self.auth_method not in ids:
            text = f"auth_method {self.auth_method!r} is not offered by the agent (it offers {ids})"
            self._fail(out, "auth_required", text, None)
        else:
            out.replies.append(self._request("authenticate", {"methodId": self.auth_method}))

    def _result_authenticate(self, result: dict[str, Any], raw: str, out: Decoded) -> None:
        out.events.append(Event("agent", "agent.other", {"method": "authenticate"}, raw))
        out.replies.append(self._open_session(out))

    def _new_session(self) -> str:
        return self._request("session/new", {"cwd": self.cwd, "mcpServers": self._mcp_for_agent()})

    def _mcp_for_agent(self) -> list[dict[str, Any]]:
        """The thread's MCP servers this agent said it takes (stdio always; http, sse if its
        ``mcpCapabilities`` say so): what ``initialize`` told, known before any session."""
        return mcp_servers.for_acp(self._mcp_servers, _d(self.agent_capabilities.get("mcpCapabilities")))[0]

    def _open_session(self, out: Decoded) -> str:
        rid = self.resume_id
        if rid is None:
            return self._new_session()
        params = {"sessionId": rid, "cwd": self.cwd, "mcpServers": self._mcp_for_agent()}
        if self.fork:
            return self._fork_session(params, out)
        if self.agent_capabilities.get("loadSession") is True:
            self._loading = True
            self._replayed = 0
            return self._request("session/load", params)
        if isinstance(_d(self.agent_capabilities.get("sessionCapabilities")).get("resume"), dict):
            return self._request("session/resume", params)
        text = (
            "the agent can neither load nor resume sessions; a new session was started and "
            "the earlier conversation is not available to it"
        )
        out.events.append(Event("bridge", "notice", {"code": "history_not_restored", "text": text}))
        return self._new_session()

    def _fork_session(self, params: dict[str, Any], out: Decoded) -> str:
        if isinstance(_d(self.agent_capabilities.get("sessionCapabilities")).get("fork"), dict):
            return self._request("session/fork", params)
        # Advertised when the fork was made (its source's capabilities), no longer now.
        text = "the agent no longer offers session/fork; a new session was started without the earlier conversation"
        out.events.append(Event("bridge", "notice", {"code": "history_not_restored", "text": text}))
        return self._new_session()

    def _session_ready(self, sid: str | None, raw: str, out: Decoded, how: str, result: dict[str, Any]) -> None:
        if sid is None:
            self._fail(out, "handshake_failed", f"{how} returned no sessionId", raw)
            return
        self.session_id = sid
        self.ready = True
        modes = session_modes(result.get("modes"))
        changed = self._state.opened(result, how)  # its config options (or older models)
        if modes is not None or self.modes is not None:
            self.modes = modes  # a session's modes are the ones its new/load/resume answer gave
            self._info = {k: v for k, v in self._info.items() if k != "modes"}
            if modes is not None:
                self._info["modes"] = modes
            changed = True
        if changed:
            self._publish_info(out)
        out.control.append(Ready())
        data: dict[str, Any] = {"native_session_id": sid, "model": model_of(self._state.options), "resumed": how}
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

    def _result_session_fork(self, result: dict[str, Any], raw: str, out: Decoded) -> None:
        # A fork is a new session: never the source's id, whatever the answer says.
        sid = _s(result.get("sessionId"))
        self._session_ready(None if sid == self.resume_id else sid, raw, out, "fork", result)

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
        usage = self._state.turn_usage(usage)  # with the turn's last usage_update (acp_state.py)
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

    def _on_request(self, req: Request, raw: str, out: Decoded) -> None:
        params = _d(req.params)
        if req.method == "session/request_permission":
            self._permission_requested(req.id, params, raw, out)
        elif req.method == "elicitation/create":
            self._elicit.requested(req.id, params, self.session_id, raw, out)
        elif req.method in FS_METHODS:
            out.events.append(
                Event("agent", "agent.other", {"method": req.method, "path": _s(params.get("path"))}, raw)
            )
            out.control.append(AgentRequest(req.id, req.method, params))
        else:
            out.events.append(Event("agent", "agent.other", {"method": req.method}, raw))
            err = RpcError.method_not_found(data={"method": req.method})
            out.replies.append(dumps(jsonrpc.error(req.id, err)))

    def _permission_requested(self, rid: jsonrpc.Id, params: dict[str, Any], raw: str, out: Decoded) -> None:
        key = _permission_key(rid)
        self._permissions[key] = rid
        call = _d(params.get("toolCall"))
        # The tool's name as tool.call reported it (claude-agent-acp: "Bash"), as on
        # stream-json; the human title only when the agent never named the tool.
        data: dict[str, Any] = {
            "request_id": key,
            "tool": self._tool_names.of(call) or _s(call.get("title")) or _s(call.get("kind")),
            "input": call.get("rawInput") if isinstance(call.get("rawInput"), dict) else {},
            "options": [o for o in _l(params.get("options")) if isinstance(o, dict)],
            "tool_call_id": _s(call.get("toolCallId")),
        }
        if _s(call.get("title")) is not None:
            data["title"] = call["title"]
        out.events.append(Event("agent", "permission.requested", data, raw))

    # -- notifications

    def _on_notification(self, msg: Notification, params: dict[str, Any], raw: str, out: Decoded) -> None:
        if msg.method == "$/cancel_request" and self._withdrawn(params.get("requestId"), raw, out):
            return
        if msg.method != "session/update":
            out.events.append(self._elicit.other(msg.method, params, raw))  # elicitation/complete names its request
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
        if self._kept(kind, update, raw, out):
            return
        out.events.extend(update_events(kind, update, raw, self._tool_names))
        if kind == "current_mode_update":
            self._mode_now(mode_in(update), out)

    def _kept(self, kind: str, update: dict[str, Any], raw: str, out: Decoded) -> bool:
        """A usage, session info or config options update (acp_state.py): its events, and
        agent_info when it changed. False for any other kind."""
        in_turn = any(m == "session/prompt" for m, _ in self._pending.contexts())
        kept = self._state.update(kind, update, raw, in_turn)
        if kept is None:
            return False
        out.events.extend(kept[0])
        if kept[1]:
            self._publish_info(out)
        return True

    def _withdrawn(self, target: Any, raw: str, out: Decoded) -> bool:
        """The agent withdrew one of its requests (docs/api.md §6.5): a pending permission
        request is resolved as cancelled and answered with -32800."""
        if not jsonrpc.is_id(target):
            return False
        key = next((k for k, v in self._permissions.items() if jsonrpc.id_key(v) == jsonrpc.id_key(target)), None)
        if key is None:
            return self._elicit.withdrawn(target, raw, out)  # or one of its elicitations
        rid = self._permissions.pop(key)
        data = {"request_id": key, "decision": "cancelled", "by": "agent"}
        out.events.append(Event("agent", "permission.resolved", data, raw))
        out.replies.append(dumps(jsonrpc.error(rid, RpcError.cancelled())))
        return True


__all__ = [
    "AUTH_REQUIRED",
    "CLIENT_CAPABILITIES",
    "FS_METHODS",
    "INVALID_REQUEST",
    "MAX_MODES",
    "MAX_MODE_TEXT",
    "MAX_TOOL_NAMES",
    "METHOD_NOT_FOUND",
    "PROTOCOL",
    "PROTOCOL_VERSION",
    "REQUEST_CANCELLED",
    "AcpCodec",
    "content_refusal",
    "initialize_params",
    "session_modes",
    "to_acp_blocks",
]
