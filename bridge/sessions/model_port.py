"""A thread's model switched on this replica (:class:`SetModel`, docs/api.md §4.5): the
one operation behind ``PATCH /v1/threads/{id} {"model"}`` and the ACP gateway's ``model``
config option, whichever surface asks.

Two ways, by what the agent offers:

* **An agent with a ``model`` config option** (ACP: its own ``configOptions``, or the older
  ``models``, sessions/config_options.py): the option is set, the agent running (started
  first when it is not, as any config switch); the agent keeps its session and uses the
  model from its next turn on. The model must be one of the option's values.
* **Every other agent** (stream-json, awp-jsonl): the model goes on the command line, so
  the agent is started again with it and resumes its session (``--resume``), which keeps
  the conversation. The new launch is checked as a new thread's is (bridge/launching.py);
  then the core decides the turn boundary (core.switch_model): an idle agent stops now, a
  busy one once its turn ends; prompts sent meanwhile wait for the new process.

An ACP agent that reports no ``model`` option cannot switch: it is never given a model on
its command line, so a restart would change nothing (400 ``model_not_supported``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from bridge.errors import InvalidRequest, LaunchRefused
from bridge.launching import ThreadLaunch
from bridge.protocols.codecs import may_have_modes
from bridge.sessions.commands import SetConfigOption, SetModel
from bridge.sessions.config_options import CONFIG_TIMEOUT_S, ConfigTimeout, model_option
from bridge.sessions.config_port import set_config_here
from bridge.sessions.conversation import Conversation


async def set_model_here(conv: Conversation, c: SetModel) -> dict[str, Any]:
    """Answers ``{model, previous, applies}`` (commands.SetModel); raises InvalidRequest
    (``invalid_model``, ``model_not_supported``), LaunchRefused (the launch rules), or what a
    config switch raises on an ACP agent."""
    profile = conv.profile
    if profile is None:
        raise LaunchRefused(f"agent profile {conv.thread['agent']!r} is no longer configured", code="agent_not_found")
    previous = conv.thread.get("model")
    if c.model == previous:
        return {"model": c.model, "previous": previous, "applies": "unchanged"}
    # Checked as a new thread's model is, before anything is recorded or stopped.
    launch = ThreadLaunch.checked(profile, conv.core.options, cwd=conv.thread["cwd"], model=c.model)
    if may_have_modes(profile.protocol):
        return await _by_option(conv, c, previous)
    applies = "after_turn" if conv.core.active is not None else "now"
    await conv.switch_model(launch, lambda: conv.core.switch_model(c.model, previous, c.actor))
    return {"model": c.model, "previous": previous, "applies": applies}


async def _by_option(conv: Conversation, c: SetModel, previous: str | None) -> dict[str, Any]:
    """The agent's own ``model`` option set to ``c.model`` (its start and handshake first,
    when it is not running); the config switch records the thread's model
    (config_port.py)."""
    conv.require_writable()
    await conv.ensure_started()
    try:
        async with asyncio.timeout(CONFIG_TIMEOUT_S):
            await conv.until_ready()
    except TimeoutError:
        raise ConfigTimeout(f"the agent did not start its session within {CONFIG_TIMEOUT_S:g} s") from None
    option = model_option(conv.thread)
    if option is None or not isinstance(option.get("config_id"), str):
        raise InvalidRequest(
            "this agent offers no model to switch to (it reports no model config option)", code="model_not_supported"
        )
    values = [v for v in (ch.get("value") for ch in option["choices"]) if isinstance(v, str)]
    if c.model not in values:
        shown = ", ".join(values[:20]) + (", …" if len(values) > 20 else "")
        raise InvalidRequest(f"model {c.model!r} is not one this agent offers ({shown})", code="invalid_model")
    await set_config_here(conv, SetConfigOption(config_id=option["config_id"], value=c.model, actor=c.actor))
    return {"model": c.model, "previous": previous, "applies": "now"}


__all__ = ["SetModel", "set_model_here"]
