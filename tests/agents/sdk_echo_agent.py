#!/usr/bin/env python3
"""Minimal ACP echo agent written with the official Python SDK (PyPI
``agent-client-protocol`` 0.12.x, import ``acp``), modelled on the SDK repository's
``examples/echo_agent.py``.

Run with a Python that has the SDK installed (the project venv), not with ``-I``
outside it: ``.venv/bin/python tests/agents/sdk_echo_agent.py``.

- initialize: answers min(client's protocolVersion, acp.PROTOCOL_VERSION), advertises loadSession, agentInfo
  {name: "sdk-echo"}, no auth methods.
- session/new: a fresh uuid hex id; nothing is persisted.
- session/load: accepted for any id, with no replay (answers {}).
- session/prompt: each text block (non-text blocks as "[<type>]") comes back as one
  agent_message_chunk, then stopReason "end_turn".
- session/cancel: accepted and ignored (every turn is instantaneous).
Everything else is whatever the SDK does by default (an un-overridden Agent method
answers {} or null rather than -32601; an unknown method is -32601).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    Agent,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    text_block,
    update_agent_message,
)
from acp.schema import AgentCapabilities, Implementation


class EchoAgent(Agent):
    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    async def initialize(
        self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None, **kwargs: Any
    ) -> InitializeResponse:
        # Echo the client's version if we speak it, else offer ours (ACP version negotiation).
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(load_session=True),
            agent_info=Implementation(name="sdk-echo", title="SDK echo", version="1.0"),
        )

    async def new_session(
        self, cwd: str, additional_directories: Any = None, mcp_servers: Any = None, **kwargs: Any
    ) -> NewSessionResponse:
        return NewSessionResponse(session_id=uuid.uuid4().hex)

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: Any = None, additional_directories: Any = None, **kwargs: Any
    ) -> LoadSessionResponse | None:
        return LoadSessionResponse()

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        for block in prompt:
            text = getattr(block, "text", None)
            if text is None:
                text = f"[{getattr(block, 'type', 'block')}]"
            await self._conn.session_update(session_id=session_id, update=update_agent_message(text_block(text)))
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        return None


if __name__ == "__main__":
    asyncio.run(run_agent(EchoAgent()))  # type: ignore[abstract]  # acp.Agent is a Protocol
