"""Sample files for the demo agent's default workspace (README "Try it"): a thread of the
bundled demo profile created without a ``cwd`` runs in a fresh directory under the data
dir, and ``list files`` / ``read <file>`` there would show nothing. These few small files
make the demo show something. Written once, into a directory just created; never over
anything."""

from __future__ import annotations

from pathlib import Path

SAMPLES = {
    "README.md": (
        "# Demo workspace\n\n"
        "A few sample files for the demo agent, which runs in this directory.\n"
        "Ask it to `list files`, to `read hello.py`, to `edit hello.py`, or for a `tour`.\n"
    ),
    "hello.py": 'def greet(name: str) -> str:\n    return f"Hello, {name}!"\n\n\nprint(greet("agent-bridge"))\n',
    "notes.txt": (
        "Things to try:\n- tour\n- list files\n- read README.md\n- edit hello.py\n- run wc -l\n"
        "- task\n- code\n- think\n- what did I say?\n- slow\n"
    ),
}


def write_demo_samples(workspace: Path) -> None:
    for name, text in SAMPLES.items():
        target = workspace / name
        if not target.exists():
            target.write_text(text, encoding="utf-8")


__all__ = ["SAMPLES", "write_demo_samples"]
