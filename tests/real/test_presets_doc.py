"""docs/agents.md ships profile presets: each one is valid TOML and a valid profile (issue #9).
The tested ones (claude, claude-acp) also run, in test_claude_code.py and
test_claude_agent_acp.py."""

from __future__ import annotations

import re
import tomllib

from realagents import DOCS_AGENTS

from bridge.config import AgentProfile

PRESETS = {
    "claude",
    "claude-offline",
    "claude-acp",
    "qwen",
    "qwen-acp",
    "qwen-acp-lean",
    "codebuddy",
    "gemini",
    "goose",
    "opencode",
    "codex",
    "awp",
}


def test_every_preset_in_the_docs_is_a_valid_profile() -> None:
    blocks = re.findall(r"```toml\n(.*?)```", DOCS_AGENTS.read_text(), flags=re.S)
    found: dict[str, dict[str, object]] = {}
    for block in blocks:
        for name, table in tomllib.loads(block)["agents"].items():
            assert name not in found, f"preset {name} shown twice"
            found[name] = table
    assert set(found) == PRESETS
    for name, table in found.items():
        if name == "claude-offline":
            continue  # an env table only, completing [agents.claude]
        profile = AgentProfile.model_validate({**table, "name": name})
        assert profile.executable.startswith("/"), name
        assert profile.env, name


def test_the_docs_name_every_tested_version_and_say_why_the_others_are_not() -> None:
    # Each status row says "tested in CI with <CLI> <version>" or "not tested: <why>", and
    # the tested versions are bridge/tested_agents.py's (which test_tested_agents.py keeps
    # equal to npm-pins.txt).
    from bridge.tested_agents import TESTED

    text = DOCS_AGENTS.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| [")]
    assert len(rows) == 9, rows
    for row in rows:
        status = row.rsplit("|", 2)[-2]
        assert re.search(r"tested in CI with [\w -]+ \d+\.\d+\.\d+", status) or "not tested: " in status, row
    tested = " ".join(rows)
    for versions in TESTED.values():
        for v in versions:
            assert re.search(rf"tested in CI with [\w -]+ {re.escape(v)}\b", tested), v
