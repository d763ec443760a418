"""The ACP gateway's session methods past the first ones (docs/api.md §11.2):
``session/close``, ``session/delete`` and ``session/set_config_option``, the
``configOptions`` of the session answers, and what a connection tells its sessions when
their threads change elsewhere (``session_info_update``, ``config_option_update``).

Each method is a coroutine ``(agent, rpc_id, params)`` named in acp_agent.py's
``_METHODS``; like the rest of the agent they reach threads only through
api/acp_threads.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import structlog

from bridge.api.acp_attached import META, Attached
from bridge.api.acp_threads import AcpThread
from bridge.api.users import check_owner
from bridge.errors import BridgeError
from bridge.protocols import jsonrpc
from bridge.protocols.jsonrpc import RpcError
from bridge.sessions import acp_config
from bridge.sessions.commands import SetConfigOption, SetMode, SetModel
from bridge.sessions.config_options import ConfigRefused
from bridge.sessions.modes import ModeRefused

if TYPE_CHECKING:
    from bridge.api.acp_agent import AcpAgent

log = structlog.get_logger("bridge.acp_gateway")

MAX_CONFIG_ID = 256


def _session_id(params: dict[str, Any]) -> str:
    sid = params.get("sessionId")
    if not isinstance(sid, str) or not sid:
        raise RpcError.invalid_params("sessionId must be a non-empty string")
    return sid


# ---------------------------------------------------------------------- config options


def options_of(agent: AcpAgent, thread: AcpThread, row: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The session's ``configOptions`` now (``row``: the thread as a change showed it)."""
    return acp_config.config_options(thread.row() if row is None else row, thread.models(), booleans=agent.booleans)


def session_state(agent: AcpAgent, att: Attached, answer: dict[str, Any]) -> dict[str, Any]:
    """A session/new, load or resume answer with the session's ``modes`` (once its agent
    reported them, sessions/modes.py) and its ``configOptions``; what the client was told."""
    modes = att.thread.modes()
    att.config = options_of(agent, att.thread)
    return {**answer, **({} if modes is None else {"modes": modes}), "configOptions": att.config}


async def set_mode(att: Attached, mode_id: str, actor: str) -> None:
    """The agent's own ``session/set_mode``, through the thread; its refusal as it gave it."""
    try:
        await att.thread.run(SetMode(mode_id=mode_id, actor=actor))
    except ModeRefused as exc:
        raise RpcError(exc.rpc["code"], exc.rpc["message"], exc.rpc.get("data")) from None
    except BridgeError as exc:
        if exc.code == "modes_not_supported":
            raise RpcError.method_not_found(exc.message, {"code": exc.code}) from None
        raise


def _config_params(params: dict[str, Any]) -> tuple[str, str | bool]:
    config_id, value = params.get("configId"), params.get("value")
    if not isinstance(config_id, str) or not 0 < len(config_id) <= MAX_CONFIG_ID:
        raise RpcError.invalid_params(f"configId must be a non-empty string of at most {MAX_CONFIG_ID} characters")
    boolean = params.get("type") == "boolean"
    if boolean != isinstance(value, bool) or not isinstance(value, str | bool) or value == "":
        raise RpcError.invalid_params('value must be a value id, or true/false with type "boolean"')
    return config_id, value


async def set_config_option(agent: AcpAgent, rpc_id: jsonrpc.Id, params: dict[str, Any]) -> dict[str, Any]:
    """``session/set_config_option``: ``mode`` through ``session/set_mode``, a ``model``
    (the bridge's, or the agent's own option of that category) as the thread's model switch
    (:class:`SetModel`, as ``PATCH`` does it), the agent's other options by the agent;
    answers every option with its value now, and the session's other clients hear of it."""
    att = _attached(agent, params)
    config_id, value = _config_params(params)
    thread = att.thread
    options = options_of(agent, thread)
    if (why := acp_config.check_value(options, config_id, value)) is not None:
        raise RpcError.invalid_params(why)
    owner = acp_config.owner_of(thread.row(), config_id)
    row: Mapping[str, Any] | None = None
    # What this client will be answered, already: the thread's change (read by ``_watch``
    # meanwhile) is then not told to it a second time.
    told, att.config = att.config, acp_config.with_value(options, config_id, value)
    try:
        if owner == acp_config.MODE:
            await set_mode(att, str(value), agent.user.name)
        elif owner == acp_config.MODEL or (isinstance(value, str) and _is_model(options, config_id)):
            await _set_model(att, str(value), agent.user.name)
        else:
            row = await _set_agent_option(att, config_id, value, agent.user.name)
    except BaseException:
        att.config = told
        raise
    att.config = acp_config.with_value(options_of(agent, thread, row), config_id, value)
    return {"configOptions": att.config}


def _is_model(options: list[dict[str, Any]], config_id: str) -> bool:
    return any(o["id"] == config_id and o.get("category") == acp_config.MODEL for o in options)


async def _set_model(att: Attached, model: str, actor: str) -> None:
    """The thread's model switch (sessions/model_port.py); an agent's refusal of its own
    option as it gave it."""
    try:
        await att.thread.run(SetModel(model=model, actor=actor))
    except ConfigRefused as exc:
        raise RpcError(exc.rpc["code"], exc.rpc["message"], exc.rpc.get("data")) from None


