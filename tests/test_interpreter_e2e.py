"""An agent CLI that is a script starting ``#!/usr/bin/env <interpreter>``, whose interpreter
the agent's PATH finds outside the system directories (nvm's node, a wheel's node), runs
confined in a real daemon: the sandbox grants that interpreter's directory (before, the
agent died with ``env: '...': Permission denied``). Here the interpreter is a copy of
Python in a temp dir of its own, named only by the profile's PATH."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FAKE_AGENT, PYTHON, fake_grants, new_thread

from bridge.process import bwrap
from bridge.process import sandbox as sb

pytestmark = pytest.mark.timeout(120)

# The script's body: run the fake agent named by its first argument, as `python fake.py` would.
BODY = "import runpy, sys\nsys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"


@pytest.fixture
def interp_dir() -> Iterator[Path]:
    """A directory outside the test's temp dir (which the test daemon grants) holding
    ``agentpy``, a copy of this Python: its real path is there, not in the system."""
    d = Path(tempfile.mkdtemp(prefix="agent-bridge-interp-"))
    shutil.copy2(PYTHON, d / "agentpy")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def profile(interp_dir: Path, env: dict[str, str], mode: str) -> str:
    # The CLI lies outside the test's temp dir, as an installed CLI lies outside what the
    # agent may write: a script the agent could rewrite is not followed (its line could
    # name any file).
    cli = interp_dir / "cli" / "agent"
    cli.parent.mkdir()
    cli.write_text("#!/usr/bin/env -S agentpy -I\n" + BODY)
    cli.chmod(0o755)
    env = {**env, "PATH": f"{interp_dir}:/usr/bin:/bin"}  # the profile's PATH, not the daemon's
    return (
        "[server]\nstop_grace_s = 2\n\n[agents.script]\n"
        'protocol = "stream-json"\n'
        f"executable = {json.dumps(str(cli))}\n"
        f"args = {json.dumps([str(FAKE_AGENT), '--dialect', 'stream-json'])}\n"
        f"sandbox = {json.dumps(mode)}\n"
        "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }\n" + fake_grants(env) + "\n"
    )


MODES = [
    pytest.param(
        "landlock", marks=pytest.mark.skipif(sb.landlock_abi() < sb.MIN_ABI, reason="this kernel has no Landlock")
    ),
    pytest.param(
        "bubblewrap",
        marks=pytest.mark.skipif(
            bwrap.problem(bwrap.find()) is not None, reason="bubblewrap cannot run here (apt-get install bubblewrap)"
        ),
    ),
]


@pytest.mark.parametrize("mode", MODES)
async def test_a_script_cli_runs_on_an_interpreter_found_on_its_path_outside_the_system(
    daemon_factory: Any, agent_env: dict[str, str], interp_dir: Path, mode: str
) -> None:
    d = await daemon_factory(profile(interp_dir, agent_env, mode))
    async with d.http() as http:
        agents = {a["name"]: a for a in (await http.get("/v1/agents")).json()}
    assert agents["script"]["available"] and agents["script"]["sandbox"] == mode, agents["script"]
    thread = await new_thread(d, "script")
    c = await d.ws(thread["id"])
    end = await c.turn("hello")
    assert end["data"]["status"] == "success", end["data"]
    assert "".join(f["data"]["text"] for f in c.seen("message.delta"))
