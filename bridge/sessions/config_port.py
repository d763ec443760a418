"""A session config option set on this replica (:class:`SetConfigOption`): the shell side
of sessions/config_options.py, as local_port.py's ``set_mode`` is for a mode.

The agent is started first when it is not running (as a prompt would start it), the
switch waits for its session, then for its answer, routed back to this call by the codec.
"""

from __future__ import annotations

from typing import Any

from bridge.errors import Conflict, InvalidRequest
from bridge.protocols.codecs import may_have_modes
from bridge.sessions.actions import Action
from bridge.sessions.commands import SetConfigOption
from bridge.sessions.config_options import (
    CONFIG_TIMEOUT_S,
    ConfigTimeout,
    config_answer,
    config_request,
    model_option,
)
from bridge.sessions.conversation import Conversation
from bridge.sessions.withdraw import ask_agent


async def set_config_here(conv: Conversation, c: SetConfigOption) -> dict[str, Any]:
    """Answers once the agent accepted the switch (its full list of options), else raises
    its refusal (ConfigRefused), ConfigTimeout, or InvalidRequest ``config_not_supported``."""
    if conv.profile is not None and not may_have_modes(conv.profile.protocol):
        # Only ACP agents have session config options (as only they have modes).
        raise InvalidRequest("this thread's agent has no session config options", code="config_not_supported")

    def request(route: str) -> list[Action]:
        if conv.core.codec is None:
            raise Conflict("the agent process is not running", code="agent_exited")
        return config_request(conv.core.codec, c.config_id, c.value, route, c.actor)

    text = await ask_agent(
        conv, request, method="session/set_config_option", timeout_s=CONFIG_TIMEOUT_S, timeout_error=ConfigTimeout
    )
    answer = config_answer(text, c.config_id, c.value)
    await _record_model(conv, c)
    return answer


async def _record_model(conv: Conversation, c: SetConfigOption) -> None:
    """The agent took a value of its ``model`` option: that is the thread's model now
    (its ``model``, a ``notice`` ``model_changed``), which a restarted agent is set to
    again (core._keep_model) — however the switch was asked (§4.5 ``PATCH``, §4.21)."""
    option = model_option(conv.thread)
    previous = conv.thread.get("model")
    if option is None or option["config_id"] != c.config_id or not isinstance(c.value, str) or c.value == previous:
        return
    async with conv.journal.lock:
        await conv.perform(conv.core.switch_model(c.value, previous, c.actor, restart=False))


__all__ = ["SetConfigOption", "set_config_here"]