async def _set_agent_option(att: Attached, config_id: str, value: str | bool, actor: str) -> Mapping[str, Any]:
    """One of the ACP agent's own options, set by the agent (its ``session/set_config_option``,
    through the thread); the thread's row with the options the agent answered."""
    try:
        answer = await att.thread.run(SetConfigOption(config_id=config_id, value=value, actor=actor))
    except ConfigRefused as exc:
        raise RpcError(exc.rpc["code"], exc.rpc["message"], exc.rpc.get("data")) from None
    except BridgeError as exc:
        if exc.code == "config_not_supported":
            raise RpcError.method_not_found(exc.message, {"code": exc.code}) from None
        raise
    row = att.thread.row()
    options = answer.get("config_options") if isinstance(answer, dict) else None
    if not options:
        return row
    info = row.get("agent_info")
    return {**row, "agent_info": {**(info if isinstance(info, dict) else {}), "config_options": options}}


def _attached(agent: AcpAgent, params: dict[str, Any]) -> Attached:
    att = agent.sessions.get(_session_id(params))
    if att is None:
        raise RpcError.not_found("session not attached on this connection: session/new, load or resume first")
    return att


# ---------------------------------------------------------------------- close and delete


async def close(agent: AcpAgent, rpc_id: jsonrpc.Id, params: dict[str, Any]) -> dict[str, Any]:
    """``session/close``: the session leaves this connection (no more updates, its
    permission requests withdrawn, its prompts answered ``cancelled``) and its agent is
    stopped, which ends its turn ``cancelled``; the thread stays. A session of the caller's
    that is not attached here is already closed: ``{}``; an unknown one is -32002."""
    sid = _session_id(params)
    att = agent.sessions.pop(sid, None)
    if att is None:
        try:
            thread = await agent.threads.get(sid)
            check_owner(agent.user, sid, thread.owner)
        except BridgeError as exc:
            raise RpcError.not_found(f"no session {sid}", {"code": exc.code}) from None
        return {}
    att.detach()
    await att.withdraw()
    try:
        await att.thread.stop_agent()
    except BridgeError as exc:  # (the thread was deleted meanwhile, say): closed all the same
        log.info("acp.close_stop_failed", thread_id=sid, code=exc.code)
    for prompt in att.prompts():
        await agent.answer_cancelled(prompt)
    att.by_client.clear()
    att.by_turn.clear()
    return {}


async def delete(agent: AcpAgent, rpc_id: jsonrpc.Id, params: dict[str, Any]) -> dict[str, Any]:
    """``session/delete``: the thread is deleted as ``DELETE /v1/threads/{id}`` deletes it,
    with the same rights. One that does not exist (or is not the caller's to see) is
    ``{}`` too, as ACP asks: deleting twice is no error."""
    sid = _session_id(params)
    try:
        await agent.threads.delete(sid, agent.user)
    except BridgeError as exc:
        if exc.code != "thread_not_found":
            raise
    return {}


async def deleted(agent: AcpAgent, att: Attached) -> None:
    """The thread went (deleted here or elsewhere): this client is told with a
    ``session_info_update`` whose ``_meta`` says so, its permission requests are withdrawn."""
    await att.withdraw()
    update = {"sessionUpdate": "session_info_update", "_meta": {META: {"deleted": True}}}
    await agent.notify("session/update", {"sessionId": att.thread.id, "update": update})


# ---------------------------------------------------------------------- the threads' changes


async def watching(agent: AcpAgent) -> None:
    """The connection follows its threads' changes from now on: called before a session's
    answer reads its state (its title, its options), so that nothing committed after that
    read is missed, however long a replay takes."""
    if agent.watcher is None or agent.watcher.done():
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        agent.watcher, agent.watch_ready = asyncio.create_task(_watch(agent, ready)), ready
    if agent.watch_ready is not None:
        await asyncio.shield(agent.watch_ready)


async def stop_watching(agent: AcpAgent) -> None:
    task, agent.watcher = agent.watcher, None
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def _watch(agent: AcpAgent, ready: asyncio.Future[None]) -> None:
    try:
        async for page in agent.threads.watch():
            if not ready.done():  # the first page comes once the change log's cursor is read
                ready.set_result(None)
            for thread_id, row in page:
                att = agent.sessions.get(thread_id)
                if att is not None and row is not None:
                    await changed(agent, att, row)
    except (TimeoutError, RuntimeError, OSError) as exc:  # an update could not go out
        log.info("acp.watch_send_failed", connection_id=agent.id, error=type(exc).__name__)
        agent.out.fail()
    except BridgeError as exc:  # the store could not be read: the next session's attach tries again
        log.warning("acp.watch_failed", connection_id=agent.id, code=exc.code)
    finally:
        if not ready.done():
            ready.set_result(None)


async def changed(agent: AcpAgent, att: Attached, row: Mapping[str, Any]) -> None:
    """A change of the session's thread: its title as ``session_info_update``, its config
    options as ``config_option_update``, each when it differs from what the client knows."""
    sid = att.thread.id
    title = str(row.get("title") or "") or None
    if title != att.title:
        att.title = title
        update: dict[str, Any] = {"sessionUpdate": "session_info_update", "title": title}
        if isinstance(row.get("updated_at"), str):
            update["updatedAt"] = row["updated_at"]
        await agent.notify("session/update", {"sessionId": sid, "update": update})
    options = options_of(agent, att.thread, row)
    if att.config is not None and options != att.config:
        att.config = options
        await agent.notify(
            "session/update",
            {"sessionId": sid, "update": {"sessionUpdate": "config_option_update", "configOptions": options}},
        )


async def tell_title(agent: AcpAgent, att: Attached) -> None:
    """After a load or resume answer: the thread's title, when it has one."""
    if att.title is not None:
        update: dict[str, Any] = {"sessionUpdate": "session_info_update", "title": att.title}
        if isinstance(updated := att.thread.row().get("updated_at"), str):
            update["updatedAt"] = updated
        await agent.notify("session/update", {"sessionId": att.thread.id, "update": update})
