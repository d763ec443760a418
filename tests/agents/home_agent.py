#!/usr/bin/env python3
"""The scripted fake agent (fake_agent.py, same arguments and directives) keeping its
native sessions where a real CLI keeps them: under its own ``$HOME``
(``$HOME/.fake-agent/sessions``), whatever ``FAKE_AGENT_STATE`` says. So which sessions a
thread can resume depends on the HOME the bridge gave its agent, as with Claude Code or Qwen
Code (users mode: each user's own). Standard library only."""

from __future__ import annotations

import os
import runpy
import sys

home = os.environ.get("HOME")
if not home:
    sys.stderr.write("home_agent: no HOME\n")
    sys.exit(2)
state = os.path.join(home, ".fake-agent", "sessions")
os.makedirs(state, mode=0o700, exist_ok=True)
os.environ["FAKE_AGENT_STATE"] = state
fake = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_agent.py")
sys.argv = [fake, *sys.argv[1:]]
runpy.run_path(fake, run_name="__main__")
