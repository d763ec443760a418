"""A client's MCP servers as the bridge checks and hands them on (protocols/mcp_servers.py):
ACP's schema, strictly, with bounds; secrets only in what goes to the agent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from acp.schema import NewSessionRequest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.protocols import mcp_servers as mcp
from bridge.protocols.acp import AcpCodec

STDIO = {"name": "fs", "command": "/usr/bin/mcp-fs", "args": ["-v"], "env": [{"name": "TOKEN", "value": "t0k"}]}
HTTP = {
    "type": "http",
    "name": "web",
    "url": "https://x.example/mcp",
    "headers": [{"name": "Authorization", "value": "B"}],
}
SSE = {"type": "sse", "name": "old", "url": "http://127.0.0.1:1/sse", "headers": []}


def test_the_stored_form_is_acps_and_the_sdk_takes_it() -> None:
    servers = mcp.parse([{**STDIO, "_meta": {"x": 1}}, HTTP, SSE])
    assert servers == [STDIO, HTTP, SSE]  # _meta dropped, nothing else changed
    assert mcp.parse([{**STDIO, "type": "stdio"}]) == [STDIO]  # a type ACP's stdio does not need, dropped
    NewSessionRequest.model_validate({"cwd": "/", "mcpServers": servers})  # the official schema agrees


@pytest.mark.parametrize(
    "bad",
    [
        None,
        {},
        [1],
        [{**STDIO, "command": "mcp-fs"}],
        [{**STDIO, "args": "x"}],
        [{**STDIO, "args": [1]}],
        [{**STDIO, "env": {"TOKEN": "x"}}],
        [{**STDIO, "env": [{"name": "1BAD", "value": "x"}]}],
        [{**STDIO, "env": [{"name": "A", "value": "x"}, {"name": "A", "value": "y"}]}],
        [{**STDIO, "env": [{"name": "A", "value": "x\x00"}]}],
        [{k: v for k, v in STDIO.items() if k != "env"}],
        [{**STDIO, "name": ""}],
        [{**STDIO, "name": "a\nb"}],
        [{**STDIO, "name": "\ud800"}],
        [{**STDIO, "cmd": "/x"}],
        [{**HTTP, "url": "ftp://x/"}],
        [{**HTTP, "url": "https://x/ y"}],
        [{**HTTP, "url": "https://" + "x" * 3000}],
        [{**HTTP, "headers": [{"name": "Bad Name", "value": "x"}]}],
        [{**HTTP, "headers": [{"name": "X", "value": "a\rb"}]}],
        [{"type": "acp", "name": "a", "serverId": "s"}],
        [{**STDIO, "args": ["x"] * 65}],
        [{**STDIO, "env": [{"name": f"V{i}", "value": ""} for i in range(65)]}],
        [{**STDIO, "name": f"s{i}"} for i in range(17)],
        [STDIO, {**HTTP, "name": "fs"}],
    ],
)
def test_anything_else_is_refused(bad: Any) -> None:
    with pytest.raises(mcp.McpServersInvalid):
        mcp.parse(bad)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=30,
)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["name", "command", "args", "env", "type", "url", "headers"]), json_values)
    )
)
def test_hostile_input_is_a_list_or_a_refusal_never_a_crash(value: Any) -> None:
    try:
        servers = mcp.parse(value)
    except mcp.McpServersInvalid:
        return
    NewSessionRequest.model_validate({"cwd": "/", "mcpServers": servers})


def test_redacted_hides_every_env_and_header_value() -> None:
    shown = json.dumps(mcp.redacted([STDIO, HTTP]))
    assert "t0k" not in shown and '"B"' not in shown and shown.count("[redacted]") == 2
    assert mcp.redacted([STDIO])[0]["command"] == STDIO["command"]


def test_an_acp_agent_gets_the_kinds_it_said_it_takes() -> None:
    assert mcp.for_acp([STDIO, HTTP, SSE], {}) == ([STDIO], ["web", "old"])
    assert mcp.for_acp([STDIO, HTTP, SSE], {"http": True}) == ([STDIO, HTTP], ["old"])
    codec = AcpCodec(cwd="/w", mcp_servers=[STDIO, HTTP])
    codec.start()
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "result": {"protocolVersion": 1, "agentCapabilities": {"mcpCapabilities": {"http": True}}},
    }
    out = codec.decode(json.dumps(init).encode())
    (new,) = [json.loads(r) for r in out.replies]
    assert new["method"] == "session/new" and new["params"]["mcpServers"] == [STDIO, HTTP]


def test_claude_code_config_and_endpoints() -> None:
    assert mcp.claude_config([STDIO, HTTP]) == {
        "mcpServers": {
            "fs": {"type": "stdio", "command": "/usr/bin/mcp-fs", "args": ["-v"], "env": {"TOKEN": "t0k"}},
            "web": {"type": "http", "url": "https://x.example/mcp", "headers": {"Authorization": "B"}},
        }
    }
    assert mcp.endpoints([STDIO, HTTP]) == ["-v", "t0k", "https://x.example/mcp"]
