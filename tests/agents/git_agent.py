#!/usr/bin/env python3
"""A stream-json agent that edits files and runs commands in its cwd, as a coding agent's
tools do (a thread's own worktree, docs/api.md §4.27). Standard library only; run as
``python -I git_agent.py`` (the bridge adds its stream-json flags, taken as the real CLIs
take them; anything else is refused).

Each user turn's text is a JSON list of steps, done in order in the agent's cwd; the
turn's one assistant message is a JSON list with one result per step:

  {"write": PATH, "text": T}      create or replace PATH (relative to the cwd, or absolute)
                                  with T; "ok", or "denied" / "error:<errno name>"
  {"write_bytes": PATH, "hex": H} the same with raw bytes (PATH may be hex too: "path_hex")
  {"append": PATH, "text": T}     append T to PATH (which must exist)
  {"symlink": PATH, "to": TARGET} make a symbolic link
  {"remove": PATH}                remove a file
  {"run": [ARGV...]}              run a program (no shell): {"rc", "out", "err"}
  {"wait_for": PATH}              wait (at most 20 s) until PATH exists: a turn held open

The turn ends with a ``result`` line, as Claude Code ends one.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
import uuid

ACCEPTED = {"--output-format", "--input-format", "--verbose", "--model", "--resume", "--print"}


def out(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def refuse_unknown(argv: list[str]) -> None:
    i = 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        if flag not in ACCEPTED:
            sys.stderr.write(f"error: unknown option '{argv[i]}'\n")
            sys.exit(1)
        if "=" not in argv[i] and flag in {"--output-format", "--input-format", "--model", "--resume"}:
            i += 1
        i += 1


def _failed(exc: OSError) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "denied"
    return f"error:{errno.errorcode.get(exc.errno or 0, str(exc))}"


def _path(step: dict[str, object], key: str) -> bytes:
    if f"{key}_hex" in step:
        return bytes.fromhex(str(step[f"{key}_hex"]))
    return str(step[key]).encode("utf-8", "surrogateescape")


def do(step: dict[str, object]) -> object:
    try:
        if "write" in step or "write_hex" in step:
            with open(_path(step, "write"), "w", encoding="utf-8") as f:
                f.write(str(step["text"]))
        elif "write_bytes" in step or "write_bytes_hex" in step:
            with open(_path(step, "write_bytes"), "wb") as f:
                f.write(bytes.fromhex(str(step["hex"])))
        elif "append" in step:
            with open(_path(step, "append"), "r+", encoding="utf-8") as f:
                f.seek(0, os.SEEK_END)
                f.write(str(step["text"]))
        elif "symlink" in step:
            os.symlink(str(step["to"]), _path(step, "symlink"))
        elif "remove" in step:
            os.remove(_path(step, "remove"))
        elif "wait_for" in step:
            deadline = time.monotonic() + 20
            while not os.path.exists(_path(step, "wait_for")) and time.monotonic() < deadline:
                time.sleep(0.02)
        elif "run" in step:
            argv = [str(a) for a in step["run"]]  # type: ignore[attr-defined]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
            return {"rc": done.returncode, "out": done.stdout[-2000:], "err": done.stderr[-2000:]}
        else:
            return "unknown step"
    except OSError as exc:
        return _failed(exc)
    return "ok"


def main() -> int:
    refuse_unknown(sys.argv[1:])
    session = str(uuid.uuid4())
    started = False
    for raw in sys.stdin:
        if not raw.strip():
            continue
        msg = json.loads(raw)
        if msg.get("type") != "user":
            continue
        if not started:
            out({"type": "system", "subtype": "init", "session_id": session, "model": "git", "tools": []})
            started = True
        content = msg["message"]["content"]
        text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
        try:
            steps = json.loads(text)
            results = [do(s) for s in steps] if isinstance(steps, list) else ["not a list of steps"]
        except ValueError:
            results = ["not JSON"]
        body = json.dumps(results)
        out(
            {
                "type": "assistant",
                "session_id": session,
                "message": {"id": str(uuid.uuid4()), "role": "assistant", "content": [{"type": "text", "text": body}]},
            }
        )
        out({"type": "result", "subtype": "success", "is_error": False, "session_id": session, "result": body})
    return 0


if __name__ == "__main__":
    sys.exit(main())
