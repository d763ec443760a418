"""process/interpreter.py and what Sandbox.plan grants for it: an agent CLI that is a script
(``#!/usr/bin/env node``) may execute the interpreter found on the agent's own PATH, only
that interpreter's directory, read-only, and never a directory the rules refuse. In
process: no kernel sandbox is needed to compute a plan."""

from __future__ import annotations

import os
import shutil
import sys
import timeit
from pathlib import Path

import pytest

from bridge.process import interpreter as it
from bridge.process import sandbox as sb


def script(path: Path, first_line: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(first_line + "\nprint('hi')\n")
    path.chmod(0o755)
    return str(path)


def program(path: Path) -> Path:
    """An executable file (its content is never run here)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def box(deny: list[Path]) -> sb.Sandbox:
    """A Landlock sandbox as the daemon holds it (a plan is only computed, never applied)."""
    return sb.Sandbox(mechanism="landlock", requested="auto", abi=3, deny=tuple(str(d) for d in deny))


def test_the_interpreter_is_found_as_the_kernel_and_env_find_it(tmp_path: Path) -> None:
    first, second = program(tmp_path / "a" / "node"), program(tmp_path / "b" / "node")
    path = f"relative:{first.parent}:{second.parent}"
    s = tmp_path / "cli.js"
    assert it.interpreter(script(s, "#!/usr/bin/env node"), path) == str(first)
    assert it.interpreter(script(s, "#!/usr/bin/env node"), f"{second.parent}:{first.parent}") == str(second)
    assert it.interpreter(script(s, "#! \t/usr/bin/env -S node --no-warnings"), path) == str(first)
    assert it.interpreter(script(s, f"#!/usr/bin/env -S -i PATH={second.parent} node"), path) == str(second)
    assert it.interpreter(script(s, f"#!{second} --flag"), path) == str(second)
    # A symlink on PATH is followed to the real file (what a rule must name).
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "node").symlink_to(second)
    assert it.interpreter(script(s, "#!/usr/bin/env node"), str(tmp_path / "links")) == str(second)
    # What is not followed: no script, a relative interpreter or PATH entry, env without -S
    # given words, options with arguments, quoting, a line longer than the kernel reads.
    for line in (
        "print('no shebang')",
        "#!node",
        "#!/usr/bin/env node --flag",
        "#!/usr/bin/env -S -u HOME node",
        "#!/usr/bin/env -S 'node'",
        "#!/usr/bin/env ./node",
        "#!/usr/bin/env " + "n" * it.HEAD,
        "#!/usr/bin/env missing",
    ):
        assert it.interpreter(script(s, line), path) is None, line
    assert it.interpreter(script(s, "#!/usr/bin/env node"), "relative:.") is None
    assert it.interpreter(str(tmp_path / "absent"), path) is None
    assert it.interpreter(str(tmp_path), path) is None  # a directory


def test_a_plan_grants_the_interpreter_on_the_agents_path_read_only(tmp_path: Path) -> None:
    node = program(tmp_path / "opt-node" / "v22" / "bin" / "node")
    cli = script(tmp_path / "prefix" / "lib" / "node_modules" / "cli" / "cli.js", "#!/usr/bin/env node")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {"HOME": str(home), "PATH": f"{node.parent}:/usr/bin:/bin"}
    plan = box([]).plan(cwd=str(work), env=env, executable=cli)
    assert plan is not None
    assert str(node.parent) in plan.read and str(node.parent) not in plan.write
    # An interpreter that is a script itself: its own interpreter too.
    wrapped = script(tmp_path / "wrapper" / "node-wrapper", f"#!{node}")
    nested = script(tmp_path / "nested" / "cli.js", "#!/usr/bin/env node-wrapper")
    twice = box([]).plan(cwd=str(work), env={**env, "PATH": os.path.dirname(wrapped)}, executable=nested)
    assert twice is not None and {str(node.parent), os.path.dirname(wrapped)} <= set(twice.read)
    # The launch env's PATH decides, not the daemon's: without node on it, nothing.
    bare = box([]).plan(cwd=str(work), env={**env, "PATH": "/usr/bin:/bin"}, executable=cli)
    assert bare is not None and str(node.parent) not in bare.read
    # An interpreter in the system adds no rule (the system is read by every agent).
    python = script(tmp_path / "tool" / "agent.py", "#!/usr/bin/env python3")
    system = box([]).plan(cwd=str(work), env={**env, "PATH": "/usr/bin:/bin"}, executable=python)
    assert system is not None and len(system.read) == len(bare.read)


@pytest.mark.parametrize("where", ["in-deny", "holds-deny", "home", "home-parent"])
def test_an_interpreter_directory_the_rules_refuse_is_not_granted(tmp_path: Path, where: str) -> None:
    home, work, data = tmp_path / "home", tmp_path / "work", tmp_path / "home" / ".local" / "share" / "agent-bridge"
    data.mkdir(parents=True)
    work.mkdir()
    node = {
        "in-deny": data / "bin" / "node",
        "holds-deny": home / ".local" / "node",  # its dir holds the data dir
        "home": home / "node",  # the whole home
        "home-parent": tmp_path / "node",  # a dir holding a home
    }[where]
    program(node)
    cli = script(tmp_path / "cli" / "cli.js", "#!/usr/bin/env node")
    env = {"HOME": str(home), "PATH": f"{node.parent}:/usr/bin"}
    plan = box([data]).plan(cwd=str(work), env=env, executable=cli)
    assert plan is not None and str(node.parent) not in plan.read
    assert not it.grantable("/", deny=(), homes=())
    assert not it.grantable("/tmp", deny=(), homes=())


def test_a_line_the_agent_could_have_written_opens_nothing(tmp_path: Path) -> None:
    """A hostile agent plants ``node`` in a directory it may write and that is on its PATH
    (its HOME's bin), as a script whose line names a file elsewhere: the next start must not
    grant that file's directory. Nor is a line followed in an executable the agent may
    rewrite (one inside its cwd)."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    secret = tmp_path / "elsewhere" / "secret"
    secret.parent.mkdir()
    secret.write_text("not for agents\n")
    planted = script(home / "bin" / "node", f"#!{secret}")
    cli = script(tmp_path / "cli" / "cli.js", "#!/usr/bin/env node")
    env = {"HOME": str(home), "PATH": f"{home / 'bin'}:/usr/bin:/bin"}
    plan = box([]).plan(cwd=str(work), env=env, executable=cli)
    assert plan is not None
    assert str(secret.parent) not in plan.read and os.path.dirname(planted) not in plan.read
    # The same line in an executable outside what the agent writes is the operator's: followed.
    outside = script(tmp_path / "operator" / "node", f"#!{secret}")
    trusted = box([]).plan(cwd=str(work), env={**env, "PATH": f"{Path(outside).parent}:/usr/bin"}, executable=cli)
    assert trusted is not None and str(secret.parent) in trusted.read
    # An executable inside the agent's cwd: its line is not read.
    inside = script(work / "tool.js", "#!/usr/bin/env node")
    mine = box([]).plan(cwd=str(work), env={**env, "PATH": f"{Path(outside).parent}:/usr/bin"}, executable=inside)
    assert mine is not None and str(secret.parent) not in mine.read


def test_reading_the_line_costs_microseconds(tmp_path: Path) -> None:
    """The cost a spawn pays for it: one open and read of 256 bytes, a PATH walk."""
    node = shutil.which("python3") or sys.executable
    cli = script(tmp_path / "cli.js", "#!/usr/bin/env python3")
    path = f"{tmp_path}/none:{os.path.dirname(node)}"
    n = 200
    each = min(timeit.repeat(lambda: it.interpreter(cli, path), number=n, repeat=3)) / n
    assert each < 0.005, each  # far above what it takes (tens of microseconds), for loaded hosts
