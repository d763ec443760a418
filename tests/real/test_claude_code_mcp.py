"""The real Claude Code reading a thread's MCP servers from the bridge's generated
``--mcp-config`` file (issue #37), offline: the server is a small stdio MCP server written
here, which answers only if it was started with the environment the client gave it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import new_thread
from realagents import Real, fake_api, real
from test_claude_code import claude_profile

__all__ = ["fake_api", "real"]  # fixtures used by the test below

pytestmark = pytest.mark.timeout(120)

TOKEN = "mcp-env-s3cret"

# MCP over stdio, the least a client needs to list a server as connected: initialize,
# then tools/list. It exits at once when its secret did not reach it.
SERVER = f"""
import json, os, sys
if os.environ.get("API_TOKEN") != {TOKEN!r}:
    sys.exit(3)
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg.get("method") == "initialize":
        result = {{"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {{"tools": {{}}}},
                  "serverInfo": {{"name": "wire-test", "version": "1"}}}}
    elif msg.get("method") == "tools/list":
        result = {{"tools": []}}
    else:
        result = {{}}
    sys.stdout.write(json.dumps({{"jsonrpc": "2.0", "id": msg["id"], "result": result}}) + "\\n")
    sys.stdout.flush()
"""


async def test_claude_code_connects_the_mcp_server_a_client_gave_the_thread(real: Real) -> None:
    script = real.work / "mcp_server.py"
    script.write_text(SERVER)
    servers = [
        {
            "name": "files",
            "command": sys.executable,
            "args": ["-I", str(script)],
            "env": [{"name": "API_TOKEN", "value": TOKEN}],
        },
        {"name": "broken", "command": sys.executable, "args": ["-I", str(script)], "env": []},
    ]
    d = await real.daemon(real.config(claude_profile(real)))
    thread = await new_thread(d, "claude", cwd=str(real.work), options={"mcp_servers": servers})
    c = await d.ws(thread["id"])
    end = await c.turn("CHAT hello there")
    assert end["data"]["status"] == "success", end
    init = c.seen("session.started")[0]["raw"]
    status = {s["name"]: s["status"] for s in init["mcp_servers"]}
    # --strict-mcp-config in the profile: the client's servers and nothing else; the one given its env connects.
    assert status["files"] == "connected" and status["broken"] != "connected", status
    assert set(status) == {"files", "broken"}
    path = Path(real.home) / ".agent-bridge-mcp" / f"{thread['id']}.json"
    assert path.exists() and path.stat().st_mode & 0o777 == 0o600
    assert all(TOKEN not in t for t in c.texts)  # the secret went to the agent, never to a client
