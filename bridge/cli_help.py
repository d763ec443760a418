"""The words of ``agent-bridge --help`` and each command's ``--help`` (issue #34 item 5):
plain text (no markup from the code's docstrings), every option with its default, and
examples to copy. bridge/cli.py builds the parsers; :func:`finish` gives each its
description and examples, and keeps the examples' line breaks as written."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Run coding agents (Claude Code, Qwen Code, CodeBuddy, ACP agents such as Gemini CLI,
or the bundled demo agent) behind one HTTP and WebSocket API and a web page. Every
conversation is kept, with its transcript, across restarts."""

# The command (as typed after agent-bridge) → (its description, its examples).
COMMANDS: dict[str, tuple[str, str]] = {
    "": (
        DESCRIPTION,
        """\
examples:
  agent-bridge serve                 start on http://127.0.0.1:8765; prints a sign-in link
  agent-bridge agents                which agent profiles can run, and which is the default
  agent-bridge status                does a daemon serve this data dir?
  agent-bridge serve --help          the options of one command, with their defaults

Settings come from, highest first: flags, their AGENT_BRIDGE_* environment twins, the
TOML file given with --config, built-in defaults (docs/configuration.md).""",
    ),
    "serve": (
        "Run the daemon until Ctrl-C or SIGTERM, then stop every agent and exit 0. The first\n"
        "line on stdout is the address it listens on, the second a one-time sign-in link.",
        """\
examples:
  agent-bridge serve
  agent-bridge serve --port 0 --data-dir /tmp/bridge-try        a free port, a scratch data dir
  agent-bridge serve --config /etc/agent-bridge/config.toml --host 0.0.0.0
  AGENT_BRIDGE_TOKEN=my-long-secret agent-bridge serve          the token from the environment""",
    ),
    "agents": (
        "List the agent profiles: the configured ones, agent CLIs found on PATH and the demo;\n"
        "for each whether it can run (if not, why and what to change) and which is the default.",
        """\
examples:
  agent-bridge agents
  agent-bridge agents --config ~/.config/agent-bridge/config.toml --json""",
    ),
    "status": (
        "Say whether a daemon serves the data dir: exit status 0 when one runs, 3 when none does.",
        """\
examples:
  agent-bridge status
  agent-bridge status --data-dir /tmp/bridge-try --json""",
    ),
    "login-link": (
        "Print a fresh one-time sign-in link for the daemon that serves the data dir (exit 3\n"
        "when none runs). Open it in a browser to sign in without pasting the token.",
        """\
example:
  agent-bridge login-link""",
    ),
    "acp": (
        "Speak ACP (the Agent Client Protocol) on stdin and stdout, relayed to a daemon's ACP\n"
        "gateway: an editor that spawns its agents runs this, and every thread is a session.",
        """\
examples:
  agent-bridge acp                                  the local daemon, its default profile
  agent-bridge acp --agent claude --url http://127.0.0.1:8765
Give the token in the editor's environment (AGENT_BRIDGE_TOKEN), not as --token.""",
    ),
    "migrate": (
        "Create or upgrade the store's schema, then exit (serve does it too at start).",
        """\
examples:
  agent-bridge migrate
  agent-bridge migrate --store-url postgresql://bridge@db.example/bridge""",
    ),
    "users": (
        'Manage the users of [auth] mode = "users" in the store, and their secrets.',
        """\
examples:
  agent-bridge users add alice               prints alice's token, once
  agent-bridge users add bob --admin
  agent-bridge users list
  agent-bridge users revoke alice
  agent-bridge users secret set alice claude ANTHROPIC_API_KEY < key.txt""",
    ),
}


def finish(parser: argparse.ArgumentParser, path: str = "", inherited: str | None = None) -> None:
    """Give ``parser`` and every parser under it plain help: the description and examples
    of :data:`COMMANDS` (a nested command, such as ``users add``, shows its parent's
    examples), laid out as written."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    if path in COMMANDS:
        parser.description, parser.epilog = COMMANDS[path]
    elif inherited is not None:
        parser.epilog = inherited
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                finish(sub, f"{path} {name}".strip(), parser.epilog if path else None)
